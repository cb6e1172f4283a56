"""Parallel ``.npy`` files: every rank reads or writes only its own block, through MPI-IO.

STANDALONE: numpy, mpi4py and the sibling runtime modules (scripts emitted with local inputs or a
distributed result carry it). Rank 0 reads a file's header (format 1, 2 or 3; C or Fortran order; either
byte order) and broadcasts it; each rank then reads its block with one collective ``Read_all`` through a
subarray file view. A save writes a temporary
file beside the target (rank 0 the header and the size, each rank its block, one copy of a replicated
block) and renames it onto the target once every rank has written: a failed or killed save leaves the
previous file or none. Failures are one line, raised on every rank alike (``error`` is the class raised).

>>> import os, tempfile
>>> from mpi4py import MPI
>>> from deinsum.layout import Layout
>>> path = os.path.join(tempfile.mkdtemp(), "x.npy")
>>> np.save(path, np.arange(6.0).reshape(2, 3), allow_pickle=False)
>>> head = npy_header(MPI.COMM_SELF, path, "x", KeyError)
>>> head.shape, head.dtype.name, read_block(MPI.COMM_SELF, path, head, (slice(1, 2), slice(0, 2)))
((2, 3), 'float64', array([[3., 4.]]))
>>> save_blocks(MPI.COMM_SELF, path, np.ones((2, 3)), Layout((2, 3), (1,), (0, None)), "f4")
>>> np.load(path).dtype.name
'float32'
"""
import contextlib
import errno
import os
from typing import NamedTuple

import numpy as np
from mpi4py import MPI
from numpy.lib import format as npformat

from .checks import agree, check_npy_data, check_npy_file, collectively, remove_quietly, sigterm_raises
from .checks import temporary_beside, validation_operands
from ..layout import Layout
from ..tables import rank_tables
from .exchange import exchange


class Header(NamedTuple):
    """What a ``.npy`` header says: the array's shape, its dtype as stored, whether it is in Fortran
    order, and where its data start."""

    shape: tuple
    dtype: np.dtype
    fortran: bool
    offset: int


def read_header(path, what="input", error=ValueError):
    """The :class:`Header` of the ``.npy`` file ``path`` (this process alone), or a one-line ``error``: a
    missing, empty or truncated file, no ``.npy`` (an ``.npz`` too), Python objects, non-numeric data."""
    size = check_npy_file(path, what, error)
    with open(path, "rb") as f:
        if f.read(4) == b"PK\x03\x04":
            raise error(f"{what} {path}: expected one array in a .npy file, not an .npz archive")
        f.seek(0)
        try:
            version = npformat.read_magic(f)
            if version not in ((1, 0), (2, 0), (3, 0)):
                raise ValueError(f"format version {version[0]}.{version[1]}, expected 1.0, 2.0 or 3.0")
            # 3.0 differs from 2.0 only in the header's encoding (UTF-8): the same for a numeric dtype
            read = npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
            shape, fortran, dtype = read(f)
        except Exception as exc:  # noqa: BLE001 - numpy raises many types for bad files
            raise error(f"{what} {path}: not a readable .npy file ({' '.join(str(exc).split())})") from None
        offset = f.tell()
    check_npy_data(shape, dtype, None, None, "no", f"{what} {path}", error)
    data = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size < offset + data:
        raise error(f"{what} {path}: truncated: {size - offset:,} bytes of data, expected {data:,}")
    return Header(tuple(shape), dtype, fortran, offset)


def npy_header(comm, path, what="input", error=ValueError):
    """Collective: :func:`read_header` of ``path`` by rank 0, the same header (or error) on every rank."""
    verdict = None
    if comm.rank == 0:
        try:
            verdict = read_header(path, what, error)
        except Exception as exc:  # noqa: BLE001 - told to every rank below
            verdict = str(exc) if isinstance(exc, error) else f"{what} {path}: {type(exc).__name__}: {exc}"
    verdict = comm.bcast(verdict, root=0)
    if isinstance(verdict, str):
        raise error(verdict)
    return verdict


def local_blocks(comm, paths, layouts, dtype, seed, what="input", error=ValueError):
    """Collective: this rank's block of each operand under the matching layout (None where it holds none): of
    the array in each ``.npy`` file of ``paths``, cast to ``dtype`` by numpy's ``safe`` rule (``what`` and the
    file's number name it in errors), or without ``paths`` cut from the random operands of ``seed``
    (:func:`~.checks.validation_operands`, made whole on every rank: small problems only)."""
    dtype = np.dtype(dtype)
    if not paths:
        whole = validation_operands([layout.shape for layout in layouts], dtype, seed)
        return [None if b is None else x[b].copy() for x, b in zip(whole, (e.block(comm.rank) for e in layouts))]
    blocks = []
    for n, (path, layout) in enumerate(zip(paths, layouts)):
        head = npy_header(comm, path, f"{what} {n}", error)
        check_npy_data(head.shape, head.dtype, layout.shape, dtype, "safe", f"{what} {n} {path}", error)   # alike
        block = read_block(comm, path, head, layout.block(comm.rank), error)
        blocks.append(None if block is None else block.astype(dtype, copy=False))
    return blocks


def gather_on_root(comm, local, layout, dtype):
    """Collective: the whole array of ``layout`` on rank 0 (None elsewhere), from each rank's block ``local``."""
    root = Layout.on_root(layout.shape, comm.size)
    return exchange(comm, rank_tables(layout, root, comm.size, comm.rank), local, dtype)


def read_block(comm, path, header, block, error=ValueError):
    """Collective: this rank's ``block`` (slices, or None: nothing) of the array in ``path`` whose
    :func:`npy_header` is ``header``, in native byte order (a Fortran-order file gives a Fortran-order block)."""
    def read():
        shape = tuple(s.stop - s.start for s in block) if block is not None else None
        # a Fortran-order array is the C-order array of the reversed shape, transposed: so is its block
        flip = (lambda t: tuple(reversed(t))) if header.fortran else tuple
        local = None if shape is None else np.empty(flip(shape), header.dtype)
        _transfer(comm, path, MPI.MODE_RDONLY, header, flip(header.shape), block and flip(block), local)
        if local is None:
            return None
        if not header.dtype.isnative:
            local = local.byteswap(inplace=True).view(header.dtype.newbyteorder("="))
        return local.T if header.fortran else local

    return collectively(comm, read, error=error)


def save_blocks(comm, path, local, layout, dtype, error=ValueError):
    """Collective: write the array of ``layout`` and ``dtype`` whose block this rank holds as ``local`` (None
    where it holds none) to the ``.npy`` file ``path`` (C order, native byte order, version 1.0 header),
    atomically: a temporary file beside the target, one copy of each block written (replica 0), renamed onto
    ``path`` once every rank has written, and synced to disk. On any failure every rank raises the same
    ``error``, and the temporary is removed."""
    if layout.partial:
        raise error(f"save: layout {layout.spec()} holds partial sums: add them first (redistribute)")
    dtype = np.dtype(dtype).newbyteorder("=")
    writes = local is not None and layout.replica_index([comm.rank])[0] == 0
    made = []   # rank 0: the temporary, once it exists
    with sigterm_raises():
        try:
            offset, target, temporary = _start(comm, path, layout.shape, dtype, made, error)
            block = np.ascontiguousarray(local, dtype) if writes else None
            collectively(comm, _transfer, comm, temporary, MPI.MODE_WRONLY, Header(layout.shape, dtype, False, offset),
                         layout.shape, layout.block(comm.rank) if writes else None, block, error=error)
            collectively(comm, _replace, temporary if made else None, target, error=error)
        except BaseException:
            for temporary in made:
                remove_quietly(temporary)
            raise


def _start(comm, path, shape, dtype, made, error):
    """A save's start, collective: rank 0 creates the temporary (listed in ``made``), writes the header and
    sizes the file; every rank learns ``(data offset, target, temporary)`` or the same failure."""
    facts = failure = None
    if comm.rank == 0:
        try:
            target, temporary = temporary_beside(path, error)
            with open(temporary, "xb") as f:
                made.append(temporary)
                npformat.write_array_header_1_0(f, {"descr": npformat.dtype_to_descr(dtype), "fortran_order": False,
                                                    "shape": shape})
                f.flush()
                _reserve(f.fileno(), f.tell() + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
                facts = (f.tell(), target, temporary)
        except error as exc:
            failure = str(exc)
        except OSError as exc:
            failure = f"save {path}: {exc.strerror or exc}"
    agree(comm, {}, failure, error)
    return comm.bcast(facts, root=0)


def _reserve(fd, size):
    """Size the file ``fd`` to ``size`` bytes with its blocks allocated (``posix_fallocate``): a full disk fails
    here, before any rank writes, and writing into allocated blocks ran 2.7x faster than into the holes of a
    sparse file (3 GiB, ext4); a file system that allocates nothing ahead gets a sparse file."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        os.ftruncate(fd, size)


def _replace(temporary, target):
    """Rank 0 (``temporary`` None elsewhere: nothing): sync the written temporary to disk, rename it onto
    ``target``, and sync the directory (where the file system can)."""
    if temporary is not None:
        _fsync(temporary)
        os.replace(temporary, target)
        with contextlib.suppress(OSError):
            _fsync(os.path.dirname(target))


def _fsync(name):
    fd = os.open(name, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: Runs (bytes contiguous in the file) of a block shorter than this are read by data sieving: ROMIO reads
#: whole stretches, gaps too, and copies the runs out (one read per run would be slower).
SIEVE_BELOW = 2**16


def _hints(comm, shape, block, itemsize):
    """ROMIO's hints for one transfer (collective: the same on every rank). Each rank reads and writes its own
    block, and writes only its own bytes (no read-modify-write); collective buffering, one aggregator per node
    relaying every block, made a 1 GiB load 25x slower at P = 4 on one node. Data sieving reads only where some
    rank's runs are short: it reads the gaps too (for an even 3-D layout, twice the bytes)."""
    run = itemsize if block else 2**62   # (no block, or a 0-d array's: no short run)
    for n, s in reversed(list(zip(shape, block or ()))):
        run *= s.stop - s.start
        if s.stop - s.start != n:
            break
    hints = MPI.Info.Create()
    hints.update({"romio_cb_read": "disable", "romio_cb_write": "disable", "romio_ds_write": "disable",
                  "romio_ds_read": "enable" if comm.allreduce(run, op=MPI.MIN) < SIEVE_BELOW else "disable"})
    return hints


def _transfer(comm, path, amode, header, shape, block, local):
    """Collective: read (``amode`` ``MODE_RDONLY``) or write this rank's ``block`` (slices of the C-order array
    of ``shape`` stored at ``header.offset``; None: nothing) into or from ``local``, a C-order array of the
    block's shape (None where the rank moves nothing)."""
    count = 0 if local is None else local.size
    item = MPI.BYTE.Create_contiguous(header.dtype.itemsize).Commit()
    view = item
    try:
        if count and shape:   # (a 0-d array's one element needs no subarray)
            view = item.Create_subarray(shape, local.shape, [s.start for s in block]).Commit()
        hints = _hints(comm, shape, block if count else None, header.dtype.itemsize)
        try:
            fh = MPI.File.Open(comm, path, amode, hints)
        finally:
            hints.Free()
        try:
            fh.Set_view(header.offset, item, view)
            buffer = [local if count else np.empty(0, np.uint8), count, item]
            fh.Read_all(buffer) if amode == MPI.MODE_RDONLY else fh.Write_all(buffer)
        finally:
            fh.Close()
    except MPI.Exception as exc:
        raise OSError(f"MPI-IO on {path}: {' '.join(exc.Get_error_string().split())}") from None
    finally:
        if view != item:
            view.Free()
        item.Free()
