"""Local (single-rank) kernels: a fused group's einsum, or one binary/unary step, on numpy blocks
(or CuPy blocks on a GPU: see ``array_module``).

STANDALONE: this file imports only numpy and the standard library (pytblis
optionally, Intel MKL's GEMMs through ctypes where the ``mkl`` wheel is
installed: both come with the `fast` extra; and deinsum's own streaming GEMMs,
``_stream.c``, through ctypes where the install compiled them). Its source is pasted verbatim
into emitted scripts, and the sequential executor and the distributed runtime
call the same functions, so there is one copy of the local compute logic.

``contract_group`` computes a whole fused group's statement on this rank's
blocks (a partial sum where the grid splits a summed index) with the fastest
strategy a cost model finds; ``group_strategy`` names it:

* ``MTTKRP`` (full or partial, any modes, factors in either orientation):
  GEMMs on views of X (no copy of X) against the Khatri-Rao product of one
  contiguous run of modes, then a Hadamard-sum over the other factored modes
  (both in one pass of the streaming kernels where those modes lead X);
  rank columns in blocks where the temporaries would exceed half of the
  inputs plus output (and 2**16 elements); where X already holds the rank
  index, one Hadamard-sum pass;
* ``TTM chain`` (X times one matrix per contracted mode): float64 with new
  sides of at most 32 on the streaming kernels, the whole chain in one pass
  slab by slab of X's first axis (X read once; a slab's intermediates stay
  in cache where they fit);
  otherwise step by step: leading/trailing modes as one GEMM, middle modes
  as batched GEMMs (or moved last by a transposed copy), in the order with
  the lowest modeled cost; a large X slab by slab; on numpy's BLAS, GEMMs
  with a narrow side (<= 16 columns) in pieces of at most 1e6 multiply-adds,
  which OpenBLAS runs without packing X (1.4x faster here);
* ``pairwise``: numpy's einsum path, each step through ``contract_pair``.

Every GEMM runs through ``_matmul`` on the library its class is routed to (``gemm_routes``:
measured once per machine and cached, see ``gemm.py``; forced by ``DEINSUM_GEMM``; agreed
across ranks by ``agree_gemm_routes``): where the streaming kernels are routed, a float64
GEMM with a narrow side whose wide operand can be read in place runs on them (``_streamed``:
they hide the read of X behind the arithmetic, which BLAS's packing does not; the strategy
name says "streamed", for C-ordered blocks). Others run on Intel MKL (float32/64, where
installed) or numpy's BLAS as routed: square GEMMs, MTTKRP GEMMs (the cost model then picks
the variant with that library's constants: ``_MTTKRP_FIT``) and TTM steps (on numpy's BLAS
in pieces) each by their own route.

Results may be transposed views: a consumer reads a block stored in any axis
order without a copy (``contract_group`` relabels it). Peak memory stays within
1.5x of inputs plus output except in the pairwise fallback and in TTM chains
whose first steps grow the tensor.

Index strings may hold any characters; they are mapped to ASCII letters where numpy needs them.

>>> import numpy as np
>>> a, b = np.arange(6.).reshape(2, 3), np.arange(12.).reshape(3, 4)
>>> bool(np.allclose(contract_pair(a, b, "ij", "jk", "ik"), a @ b))
True
>>> float(unary(np.eye(3), "ii", ""))
3.0
>>> x, f = np.ones((4, 5, 6)), np.ones((5, 3))
>>> contract_group(("ijk", "ja", "ka"), "ia", x, f, np.ones((6, 3)))[0].tolist()
[30.0, 30.0, 30.0]
>>> group_strategy(("ijklm", "ia", "ja", "la", "ma"), "ka", [(24,) * 5] + [(24, 24)] * 4).split(": GEMM")[0]
'MTTKRP to (k)'
"""
import ctypes
import glob
import itertools
import os
import sys
from functools import lru_cache

import numpy as np

try:  # optional fast transposes (the `fast` extra)
    import pytblis as _tblis
except ImportError:  # pragma: no cover - depends on the environment
    _tblis = None


#: ``DEINSUM_GEMM`` values: ``auto`` (the default) measures; the others force every class (``forced_routes``).
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
    it is measured (``gemm_routes``): on an AMD EPYC here MKL takes a generic path, on Intel CPUs it
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
    as ``(rows, cols, ttm_chain, set_threads, build)`` (ctypes functions; build: the file's name, size and
    time), where built, the CPU has AVX-512 and ``DEINSUM_GEMM`` is not ``numpy``; else None. Looked up
    through the installed package (an emitted
    script finds them too)."""
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
            lib.stream_set_threads.argtypes = [i]
        except (OSError, AttributeError):   # pragma: no cover - a broken build
            continue
        stat = os.stat(path)
        build = f"{os.path.basename(path)} {stat.st_size} {stat.st_mtime_ns} abi {_STREAM_ABI}"
        return lib.stream_rows, lib.stream_cols, lib.ttm_chain, lib.stream_set_threads, build
    return None


#: The interface of ``_stream.c`` this file calls (its ``stream_abi()``).
_STREAM_ABI = 4


#: deinsum's streaming GEMMs (float64) where built, or None; ``_STREAM``: the same where the routes
#: run them (see ``_streamed``), else None.
_STREAM_BUILT = _stream_kernels()
_STREAM = None


#: Threads the streaming kernels run on (``set_stream_threads``).
_STREAM_THREADS = 1


def set_stream_threads(threads):
    """Run the streaming kernels on ``threads`` threads (OpenMP), as many as the rank's BLAS: the runtime
    sets it where it pins BLAS threads; 1 until then. Measured GEMM routes are resolved again for the new
    thread count where next needed (forced or agreed ones stay)."""
    global _STREAM_THREADS
    _STREAM_THREADS = max(1, int(threads))
    if _STREAM is not None:
        _STREAM[3](_STREAM_THREADS)
    if _ROUTES is not None and _ROUTES["why"] == "measured":
        use_gemm_routes(None)


#: The GEMM classes routed apart, with what they cover (``gemm_library`` names each one's library).
GEMM_CLASSES = {"square": "square GEMMs (matrix products, pairwise steps)",
                "narrow": "MTTKRP GEMMs on BLAS (a wide X times <= 32 columns)",
                "ttm": "TTM steps on BLAS (a short k, <= 16 columns)",
                "streamed": "the streaming kernels' shapes (float64 MTTKRP and TTM passes)"}
_NAMES = {"numpy": "numpy's BLAS", "mkl": "Intel MKL", "stream": "deinsum's streaming kernels"}
#: This process's routes (``gemm_routes``), resolved the first time a GEMM needs one.
_ROUTES = None


def forced_routes(name):
    """The routes ``DEINSUM_GEMM=name`` forces: ``numpy`` every GEMM on numpy's BLAS (MKL and the streaming
    kernels out); ``mkl`` every GEMM on MKL (where installed); ``stream`` the streaming kernels on their
    shapes (where built), numpy's BLAS elsewhere.

    >>> forced_routes("numpy")
    {'square': 'numpy', 'narrow': 'numpy', 'ttm': 'numpy', 'streamed': 'numpy'}
    """
    mkl = "mkl" if name == "mkl" and np.dtype(np.float64) in _GEMM else "numpy"
    stream = "stream" if name == "stream" and _STREAM_BUILT is not None else mkl
    return {"square": mkl, "narrow": mkl, "ttm": mkl, "streamed": stream}


def _resolve():
    """``{"why", "routes", "rates"}`` for this process: forced by ``DEINSUM_GEMM``, else measured by the
    sibling module ``gemm`` (cached per machine; an emitted script carries it too). Where that fails: the
    routes of an install without `fast` (numpy's BLAS, the streaming kernels on their shapes)."""
    forced = gemm_choice()
    if forced != "auto":
        return {"why": f"DEINSUM_GEMM={forced}", "routes": forced_routes(forced), "rates": None}
    from . import gemm
    try:   # (never break a run over a measurement)
        return gemm.measured_routes(gemm_trial, ("numpy", "mkl") if np.dtype(np.float64) in _GEMM else ("numpy",),
                                    ("stream",) if _STREAM_BUILT is not None else (),
                                    gemm_libraries())
    except Exception as exc:
        return {"why": f"not measured ({type(exc).__name__}: {exc}): as without `fast`",
                "routes": forced_routes("stream"), "rates": None}


def gemm_libraries():
    """The builds of the GEMM libraries besides numpy's (MKL's version, the streaming kernels'): part of the
    key under which measured routes are cached."""
    return {"mkl": _MKL_VERSION, "stream": _STREAM_BUILT and _STREAM_BUILT[4]}


def gemm_trial(a, b, library):
    """``a @ b`` on ``library`` alone (numpy, mkl or stream), whatever the routes: what ``gemm.py`` times.

    >>> gemm_trial(np.ones((2, 3)), np.ones((3, 2)), "numpy").tolist()
    [[3.0, 3.0], [3.0, 3.0]]
    """
    global _STREAM
    routed, _STREAM = _STREAM, _STREAM_BUILT if library == "stream" else None
    try:
        return _matmul(a, b, library)
    finally:
        _STREAM = routed


def use_gemm_routes(state):
    """Route GEMMs as ``state`` says (``gemm_routes``'s form: another rank's, or forced by a test).

    >>> saved = gemm_routes()
    >>> use_gemm_routes({"why": "DEINSUM_GEMM=numpy", "routes": forced_routes("numpy"), "rates": None})
    >>> gemm_routes()["routes"]["square"], gemm_routes()["routes"]["streamed"]
    ('numpy', 'numpy')
    >>> use_gemm_routes(saved)    # (None: resolved again where next needed)
    """
    global _ROUTES, _STREAM
    _ROUTES = state
    _STREAM = _STREAM_BUILT if state and state["routes"]["streamed"] == "stream" else None
    if _STREAM is not None:
        _STREAM[3](_STREAM_THREADS)
    _strategy.cache_clear()


def gemm_routes():
    """This process's GEMM routes: ``{"why": "measured" or what forced them, "routes": {class: library},
    "rates": {class: {library: GFLOP/s}} or None}``, resolved on first use (``_resolve``)."""
    if _ROUTES is None:
        use_gemm_routes(_resolve())
    return _ROUTES


def agree_gemm_routes(comm):
    """Collective: every rank of ``comm`` routes its GEMMs as rank 0 does (``gemm_routes`` there: resolved
    where not yet), so ranks on different CPUs differ in speed, never in behaviour."""
    state = comm.bcast(gemm_routes() if comm.Get_rank() == 0 else None, root=0)
    use_gemm_routes(dict(state, why="measured on rank 0" if state["why"] == "measured" else state["why"]))


def _route(cls):
    return gemm_routes()["routes"][cls]


_ASCII = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _ascii_map(*subscripts):
    """Map the characters of ``subscripts`` onto ASCII letters for numpy."""
    chars = sorted(set("".join(subscripts)))
    if len(chars) > len(_ASCII):
        raise ValueError(f"a local step uses {len(chars)} distinct indices; at most 52 are supported")
    table = {c: _ASCII[n] for n, c in enumerate(chars)}
    return ["".join(table[c] for c in s) for s in subscripts]


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


def reference_einsum(equation, *operands):
    """``numpy.einsum`` of an explicit equation whose letters numpy may not accept."""
    lhs, out = equation.split("->")
    *subs, o = _ascii_map(*lhs.split(","), out)
    return np.einsum(",".join(subs) + "->" + o, *operands)


def unary(a, sub, out):
    """Diagonal extraction, sums and transposes of one operand: ``einsum(sub->out)``.

    Size-1 axes whose index is not in ``out`` are broadcast away (numpy semantics).
    """
    s, o = _ascii_map(sub, out)
    return np.einsum(f"{s}->{o}", a)


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


def contract_pair(a, b, sa, sb, out):
    """Binary step ``einsum(sa,sb->out)`` through BLAS where it applies.

    * contraction without batch indices -> one GEMM on matrix views (GEMM/TDOT);
    * batch and contracted indices -> batched ``matmul`` (``einsum`` when GEMV-like);
    * no contracted index (KRP, Hadamard, outer) -> broadcast multiply.
    """
    batch = [c for c in sa if c in sb and c in out]
    summed = [c for c in sa if c in sb and c not in out]
    free_a = [c for c in sa if c not in sb]
    free_b = [c for c in sb if c not in sa]
    if not summed:
        # broadcast multiply: result axes batch + free_a + free_b
        order = batch + free_a + free_b
        ea = np.expand_dims(a.transpose([sa.index(c) for c in batch + free_a]),
                            tuple(range(len(batch) + len(free_a), len(order))))
        bb = b.transpose([sb.index(c) for c in batch + free_b])
        eb = np.expand_dims(bb, tuple(range(len(batch), len(batch) + len(free_a))))
        res = ea * eb
    elif not batch:
        # order the contracted indices as the larger operand stores them
        big, sbig = (a, sa) if a.size >= b.size else (b, sb)
        summed = [c for c in sbig if c in summed]
        am = _matrix(a, sa, free_a, summed, rows_free=True)
        bm = _matrix(b, sb, free_b, summed, rows_free=False)
        order = free_a + free_b
        res = _matmul(am, bm).reshape([a.shape[sa.index(c)] for c in free_a] +
                                      [b.shape[sb.index(c)] for c in free_b])
    else:
        shape = dict(zip(sa, a.shape))
        shape.update(zip(sb, b.shape))
        nb, na, nk, nn = (int(np.prod([shape[c] for c in g], dtype=np.int64))
                          for g in (batch, free_a, summed, free_b))
        if min(na, nn) < 8:  # memory-bound (batched GEMV-like): one pass, no transposed copies
            ea, eb, eo = _ascii_map(sa, sb, out)
            return np.einsum(f"{ea},{eb}->{eo}", a, b)
        am = transposed(a, [sa.index(c) for c in batch + free_a + summed]).reshape(nb, na, nk)
        bm = transposed(b, [sb.index(c) for c in batch + summed + free_b]).reshape(nb, nk, nn)
        order = batch + free_a + free_b
        res = _matmul(am, bm).reshape([shape[c] for c in order])
    return res.transpose([order.index(c) for c in out])


def _matrix(x, sub, free, summed, rows_free):
    """``x`` as a (free x summed) matrix if ``rows_free`` else (summed x free).

    Of the two memory orders that give such a matrix (directly, or as the
    transpose of the other), take a zero-copy view when one exists, else the
    order whose copy keeps ``x``'s innermost axis innermost (a fast copy).
    """
    nf = int(np.prod([x.shape[sub.index(c)] for c in free], dtype=np.int64))
    ns = int(np.prod([x.shape[sub.index(c)] for c in summed], dtype=np.int64))
    direct = free + summed if rows_free else summed + free
    flipped = summed + free if rows_free else free + summed
    perm_d = [sub.index(c) for c in direct]
    perm_f = [sub.index(c) for c in flipped]
    identity = list(range(len(sub)))
    use_flipped = perm_f == identity or (perm_d != identity and sub and perm_f[-1] == len(sub) - 1
                                         and perm_d[-1] != len(sub) - 1)
    if use_flipped:
        return transposed(x, perm_f).reshape((ns, nf) if rows_free else (nf, ns)).T
    return transposed(x, perm_d).reshape((nf, ns) if rows_free else (ns, nf))


# ---------------------------------------------------------------------------------------------
# group kernels: cost model
# ---------------------------------------------------------------------------------------------
#: Cost model constants, in seconds (one core, float64; only their ratios steer the choice).
_PEAK = 5e10          # GEMM flop/s at large M, K, N
_CALL = 0.5e-6        # per GEMM call (numpy matmul loop + BLAS set-up)
_CALL_SMALL = 1e-7    # per call of OpenBLAS's small-matrix kernels (no packing)
_SMALL_RATE = 2.5e10  # their flop/s (narrow TTM steps: (8 x 24) @ (24 x n))
_ELEM = 1.2e-9        # per element of an elementwise pass (Khatri-Rao, Hadamard-sum, copy)
#: MTTKRP GEMM variants by library: (the m, k and n that double the time per flop, relative speeds of
#: X^T KR over trailing, middle and leading modes, of KR^T X over trailing, middle and leading modes),
#: fitted on 26 shapes here (orders 3-5, R = 8-48, every variant on both libraries timed:
#: scripts/bench_mttkrp_variants.py). OpenBLAS packs X first and streams it fastest as KR^T @ X, X
#: untransposed; MKL streams X while it computes, fastest as X^T KR over trailing modes or KR^T X over
#: middle ones (its other speeds, 0.1, are set: never the pick).
_MTTKRP_FIT = {False: (4.0, 6.0, 24.0, 0.5, 0.5, 0.5, 0.7, 1.0, 1.0),
               True: (16.0, 64.0, 8.0, 3.0, 0.1, 0.1, 0.1, 3.0, 0.1)}
#: Flop/s of the streaming kernels' fused MTTKRP passes (GEMM and Hadamard-sum), by kind, in the units of
#: the fit above: fitted on scripts/bench_mttkrp_variants.py --kernels.
_FUSED_RATE = {"rows": 6e10, "cols": 4.5e10}
#: Bytes in one core's L1 data and L2 caches here (48 KiB, 2 MiB).
_L1_BYTES = 48 << 10
_L2_BYTES = 2 << 20
#: Elements of X per slab of a TTM chain run slab by slab (a few MiB: intermediates stay in cache).
_SLAB = 1 << 20
#: Temporaries up to this many elements are always allowed (beyond it: half of inputs plus output).
_SMALL = 1 << 16
#: Multiply-adds per GEMM call up to which OpenBLAS (>= 0.3.16, x86-64) runs its small-matrix kernels,
#: which read both operands in place instead of packing them; and the widest narrow side that gains.
_SMALL_GEMM = 1_000_000
_NARROW = 16


def _matmul(a, b, library=None):
    """``a @ b`` (numpy's broadcasting) on CPU blocks: on the streaming kernels where routed and they take
    it; else on ``library`` (default: the route of square GEMMs): ``mkl``, MKL's strided-batch GEMM where
    installed and it reads the float operands in place; otherwise numpy, where a float GEMM with a
    narrow side (<= 16: a TTM) runs in pieces of at most 1e6 multiply-adds, cut along its wide side,
    so OpenBLAS streams the wide operand in place instead of packing it first ((8 x 24) @ (24 x 13824),
    24 times: 4.7 ms in pieces, 6.7 ms in one).

    >>> a, b = np.ones((2, 8, 24)), np.ones((24, 9000))
    >>> bool((_matmul(a, b) == 24).all()), _matmul(a, b[:, :0]).shape
    (True, (2, 8, 0))
    """
    (m, k), n, dtype = a.shape[-2:], b.shape[-1], np.result_type(a.dtype, b.dtype)
    if array_module(a, b) is not np:
        return a @ b     # (a GPU's GEMM needs no pieces)
    library = library or _route("square")
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    if _STREAM is not None and dtype == np.float64 and a.dtype == b.dtype == dtype:
        res = _streamed(a, b, batch)
        if res is not None:
            return res
    if library == "mkl" and dtype in _GEMM:
        a = np.broadcast_to(a.astype(dtype, copy=False), batch + (m, k))
        b = np.broadcast_to(b.astype(dtype, copy=False), batch + (k, n))
        views = [_cblas_view(v) for v in (a, b)]
        if None not in views:
            (ta, lda, sa), (tb, ldb, sb) = views
            res = np.empty(batch + (m, n), dtype)
            if res.size:   # (k = 0: beta = 0 writes zeros; C is C-ordered: ldc = n, MKL wants stridec >= m n)
                _GEMM[dtype](101, ta, tb, m, n, k, 1.0, a.ctypes.data, lda, sa, b.ctypes.data, ldb, sb,
                             0.0, res.ctypes.data, n, m * n, res.size // (m * n))
            return res
    with np.errstate(all="ignore"):   # (no floating-point warnings on NaN or inf: as on MKL, whatever the route)
        if m * k * n <= _SMALL_GEMM or min(m, n) > _NARROW or dtype.kind != "f":
            return a @ b
        res = np.empty(batch + (m, n), dtype)
        wide = max(m, n)
        pieces = -(-wide // max(1, _SMALL_GEMM // (k * min(m, n))))
        step = -(-wide // pieces)                                       # even pieces
        for lo in range(0, wide, step):
            if m > n:
                np.matmul(a[..., lo:lo + step, :], b, out=res[..., lo:lo + step, :])
            else:
                np.matmul(a, b[..., lo:lo + step], out=res[..., lo:lo + step])
        return res


#: Multiply-adds from which a GEMM runs on the streaming kernels, and their narrow side's limit.
_STREAM_WORK = 1 << 22
_STREAM_NARROW = 32


def _streamed(a, b, batch):
    """``a @ b`` (float64) on deinsum's streaming kernels where one operand is wide, read in place with
    unit stride along its rows, and the other narrow and shared by the batch; else None.

    * rows: T = X @ W with W (k x n) of at most 32 columns that fits in L2: MTTKRP's X^T KR over
      trailing modes (order 3, 256^3, R = 24, mode 1: 13.1 ms; MKL 19.4, OpenBLAS 36.0);
    * cols: T = A @ X with A (m x k) and every X block at most 32 rows and columns: KR^T X over middle
      modes in small blocks (order 5, 24^5, mode 4: 7.3 ms; MKL 8.1).

    >>> x, w = np.arange(2 * 300 * 70.).reshape(2, 300, 70), np.ones((70, 3))
    >>> r = _streamed(x, w, (2,))
    >>> r is None or bool((r == x @ w).all())
    True
    """
    (m, k), n = a.shape[-2:], b.shape[-1]
    kind = _stream_kind(_prod(batch), m, k, n, a.ndim > 2, b.ndim > 2)
    if kind == "rows":
        view = _cblas_view(np.broadcast_to(a, batch + (m, k)))
        if view is not None and view[0] == 111:
            w_view = _cblas_view(b)        # W read in place where its rows are, else a contiguous copy
            w, ldw = (b, w_view[1]) if w_view is not None and w_view[0] == 111 else (np.ascontiguousarray(b), n)
            res = np.empty(batch + (m, n))
            _checked(_STREAM[0](_prod(batch), m, n, k, a.ctypes.data, view[1], view[2], w.ctypes.data, ldw,
                                res.ctypes.data, n, m * n, None), m, n)
            return res
    if kind == "cols":
        view = _cblas_view(np.broadcast_to(b, batch + (k, n)))
        if view is not None and view[0] == 111:
            at = np.ascontiguousarray(a.T)
            res = np.empty(batch + (m, n))
            _checked(_STREAM[1](_prod(batch), m, n, k, at.ctypes.data, b.ctypes.data, view[1], view[2],
                                res.ctypes.data, n, m * n, None), m, n)
            return res
    return None


def _checked(status, m, n):
    """Raise on a streaming kernel's error status for a result of m x n (1: no memory for its scratch
    blocks; 2: a shape it does not take, which the routing never passes)."""
    if status == 1:
        raise MemoryError(f"the streaming kernels found no memory for their scratch blocks (a result of {m} x {n})")
    if status:
        raise ValueError(f"the streaming kernels refused a product whose result is {m} x {n}")


def _stream_kind(nbatch, m, k, n, a_batched, b_batched, wide=False):
    """``"rows"``, ``"cols"`` or None: the streaming kernel that takes a float64 GEMM of ``nbatch`` times
    (m x k) @ (k x n) (operands batched or shared), given its wide operand has unit stride along rows.
    With ``wide`` (the fused MTTKRP pass), "cols" takes any n where a column tile of X (k x 24) stays
    in L1 while the rows of A re-read it.

    >>> _stream_kind(1, 65536, 256, 24, False, False) == ("rows" if _STREAM else None)
    True
    """
    if _STREAM is None or nbatch * m * k * n < max(1, _STREAM_WORK):    # (never an empty GEMM)
        return None
    a_wide = a_batched or (not b_batched and m >= n)     # the batched operand, or the larger one
    if a_wide and not b_batched and n <= _STREAM_NARROW and k * n * 8 <= _L2_BYTES // 2:
        return "rows"
    if (not a_wide and not a_batched and m <= _STREAM_NARROW
            and (n <= _STREAM_NARROW or wide and k * 24 * 8 <= _L1_BYTES)):
        return "cols"
    return None


def _cblas_view(x):
    """(CBLAS transpose flag, leading dimension, batch stride), in elements, that describe ``x``
    (..., rows, cols) in place to a row-major strided-batch GEMM; None where no such triple exists.

    >>> _cblas_view(np.ones((3, 4, 5))), _cblas_view(np.ones((3, 5, 4)).transpose(0, 2, 1))
    ((111, 5, 20), (112, 4, 20))
    """
    if any(s % x.itemsize or s < 0 for s in x.strides):
        return None
    *batch, (r, sr), (c, sc) = [(n, s // x.itemsize) for n, s in zip(x.shape, x.strides)]
    if (c == 1 or sc == 1) and (r == 1 or sr >= c):
        flag, ld = 111, sr if r > 1 else c
    elif (r == 1 or sr == 1) and (c == 1 or sc >= r):
        flag, ld = 112, sc if c > 1 else r
    else:
        return None
    batch = [(n, s) for n, s in batch if n > 1]   # one stride must step through them all
    if any(s != s2 * n2 for (_, s), (n2, s2) in zip(batch, batch[1:])):
        return None
    ld = max(1, ld)
    return flag, ld, batch[-1][1] if batch else (r if flag == 111 else c) * ld


def _prod(values):
    n = 1
    for v in values:
        n *= int(v)
    return n


def _gemm_seconds(m, k, n, calls=1, pieces=False, short=(4.0, 48.0, 24.0)):
    """Modeled seconds of ``calls`` numpy GEMMs (m x k) @ (k x n), C order: small sizes run below peak
    (an m, k or n of ``short`` doubles the time per flop).

    Fitted on this machine's OpenBLAS, one thread: a narrow n (BLAS's m) costs more than a narrow m;
    with ``pieces`` (TTM steps through ``_matmul``: a short k), small-matrix kernels (up to 1e6
    multiply-adds per call, or a narrow side cut in such pieces) run at a flat rate with little set-up.
    """
    if pieces and (m * k * n <= _SMALL_GEMM or min(m, n) <= _NARROW):
        return calls * (-(-m * k * n // _SMALL_GEMM) * _CALL_SMALL + 2.0 * m * k * n / _SMALL_RATE)
    eff = 1.0 / (1.0 + short[0] / m + short[1] / k + short[2] / n)
    return calls * (2.0 * m * k * n / (_PEAK * eff) + _CALL)


def gemm_library():
    """The library each GEMM class runs on in this process and why: the rates measured (GFLOP/s, float64,
    cached per machine), or ``DEINSUM_GEMM`` forcing it; a kernel on MKL or on the streaming kernels also
    says so in its strategy name.

    >>> rates = {"square": {"numpy": [50, 52], "mkl": [48, 50]}, "ttm": {"numpy": [9, 10], "mkl": [19, 20]},
    ...          "narrow": {"numpy": [38, 40], "mkl": [33, 35], "stream": [80, 90]}}
    >>> saved = gemm_routes()
    >>> use_gemm_routes({"why": "measured", "rates": rates,
    ...                  "routes": {"square": "numpy", "narrow": "numpy", "ttm": "mkl", "streamed": "stream"}})
    >>> print(gemm_library().split("; ")[2])
    TTM steps on BLAS (a short k, <= 16 columns): Intel MKL (GFLOP/s measured, slowest-fastest round: numpy 9-10, mkl 19-20)
    >>> use_gemm_routes(saved)
    """
    state = gemm_routes()

    def why(cls):
        if not state["rates"]:
            return state["why"]
        rates = state["rates"]["narrow" if cls == "streamed" else cls]
        return "GFLOP/s measured, slowest-fastest round: " + ", ".join(
            f"{lib} {slowest}-{fastest_round}" for lib, (slowest, fastest_round) in rates.items()
            if cls != "narrow" or lib != "stream")
    return "; ".join(f"{what}: {_NAMES[state['routes'][cls]]} ({why(cls)})" for cls, what in GEMM_CLASSES.items())


def group_strategy(inputs, output, shapes, dtype=np.float64, device=False):
    """The name of the strategy ``contract_group`` uses for these subscripts, block shapes and dtype (on
    the CPU, or on a GPU with ``device``).

    >>> group_strategy(("ij", "jk"), "ik", [(4, 5), (5, 6)])
    'pairwise: ij,jk->ik'
    >>> name = group_strategy(("ijklm", "jb", "kc", "ld", "me"), "ibcde", [(24,) * 5] + [(24, 8)] * 4, np.float32)
    >>> name.split("; ")[:2]
    ['TTM chain: j (middle), k (middle), l (middle), m (last)', 'in slabs of 3 i']
    >>> name.split("; ")[2]
    'narrow GEMMs in pieces of <= 1e6 multiply-adds (float)'
    """
    return _strategy(tuple(inputs), output, tuple(tuple(int(n) for n in s) for s in shapes),
                     _route("narrow") == "mkl" and np.dtype(dtype) in _GEMM and not device, np.dtype(dtype).itemsize,
                     np.dtype(dtype) == np.float64 and not device)[1]


def contract_group(inputs, output, *blocks):
    """``einsum(inputs -> output)`` of one fused group on this rank's blocks (see module docstring).

    >>> x = np.arange(24.).reshape(2, 3, 4)
    >>> u, v = np.ones((3, 2)), np.ones((4, 5))
    >>> contract_group(("ijk", "jb", "kc"), "ibc", x, u, v).shape
    (2, 2, 5)
    """
    inputs = tuple(inputs)
    if len(inputs) != len(blocks):
        raise ValueError(f"{len(inputs)} subscripts but {len(blocks)} blocks")
    xp = array_module(*blocks)
    dtype = xp.result_type(*blocks)
    blocks = [xp.asarray(b, dtype=dtype) for b in blocks]
    # a block stored as a permutation of C order becomes a C-ordered view with permuted subscripts
    subs = []
    for n, (b, s) in enumerate(zip(blocks, inputs)):
        if b.ndim > 1 and not b.flags.c_contiguous:
            perm = sorted(range(b.ndim), key=lambda d: -abs(b.strides[d]))
            if b.transpose(perm).flags.c_contiguous:
                b, s = b.transpose(perm), "".join(s[d] for d in perm)
        blocks[n] = b
        subs.append(s)
    # the streaming kernels' passes read C-ordered blocks (as a plan's are: group_strategy names those)
    stream = dtype == np.float64 and xp is np and all(b.flags.c_contiguous for b in blocks)
    mkl = _route("narrow") == "mkl" and dtype in _GEMM and xp is np
    kind, _, params = _strategy(tuple(subs), output, tuple(b.shape for b in blocks), mkl,
                                dtype.itemsize, stream)
    return _RUN[kind](subs, output, blocks, dtype, params)


@lru_cache(maxsize=256)
def _strategy(subs, out, shapes, mkl, itemsize=8, stream=False):
    """(kind, name, params) for ``contract_group``; pure function of subscripts, shapes, whether MKL
    can run the GEMMs (float32/64 on the CPU, where installed), the bytes per element and whether the
    blocks are float64 on the CPU (the streaming kernels' domain, where built: ``_stream_kind``)."""
    sizes = {}
    for s, shape in zip(subs, shapes):
        if len(s) != len(shape):
            raise ValueError(f"subscripts {s!r} do not match a block of shape {shape}")
        for c, n in zip(s, shape):
            if sizes.setdefault(c, n) != n:
                return "einsum", "einsum (broadcast sizes)", None
    if 0 in sizes.values():
        return "zeros", "zeros (an empty block)", tuple(sizes[c] for c in out)
    found = _mttkrp_strategy(subs, out, sizes, mkl, itemsize, stream) or _ttm_strategy(subs, out, sizes, stream)
    if found is not None:
        return found
    return _pairwise_strategy(subs, out, sizes)


# ---------------------------------------------------------------------------------------------
# MTTKRP: out[free..., r] = sum over the factored modes of X[...] * prod_q F_q[n_q, r]
# ---------------------------------------------------------------------------------------------
def _mttkrp_strategy(subs, out, sizes, mkl, itemsize, stream):
    """Full or partial MTTKRP (several free modes; X may already hold r: then a Hadamard-sum)."""
    big = [n for n, s in enumerate(subs) if len(s) >= 3]
    if len(subs) < 3 or len(big) != 1 or len(set(subs[big[0]])) != len(subs[big[0]]):
        return None
    x = big[0]
    sx = subs[x]
    pairs = [set(s) for n, s in enumerate(subs) if n != x]
    rank = set.intersection(*pairs)
    if any(len(s) != 2 for s in pairs) or len(rank) != 1:
        return None
    (r,) = rank
    modes = [(set(s) - rank).pop() for s in pairs]
    free = [c for c in sx if c not in modes and c != r]
    if (len(set(modes)) != len(modes) or any(m not in sx for m in modes) or len(set(out)) != len(out)
            or set(out) != {*free, r}):
        return None
    axes = [sx.index(m) for m in modes]
    if r in sx:  # X already holds r: one elementwise pass, no GEMM
        return "mttkrp", f"MTTKRP to ({','.join(free)}): Hadamard-sum over ({','.join(c for c in sx if c in modes)})", \
            (x, r, None)
    dims, nr = [sizes[c] for c in sx], sizes[r]
    budget = max(_SMALL, 0.5 * (sum(_prod(sizes[c] for c in s) for s in subs) + _prod(sizes[c] for c in out)))
    best = None
    for (s, e, orient), on_mkl in itertools.product(_mttkrp_variants(len(sx), axes), (False, True)[:1 + mkl]):
        a, k, b = _prod(dims[:s]), _prod(dims[s:e]), _prod(dims[e:])
        rest = _prod(dims[q] for q in axes if not s <= q < e)
        extra = (2 * k + a * b + rest) * nr       # Khatri-Rao (and its last partial), T, rest's KRP
        if stream and _fusion(dims, s, e, orient, [q for q in axes if not s <= q < e], nr):
            extra = (2 * k + rest + a * b // rest) * nr      # no T: the fused pass's scratch is one result
        block = nr if extra <= budget else max(1, int(nr * budget // extra))
        seconds = _mttkrp_seconds(dims, axes, nr, (s, e, orient, block, on_mkl), itemsize, stream)
        if best is None or seconds < best[0]:
            best = (seconds, s, e, orient, block, on_mkl)
    _, s, e, orient, block, on_mkl = best
    streamed = _variant_streams(dims, s, e, orient, block)
    hadamard = [c for c in sx if c in modes and c not in sx[s:e]]
    name = (f"MTTKRP to ({','.join(free)}): GEMM over ({','.join(sx[s:e])}) "
            f"{'X^T KR' if orient == 'rows' else 'KR^T X'}")
    if stream and _fusion(dims, s, e, orient, [sx.index(c) for c in hadamard], block):
        name += f" and Hadamard-sum over ({','.join(hadamard)}) in one streamed pass"
    else:
        name += " (streamed)" if stream and streamed else " (MKL)" if on_mkl else ""
        if hadamard:
            name += f", Hadamard-sum over ({','.join(hadamard)})"
    if block < nr:
        name += f", rank columns in blocks of {block}"
    return "mttkrp", name, (x, r, (s, e, orient, block, on_mkl))


def _mttkrp_seconds(dims, axes, nr, variant, itemsize, stream):
    """Modeled seconds of an MTTKRP variant (s, e, orient, block, on_mkl) on X of ``dims`` summed over
    ``axes``: the GEMM and Hadamard-sum in one pass of the streaming kernels where ``_fusion`` runs it
    (with ``stream``: float64 on the CPU), else the GEMM (``_MTTKRP_FIT`` of its library) and the
    elementwise passes.

    >>> round(1e3 * _mttkrp_seconds((256,) * 3, [0, 1], 24, (1, 2, "cols", 24, True), 8, False), 1)   # MKL
    12.9
    """
    s, e, orient, block, on_mkl = variant
    a, k, b = _prod(dims[:s]), _prod(dims[s:e]), _prod(dims[e:])
    rest = _prod(dims[q] for q in axes if not s <= q < e)
    fused = stream and _fusion(dims, s, e, orient, [q for q in axes if not s <= q < e], block)
    if fused:   # X read once per block of rank columns, each in whole vectors of 8
        return 2.0 * a * k * b * -(-nr // block) * -(-block // 8) * 8 / _FUSED_RATE[fused] + _ELEM * (k + rest) * nr
    chunks = -(-nr // block)
    if e == len(dims) and orient == "rows":
        shape = (a, k, block, chunks)
    elif e == len(dims) or s == 0:
        shape = (block, k, a * b, chunks) if orient == "cols" else (b, k, block, chunks)
    else:
        shape = (block, k, b, a * chunks) if orient == "cols" else (b, k, block, a * chunks)
    where = 0 if e == len(dims) else 1 if s > 0 else 2     # the run of modes: trailing, middle, leading
    if on_mkl and orient == "cols" and where == 1 and k * b * itemsize > _L2_BYTES:
        where = 2   # MKL's batched KR^T X runs as fast as over middle modes only while a slab of X fits in L2
    fit = _MTTKRP_FIT[on_mkl]
    gemm = _gemm_seconds(*shape, short=fit[:3]) / fit[3 + 3 * (orient == "cols") + where]
    return gemm + _ELEM * ((k + a * b + rest) * nr + (a * b * nr / 4 if rest > 1 else 0))


def _variant_streams(dims, s, e, orient, block):
    """Whether the GEMM ``_run_mttkrp`` makes for this variant (X C-ordered) runs on the streaming kernels:
    ``_streamed`` takes it where ``_stream_kind`` names the kernel whose wide operand has unit-stride rows.

    >>> _variant_streams((256, 256, 256), 2, 3, "rows", 24) == bool(_STREAM)
    True
    """
    n = len(dims)
    a, k, b = _prod(dims[:s]), _prod(dims[s:e]), _prod(dims[e:])
    if orient == "rows" and e == n:     # X (a x k) @ KR: both operands' rows in place
        return _stream_kind(1, a, k, block, False, False) is not None
    if orient == "cols" and s == 0:     # KR^T (its rows strided) @ X (k x b)
        return _stream_kind(1, block, k, b, False, False) == "cols"
    if orient == "cols" and e < n:      # KR^T @ X (a batches of k x b)
        return _stream_kind(a, block, k, b, False, True) == "cols"
    return False                        # X's rows strided: X^T KR over leading or middle modes, KR^T X over trailing


def _mttkrp_variants(ndim, axes):
    """(s, e, orient): GEMM over the factored axes s..e-1 (a run of ``axes``), T as (..., R) or (R, ...)."""
    return [(s, e, o) for s in range(ndim) for e in range(s + 1, ndim + 1) if all(q in axes for q in range(s, e))
            for o in ("rows", "cols")]


def _khatri_rao(mats):
    """Row-wise Khatri-Rao product of (n_q, R) matrices: ((prod n_q), R), last factor fastest."""
    res = mats[0]
    for m in mats[1:]:
        res = (res[:, None, :] * m[None, :, :]).reshape(-1, res.shape[1])
    return res


def _run_mttkrp(subs, out, blocks, dtype, params):
    """T = X times the Khatri-Rao product of modes s..e-1 (GEMMs on views of X), then a Hadamard-sum."""
    x, r, gemm = params
    sx, xb = subs[x], blocks[x]
    n = xb.ndim
    factors = {sx.index(sub.replace(r, "")): blocks[k] if sub[1] == r else blocks[k].T
               for k, sub in enumerate(subs) if k != x}           # axis of X -> (n_axis, R)
    label = {c: q for q, c in enumerate(sx)}
    label.setdefault(r, n)
    out_axes = [label[c] for c in out]
    if gemm is None:
        rest = sorted(factors)
        w = _khatri_rao([factors[q] for q in rest]).reshape([xb.shape[q] for q in rest] + [-1])
        return np.einsum(xb, list(range(n)), w, rest + [label[r]], out_axes)
    s, e, orient, block, mkl = gemm
    library = "mkl" if mkl else "numpy"
    dims = xb.shape
    nr = next(f.shape[1] for f in factors.values())
    a, k, b = _prod(dims[:s]), _prod(dims[s:e]), _prod(dims[e:])
    rest = [q for q in sorted(factors) if not s <= q < e]
    t_axes = list(range(s)) + list(range(e, n)) + [n] if orient == "rows" else \
        list(range(s)) + [n] + list(range(e, n))
    res_axes = sorted(out_axes)                                    # free axes in X's order, then r
    xp = array_module(xb)
    res = None if block == nr and not rest else xp.empty([dims[q] if q < n else nr for q in res_axes], dtype)
    fused = (xp is np and xb.flags.c_contiguous and xb.dtype == np.float64
             and _fusion(dims, s, e, orient, rest, block))       # (CPU blocks only)
    for r0 in range(0, nr, block):
        cols = slice(r0, min(nr, r0 + block))
        kr = xp.ascontiguousarray(_khatri_rao([factors[q][:, cols] for q in range(s, e)]))   # (small)
        if fused:
            h = _khatri_rao([factors[q][:, cols] for q in rest])
            res[..., cols] = _run_fused(fused, xb, s, e, rest, kr, h).reshape(res[..., cols].shape)
            continue
        if orient == "rows":
            t = _matmul(xb.reshape(a, k) if e == n else xb.reshape(a, k, b).transpose(0, 2, 1), kr, library)
        elif s == 0:
            t = _matmul(kr.T, xb.reshape(k, b), library)
        elif e == n:
            t = _matmul(kr.T, xb.reshape(a, k).T, library).T
        else:
            t = _matmul(kr.T, xb.reshape(a, k, b), library)
        t = t.reshape([dims[q] if q < n else -1 for q in t_axes])
        if res is None:           # T is the result: a transposed view, no copy
            return t.transpose([t_axes.index(q) for q in out_axes])
        if rest:  # the weights stored in T's axis order: einsum's inner loop runs contiguously in both
            w = _khatri_rao([factors[q][:, cols] for q in rest]).reshape([dims[q] for q in rest] + [-1])
            w_axes = [q for q in t_axes if q in rest or q == n]
            w = xp.ascontiguousarray(w.transpose([(rest + [n]).index(q) for q in w_axes]))
            # no out=: numpy's einsum then picks the output order its loops run fastest in (into a C-ordered
            # out= it took 6.7 ms instead of 0.8 here: ijk,ia,ja->ka at 256^3, R = 24); the copy is small
            res[..., cols] = xp.einsum(t, t_axes, w, w_axes, res_axes)
        else:
            res[..., cols] = xp.einsum(t, t_axes, res_axes)
        del kr, t  # before the next block's Khatri-Rao product
    return res.transpose([res_axes.index(q) for q in out_axes])


def _fusion(dims, s, e, orient, rest, block):
    """``"rows"`` or ``"cols"`` where the streaming kernels run an MTTKRP variant's GEMM and its
    Hadamard-sum in one pass (T = X times KR never stored): the Hadamard-summed modes ``rest`` lead X
    and the free ones sit next to the GEMM's; else None.

    * rows, X^T KR over trailing modes: X as (G, F, K): out (F, r) = sum_g (X[g] @ KR) * H[g];
    * cols, KR^T X over middle modes: X as (G, K, F): out (r, F) = sum_g H[g] * (KR^T @ X[g]), F of any
      width where a column tile of X[g] (K x 24) stays in L1 while the rank rows re-read it (order 3,
      256^3, R = 24, mode 2: 17.3 ms; on MKL, then the Hadamard-sum: 19.9).

    >>> _fusion((256, 256, 256), 2, 3, "rows", [0], 24) == ("rows" if _STREAM else None)
    True
    """
    n = len(dims)
    if not rest or rest != list(range(len(rest))):
        return None
    g, k, free_rows, free_cols = _prod(dims[:len(rest)]), _prod(dims[s:e]), _prod(dims[len(rest):s]), _prod(dims[e:])
    if orient == "rows" and e == n and _stream_kind(g, free_rows, k, block, True, False) == "rows":
        return "rows"
    if (orient == "cols" and s == len(rest) and e < n
            and _stream_kind(g, block, k, free_cols, False, True, wide=True) == "cols"):
        return "cols"
    return None


def _run_fused(kind, xb, s, e, rest, kr, h):
    """The fused pass of ``_fusion``'s ``kind`` on a C-ordered float64 X and a C-ordered Khatri-Rao block
    ``kr``: (free modes x rank columns)."""
    dims, nr = xb.shape, kr.shape[1]
    g, k = _prod(dims[:len(rest)]), _prod(dims[s:e])
    h = np.ascontiguousarray(h)
    if kind == "rows":
        f = _prod(dims[len(rest):s])
        out = np.zeros((f, nr))
        _checked(_STREAM[0](g, f, nr, k, xb.ctypes.data, k, f * k, kr.ctypes.data, nr, out.ctypes.data, nr, 0,
                            h.ctypes.data), f, nr)
        return out
    f = _prod(dims[e:])
    out = np.zeros((nr, f))
    _checked(_STREAM[1](g, nr, f, k, kr.ctypes.data, xb.ctypes.data, f, k * f, out.ctypes.data, f, 0, h.ctypes.data),
             nr, f)
    return out.T


# ---------------------------------------------------------------------------------------------
# TTM chain: X times one matrix per contracted mode, e.g. ijklm,jb,kc,ld,me->ibcde
# ---------------------------------------------------------------------------------------------
def _ttm_strategy(subs, out, sizes, stream):
    big = [n for n, s in enumerate(subs) if len(s) >= 3]
    if len(subs) < 2 or len(big) != 1 or len(set(subs[big[0]])) != len(subs[big[0]]):
        return None
    x = big[0]
    sx = subs[x]
    steps = []   # (mode, new index, operand)
    for n, s in enumerate(subs):
        if n == x:
            continue
        if len(s) != 2 or (s[0] in sx) == (s[1] in sx):
            return None
        mode, new = (s[0], s[1]) if s[0] in sx else (s[1], s[0])
        if "".join(subs).count(new) != 1 or new not in out or mode in out:
            return None
        steps.append((mode, new, n))
    contracted = {m for m, _, _ in steps}
    kept = {c for c in sx if c not in contracted}
    if len(contracted) != len(steps) or set(out) != kept | {w for _, w, _ in steps} or len(out) != len(set(out)):
        return None
    if stream:
        found = _ttm_streamed_strategy(x, sx, steps, sizes)
        if found is not None:
            return found
    # a large X whose first axis is kept runs slab by slab (intermediates stay in cache): model one slab
    size, first = _prod(sizes[c] for c in sx), sizes[sx[0]]
    rows = max(1, _SLAB * first // size) if len(steps) > 1 and sx[0] in out and size > 2 * _SLAB else 0
    rows = rows if rows < first else 0
    dims = dict(sizes, **{sx[0]: rows}) if rows else sizes
    best = None
    for order in _step_orders(steps, sizes):
        labels, seconds, kinds, gemms = list(sx), 0.0, [], []     # gemms: (m, k, n, batches) of each step
        for mode, new, _ in order:
            q, total = labels.index(mode), _prod(dims[c] for c in labels)
            n, w = dims[mode], dims[new]
            if q == len(labels) - 1:
                kinds.append("last")
                gemms.append((total // n, n, w, 1))
                seconds += _gemm_seconds(*gemms[-1], pieces=True)
                labels[q] = new
            elif q == 0:
                kinds.append("first")
                gemms.append((total // n, n, w, 1))
                seconds += _gemm_seconds(*gemms[-1], pieces=True)
                labels = labels[1:] + [new]
            else:
                after = _prod(dims[c] for c in labels[q + 1:])
                batched = _gemm_seconds(w, n, after, total // (n * after), pieces=True)
                moved = _gemm_seconds(total // n, n, w, pieces=True) + 3 * _ELEM * total    # a transposed copy
                kinds.append("middle" if batched <= moved else "moved last")
                gemms.append((w, n, after, total // (n * after)) if batched <= moved else (total // n, n, w, 1))
                seconds += min(batched, moved)
                labels = labels[:q] + [new] + labels[q + 1:] if batched <= moved else \
                    labels[:q] + labels[q + 1:] + [new]
        if labels != list(out):
            seconds += _ELEM * _prod(dims[c] for c in out)
        if best is None or seconds < best[0] - 1e-12:
            best = (seconds, order, kinds, gemms)
    _, order, kinds, gemms = best
    name = "TTM chain: " + ", ".join(f"{m} ({k})" for (m, _, _), k in zip(order, kinds))
    if rows:
        name += f"; in slabs of {rows} {sx[0]}"
    # as _ttm_chain calls _matmul: "middle" U^T (rows strided) @ T batches, "last" and "moved last" T @ U with
    # both operands' rows in place, "first" T^T (rows strided) @ U
    streamed = [m for (m, _, _), kind, (gm, gk, gn, nb) in zip(order, kinds, gemms) if stream and kind != "first"
                and (_stream_kind(nb, gm, gk, gn, False, True) == "cols" if kind == "middle"
                     else _stream_kind(nb, gm, gk, gn, False, False) is not None)]
    if streamed:
        name += f"; streamed GEMMs: {', '.join(streamed)}"
    if _route("ttm") == "numpy" and any(m * k * n > _SMALL_GEMM and min(m, n) <= _NARROW
                                        for (m, k, n, _), (mode, _, _) in zip(gemms, order) if mode not in streamed):
        name += "; narrow GEMMs in pieces of <= 1e6 multiply-adds (float)"
    return "ttm", name, (x, tuple(order), tuple(kinds), rows)


def _step_orders(steps, sizes):
    """The orders a TTM chain's ``steps`` (mode, new index, operand) are tried in: all of them up to 6
    steps, beyond that the one that shrinks the tensor fastest first."""
    if len(steps) <= 6:
        return itertools.permutations(steps)
    return [sorted(steps, key=lambda t: sizes[t[1]] / sizes[t[0]])]


def _ttm_streamed_strategy(x, sx, steps, sizes):
    """The whole chain in one pass of the streaming kernels (``ttm_chain`` in ``_stream.c``), slab by slab
    of X's first axis where it is kept: float64 on the CPU, every new side at most 32 wide, intermediates of
    one slab at most ``_SLAB`` elements, ``_STREAM_WORK`` multiply-adds in all; else None. The order has
    the fewest multiply-adds counted in whole vectors of 8 (ties: X's order, which streams X by columns),
    among those whose steps each read whole vectors (a mode product over a run of 2..7 trailing elements
    lost to BLAS: 9.9 ms against 8.4 on a 2000 x 600 x 3 X)."""
    if _STREAM is None or any(sizes[new] > _STREAM_NARROW for _, new, _ in steps):
        return None
    slab = sx[1:] if sx[0] not in {m for m, _, _ in steps} else sx
    steps = sorted(steps, key=lambda t: sx.index(t[0]))      # (ties: X's order, whatever the operands' order)
    best = None
    for order in _step_orders(steps, sizes):
        dims, work, largest = [sizes[c] for c in slab], 0, 0
        for mode, new, _ in order:
            q = slab.index(mode)
            a, n, b, w = _prod(dims[:q]), dims[q], _prod(dims[q + 1:]), sizes[new]
            if 1 < b < 8:
                break
            work += a * n * (-(-b // 8) * 8 * w if b > 1 else -(-w // 8) * 8)
            dims[q] = w
            largest = max(largest, _prod(dims))
        else:
            if best is None or work < best[0]:
                best = (work, order, largest)
    if best is None:
        return None
    work, order, largest = best
    slabs = sizes[sx[0]] if slab != sx else 1
    if work * slabs < max(1, _STREAM_WORK) or largest > _SLAB:
        return None
    name = f"TTM chain: {', '.join(m for m, _, _ in order)} in one streamed pass"
    return "ttm streamed", name + (f", {sx[0]} by {sx[0]}" if slabs > 1 else ""), (x, tuple(order), slab != sx)


def _run_ttm_streamed(subs, out, blocks, dtype, params):
    """The chain on ``ttm_chain``: X (C-ordered: see ``contract_group``) read once, in place."""
    x, order, slabbed = params
    xb = blocks[x]
    labels = list(subs[x][1:] if slabbed else subs[x])
    dims, shape, mats = [], list(xb.shape[1:] if slabbed else xb.shape), []
    for mode, new, n in order:
        q = labels.index(mode)
        u = blocks[n] if subs[n][0] == mode else blocks[n].T
        mats.append(np.ascontiguousarray(u))                    # (n_mode, n_new), C order
        dims += [_prod(shape[:q]), shape[q], _prod(shape[q + 1:]), u.shape[1]]
        labels[q], shape[q] = new, u.shape[1]
    slabs = xb.shape[0] if slabbed else 1
    res = np.empty((slabs, *shape) if slabbed else shape)
    dims, ptrs = np.array(dims, dtype=np.int64), np.array([m.ctypes.data for m in mats], dtype=np.uintp)
    _checked(_STREAM[2](slabs, len(order), dims.ctypes.data, ptrs.ctypes.data, xb.ctypes.data,
                        xb.size // slabs, res.ctypes.data, res.size // slabs), slabs, res.size // slabs)
    labels = [subs[x][0]] + labels if slabbed else labels
    return res.transpose([labels.index(c) for c in out])


def _run_ttm(subs, out, blocks, dtype, params):
    """The chain on X, or slab by slab of X's first axis (kept) so intermediates stay in cache (CPU only:
    a GPU runs the whole chain, its small slab GEMMs would cost more in launches than they save)."""
    x, order, kinds, rows = params
    xb = blocks[x]
    if not rows or array_module(xb) is not np:
        t, labels = _ttm_chain(xb, list(subs[x]), subs, blocks, order, kinds)
        return t.transpose([labels.index(c) for c in out])   # a view: the consumer reads it as it lies
    res = None
    for r0 in range(0, xb.shape[0], rows):
        t, labels = _ttm_chain(xb[r0:r0 + rows], list(subs[x]), subs, blocks, order, kinds)
        if res is None:
            res = np.empty((xb.shape[0],) + t.shape[1:], dtype=t.dtype)
        res[r0:r0 + rows] = t
    return res.transpose([labels.index(c) for c in out])


def _ttm_chain(t, labels, subs, blocks, order, kinds):
    library = _route("ttm")
    for (mode, new, n), kind in zip(order, kinds):
        u = blocks[n] if subs[n][0] == mode else blocks[n].T       # (n_mode, n_new)
        u = array_module(u).ascontiguousarray(u)
        q, dims = labels.index(mode), t.shape
        if kind == "last":
            t = _matmul(t.reshape(-1, dims[q]), u, library).reshape(dims[:q] + (u.shape[1],))
            labels[q] = new
        elif kind == "first":
            t = _matmul(t.reshape(dims[0], -1).T, u, library).reshape(dims[1:] + (u.shape[1],))
            labels = labels[1:] + [new]
        elif kind == "middle":
            t = _matmul(u.T, t.reshape(_prod(dims[:q]), dims[q], -1), library)
            t = t.reshape(dims[:q] + (u.shape[1],) + dims[q + 1:])
            labels[q] = new
        else:  # moved last
            perm = [d for d in range(len(dims)) if d != q] + [q]
            t = _matmul(transposed(t, perm).reshape(-1, dims[q]), u, library)
            t = t.reshape(tuple(dims[d] for d in perm[:-1]) + (u.shape[1],))
            labels = labels[:q] + labels[q + 1:] + [new]
    return t, labels


# ---------------------------------------------------------------------------------------------
# everything else: numpy's einsum path, one contract_pair per step
# ---------------------------------------------------------------------------------------------
def _pairwise_strategy(subs, out, sizes):
    # indices needed by no other operand and not by the output are summed first (unary)
    kept = []
    for n, s in enumerate(subs):
        elsewhere = out + "".join(subs[:n] + subs[n + 1:])
        kept.append("".join(dict.fromkeys(c for c in s if c in elsewhere)))
    path = ()
    if len(kept) > 1:
        letters = _ascii_map(*kept, out)
        views = [np.broadcast_to(np.zeros(()), tuple(sizes[c] for c in s)) for s in kept]
        path = tuple(tuple(step) for step in np.einsum_path(
            ",".join(letters[:-1]) + "->" + letters[-1], *views,
            optimize="optimal" if len(kept) <= 4 else "greedy")[0][1:])
    return "pairwise", f"pairwise: {','.join(subs)}->{out}", (tuple(kept), path)


def _run_pairwise(subs, out, blocks, dtype, params):
    kept, path = params
    ops = [(k, b if k == s else unary(b, s, k)) for s, k, b in zip(subs, kept, blocks)]
    for step in path:
        group = [ops.pop(i) for i in sorted(step, reverse=True)]
        while len(group) > 1:  # numpy's path may join more than two operands in one step
            (sa, a), (sb, b) = group.pop(), group.pop()
            needed = out + "".join(s for s, _ in ops + group)
            batch = [c for c in sa if c in sb and c in needed]
            res = "".join(batch + [c for c in sa if c not in sb] + [c for c in sb if c not in sa])
            group.append((res, contract_pair(a, b, sa, sb, res)))
        ops += group
    (s, res), = ops
    return res if s == out else unary(res, s, out)


def _run_zeros(subs, out, blocks, dtype, shape):
    return array_module(*blocks).zeros(shape, dtype=dtype)


def _run_einsum(subs, out, blocks, dtype, params):
    return reference_einsum(",".join(subs) + "->" + out, *blocks)


_RUN = {"mttkrp": _run_mttkrp, "ttm": _run_ttm, "ttm streamed": _run_ttm_streamed, "pairwise": _run_pairwise,
        "zeros": _run_zeros, "einsum": _run_einsum}
