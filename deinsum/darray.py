"""Distributed arrays: a tensor that stays block-distributed across einsums.

A :class:`DistributedArray` is this rank's block of a global tensor, the
tensor's :class:`~deinsum.layout.Layout` (which grid dimension splits which
axis; replication; ranks holding nothing) and the communicator. Compiled
programs and :func:`deinsum.einsum` take them as inputs (their layouts are
pinned start layouts: no move where they already fit the plan) and return
them. Everything here is collective: every rank of the communicator calls it
with the same arguments, and an error on one rank is the same one-line
:class:`~deinsum.errors.DeinsumError` on all of them.

Layouts are written as a :class:`~deinsum.layout.Layout`, a mode name
(``"even"``, ``"replicated"``, ``"root"``) or a short ``PartitionSpec``-like text:
the grid, then per tensor axis the grid dimension(s) that split it (``-`` for
none, ``1.0`` for nested)::

    "2x3: 0, -"        rows split in 2, columns whole, each block on 3 ranks
    "2x2x2: 0.2, 1"    rows split by grid dims 0 then 2, columns by dim 1

>>> import numpy as np
>>> from mpi4py import MPI
>>> x = DistributedArray.from_global(np.arange(12.0).reshape(3, 4), "even", MPI.COMM_SELF)
>>> x.shape, x.local.shape, x.dtype.name
((3, 4), (3, 4), 'float64')
>>> bool(np.array_equal(x.redistribute("1: -, 0").gather(), np.arange(12.0).reshape(3, 4)))
True
>>> round(x.norm() ** 2)
506
"""
from __future__ import annotations

import math
import os
from typing import Callable

import numpy as np

from .darray_numpy import NumpyProtocols
from .runtime.checks import agree, check_npy_data, check_launch, collectively
from .runtime.exchange import exchange
from .runtime.npyio import npy_header, read_block, save_blocks
from .errors import DeinsumError
from .options import CASTINGS, as_dtype, check_choice
from .layout import Layout
from .placement import pin_layout
from .schedule import Move

__all__ = ["DistributedArray", "as_layout"]


def _world(comm):
    """The communicator of a new array (default COMM_WORLD), once the launch is checked (see
    :func:`~deinsum.runtime.checks.check_launch`)."""
    from mpi4py import MPI
    check_launch(DeinsumError)
    return MPI.COMM_WORLD if comm is None else comm


def as_layout(spec, shape, nprocs: int, what: str = "array") -> Layout:
    """``spec`` (Layout, mode name or ``"2x3: 0, -"`` text) as a Layout of ``shape`` on ``nprocs`` ranks.

    >>> as_layout("2x2: 1, 0", (4, 6), 4).axes
    (1, 0)
    >>> as_layout("4x1: 0, -", (4, 6), 2)
    Traceback (most recent call last):
    ...
    deinsum.errors.DeinsumError: layout of array: grid (4, 1) needs 4 ranks, only 2 given
    """
    return pin_layout(spec, tuple(shape), nprocs, what)


def _not_numbers(dtype, what: str) -> str | None:
    """The failure message for an array of ``dtype`` that deinsum does not compute with (see
    :func:`~deinsum.options.as_dtype`: not bool, strings or objects), else None."""
    try:
        as_dtype(dtype, f"{what}: an array of dtype")
    except DeinsumError as exc:
        return str(exc)
    return None


def _held_dtypes(comm, local) -> set[str]:
    """The dtypes of the blocks the ranks of ``comm`` hold (collective)."""
    return {d for d in comm.allgather(None if local is None else local.dtype.str) if d is not None}


def _rank_block(block, layout: Layout, rank: int, what: str) -> np.ndarray | None:
    """``block`` as ``rank``'s block of ``layout`` (None where the rank holds nothing: None or an empty
    array), else a DeinsumError naming both shapes.

    >>> _rank_block(np.ones((1, 1)), Layout.replicated((2, 3), 1), 0, "with_local")
    Traceback (most recent call last):
    ...
    deinsum.errors.DeinsumError: with_local: block of shape (1, 1), layout 1: -, - gives this rank (2, 3)
    """
    want = layout.local_shape(rank)
    got = None if block is None else np.shape(block)
    if want is None and (got is None or math.prod(got) == 0):
        return None
    if got != want:
        raise DeinsumError(f"{what}: block of shape {got}, layout {layout.spec()} gives this rank {want}")
    return np.asarray(block)


def _agreed_blocks(comm, local, default, what: str) -> tuple:
    """``(local, dtype)`` with one dtype on every rank: the result type of the blocks held (``default`` where
    no rank holds one), each block cast to it; a DeinsumError on every rank if it holds no numbers."""
    held = _held_dtypes(comm, local)
    dtype = as_dtype(np.result_type(*sorted(held)) if held else default, f"{what}: blocks of dtype")
    return (None if local is None else local.astype(dtype, copy=False)), dtype


def _sum_of_squares(block: np.ndarray, chunk: int = 1 << 16) -> float:
    """``sum(|x|^2)`` of ``block``: float32 and wider in their own type (numpy's precision), narrower types and
    integers in float64, ``chunk`` elements converted at a time (their squares would wrap or overflow).

    >>> _sum_of_squares(np.full(5, 200, np.uint8)), _sum_of_squares(np.full(3, 300, np.float16))
    (200000.0, 270000.0)
    """
    flat = block.reshape(-1)
    if flat.dtype.kind in "fc" and flat.dtype.itemsize >= 4:
        return float(np.vdot(flat, flat).real)
    wide = np.complex128 if flat.dtype.kind == "c" else np.float64
    return math.fsum(float(np.vdot(part, part).real)
                     for part in (flat[n:n + chunk].astype(wide) for n in range(0, flat.size, chunk)))


class DistributedArray(NumpyProtocols):
    """This rank's ``local`` block (None where it holds nothing) of a global tensor laid out by ``layout``
    on ``comm``. Build one with :meth:`from_global`, :meth:`scatter`, :meth:`from_blocks` or :meth:`full` (also empty);
    the constructor itself trusts its arguments. numpy's functions, ufuncs and operators run on it
    distributed (:mod:`deinsum.darray_numpy`)."""

    __slots__ = ("local", "layout", "comm", "dtype")

    def __init__(self, local: np.ndarray | None, dtype=None, *, layout: Layout, comm):
        self.local, self.layout, self.comm = local, layout, comm
        self.dtype = np.dtype(dtype if dtype is not None else local.dtype)

    # ---- construction ---------------------------------------------------------------------------
    @classmethod
    def from_global(cls, array, layout="even", comm=None) -> DistributedArray:
        """Every rank passes the whole ``array``; each keeps its block of ``layout``."""
        comm = _world(comm)

        def check():
            whole = np.asarray(array)
            if failure := _not_numbers(whole.dtype, "from_global"):
                raise DeinsumError(failure)
            return whole, as_layout(layout, whole.shape, comm.size)

        array, layout = collectively(comm, check, error=DeinsumError)
        agree(comm, {"shape": array.shape, "dtype": array.dtype.str, "layout": layout}, error=DeinsumError)
        block = layout.block(comm.rank)
        return cls(None if block is None else array[block].copy(), array.dtype, layout=layout, comm=comm)

    @classmethod
    def load(cls, path, layout="even", comm=None, *, shape=None, dtype=None, casting="equiv") -> DistributedArray:
        """Each rank reads only its block of ``layout`` from the ``.npy`` file ``path`` (format 1 to 3, C or
        Fortran order, either byte order; blocks in native byte order). With ``shape``, the file must hold that
        shape; with ``dtype``, a dtype that numpy's ``casting`` rule turns into it (by default the same type, in
        either byte order), and the blocks come as ``dtype``. See :meth:`save`."""
        comm = _world(comm)
        path = collectively(comm, os.fspath, path, error=DeinsumError)
        head = npy_header(comm, path, "load", DeinsumError)   # rank 0 reads it, every rank raises alike

        def check():
            check_choice("casting", casting, CASTINGS)
            want = head.dtype.newbyteorder("=") if dtype is None else np.dtype(dtype)
            check_npy_data(head.shape, head.dtype, shape, want, casting, f"load {path}", DeinsumError)
            return want, as_layout(layout, head.shape, comm.size)

        want, lay = collectively(comm, check, error=DeinsumError)
        agree(comm, {"path": path, "layout": lay, "dtype": want.str}, error=DeinsumError)
        block = read_block(comm, path, head, lay.block(comm.rank), DeinsumError)
        return cls(None if block is None else block.astype(want, copy=False), want, layout=lay, comm=comm)

    @classmethod
    def scatter(cls, array, layout="even", comm=None) -> DistributedArray:
        """Rank 0 passes the whole ``array`` (the others None); each rank gets its block of ``layout``."""
        comm = _world(comm)
        facts = None
        if comm.rank == 0:
            try:
                array = np.asarray(array)
                facts = (array.shape, array.dtype.str, _not_numbers(array.dtype, "scatter: rank 0 passes"))
            except Exception as exc:  # noqa: BLE001 - told to every rank below
                facts = ((), "f8", f"scatter: rank 0's array: {type(exc).__name__}: {exc}")
        shape, dtype, failure = comm.bcast(facts, root=0)
        if failure is not None:   # rank 0's verdict, the same on every rank
            raise DeinsumError(failure)
        root = cls(array if comm.rank == 0 else None, dtype, layout=Layout.on_root(shape, comm.size), comm=comm)
        return root.redistribute(layout)

    @classmethod
    def from_blocks(cls, block, shape, layout, comm=None) -> DistributedArray:
        """Each rank passes its own ``block`` of the global ``shape`` under ``layout`` (None or an empty
        array where it holds nothing); every rank checks its block's shape, and all agree on the rest."""
        comm = _world(comm)
        shape = tuple(int(n) for n in shape)

        def check():
            lay = as_layout(layout, shape, comm.size)
            return lay, _rank_block(block, lay, comm.rank, "from_blocks")

        lay, local = collectively(comm, check, error=DeinsumError)
        kinds = _held_dtypes(comm, local)
        if len(kinds) != 1:
            raise DeinsumError(f"blocks of dtypes {sorted(kinds) or 'none (no rank holds a block)'}: "
                               f"expected one dtype")
        dtype = as_dtype(kinds.pop(), "from_blocks: blocks of dtype")
        agree(comm, {"shape": shape, "layout": lay}, error=DeinsumError)
        return cls(local, dtype, layout=lay, comm=comm)

    @classmethod
    def full(cls, shape, fill, layout="even", dtype=np.float64, comm=None) -> DistributedArray:
        """A tensor of ``shape`` filled with ``fill`` under ``layout`` (``fill=0`` for zeros; ``fill=None``
        leaves the blocks uninitialised, like ``numpy.empty``)."""
        comm = _world(comm)
        shape = tuple(int(n) for n in shape)

        def check():
            as_dtype(dtype, "full: dtype")
            if fill is not None:
                try:
                    np.array(fill, dtype=dtype)
                except (TypeError, ValueError) as exc:
                    raise DeinsumError(f"full: fill {fill!r} is not a {np.dtype(dtype).name}: {exc}") from None
            return as_layout(layout, shape, comm.size)

        lay = collectively(comm, check, error=DeinsumError)
        agree(comm, {"shape": shape, "layout": lay, "dtype": np.dtype(dtype).str, "fill": fill},
              error=DeinsumError)
        want = lay.local_shape(comm.rank)
        block = None if want is None else np.empty(want, dtype=dtype) if fill is None else np.full(want, fill, dtype)
        return cls(block, dtype, layout=lay, comm=comm)

    def with_local(self, local: np.ndarray | None, shape=None) -> DistributedArray:
        """The same distribution with new blocks (a local computation that keeps block boundaries);
        ``shape`` is the new global shape where the last axis changed length (it must then be whole).
        Every rank's block must have the shape its layout gives it (as in :meth:`from_blocks`)."""
        def check():
            layout = self.layout
            if shape is not None and tuple(shape) != layout.shape:
                if len(shape) != self.ndim or tuple(shape[:-1]) != layout.shape[:-1] or layout.axes[-1] is not None:
                    raise DeinsumError(f"with_local: new shape {tuple(shape)} from {layout.shape} under "
                                       f"{layout.spec()}: only an unsplit last axis may change length")
                layout = Layout(tuple(shape), layout.grid, layout.axes, layout.partial)
            return layout, _rank_block(local, layout, self.comm.rank, "with_local")

        # a bad shape or block on one rank fails on all, and so does a shape the ranks differ on
        layout, block = collectively(self.comm, check, error=DeinsumError)
        agree(self.comm, {"with_local shape": layout.shape}, error=DeinsumError)
        return DistributedArray(*_agreed_blocks(self.comm, block, self.dtype, "with_local"), layout=layout,
                                comm=self.comm)

    # ---- what it is -----------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self.layout.shape

    @property
    def ndim(self) -> int:
        return len(self.layout.shape)

    @property
    def size(self) -> int:
        return math.prod(self.layout.shape)

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def block(self) -> tuple[slice, ...] | None:
        """This rank's slice of the global tensor (None where it holds nothing)."""
        return self.layout.block(self.comm.rank)

    @property
    def owns(self) -> bool:
        """Whether this rank's block is the first copy of its piece (sums count each element once)."""
        coords = self.layout.coords(self.comm.rank)
        return coords is not None and not self.layout.partial and all(coords[g] == 0
                                                                      for g in self.layout.replicated_dims)

    def __repr__(self) -> str:
        shape = "x".join(map(str, self.shape)) or "scalar"
        return f"DistributedArray({shape} {self.dtype.name}, {self.layout.spec()}, {self.comm.size} ranks)"

    def visualize(self) -> str:
        """Who holds what, one line per distinct block (like JAX's ``visualize_sharding``, in text).

        >>> from mpi4py import MPI
        >>> print(DistributedArray.full((5, 4), 0, "1x1: 0, 1", comm=MPI.COMM_SELF).visualize())
        DistributedArray(5x4 float64, 1x1: 0, 1, 1 ranks)
          [0:5, 0:4]  5x4  rank 0
        """
        lo, hi = self.layout.boxes(self.comm.size)
        holders: dict = {}
        for r in range(min(self.layout.nranks, self.comm.size)):
            holders.setdefault((tuple(lo[r]), tuple(hi[r])), []).append(r)
        lines = [repr(self)]
        for (a, b), ranks in holders.items():
            box = ", ".join(f"{s}:{e}" for s, e in zip(a, b)) or "scalar"
            extent = "x".join(str(e - s) for s, e in zip(a, b)) or "1"
            who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
            lines.append(f"  [{box}]  {extent}  {who}")
        idle = self.comm.size - self.layout.nranks
        if idle > 0:
            lines.append(f"  nothing on rank(s) {self.layout.nranks}..{self.comm.size - 1}")
        return "\n".join(lines)

    # ---- moving ---------------------------------------------------------------------------------
    def redistribute(self, layout) -> DistributedArray:
        """The same tensor under ``layout`` (partial sums, if any, added on the way)."""
        dst = collectively(self.comm, as_layout, layout, self.shape, self.comm.size, error=DeinsumError)
        agree(self.comm, {"layout": dst}, error=DeinsumError)
        if dst == self.layout:
            return self
        move = Move("array", "redistribute", self.layout, dst, self.comm.size)
        local = exchange(self.comm, move.table(self.comm.rank), self.local, self.dtype)
        return DistributedArray(local, self.dtype, layout=dst, comm=self.comm)

    def gather(self, root: int | None = None) -> np.ndarray | None:
        """The whole tensor on every rank (``root=None``) or on ``root`` only (None elsewhere)."""
        comm = self.comm
        if root is None:
            return self.redistribute(Layout.replicated(self.shape, comm.size)).local
        valid = not isinstance(root, bool) and isinstance(root, (int, np.integer)) and 0 <= root < comm.size
        failure = None if valid else f"gather: root {root!r} is not a rank of a communicator of {comm.size}"
        # agreed before any point-to-point (else a Send or Recv would wait forever), a bad root on one rank too
        agree(comm, {"gather root": int(root) if valid else None}, failure, error=DeinsumError)
        whole = self.redistribute(Layout.on_root(self.shape, comm.size)).local
        if root != 0:      # the root's copy comes from rank 0, point to point
            if comm.rank == 0:
                comm.Send(np.ascontiguousarray(whole), dest=root)
            whole = None
            if comm.rank == root:
                whole = np.empty(self.shape, dtype=self.dtype)
                comm.Recv(whole, source=0)
        return whole

    def save(self, path) -> None:
        """Write the tensor to the ``.npy`` file ``path`` (C order, format 1.0), each rank only its block (one
        copy of a replicated one; partial sums are added first), through a temporary file renamed onto
        ``path`` once every rank has written: a failed or killed save leaves the previous file or none. Any
        number of ranks and any layout loads it again (:meth:`load`); ``numpy.load`` reads it.

        >>> import os, tempfile
        >>> from mpi4py import MPI
        >>> path = os.path.join(tempfile.mkdtemp(), "x.npy")
        >>> DistributedArray.from_global(np.arange(6.0).reshape(2, 3), "even", MPI.COMM_SELF).save(path)
        >>> DistributedArray.load(path, "1: -, 0", MPI.COMM_SELF).local[1]
        array([3., 4., 5.])
        """
        path = collectively(self.comm, os.fspath, path, error=DeinsumError)
        agree(self.comm, {"path": path}, error=DeinsumError)
        whole = self.redistribute(Layout(self.shape, self.layout.grid, self.layout.axes)) if self.layout.partial else self
        save_blocks(self.comm, path, whole.local, whole.layout, self.dtype, DeinsumError)

    # ---- just enough local algebra --------------------------------------------------------------
    def rows(self) -> DistributedArray:
        """This tensor with its last axis whole (all-gathered inside the groups that split it)."""
        if self.layout.axes[-1] is None and not self.layout.partial:
            return self
        axes = self.layout.axes[:-1] + (None,)
        return self.redistribute(Layout(self.shape, self.layout.grid, axes))

    def matmul(self, matrix: np.ndarray) -> DistributedArray:
        """``A @ matrix`` with a small ``matrix`` every rank holds (e.g. a CP-ALS update ``M pinv(V)``):
        the last axis is gathered where split, multiplied locally, and the result keeps ``A``'s layout."""
        def check():
            if np.ndim(matrix) != 2 or np.shape(matrix)[0] != self.shape[-1]:
                raise DeinsumError(f"matmul: {self.shape} @ {np.shape(matrix)}: the matrix must be "
                                   f"({self.shape[-1]}, n)")
            return np.asarray(matrix)

        matrix = collectively(self.comm, check, error=DeinsumError)   # a bad matrix on one rank fails on all
        agree(self.comm, {"matmul matrix shape": matrix.shape, "matmul matrix dtype": matrix.dtype.str},
              error=DeinsumError)
        whole = self.rows()
        local = None if whole.local is None else whole.local @ matrix
        out = whole.with_local(local, self.shape[:-1] + (matrix.shape[1],))
        if self.layout.axes[-1] is None:
            return out
        return out.redistribute(Layout(out.shape, self.layout.grid, self.layout.axes))

    def gram(self) -> np.ndarray:
        """``A^T A`` over every axis but the last (``A_(n)`` unfolded), on every rank: one allreduce."""
        whole = self.rows()
        n = self.shape[-1]
        part = np.zeros((n, n), dtype=self.dtype)     # the same dtype on every rank
        if whole.owns:
            flat = whole.local.reshape(-1, n)
            part[...] = flat.conj().T @ flat
        return self._allreduce(part)

    def vdot(self, other: DistributedArray) -> complex | float:
        """``sum(conj(A) * B)`` on every rank (``B`` moved to ``A``'s layout first if it differs)."""
        def check():
            if not isinstance(other, DistributedArray) or other.shape != self.shape:
                raise DeinsumError(f"vdot: expected a DistributedArray of shape {self.shape}")

        collectively(self.comm, check, error=DeinsumError)   # a bad operand on one rank fails on all
        other = other.redistribute(self.layout)
        part = np.zeros((), dtype=np.result_type(self.dtype, other.dtype))   # the same dtype on every rank
        if self.owns:
            part[()] = np.vdot(self.local, other.local)
        return self._allreduce(part)[()]

    def norm(self) -> float:
        """The Frobenius norm, on every rank (the ranks' parts added in float64)."""
        part = np.zeros((), dtype=np.float64)
        if self.owns:
            part[()] = _sum_of_squares(self.local)
        return float(np.sqrt(self._allreduce(part)))

    def map_blocks(self, function: Callable[[np.ndarray], np.ndarray]) -> DistributedArray:
        """``function`` applied to every block (element-wise work that keeps shapes)."""
        def apply():
            local = None if self.local is None else np.asarray(function(self.local))
            if local is not None and local.shape != self.local.shape:
                raise DeinsumError(f"map_blocks: the function changed a block's shape {self.local.shape} -> "
                                   f"{local.shape}")
            return local

        local = collectively(self.comm, apply, error=DeinsumError)
        return DistributedArray(*_agreed_blocks(self.comm, local, self.dtype, "map_blocks"), layout=self.layout,
                                comm=self.comm)

    def _allreduce(self, part: np.ndarray) -> np.ndarray:
        from mpi4py import MPI
        total = np.empty_like(part)
        self.comm.Allreduce(np.ascontiguousarray(part), total, op=MPI.SUM)
        return total
