"""Layouts: who holds which block of a tensor on a Cartesian process grid, and block arithmetic.

Pure value objects (no MPI). The vocabulary follows JAX's ``PartitionSpec``:
``axes[x]`` names the grid dimension(s) that split tensor axis ``x``. Several
grid dimensions split one axis *nested* (major first): the axis is cut into
balanced blocks by the first, each block again by the next, and so on.

* :func:`block_bounds`, :func:`block_range` - balanced uneven blocks (``q, r = divmod(n, p)``).
* :func:`nested_bounds` - every boundary of a nested split.
* :class:`Layout` - a tensor block-distributed over a grid, possibly replicated or
  holding partial sums.

>>> a = Layout((10, 4), grid=(2, 3), axes=((0, 1), None))   # rows cut in 2, each half in 3
>>> [a.block(r)[0] for r in range(3)]
[slice(0, 2, None), slice(2, 4, None), slice(4, 5, None)]
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from .errors import DeinsumError

__all__ = ["block_bounds", "block_range", "nested_bounds", "Layout", "check_count"]


def check_count(value: Any, what: str, minimum: int) -> int:
    """``value`` as an int >= ``minimum``, or a one-line DeinsumError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise DeinsumError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _count(value: Any, what: str, minimum: int) -> int:
    """:func:`check_count` with a fast path for plain ints."""
    if type(value) is int and value >= minimum:
        return value
    return check_count(value, what, minimum)


def block_bounds(n: int, p: int) -> tuple[int, ...]:
    """Offsets of ``p`` balanced blocks of ``range(n)``; the first ``n % p`` blocks get one more.

    >>> block_bounds(10, 4)
    (0, 3, 6, 8, 10)
    >>> block_bounds(2, 3)   # more blocks than elements: the last one is empty
    (0, 1, 2, 2)
    """
    check_count(n, "block_bounds: n", minimum=0)
    check_count(p, "block_bounds: p", minimum=1)
    starts, _ = block_range(n, p, np.arange(p))
    return (*starts.tolist(), n)


def block_range(n, p, j):
    """``(start, stop)`` of block ``j`` of :func:`block_bounds` ``(n, p)``; numpy-vectorised over all arguments.

    >>> [int(v) for v in block_range(10, 4, 3)]
    [8, 10]
    """
    q, r = np.divmod(n, p)
    start = j * q + np.minimum(j, r)
    return start, start + q + (j < r)


def nested_range(n: int, parts: Sequence[int], coords: Sequence) -> tuple:
    """``(start, stop)`` of the block at ``coords`` (one per level) of a nested balanced split; vectorised.

    >>> [int(v) for v in nested_range(10, (2, 3), (1, 2))]
    [9, 10]
    """
    start, stop = np.asarray(0), np.asarray(n)
    for p, c in zip(parts, coords):
        lo, hi = block_range(stop - start, p, c)
        start, stop = start + lo, start + hi
    return start, stop


@lru_cache(maxsize=4096)
def nested_bounds(n: int, parts: tuple[int, ...]) -> tuple[int, ...]:
    """All ``prod(parts) + 1`` boundaries of a nested split (block ``k`` = mixed-radix coords).

    >>> nested_bounds(10, (2, 3)), nested_bounds(10, (4,)) == block_bounds(10, 4)
    ((0, 2, 4, 5, 7, 9, 10), True)
    """
    return tuple(_bounds(n, tuple(parts)).tolist())


def _bounds(n: int, parts: tuple[int, ...]) -> np.ndarray:
    """:func:`nested_bounds` as a read-only array: block ``k`` is ``bounds[k]:bounds[k + 1]``."""
    return (_kept_bounds if math.prod(parts) <= KEPT_BLOCKS else _bounds_of)(n, parts)


def _bounds_of(n: int, parts: tuple[int, ...]) -> np.ndarray:
    count = math.prod(parts)
    starts, _ = nested_range(n, parts, np.unravel_index(np.arange(count), parts) if parts else ())
    bounds = np.append(np.broadcast_to(starts, (count,)), n)
    bounds.flags.writeable = False
    return bounds


_kept_bounds = lru_cache(maxsize=4096)(_bounds_of)


# ----------------------------------------------------------------------------- layouts

def _axis_dims(spec) -> tuple[int, ...]:
    """The grid dimensions of one ``axes`` entry as a tuple (None -> ``()``)."""
    if spec is None:
        return ()
    return tuple(spec) if isinstance(spec, tuple) else (spec,)


@dataclass(frozen=True)
class Layout:
    """A tensor of ``shape`` block-distributed over the process grid ``grid``.

    ``axes[x]`` is the grid dimension that splits tensor axis ``x`` into
    :func:`block_bounds` blocks, a tuple of grid dimensions that split it
    nested (major first), or ``None`` (not split). ``partial`` lists grid
    dimensions over which the local blocks are partial sums still to be added.
    Blocks are replicated over the remaining grid dimensions. Rank ``r`` has the
    C-order coordinates of ``r`` in ``grid`` (``comm.Create_cart(grid,
    reorder=False)``); ranks ``>= prod(grid)`` hold nothing. An empty block is a
    valid block.

    >>> a = Layout((5, 7), grid=(2, 3), axes=(0, None))   # rows split, replicated 3 times
    >>> a.block(4), a.local_shape(4)
    ((slice(3, 5, None), slice(0, 7, None)), (2, 7))
    >>> print(a.block(6))
    None
    """

    shape: tuple[int, ...]
    grid: tuple[int, ...]
    axes: tuple[int | tuple[int, ...] | None, ...]
    partial: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        shape = tuple(_count(n, "layout shape", 0) for n in self.shape)
        grid = tuple(_count(g, "layout grid", 1) for g in self.grid)
        axes = []
        for spec in self.axes:
            dims = tuple(_count(g, "layout axes", 0) for g in _axis_dims(spec))
            axes.append(None if not dims else dims[0] if len(dims) == 1 else dims)
        partial = tuple(_count(g, "layout partial", 0) for g in self.partial)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "grid", grid)
        object.__setattr__(self, "axes", tuple(axes))
        object.__setattr__(self, "partial", partial)
        if len(axes) != len(shape):
            raise DeinsumError(f"layout of shape {shape}: {len(axes)} axes given, expected {len(shape)}")
        split = [g for spec in axes for g in _axis_dims(spec)]
        if any(g >= len(grid) for g in split + list(partial)):
            g = max(split + list(partial))
            raise DeinsumError(f"layout on grid {grid}: grid dimension {g} does not exist")
        if len(set(split)) != len(split):
            raise DeinsumError(f"layout axes {tuple(axes)}: one grid dimension splits two tensor axes")
        if len(set(partial)) != len(partial) or set(partial) & set(split):
            raise DeinsumError(f"layout partial {partial}: repeated or also splitting an axis {tuple(axes)}")

    @property
    def nranks(self) -> int:
        """Ranks that hold a block: ``prod(grid)``."""
        return math.prod(self.grid)

    def axis_dims(self, x: int) -> tuple[int, ...]:
        """Grid dimensions splitting tensor axis ``x`` (major first; ``()`` if unsplit)."""
        return _axis_dims(self.axes[x])

    def axis_parts(self, x: int) -> tuple[int, ...]:
        """Number of parts per nesting level of tensor axis ``x``."""
        return tuple(self.grid[g] for g in self.axis_dims(x))

    def axis_bounds(self, x: int) -> tuple[int, ...]:
        """Every block boundary along tensor axis ``x``."""
        return nested_bounds(self.shape[x], self.axis_parts(x))

    @property
    def split_dims(self) -> tuple[int, ...]:
        """Grid dimensions that split some tensor axis."""
        return tuple(g for x in range(len(self.shape)) for g in self.axis_dims(x))

    @property
    def replicated_dims(self) -> tuple[int, ...]:
        """Grid dimensions over which blocks are identical copies."""
        busy = set(self.split_dims) | set(self.partial)
        return tuple(g for g in range(len(self.grid)) if g not in busy)

    @property
    def n_summands(self) -> int:
        """Number of partial sums that add up to the tensor (1 if not partial)."""
        return math.prod(self.grid[g] for g in self.partial)

    def coords(self, rank: int) -> tuple[int, ...] | None:
        """Grid coordinates of ``rank`` (C order), or None if it holds nothing."""
        check_count(rank, "rank", minimum=0)
        if rank >= self.nranks:
            return None
        return tuple(int(c) for c in np.unravel_index(rank, self.grid)) if self.grid else ()

    def block(self, rank: int) -> tuple[slice, ...] | None:
        """Global index ranges of the block ``rank`` holds, or None if it holds nothing."""
        if self.coords(rank) is None:
            return None
        lo, hi = self.boxes_of(np.array([rank]))
        return tuple(slice(int(a), int(b)) for a, b in zip(lo[0], hi[0]))

    def local_shape(self, rank: int) -> tuple[int, ...] | None:
        """Shape of the block ``rank`` holds, or None if it holds nothing."""
        block = self.block(rank)
        return None if block is None else tuple(s.stop - s.start for s in block)

    def boxes(self, nprocs: int) -> tuple[np.ndarray, np.ndarray]:
        """``(lo, hi)``: arrays ``(nprocs, ndim)`` of every rank's block; ranks holding nothing get empty boxes.

        >>> lo, hi = Layout((5,), grid=(2,), axes=(0,)).boxes(3)
        >>> lo.ravel().tolist(), hi.ravel().tolist()
        ([0, 3, 0], [3, 5, 0])
        """
        if self.nranks > nprocs:
            raise DeinsumError(f"layout on grid {self.grid} needs {self.nranks} ranks, only {nprocs} given")
        return _layout_boxes(self, nprocs)

    def boxes_of(self, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(lo, hi)`` of the blocks of the given ``ranks`` (empty for ranks holding nothing); vectorised
        (read-only: kept for a few ranks, see :meth:`holdings_of`)."""
        ranks = np.asarray(ranks, dtype=np.int64)
        if ranks.size <= KEPT_RANKS:
            return _kept_boxes(self, ranks.tobytes())
        return self._boxes(self._at(ranks))

    def holdings_of(self, ranks: np.ndarray) -> tuple[np.ndarray, ...]:
        """``(lo, hi, block, summand, replica, held)`` at ``ranks`` at once (:meth:`boxes_of`, the block index per axis,
        :meth:`summand_index`, :meth:`replica_index`, ``ranks < nranks``), the coordinates computed once;
        read-only arrays, kept per layout and ranks up to KEPT_RANKS ranks.

        >>> [a.tolist() for a in Layout((4,), grid=(2, 2), axes=(0,), partial=(1,)).holdings_of(np.arange(5))[2:]]
        [[[0], [0], [1], [1], [0]], [0, 1, 0, 1, 0], [0, 0, 0, 0, 0], [True, True, True, True, False]]
        """
        ranks = np.asarray(ranks, dtype=np.int64)
        if ranks.size <= KEPT_RANKS:
            return _kept_holdings(self, ranks.tobytes())
        return self._holdings(ranks)

    def _holdings(self, ranks: np.ndarray, boxes: tuple | None = None) -> tuple[np.ndarray, ...]:
        at = self._at(ranks)
        arrays = (*(boxes or self._boxes(at)), self._block_index(at), self._index(sorted(self.partial), at),
                  self._index(self.replicated_dims, at), at[1])
        for a in arrays:
            a.flags.writeable = False
        return arrays

    def block_sizes(self, ranks: np.ndarray, cut: tuple[int, ...] = ()) -> np.ndarray:
        """Words in the block of each of ``ranks`` (0 where a rank holds none; 1 for a 0-d tensor); with ``cut``
        ``(axis, T)``, in the largest of T balanced parts of it along ``axis`` (one round's); ``(axis, T, axis2,
        T2, ...)`` cuts that part again (a piece of a round's part). Vectorised.

        >>> Layout((10, 8), grid=(2,), axes=(0, None)).block_sizes(np.arange(3), cut=(0, 2)).tolist()   # 3 x 8
        [24, 24, 0]
        >>> Layout((10, 8), grid=(2,), axes=(0, None)).block_sizes(np.arange(1), cut=(0, 2, 1, 3)).tolist()   # 3 x 3
        [9]
        """
        ranks = np.asarray(ranks, dtype=np.int64)
        if not self.shape:
            return np.ones(ranks.size, dtype=np.int64)
        if ranks.size <= KEPT_RANKS:
            lo, hi = _kept_boxes(self, ranks.tobytes())
            extent = hi - lo
            for axis, parts in zip(cut[::2], cut[1::2]):
                extent[:, axis] = -(-extent[:, axis] // parts)
            return np.prod(extent, axis=1, dtype=np.int64)
        coords, held, per_rank = self._at(ranks)
        extents = []
        for x in range(len(self.shape)):
            start, stop = self._axis_range(x, coords)
            extents.append(stop - start)
            for axis, parts in zip(cut[::2], cut[1::2]):
                extents[-1] = -(-extents[-1] // parts) if axis == x else extents[-1]
        words = np.ones(np.broadcast_shapes(*(np.shape(e) for e in extents)), dtype=np.int64)
        for extent in extents:   # (in place: each product may be as large as the grid)
            words *= extent
        return np.broadcast_to(per_rank(words), held.shape) * held

    def _at(self, ranks: np.ndarray) -> tuple:
        """``(coords, held, per_rank)`` to evaluate per-rank figures at ``ranks``: ``coords[g]`` the coordinates
        along grid dimension ``g`` (rank 0's where a rank holds nothing), ``held`` whether each rank holds a block,
        ``per_rank(a)`` the values at ``ranks`` of an array computed from ``coords``. At least as many ranks as the
        grid has: ``coords`` span the grid once (broadcast open ranges: each block computed once) and ``per_rank``
        picks each rank's; fewer: ``coords`` are the ranks' own."""
        ranks = np.asarray(ranks, dtype=np.int64)
        held = ranks < self.nranks
        if ranks.size > KEPT_RANKS and ranks.size >= self.nranks:
            coords = [np.arange(p).reshape([p if g == d else 1 for g in range(len(self.grid))])
                      for d, p in enumerate(self.grid)]
            every = ranks[0] == 0 and ranks[-1] == ranks.size - 1 and (ranks[1:] > ranks[:-1]).all()   # 0, 1, ...
            at = None if every else np.where(held, ranks, 0)

            def per_rank(a):
                if np.ndim(a) == 0:
                    return a
                grid = np.broadcast_to(a, self.grid).reshape(-1)
                if not every:
                    return grid[at]
                return grid if grid.size == ranks.size else np.concatenate((grid, np.full(ranks.size - grid.size,
                                                                                        grid[0])))
            return coords, held, per_rank
        return (np.unravel_index(np.where(held, ranks, 0), self.grid) if self.grid else ()), held, lambda a: a

    def axis_blocks(self, ranks: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per tensor axis, ``(bounds, block)``: :meth:`axis_bounds` as an array and which interval each of
        ``ranks`` holds (rank 0's where it holds none; 0 where the axis is not split); no ranks x axes array.

        >>> [(b.tolist(), k.tolist()) for b, k in Layout((6, 4), (2, 2), (1, None)).axis_blocks(np.arange(5))]
        [([0, 3, 6], [0, 1, 0, 1, 0]), ([0, 4], 0)]
        """
        coords, _, per_rank = self._at(np.asarray(ranks, dtype=np.int64))
        return [(_bounds(n, self.axis_parts(x)), per_rank(self._axis_block(x, coords))) for x, n in enumerate(self.shape)]

    def _axis_block(self, x: int, coords: list) -> np.ndarray:
        """The block index along tensor axis ``x`` of the blocks at grid ``coords`` (:meth:`_at`'s)."""
        dims = self.axis_dims(x)
        if len(dims) < 2:
            return coords[dims[0]] if dims else np.zeros((), dtype=np.int64)
        return np.ravel_multi_index([coords[g] for g in dims], self.axis_parts(x))

    def _axis_range(self, x: int, coords: list) -> tuple:
        """``(start, stop)`` along tensor axis ``x`` of the blocks at grid ``coords`` (:meth:`_at`'s)."""
        parts = self.axis_parts(x)
        if math.prod(parts) > KEPT_BLOCKS:
            return nested_range(self.shape[x], parts, [coords[g] for g in self.axis_dims(x)])
        bounds, block = _bounds(self.shape[x], parts), self._axis_block(x, coords)
        return bounds[block], bounds[block + 1]

    def _boxes(self, at: tuple) -> tuple[np.ndarray, np.ndarray]:
        coords, held, per_rank = at
        lo = np.zeros((held.size, len(self.shape)), dtype=np.int64)
        hi = np.zeros_like(lo)
        for x in range(len(self.shape)):
            start, stop = self._axis_range(x, coords)
            lo[:, x], hi[:, x] = per_rank(start) * held, per_rank(stop) * held
        return lo, hi

    def _block_index(self, at: tuple) -> np.ndarray:
        coords, held, per_rank = at
        index = np.zeros((held.size, len(self.shape)), dtype=np.int64)
        for x in range(len(self.shape)):
            index[:, x] = per_rank(self._axis_block(x, coords)) * held
        return index

    def summand_index(self, ranks: np.ndarray) -> np.ndarray:
        """Per rank, which of the partial sums it holds: C-order rank of its coordinates over ``partial``."""
        return self._index(sorted(self.partial), self._at(ranks))

    @property
    def n_replicas(self) -> int:
        """Number of ranks that hold each block and summand: ``prod`` of the replicated grid dimensions."""
        return math.prod(self.grid[g] for g in self.replicated_dims)

    def replica_index(self, ranks: np.ndarray) -> np.ndarray:
        """Per rank, which copy of its block and summand it holds: C-order rank of its coordinates over
        :attr:`replicated_dims` (0 where it holds nothing).

        >>> Layout((5, 7), grid=(2, 3), axes=(0, None)).replica_index(np.arange(7)).tolist()
        [0, 1, 2, 0, 1, 2, 0]
        """
        return self._index(self.replicated_dims, self._at(ranks))

    def _index(self, dims, at: tuple) -> np.ndarray:
        """C-order rank of the coordinates over grid ``dims`` (0 where a rank holds nothing)."""
        coords, held, per_rank = at
        if not dims:
            return np.zeros(held.size, dtype=np.int64)
        return per_rank(np.ravel_multi_index(tuple(coords[g] for g in dims), [self.grid[g] for g in dims])) * held

    def largest_block(self) -> int:
        """Words in the largest block (the block of rank 0 under balanced splits)."""
        return math.prod(int(np.diff(self.axis_bounds(x)).max(initial=0)) for x in range(len(self.shape)))

    def smallest_block(self, nprocs: int) -> int:
        """Words in the smallest block any of ``nprocs`` ranks holds: 0 where some rank holds nothing.

        >>> Layout((5, 7), grid=(2, 3), axes=(0, None)).smallest_block(6), Layout.on_root((5, 7), 2).smallest_block(2)
        (14, 0)
        """
        if self.nranks < nprocs:
            return 0
        return math.prod(int(np.diff(self.axis_bounds(x)).min()) for x in range(len(self.shape)))

    def spec(self) -> str:
        """The short ``PartitionSpec``-like text that pinned layouts accept: grid extents, then per tensor
        axis the grid dimension(s) splitting it (``-`` none, ``1.0`` dims 1 then 0 nested).

        >>> Layout((4, 6), grid=(2, 3), axes=((1, 0), None)).spec()
        '2x3: 1.0, -'
        """
        axes = ", ".join("-" if a is None else ".".join(map(str, self.axis_dims(x))) for x, a in enumerate(self.axes))
        text = "x".join(map(str, self.grid)) + ": " + axes
        return text + (f" (partial over {self.partial})" if self.partial else "")

    def __str__(self) -> str:
        shape = "x".join(map(str, self.shape)) or "scalar"
        split = ", ".join(f"axis {x}/grid {self.axes[x]}" for x in range(len(self.shape))
                          if self.axes[x] is not None) or "nothing split"
        extra = f", partial over grid {self.partial}" if self.partial else ""
        return f"{shape} on grid {self.grid} ({split}{extra})"

    @classmethod
    def on_root(cls, shape: Sequence[int], nprocs: int) -> Layout:
        """The whole tensor on rank 0 only.

        >>> Layout.on_root((3, 4), 4).block(1) is None
        True
        """
        check_count(nprocs, "nprocs", minimum=1)
        return cls(tuple(shape), (1,), (None,) * len(shape))

    @classmethod
    def replicated(cls, shape: Sequence[int], nprocs: int) -> Layout:
        """The whole tensor on every one of ``nprocs`` ranks."""
        check_count(nprocs, "nprocs", minimum=1)
        return cls(tuple(shape), (nprocs,), (None,) * len(shape))


#: :meth:`Layout.holdings_of` keeps its arrays at up to this many ranks (by layout and ranks): the planner's
#: search models the same sample ranks (``deinsum.plan.SEARCH_RANKS``) of the same layouts many times.
KEPT_RANKS = 256

#: :func:`_bounds` keeps the boundaries of axes split into at most this many blocks.
KEPT_BLOCKS = 2 ** 16


@lru_cache(maxsize=4096)
def _kept_holdings(layout: Layout, ranks: bytes) -> tuple[np.ndarray, ...]:
    """:meth:`Layout.holdings_of` at a few ranks (their int64 bytes), kept."""
    return layout._holdings(np.frombuffer(ranks, dtype=np.int64), _kept_boxes(layout, ranks))


@lru_cache(maxsize=2048)
def _kept_boxes(layout: Layout, ranks: bytes) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_kept_holdings`' boxes alone (a plan with its bounds asks for up to 1,300 at P = 65,536 and 1,940
    at 2^20: TTMc-O5)."""
    boxes = layout._boxes(layout._at(np.frombuffer(ranks, dtype=np.int64)))
    for a in boxes:
        a.flags.writeable = False
    return boxes


@lru_cache(maxsize=64)
def _layout_boxes(layout: Layout, nprocs: int) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = layout.boxes_of(np.arange(nprocs))
    lo.flags.writeable = hi.flags.writeable = False
    return lo, hi
