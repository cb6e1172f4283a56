"""Process grids: who holds which block of a tensor, and which grid a group runs on.

Everything here is pure planning and needs no MPI ranks; mpi4py is imported
only inside :func:`make_communicators`.

* :func:`block_bounds` - balanced uneven blocks of one dimension.
* :class:`Layout` - a tensor block-distributed over a Cartesian process grid.
* :func:`plan_grid` - the grid of one fused group, from an exact per-rank
  communication-volume model searched over the ordered factorisations of P.
* :func:`make_communicators` - the Cartesian and sub-communicators of a grid.

>>> sizes = dict(i=10, j=10, k=10, a=10)
>>> choice = plan_grid("ijka", sizes, ("ijk", "ja", "ka"), "ia", 8)   # MTTKRP on 8 ranks
>>> choice.dims, choice.idle
((2, 2, 2, 1), 0)
>>> choice.layout("ia", sizes)      # the output before reduction: partial sums over j and k
Layout(shape=(10, 10), grid=(2, 2, 2, 1), axes=(0, 3), partial=(1, 2))
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping, Sequence

import numpy as np

from deinsum.errors import DeinsumError

__all__ = ["block_bounds", "block_range", "balanced_split", "ordered_factorisations", "Layout", "GridChoice",
           "plan_grid", "grid_volume", "GridComms", "make_communicators"]

# Fewer than P ranks are searched when P has a prime factor above this, or when
# no grid of P ranks fits the sizes: then the largest counts below P whose prime
# factors are all <= SMOOTH_PRIME (at most FEWER_RANK_COUNTS of them) compete too.
SMOOTH_PRIME = 7
FEWER_RANK_COUNTS = 4
# The branch and bound scores at most this many grids exactly (in order of their lower
# bounds); past it the best so far is kept and GridChoice.reason says the search was cut.
EXACT_EVALUATIONS = 64


def block_bounds(n: int, p: int) -> tuple[int, ...]:
    """Offsets of ``p`` balanced blocks of ``range(n)``; the first ``n % p`` blocks get one more.

    >>> block_bounds(10, 4)
    (0, 3, 6, 8, 10)
    >>> block_bounds(2, 3)   # more blocks than elements: the last one is empty
    (0, 1, 2, 2)
    """
    _check_count(n, "block_bounds: n", minimum=0)
    _check_count(p, "block_bounds: p", minimum=1)
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


@dataclass(frozen=True)
class Layout:
    """A tensor of ``shape`` block-distributed over the process grid ``grid``.

    ``axes[x]`` is the grid dimension that splits tensor axis ``x`` into
    :func:`block_bounds` blocks (``None``: not split). ``partial`` lists grid
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
    axes: tuple[int | None, ...]
    partial: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        shape = tuple(_check_count(n, "layout shape", minimum=0) for n in self.shape)
        grid = tuple(_check_count(g, "layout grid", minimum=1) for g in self.grid)
        axes = tuple(None if g is None else _check_count(g, "layout axes", minimum=0) for g in self.axes)
        partial = tuple(_check_count(g, "layout partial", minimum=0) for g in self.partial)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "grid", grid)
        object.__setattr__(self, "axes", axes)
        object.__setattr__(self, "partial", partial)
        if len(axes) != len(shape):
            raise DeinsumError(f"layout of shape {shape}: {len(axes)} axes given, expected {len(shape)}")
        split = [g for g in axes if g is not None]
        for g in split + list(partial):
            if g >= len(grid):
                raise DeinsumError(f"layout on grid {grid}: grid dimension {g} does not exist")
        if len(set(split)) != len(split):
            raise DeinsumError(f"layout axes {axes}: one grid dimension splits two tensor axes")
        if len(set(partial)) != len(partial) or set(partial) & set(split):
            raise DeinsumError(f"layout partial {partial}: repeated or also splitting an axis {axes}")

    @property
    def nranks(self) -> int:
        """Ranks that hold a block: ``prod(grid)``."""
        return math.prod(self.grid)

    @property
    def replicated_dims(self) -> tuple[int, ...]:
        """Grid dimensions over which blocks are identical copies."""
        busy = set(self.axes) | set(self.partial)
        return tuple(g for g in range(len(self.grid)) if g not in busy)

    def coords(self, rank: int) -> tuple[int, ...] | None:
        """Grid coordinates of ``rank`` (C order), or None if it holds nothing."""
        _check_count(rank, "rank", minimum=0)
        if rank >= self.nranks:
            return None
        return tuple(int(c) for c in np.unravel_index(rank, self.grid)) if self.grid else ()

    def block(self, rank: int) -> tuple[slice, ...] | None:
        """Global index ranges of the block ``rank`` holds, or None if it holds nothing."""
        coords = self.coords(rank)
        if coords is None:
            return None
        return tuple(slice(0, n) if g is None else slice(*block_bounds(n, self.grid[g])[coords[g]:coords[g] + 2])
                     for n, g in zip(self.shape, self.axes))

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
        return _layout_boxes(self, nprocs)

    def block_index(self, nprocs: int) -> np.ndarray:
        """Per rank and tensor axis, which block along that axis the rank holds (0 if unsplit or idle).

        >>> Layout((5, 7), grid=(2, 3), axes=(1, None)).block_index(7)[:, 0].tolist()
        [0, 1, 2, 0, 1, 2, 0]
        """
        if self.nranks > nprocs:
            raise DeinsumError(f"layout on grid {self.grid} needs {self.nranks} ranks, only {nprocs} given")
        coords = _grid_coords(self.grid, self.nranks)
        index = np.zeros((len(self.shape), nprocs), dtype=np.int64).T
        for x, g in enumerate(self.axes):
            if g is not None:
                index[:self.nranks, x] = coords[:, g]
        return index

    def summand_index(self, nprocs: int) -> np.ndarray:
        """Per rank, which of the partial sums it holds: C-order rank of its coordinates over ``partial``."""
        coords = _grid_coords(self.grid, min(self.nranks, nprocs))
        dims = sorted(self.partial)
        index = np.zeros(nprocs, dtype=np.int64)
        if dims:
            index[:coords.shape[0]] = np.ravel_multi_index(tuple(coords[:, dims].T), [self.grid[g] for g in dims])
        return index

    @property
    def n_summands(self) -> int:
        """Number of partial sums that add up to the tensor (1 if not partial)."""
        return math.prod(self.grid[g] for g in self.partial)

    def __str__(self) -> str:
        shape = "x".join(map(str, self.shape)) or "scalar"
        split = ", ".join(f"axis {x}/grid {g}" for x, g in enumerate(self.axes) if g is not None) or "nothing split"
        extra = f", partial over grid {self.partial}" if self.partial else ""
        return f"{shape} on grid {self.grid} ({split}{extra})"

    @classmethod
    def on_root(cls, shape: Sequence[int], nprocs: int) -> Layout:
        """The whole tensor on rank 0 only.

        >>> Layout.on_root((3, 4), 4).block(1) is None
        True
        """
        _check_count(nprocs, "nprocs", minimum=1)
        return cls(tuple(shape), (1,), (None,) * len(shape))

    @classmethod
    def replicated(cls, shape: Sequence[int], nprocs: int) -> Layout:
        """The whole tensor on every one of ``nprocs`` ranks."""
        _check_count(nprocs, "nprocs", minimum=1)
        return cls(tuple(shape), (nprocs,), (None,) * len(shape))

    @classmethod
    def even(cls, shape: Sequence[int], nprocs: int) -> Layout:
        """Evenly block-distributed over all ``nprocs`` ranks, no replication: the fair starting layout.

        The grid is the factorisation of ``nprocs`` over the tensor axes with the
        smallest largest block; ties go to the larger smallest block, then to
        the most cube-like block (least sum of extents), then to splitting
        leading axes more (longer contiguous runs). An axis may get
        more parts than it has elements (a prime P larger than every axis):
        those ranks hold empty blocks. A 0-d tensor lives on rank 0.

        >>> Layout.even((6, 4), 4).grid
        (2, 2)
        >>> Layout.even((3, 4), 7).grid, Layout.even((3, 4), 7).local_shape(6)
        ((1, 7), (3, 0))
        """
        shape = tuple(shape)
        _check_count(nprocs, "nprocs", minimum=1)
        if not shape:
            return cls.on_root(shape, nprocs)
        return cls(shape, balanced_split(shape, nprocs), tuple(range(len(shape))))


def balanced_split(shape: Sequence[int], parts: int) -> tuple[int, ...]:
    """The factorisation of ``parts`` over the axes of ``shape`` used by :meth:`Layout.even`.

    >>> balanced_split((5, 10), 4)
    (2, 2)
    """
    return _balanced_split(tuple(int(n) for n in shape), int(parts))


@lru_cache(maxsize=4096)
def _balanced_split(shape: tuple[int, ...], parts: int) -> tuple[int, ...]:
    rows = _factorisations(parts, len(shape))
    if rows.shape[0] == 0:
        raise DeinsumError(f"cannot split a 0-d tensor into {parts} parts")
    n = np.array(shape, dtype=np.int64)
    extents = -(-n // rows)
    largest = np.prod(extents, axis=1)
    smallest = np.prod(n // rows, axis=1)
    order = np.lexsort(tuple(-rows[:, x] for x in reversed(range(len(shape))))
                       + (extents.sum(axis=1), -smallest, largest))
    return tuple(int(p) for p in rows[order[0]])


@lru_cache(maxsize=32)
def _layout_boxes(layout: Layout, nprocs: int) -> tuple[np.ndarray, np.ndarray]:
    index = layout.block_index(nprocs)
    held = np.arange(nprocs) < layout.nranks
    lo = np.zeros(index.shape[::-1], dtype=np.int64).T
    hi = np.zeros(index.shape[::-1], dtype=np.int64).T
    for x, (n, g) in enumerate(zip(layout.shape, layout.axes)):
        parts = 1 if g is None else layout.grid[g]
        lo[held, x], hi[held, x] = block_range(n, parts, index[held, x])
    lo.flags.writeable = hi.flags.writeable = False
    return lo, hi


@lru_cache(maxsize=16)
def _grid_coords(grid: tuple[int, ...], nranks: int) -> np.ndarray:
    """C-order coordinates ``(nranks, len(grid))`` of ranks ``0..nranks-1`` (read-only, column-major)."""
    ranks = np.arange(nranks, dtype=np.int64)
    coords = np.empty((len(grid), nranks), dtype=np.int64)
    stride = 1
    for g in reversed(range(len(grid))):
        coords[g] = ranks // stride % grid[g]
        stride *= grid[g]
    coords.flags.writeable = False
    return coords.T


# ----------------------------------------------------------------------------- ordered factorisations

def ordered_factorisations(n: int, caps: Sequence[int]) -> np.ndarray:
    """Every ``(f_0, ..., f_{k-1})`` with product ``n`` and ``f_v <= caps[v]``, as rows of an int64 array.

    Built per prime factor (bounded compositions of its exponent), so primes
    and prime powers are as cheap as smooth numbers.

    >>> sorted(map(tuple, ordered_factorisations(12, (4, 3)).tolist()))
    [(4, 3)]
    >>> ordered_factorisations(7, (3, 3)).shape, ordered_factorisations(3, ()).shape
    ((0, 2), (0, 0))
    """
    caps = np.array(caps, dtype=np.int64)
    if caps.size == 0:  # a grid over no index has one rank
        return np.ones((int(n == 1), 0), dtype=np.int64)
    rows = np.ones((1, caps.size), dtype=np.int64)
    for prime, exponent in sorted(_prime_factors(n).items(), reverse=True):
        most = [_max_power(prime, int(c)) for c in caps]
        factors = prime ** _bounded_compositions(exponent, most)
        rows = (rows[:, None, :] * factors[None, :, :]).reshape(-1, caps.size)
        rows = rows[(rows <= caps).all(axis=1)]
    return rows


@lru_cache(maxsize=256)
def _factorisations(n: int, k: int) -> np.ndarray:
    """:func:`ordered_factorisations` without caps, cached."""
    rows = ordered_factorisations(n, (n,) * k)
    rows.flags.writeable = False
    return rows


def _prime_factors(n: int) -> dict[int, int]:
    factors: dict[int, int] = {}
    d = 2
    while d * d <= n:
        while n % d == 0:
            factors[d] = factors.get(d, 0) + 1
            n //= d
        d += 1
    if n > 1:
        factors[n] = factors.get(n, 0) + 1
    return factors


def _max_power(prime: int, cap: int) -> int:
    power = 0
    while prime ** (power + 1) <= cap:
        power += 1
    return power


def _bounded_compositions(total: int, most: Sequence[int]) -> np.ndarray:
    """Rows ``c`` with ``sum(c) == total`` and ``0 <= c[v] <= most[v]``."""
    k = len(most)
    if k == 0:
        return np.zeros((1 if total == 0 else 0, 0), dtype=np.int64)
    room_after = np.concatenate([np.cumsum(most[::-1])[::-1], [0]])
    rows = np.zeros((1, 0), dtype=np.int64)
    sums = np.zeros(1, dtype=np.int64)
    for v in range(k - 1):
        values = np.arange(most[v] + 1, dtype=np.int64)
        new = sums[:, None] + values[None, :]
        keep_row, keep_value = np.nonzero((new <= total) & (new + room_after[v + 1] >= total))
        rows = np.column_stack([rows[keep_row], values[keep_value]])
        sums = new[keep_row, keep_value]
    last = total - sums
    fits = (last >= 0) & (last <= most[-1])
    return np.column_stack([rows[fits], last[fits]])


def _smooth_counts_below(n: int) -> list[int]:
    """Numbers below ``n`` whose prime factors are all <= SMOOTH_PRIME, largest first."""
    counts = {1}
    for prime in (p for p in range(2, SMOOTH_PRIME + 1) if _prime_factors(p) == {p: 1}):
        counts |= {c * prime ** e for c in counts for e in range(1, _max_power(prime, n) + 1) if c * prime ** e < n}
    return sorted((c for c in counts if c < n), reverse=True)


# ----------------------------------------------------------------------------- grid planning

@dataclass(frozen=True)
class GridChoice:
    """The process grid of one fused group: ``dims[v]`` ranks along index ``indices[v]``.

    ``volume`` is the modeled number of words the busiest rank receives
    (inputs from their source layouts, the output's partial sums reduced into
    its target layout); ``reason`` says why this grid, and why any ranks idle.
    """

    indices: str
    dims: tuple[int, ...]
    output: str
    nprocs: int
    volume: int
    reason: str

    @property
    def used(self) -> int:
        """Ranks with a block of the iteration space: ``prod(dims)``."""
        return math.prod(self.dims)

    @property
    def idle(self) -> int:
        """Ranks left out of the grid (they still hold and send input data)."""
        return self.nprocs - self.used

    @property
    def reduction_dims(self) -> tuple[int, ...]:
        """Grid dimensions of the reduction indices (in ``indices`` but not in ``output``)."""
        return tuple(v for v, c in enumerate(self.indices) if c not in self.output)

    def layout(self, subscripts: str, sizes: Mapping[str, int], partial: bool | None = None) -> Layout:
        """Layout on this grid of the tensor with ``subscripts``.

        ``partial`` (default: ``subscripts == output``) marks the un-reduced
        output: partial over the reduction dims that have more than one rank.
        Pass ``partial=False`` for an input whose subscripts equal the output's.

        >>> c = GridChoice("ijk", (2, 1, 3), "ik", 6, 0, "")
        >>> c.layout("ij", {"i": 4, "j": 5})
        Layout(shape=(4, 5), grid=(2, 1, 3), axes=(0, 1), partial=())
        """
        unknown = set(subscripts) - set(self.indices)
        if unknown or len(set(subscripts)) != len(subscripts):
            raise DeinsumError(f"tensor '{subscripts}' on grid over '{self.indices}': "
                               f"{'unknown index ' + repr(sorted(unknown)[0]) if unknown else 'repeated index'}")
        missing = [c for c in subscripts if c not in sizes]
        if missing:
            raise DeinsumError(f"tensor '{subscripts}': no size given for index '{missing[0]}'")
        if partial is None:
            partial = subscripts == self.output
        summed = tuple(g for g in self.reduction_dims if self.dims[g] > 1) if partial else ()
        return Layout(tuple(sizes[c] for c in subscripts), self.dims,
                      tuple(self.indices.index(c) for c in subscripts), summed)

    def __str__(self) -> str:
        grid = ", ".join(f"{c}={p}" for c, p in zip(self.indices, self.dims))
        return f"grid [{grid}] on {self.used} of {self.nprocs} ranks, {self.volume} words/rank: {self.reason}"


def plan_grid(indices: str, sizes: Mapping[str, int], inputs: Sequence[str], output: str, nprocs: int,
              tile: Mapping[str, float] | None = None, *, sources: Sequence[Layout | None] | None = None,
              target: Layout | None = None) -> GridChoice:
    """Choose the process grid of a group by an exact per-rank communication-volume model.

    Candidates are the ordered factorisations of ``nprocs`` over ``indices``
    (a dimension never gets more ranks than its size), plus grids on fewer
    ranks when ``nprocs`` has a prime factor above 7 or no grid of ``nprocs``
    fits. Each is scored by :func:`grid_volume`: the words the busiest rank
    receives to bring every input from ``sources[i]`` (default
    :meth:`Layout.even` over all ranks) and to reduce the output's partial sums
    into ``target`` (default :meth:`Layout.even`: outputs end as inputs start).

    Ties prefer no idle ranks, then per-rank blocks closest in log-space (up
    to scale) to the SOAP ``tile`` (cube-like blocks without one), then the
    lexicographically smallest dims. Branch and bound on lower bounds taken at
    a few sample ranks keeps exact evaluations few; deterministic.

    >>> c = plan_grid("ijka", dict(i=10, j=10, k=10, a=10), ("ijk", "ja", "ka"), "ia", 8)
    >>> c.dims, c.reduction_dims, c.volume
    ((2, 2, 2, 1), (1, 2), 145)
    """
    model = _GroupModel.build(indices, sizes, inputs, output, nprocs, sources, target)
    dims, counts_note = _candidate_grids(nprocs, tuple(max(1, sizes[c]) for c in indices))
    idle = nprocs - dims.prod(axis=1)
    fit = np.round(_tile_distance(dims, indices, sizes, tile), 9)
    coarse = model.lower_bound(dims, exact_scatter=False)

    cut = []  # searches that ran out of EXACT_EVALUATIONS

    def search(rows: np.ndarray) -> tuple:
        """Best key ``(volume, idle, tile distance, dims)`` among candidate ``rows``.

        Candidates come in order of the coarse bound; each chunk gets the fine
        bound (exact reduce-scatter pieces) and only hopeful ones an exact score.
        """
        order = rows[np.lexsort(tuple(dims[rows, v] for v in reversed(range(len(indices))))
                                + (fit[rows], idle[rows], coarse[rows]))]
        best: tuple = ()
        evaluations = 0
        for first in range(0, order.size, 512):
            if best and coarse[order[first]] > best[0]:
                break
            chunk = order[first:first + 512]
            fine = model.lower_bound(dims[chunk], exact_scatter=True)
            for hopeful in sorted((int(bound), int(idle[r]), float(fit[r]), tuple(int(p) for p in dims[r]))
                                  for r, bound in zip(chunk, fine)):
                if best and hopeful >= best:
                    break
                if evaluations == EXACT_EVALUATIONS:
                    cut.append(hopeful[0])
                    return best
                evaluations += 1
                key = (model.volume(hopeful[3]),) + hopeful[1:]
                best = min(best, key) if best else key
        return best

    all_rows = np.arange(dims.shape[0])
    volume, _, _, dims_won = search(all_rows)
    used = math.prod(dims_won)
    if used == nprocs:
        reason = f"all {nprocs} ranks busy"
    elif not (idle == 0).any():
        reason = f"{_idle_ranks(nprocs - used)}: no grid of {nprocs} ranks fits sizes {dict(sizes)}"
    else:
        full_volume, _, _, full_dims = search(all_rows[idle == 0])
        reason = (f"{_idle_ranks(nprocs - used)}: the best grid on all {nprocs} ranks, {full_dims}, "
                  f"needs {full_volume} words/rank; busy ranks do {nprocs / used:.2f}x the iterations "
                  f"of an even split")
    if cut:
        counts_note += (f"; stopped after {EXACT_EVALUATIONS} exact scores (unscored grids need >= {min(cut)} "
                        f"words/rank by their lower bound)")
    return GridChoice(indices, dims_won, output, nprocs, volume, f"{reason}; {counts_note}")


def _idle_ranks(count: int) -> str:
    return f"{count} idle rank{'s' if count > 1 else ''}"


def grid_volume(indices: str, sizes: Mapping[str, int], inputs: Sequence[str], output: str, nprocs: int,
                dims: Sequence[int], *, sources: Sequence[Layout | None] | None = None,
                target: Layout | None = None) -> int:
    """Modeled words the busiest rank receives when the group runs on grid ``dims`` (see :func:`plan_grid`).

    >>> grid_volume("ijk", dict(i=4, j=4, k=4), ("ij", "jk"), "ik", 4, (2, 1, 2))
    8
    """
    model = _GroupModel.build(indices, sizes, inputs, output, nprocs, sources, target)
    dims = tuple(_check_count(p, "grid dimension", minimum=1) for p in dims)
    if len(dims) != len(indices) or math.prod(dims) > nprocs:
        raise DeinsumError(f"grid {dims} does not fit indices '{indices}' on {nprocs} ranks")
    return model.volume(dims)


@dataclass(frozen=True)
class _GroupModel:
    """The volume model of one group: its tensors, their source layouts and the output's target."""

    indices: str
    sizes: tuple[tuple[str, int], ...]
    inputs: tuple[str, ...]
    output: str
    nprocs: int
    sources: tuple[Layout, ...]
    target: Layout

    @classmethod
    def build(cls, indices, sizes, inputs, output, nprocs, sources, target) -> _GroupModel:
        _check_group(indices, sizes, inputs, output)
        _check_count(nprocs, "nprocs", minimum=1)
        shape_of = {t: tuple(sizes[c] for c in t) for t in (*inputs, output)}
        sources = tuple(sources) if sources is not None else (None,) * len(inputs)
        if len(sources) != len(inputs):
            raise DeinsumError(f"plan_grid: {len(sources)} source layouts for {len(inputs)} inputs")
        sources = tuple(Layout.even(shape_of[t], nprocs) if s is None else s for t, s in zip(inputs, sources))
        target = Layout.even(shape_of[output], nprocs) if target is None else target
        for name, layout, sub in [*zip(("input",) * len(inputs), sources, inputs), ("output", target, output)]:
            if layout.shape != shape_of[sub] or layout.nranks > nprocs or (name == "output" and layout.partial):
                raise DeinsumError(f"plan_grid: {name} '{sub}' layout {layout} does not fit shape "
                                   f"{shape_of[sub]} on {nprocs} ranks")
        return cls(indices, tuple((c, sizes[c]) for c in indices), tuple(inputs), output, nprocs, sources, target)

    def volume(self, dims: tuple[int, ...]) -> int:
        """Exact: max over ranks of the words received, by :func:`deinsum.redistribute.received_words`."""
        from deinsum.redistribute import received_words

        sizes = dict(self.sizes)
        choice = GridChoice(self.indices, dims, self.output, self.nprocs, 0, "")
        words = received_words(choice.layout(self.output, sizes, partial=True), self.target, self.nprocs)
        for subscripts, source in zip(self.inputs, self.sources):
            words += received_words(source, choice.layout(subscripts, sizes, partial=False), self.nprocs)
        return int(words.max())

    def lower_bound(self, dims: np.ndarray, exact_scatter: bool) -> np.ndarray:
        """Per candidate (row of ``dims``), max over sample ranks of :meth:`sampled_words`.

        The coarse bound (``exact_scatter=False``, all candidates) samples 4
        ranks, the fine one (few candidates) 64.
        """
        ranks = _sample_ranks(self.nprocs, 64 if exact_scatter else 4)
        bound = np.empty(dims.shape[0], dtype=np.int64)
        step = max(1, 2 ** 18 // ranks.size)
        for first in range(0, dims.shape[0], step):
            words = self.sampled_words(dims[first:first + step], ranks, exact_scatter)
            bound[first:first + step] = words.max(axis=1)
        return bound

    def sampled_words(self, dims: np.ndarray, ranks: np.ndarray, exact_scatter: bool) -> np.ndarray:
        """Words received at ``ranks`` (columns) for each candidate (rows), never above the exact model.

        Inputs from plain sources and a direct output reduction are exact
        (inputs from partial sources: their block size). A reduce-scatter is
        exact with ``exact_scatter`` (it needs each candidate's piece split);
        without, a rank reducing R > 1 partial sums is credited only its target
        block m, which it receives in full either way, and rank 0 (the largest
        block n0, hence the largest piece) also (R-1)·ceil(n0/R) + max(0, m0-n0).
        """
        sizes = dict(self.sizes)
        busy = ranks[None, :] < dims.prod(axis=1)[:, None]
        stride = np.concatenate([np.cumprod(dims[:, :0:-1], axis=1)[:, ::-1], np.ones_like(dims[:, :1])], axis=1)
        digit = {c: (ranks[None, :] // stride[:, v:v + 1]) % dims[:, v:v + 1] for v, c in enumerate(self.indices)}
        ranges = {c: block_range(sizes[c], dims[:, v:v + 1], digit[c]) for v, c in enumerate(self.indices)}
        lo = {c: start for c, (start, _) in ranges.items()}
        hi = {c: stop for c, (_, stop) in ranges.items()}

        def overlap(box_lo, box_hi, layout):
            other_lo, other_hi = (a[ranks] for a in layout.boxes(self.nprocs))
            words = np.ones(busy.shape, dtype=np.int64)
            for x in range(len(box_lo)):
                words *= np.clip(np.minimum(box_hi[x], other_hi[:, x]) - np.maximum(box_lo[x], other_lo[:, x]), 0, None)
            return words * busy * (ranks < layout.nranks)

        def size(box_lo, box_hi):
            return np.prod([h - l for l, h in zip(box_lo, box_hi)], axis=0, initial=1, dtype=np.int64) * busy

        words = np.zeros(busy.shape, dtype=np.int64)
        for subscripts, source in zip(self.inputs, self.sources):
            box = [lo[c] for c in subscripts], [hi[c] for c in subscripts]
            # partial sources may be reduce-scattered first: either way the whole block arrives
            words += size(*box) - overlap(*box, source) if source.n_summands == 1 else size(*box)
        target_lo, target_hi = self.target.boxes(self.nprocs)
        m = np.prod(target_hi[ranks] - target_lo[ranks], axis=1) * (ranks < self.target.nranks)
        reduced = [v for v, c in enumerate(self.indices) if c not in self.output]
        fan_in = np.prod(dims[:, reduced], axis=1)[:, None]
        box = [lo[c] for c in self.output], [hi[c] for c in self.output]
        direct = fan_in * m - overlap(*box, self.target)
        if not self.output or fan_in.max() == 1:
            return words + direct
        if not exact_scatter:
            via_scatter = np.broadcast_to(m, busy.shape).copy()
            if ranks[0] == 0:
                n0 = size(*box)[:, 0]
                first_piece = (fan_in[:, 0] - 1) * -(-n0 // fan_in[:, 0]) + np.maximum(m[0] - n0, 0)
                via_scatter[:, 0] = np.maximum(m[0], first_piece)
            return words + np.where(fan_in > 1, np.minimum(direct, via_scatter), direct)
        # the rank holding summand k keeps sub-block k of balanced_split(largest block, R)
        summand = np.zeros(busy.shape, dtype=np.int64)
        for v in reduced:
            summand = summand * dims[:, v:v + 1] + digit[self.indices[v]]
        largest = -(-np.array([sizes[c] for c in self.output]) // dims[:, [self.indices.index(c) for c in self.output]])
        split = np.array([balanced_split(tuple(b), int(r)) for b, r in zip(largest, fan_in[:, 0])])
        piece_lo, piece_hi = [], []
        for x in reversed(range(len(self.output))):
            sub = summand % split[:, x:x + 1]
            summand = summand // split[:, x:x + 1]
            extent = box[1][x] - box[0][x]
            start, stop = block_range(extent, split[:, x:x + 1], sub)
            piece_lo.insert(0, box[0][x] + start)
            piece_hi.insert(0, box[0][x] + stop)
        via_scatter = (fan_in - 1) * size(piece_lo, piece_hi) + m - overlap(piece_lo, piece_hi, self.target)
        return words + np.where(fan_in > 1, np.minimum(direct, via_scatter), direct)


def _check_group(indices: str, sizes: Mapping[str, int], inputs: Sequence[str], output: str) -> None:
    if len(set(indices)) != len(indices):
        raise DeinsumError(f"plan_grid: repeated index in group indices '{indices}'")
    for c in indices:
        if c not in sizes:
            raise DeinsumError(f"plan_grid: no size given for index '{c}'")
        _check_count(sizes[c], f"size of index '{c}'", minimum=0)
    if isinstance(inputs, str):
        raise DeinsumError(f"plan_grid: inputs must be a sequence of subscripts, got the string '{inputs}'")
    for t in (*inputs, output):
        if set(t) - set(indices) or len(set(t)) != len(t):
            raise DeinsumError(f"plan_grid: tensor '{t}' has an index outside '{indices}' or a repeated index")


def _candidate_grids(nprocs: int, caps: tuple[int, ...]) -> tuple[np.ndarray, str]:
    """All candidate dims (rows) and a note on which rank counts were searched."""
    blocks = [ordered_factorisations(nprocs, caps)]
    if max(_prime_factors(nprocs), default=1) > SMOOTH_PRIME or blocks[0].shape[0] == 0:
        for count in _smooth_counts_below(nprocs):
            if len(blocks) > FEWER_RANK_COUNTS:
                break
            rows = ordered_factorisations(count, caps)
            if rows.shape[0]:
                blocks.append(rows)
    counts = [int(b[0].prod()) for b in blocks if b.shape[0]]
    note = f"searched {sum(b.shape[0] for b in blocks)} grids on {', '.join(map(str, counts))} ranks"
    return np.concatenate(blocks), note


def _sample_ranks(nprocs: int, count: int) -> np.ndarray:
    """Rank 0, the last rank, and ranks spread by the golden ratio (mixed grid coordinates)."""
    golden = (np.arange(count - 1) * 0.6180339887498949) % 1.0
    return np.unique(np.concatenate([(golden * nprocs).astype(np.int64), [nprocs - 1]]))


def _tile_distance(dims: np.ndarray, indices: str, sizes: Mapping[str, int],
                   tile: Mapping[str, float] | None) -> np.ndarray:
    """Squared log-space distance, up to a common scale, between per-rank blocks and the tile."""
    extent = np.array([max(sizes[c], 1) for c in indices], dtype=float)
    ideal = np.ones(len(indices)) if tile is None else np.array(
        [min(max(float(tile.get(c, 1.0)), 1.0), e) for c, e in zip(indices, extent)])
    gap = np.log(extent / dims) - np.log(ideal)
    if gap.shape[1]:
        gap -= gap.mean(axis=1, keepdims=True)
    return (gap ** 2).sum(axis=1)


# ----------------------------------------------------------------------------- communicators

@dataclass
class GridComms:
    """MPI communicators of one group's grid, on one rank.

    ``cart`` is ``MPI.COMM_NULL`` and the others are empty/None on ranks
    outside the grid. ``replication[name]`` spans the grid dims not in tensor
    ``name`` (the ranks holding copies of the same block); ``reduction`` spans
    the reduction dims (the ranks whose partial sums of the output add up).
    """

    cart: Any
    replication: dict[str, Any]
    reduction: Any

    @property
    def active(self) -> bool:
        """Whether this rank is part of the grid."""
        return self.reduction is not None

    def free(self) -> None:
        """Free every communicator created here (collective over each)."""
        if self.active:
            for comm in (*self.replication.values(), self.reduction, self.cart):
                comm.Free()
        self.replication, self.reduction = {}, None


def make_communicators(comm: Any, choice: GridChoice, tensors: Mapping[str, str]) -> GridComms:
    """Cartesian communicator of ``choice`` (``reorder=False``) and its sub-communicators; collective on ``comm``.

    ``tensors`` maps tensor names to their subscripts over ``choice.indices``.
    """
    from mpi4py import MPI

    if comm.Get_size() != choice.nprocs:
        raise DeinsumError(f"grid planned for {choice.nprocs} ranks, communicator has {comm.Get_size()}")
    for name, subscripts in tensors.items():
        if set(subscripts) - set(choice.indices):
            raise DeinsumError(f"tensor {name} '{subscripts}' has an index outside grid '{choice.indices}'")
    cart = comm.Create_cart(list(choice.dims), periods=[False] * len(choice.dims), reorder=False)
    if cart == MPI.COMM_NULL:
        return GridComms(cart, {}, None)
    replication = {name: cart.Sub([c not in subscripts for c in choice.indices])
                   for name, subscripts in tensors.items()}
    reduction = cart.Sub([c not in choice.output for c in choice.indices])
    return GridComms(cart, replication, reduction)


def _check_count(value: Any, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise DeinsumError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return int(value)
