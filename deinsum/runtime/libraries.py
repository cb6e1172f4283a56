"""The libraries the local kernels call: numpy or CuPy for a block, TBLIS's transposes, Intel MKL's GEMMs and
deinsum's own streaming GEMMs (``_stream.c``), each found where installed and loaded once, at import.

STANDALONE: numpy and the standard library (pytblis optionally, MKL through ctypes where the ``mkl`` wheel is
installed: both come with the `fast` extra; the streaming kernels through ctypes where the install compiled
them). Which GEMM runs where is ``blas.py``'s business; this module only says what there is.

>>> sorted(np.dtype(t).name for t in _GEMM) in ([], ['float32', 'float64'])
True
"""
import ctypes
import glob
import os
import sys

import numpy as np

try:  # optional fast transposes (the `fast` extra)
    import pytblis as _tblis
except ImportError:  # pragma: no cover - depends on the environment
    _tblis = None


#: ``DEINSUM_GEMM`` values: ``auto`` (the default) measures; the others force every class (``blas.forced_routes``).
GEMM_CHOICES = ("auto", "numpy", "mkl", "stream")


def gemm_choice():
    """``DEINSUM_GEMM`` (default ``auto``), checked.

    >>> gemm_choice() in GEMM_CHOICES
    True
    """
    value = os.environ.get("DEINSUM_GEMM", "auto")
    if value not in GEMM_CHOICES:
        raise ValueError(f"DEINSUM_GEMM={value!r}: expected one of {', '.join(GEMM_CHOICES)}")
    return value


def _mkl_gemms():
    """(``{dtype: cblas_?gemm_batch_strided_64}``, version) of Intel MKL (the ``mkl`` wheel, in the `fast`
    extra) when installed and ``DEINSUM_GEMM`` is not ``numpy``; else ``({}, None)``. Which GEMMs run on
    it is measured (``blas.gemm_routes``): on an AMD EPYC here MKL takes a generic path, on Intel CPUs it
    streams the wide operand of a narrow GEMM while it computes, where OpenBLAS first packs it.
    """
    libs = sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*")), reverse=True)   # newest first
    if gemm_choice() == "numpy" or not libs:
        return {}, None
    i, p, found = ctypes.c_int64, ctypes.c_void_p, {}
    try:   # an MKL older than 2023 (no 64-bit-integer API) or a broken library: numpy's BLAS instead
        lib = ctypes.CDLL(libs[0])
        for dtype, real, letter in ((np.float64, ctypes.c_double, "d"), (np.float32, ctypes.c_float, "s")):
            gemm = getattr(lib, f"cblas_{letter}gemm_batch_strided_64")
            gemm.argtypes = [ctypes.c_int] * 3 + [i] * 3 + [real, p, i, i, p, i, i, real, p, i, i, i]
            found[np.dtype(dtype)] = gemm
        version = ctypes.create_string_buffer(256)
        lib.MKL_Get_Version_String(version, 256)
    except (OSError, AttributeError):
        return {}, None
    return found, version.value.decode(errors="replace").strip()


#: MKL's GEMMs by dtype, loaded at import so that threadpoolctl sees (and limits) MKL's threads.
_GEMM, _MKL_VERSION = _mkl_gemms()


def _stream_kernels():
    """deinsum's own streaming GEMMs (``_stream.c``, compiled at install where a C compiler is found)
    as ``(rows, cols, ttm_chain, rows_sum, set_threads, build)`` (ctypes functions; build: the file's
    name, size and time), where built, the CPU has AVX-512 and ``DEINSUM_GEMM`` is not ``numpy``; else
    None. Looked up through the installed package (an emitted script finds them too)."""
    import importlib.util
    if gemm_choice() == "numpy":
        return None
    try:
        spec = importlib.util.find_spec("deinsum")
    except (ImportError, ValueError):   # pragma: no cover - depends on the environment
        return None
    folders = list(spec.submodule_search_locations or []) if spec else []
    i, p = ctypes.c_long, ctypes.c_void_p
    for path in sorted(f for d in folders for f in glob.glob(os.path.join(d, "runtime", "_stream*.so"))):
        try:   # a build of this interface (an older one left in place, e.g. by an editable install, is skipped)
            lib = ctypes.CDLL(path)
            if lib.stream_abi() != _STREAM_ABI or not lib.stream_supported():
                continue
            lib.stream_rows.argtypes = [i] * 4 + [p, i, i, p, i, p, i, i, p]
            lib.stream_cols.argtypes = [i] * 4 + [p, p, i, i, p, i, i, p]
            lib.ttm_chain.argtypes = [i, i, p, p, p, i, p, i]
            lib.stream_rows_sum.argtypes = [i] * 4 + [p, i, i, p, i, p, i, p, i]
            lib.stream_set_threads.argtypes = [i]
        except (OSError, AttributeError):   # pragma: no cover - a broken build
            continue
        stat = os.stat(path)
        build = f"{os.path.basename(path)} {stat.st_size} {stat.st_mtime_ns} abi {_STREAM_ABI}"
        return lib.stream_rows, lib.stream_cols, lib.ttm_chain, lib.stream_rows_sum, lib.stream_set_threads, build
    return None


#: The interface of ``_stream.c`` this file calls (its ``stream_abi()``).
_STREAM_ABI = 5


#: deinsum's streaming GEMMs (float64) where built, or None (``blas._STREAM``: the same where the routes
#: run them).
_STREAM_BUILT = _stream_kernels()


def array_module(*blocks):
    """numpy, or the module of the first block that is no numpy array (CuPy for device blocks: the GPU
    runtime runs these same kernels on them; numpy's einsum and ``@`` dispatch to it).

    >>> array_module(np.ones(2), 3.0).__name__
    'numpy'
    """
    for b in blocks:
        if b is not None and not isinstance(b, (np.ndarray, np.generic, int, float, complex, list, tuple)):
            return __import__(type(b).__module__.partition(".")[0])
    return np


def transposed(a, perm):
    """C-contiguous copy of ``a.transpose(perm)``: TBLIS when installed and the innermost axis moves
    (2.6x numpy here for 64^4, perm (3,1,2,0)), else numpy (as fast as TBLIS when it stays).

    >>> transposed(np.arange(6.).reshape(2, 3), (1, 0)).tolist()
    [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    """
    t = a.transpose(perm)
    if t.flags.c_contiguous:
        return t
    if (_tblis is not None and isinstance(a, np.ndarray) and a.size >= 1 << 16 and a.dtype.kind in "fc"
            and a.flags.c_contiguous
            and perm[-1] != a.ndim - 1):
        return _tblis.ascontiguousarray(t)
    return t.copy(order="C")

