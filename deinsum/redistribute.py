"""Plans for moving a tensor between layouts: who sends which subarray to whom.

Pure planning (no MPI). A :class:`Redistribution` is built once from a source
and a destination :class:`~deinsum.layout.Layout` and reused; its
:meth:`~Redistribution.table` gives each rank plain integer tables that
:func:`deinsum.codegen.exchange.exchange` executes with one ``Alltoallw`` per
phase.

* Per tensor axis the two sorted boundary lists are intersected, so any sizes
  (uneven blocks, more blocks than elements) are exact.
* A piece a rank already holds is copied locally and costs nothing; other
  pieces come from a replica chosen round-robin over the destinations that
  need it, spreading the sending load.
* A partial source is summed on the way (reduce-redistribute), either directly
  (every destination receives all summands) or via a reduce-scatter inside
  each group of summands followed by a plain redistribution, whichever the
  model says the busiest rank receives less from (an allreduce thus costs
  ``2n(R-1)/R`` words per rank instead of ``n(R-1)``).

>>> plan = plan_redistribution(Layout.even((6, 4), 4), Layout.replicated((6, 4), 4), 4)
>>> plan.words_received
(18, 18, 18, 18)
>>> print(plan)
redistribute 6x4 on 4 ranks, grid (2, 2) -> (4,): direct; received max 18 words/rank, total 72; sent max 18
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import product
from typing import Sequence

import numpy as np

from deinsum.errors import DeinsumError
from deinsum.layout import Layout, balanced_split, block_range, nested_bounds

__all__ = ["Redistribution", "plan_redistribution", "received_words", "via_scatter", "sample_ranks", "scatter_split"]


@dataclass(frozen=True, eq=False)
class _Holdings:
    """Who holds what at ``ranks``: the tensor cut into a product of per-axis intervals ("cells").

    Rank ``ranks[k]`` (if ``held[k]``) holds cell ``cell[k]`` (indices into ``bounds``), the box
    ``lo[k]:hi[k]``, of summand ``summand[k]`` (of ``n_summands`` partial sums); several ranks may
    hold the same one.
    """

    bounds: tuple[tuple[int, ...], ...]
    cell: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    summand: np.ndarray
    held: np.ndarray
    n_summands: int

    def sizes(self) -> np.ndarray:
        """Words each rank holds (0 for ranks holding nothing)."""
        return np.prod(self.hi - self.lo, axis=1) * self.held


def _holdings(layout: Layout, ranks: np.ndarray) -> _Holdings:
    """Holdings of ``layout`` at ``ranks``: one cell per block, one summand per partial sum."""
    bounds = tuple(layout.axis_bounds(x) for x in range(len(layout.shape)))
    lo, hi = layout.boxes_of(ranks)
    return _Holdings(bounds, layout.block_index(ranks), lo, hi, layout.summand_index(ranks),
                     ranks < layout.nranks, layout.n_summands)


def scatter_split(layout: Layout) -> tuple[int, ...]:
    """How a reduce-scatter of partial ``layout`` cuts every block: :func:`balanced_split` of the
    number of summands over the largest block (C order of the summand index).

    >>> scatter_split(Layout((8, 6), grid=(2, 4), axes=(None, 1), partial=(0,)))   # blocks 8 x 2, two summands
    (2, 1)
    """
    largest = tuple(max(b[j + 1] - b[j] for j in range(len(b) - 1)) for b in
                    (layout.axis_bounds(x) for x in range(len(layout.shape))))
    return balanced_split(largest, layout.n_summands)


def _scattered(layout: Layout, ranks: np.ndarray) -> _Holdings:
    """Holdings after a reduce-scatter of partial ``layout`` inside each group of summands.

    Every block is cut nested by :func:`scatter_split`; the rank holding summand
    ``k`` keeps the fully summed sub-block ``k`` (C order).
    """
    base = _holdings(layout, ranks)
    split = scatter_split(layout)
    bounds = tuple(nested_bounds(n, layout.axis_parts(x) + (p,)) for x, (n, p) in enumerate(zip(layout.shape, split)))
    sub = np.stack(np.unravel_index(base.summand, split), axis=1) if split else np.zeros((ranks.size, 0), np.int64)
    lo, hi = base.lo.copy(), base.hi.copy()
    for x, p in enumerate(split):
        start, stop = block_range(base.hi[:, x] - base.lo[:, x], p, sub[:, x])
        lo[:, x], hi[:, x] = (base.lo[:, x] + start) * base.held, (base.lo[:, x] + stop) * base.held
    return _Holdings(bounds, base.cell * np.array(split, dtype=np.int64) + sub, lo, hi,
                     np.zeros_like(base.summand), base.held, 1)


def _direct_words(src: _Holdings, dst: _Holdings) -> np.ndarray:
    """Words each rank receives when every destination block is assembled directly from ``src``."""
    overlap = np.prod(np.clip(np.minimum(src.hi, dst.hi) - np.maximum(src.lo, dst.lo), 0, None), axis=1)
    return dst.sizes() * src.n_summands - overlap * (src.held & dst.held)


def _check_pair(src: Layout, dst: Layout, nprocs: int) -> None:
    if src.shape != dst.shape:
        raise DeinsumError(f"redistribution between shapes {src.shape} and {dst.shape}")
    if dst.partial:
        raise DeinsumError(f"destination layout {dst} is partial: redistribution always sums partial sources")
    if max(src.nranks, dst.nranks) > nprocs:
        raise DeinsumError(f"layouts on grids {src.grid} and {dst.grid} do not fit {nprocs} ranks")


def via_scatter(src: Layout, dst: Layout, nprocs: int) -> bool:
    """Whether moving partial ``src`` to ``dst`` goes through a reduce-scatter inside each group of
    summands first: when that makes the busiest rank (then all ranks together) receive less.

    Decided at the rank that holds the largest block (rank 0) and in total over sample ranks, so that
    every rank, and the model at any subset of ranks, takes the same decision.
    """
    if src.n_summands == 1 or not src.shape:
        return False
    ranks = sample_ranks(nprocs)
    start, end, middle = _holdings(src, ranks), _holdings(dst, ranks), _scattered(src, ranks)
    words = _direct_words(start, end)
    via = _direct_words(start, middle) + _direct_words(middle, end)
    return bool((via.max(), via.sum()) < (words.max(), words.sum()))


def received_words(src: Layout, dst: Layout, nprocs: int, ranks: np.ndarray | None = None) -> np.ndarray:
    """Modeled words each rank receives in :func:`plan_redistribution` ``(src, dst)``; vectorised.

    ``ranks`` (default: all ``nprocs``) picks the ranks to model: the grid search
    scores candidates at a sample of ranks with this same function.

    >>> partial = Layout((8,), grid=(1, 4), axes=(0,), partial=(1,))
    >>> received_words(partial, Layout((8,), grid=(1, 4), axes=(0,)), 4).tolist()   # allreduce: 2n(R-1)/R
    [12, 12, 12, 12]
    """
    _check_pair(src, dst, nprocs)
    ranks = np.arange(nprocs) if ranks is None else np.asarray(ranks, dtype=np.int64)
    start, end = _holdings(src, ranks), _holdings(dst, ranks)
    if via_scatter(src, dst, nprocs):
        middle = _scattered(src, ranks)
        return _direct_words(start, middle) + _direct_words(middle, end)
    return _direct_words(start, end)


def sample_ranks(nprocs: int, count: int = 64) -> np.ndarray:
    """All ranks up to ``count``, else rank 0, the last rank and ranks spread by the golden ratio.

    >>> sample_ranks(5).tolist()
    [0, 1, 2, 3, 4]
    """
    if nprocs <= count:
        return np.arange(nprocs)
    golden = (np.arange(count - 1) * 0.6180339887498949) % 1.0
    return np.unique(np.concatenate([(golden * nprocs).astype(np.int64), [nprocs - 1]]))


@dataclass(frozen=True, eq=False)
class Redistribution:
    """A planned move of one tensor from layout ``src`` to ``dst`` on ``nprocs`` ranks.

    ``words_sent[r]`` / ``words_received[r]`` are the modeled words rank ``r``
    sends / receives (local copies excluded); :meth:`table` is what rank ``r``
    executes, one ``Alltoallw`` per phase.
    """

    src: Layout
    dst: Layout
    nprocs: int
    method: str
    words_sent: tuple[int, ...] = field(repr=False)
    words_received: tuple[int, ...] = field(repr=False)
    _tables: tuple = field(repr=False)

    def bytes_sent(self, rank: int, itemsize: int) -> int:
        """Modeled bytes ``rank`` sends for elements of ``itemsize`` bytes."""
        return self.words_sent[self._rank(rank)] * itemsize

    def bytes_received(self, rank: int, itemsize: int) -> int:
        """Modeled bytes ``rank`` receives for elements of ``itemsize`` bytes."""
        return self.words_received[self._rank(rank)] * itemsize

    @property
    def max_words_received(self) -> int:
        """Words the busiest receiver gets."""
        return max(self.words_received)

    def table(self, rank: int) -> tuple:
        """Plain-int tables of ``rank``, one per phase, for :func:`deinsum.codegen.exchange.exchange`.

        A phase is ``(in_held, in_shape, out_held, out_shape, sends, recvs, ops)``:
        ``sends`` = ``((peer, starts, subsizes), ...)`` subarrays of the input
        block; ``recvs`` = ``((peer, starts, subsizes, add), ...)``: ``add=0``
        lands directly at ``starts`` of the output block, ``add=1`` in staging;
        ``ops`` = ``((peer, add, from_starts, subsizes, to_starts), ...)`` run in
        order after the exchange: copy (``add=0``) or add (``add=1``) a piece of
        the input block (``peer == rank``) or of ``peer``'s staging into the output.
        """
        return self._tables[self._rank(rank)]

    def _rank(self, rank: int) -> int:
        if not 0 <= rank < self.nprocs:
            raise DeinsumError(f"rank {rank} outside a redistribution on {self.nprocs} ranks")
        return rank

    def __str__(self) -> str:
        shape = "x".join(map(str, self.src.shape)) or "scalar"
        partial = f" partial over {self.src.partial}" if self.src.partial else ""
        return (f"redistribute {shape} on {self.nprocs} ranks, grid {self.src.grid}{partial} -> {self.dst.grid}: "
                f"{self.method}; received max {self.max_words_received} words/rank, "
                f"total {sum(self.words_received)}; sent max {max(self.words_sent)}")


def plan_redistribution(src: Layout, dst: Layout, nprocs: int) -> Redistribution:
    """Plan moving a tensor from ``src`` to ``dst`` (summing ``src``'s partial sums) on ``nprocs`` ranks.

        >>> plan = plan_redistribution(Layout.on_root((5,), 2), Layout.even((5,), 2), 2)
    >>> plan.words_sent, plan.words_received
    ((2, 0), (0, 2))
    >>> plan.table(1)   # rank 1: holds nothing yet, receives 2 words from rank 0 into its (2,) block
    ((0, (), 1, (2,), (), ((0, (0,), (2,), 0),), ()),)
    """
    _check_pair(src, dst, nprocs)
    ranks = np.arange(nprocs)
    start, end = _holdings(src, ranks), _holdings(dst, ranks)
    if via_scatter(src, dst, nprocs):
        middle = _scattered(src, ranks)
        phases = ((start, middle), (middle, end))
        modeled = _direct_words(start, middle) + _direct_words(middle, end)
    else:
        phases, modeled = ((start, end),), _direct_words(start, end)
    sent = np.zeros(nprocs, dtype=np.int64)
    received = np.zeros(nprocs, dtype=np.int64)
    per_phase = [_plan_phase(start, end, sent, received) for start, end in phases]
    assert np.array_equal(received, modeled), "piece plan disagrees with the volume model"
    method = "direct" if len(phases) == 1 else "reduce-scatter, then direct"
    tables = tuple(tuple(phase[rank] for phase in per_phase) for rank in range(nprocs))
    return Redistribution(src, dst, nprocs, method, tuple(int(w) for w in sent), tuple(int(w) for w in received),
                          tables)


def _axis_overlaps(dst_bounds: Sequence[int], src_bounds: Sequence[int]) -> list[list[tuple[int, int, int]]]:
    """For each destination interval, the non-empty ``(source part, lo, hi)`` overlaps, in O(p_dst + p_src).

    >>> _axis_overlaps((0, 2, 5), (0, 3, 3, 5))
    [[(0, 0, 2)], [(0, 2, 3), (2, 3, 5)]]
    """
    overlaps = []
    first = 0
    for a, b in zip(dst_bounds[:-1], dst_bounds[1:]):
        while first < len(src_bounds) - 2 and src_bounds[first + 1] <= a:
            first += 1
        pieces = []
        part = first
        while part < len(src_bounds) - 1 and src_bounds[part] < b:
            lo, hi = max(a, src_bounds[part]), min(b, src_bounds[part + 1])
            if lo < hi:
                pieces.append((part, lo, hi))
            part += 1
        overlaps.append(pieces)
    return overlaps


def _plan_phase(src: _Holdings, dst: _Holdings, sent: np.ndarray, received: np.ndarray) -> list[tuple]:
    """Per rank ``(in_held, in_shape, out_held, out_shape, sends, recvs, ops)`` of one phase.

    Adds each rank's words to ``sent`` / ``received``. Summands are combined in
    summand order on every destination, so replicas get bit-identical sums.
    """
    nprocs = src.held.size
    holders: dict[tuple, list[int]] = {}
    for r in np.flatnonzero(src.held):
        holders.setdefault((tuple(src.cell[r].tolist()), int(src.summand[r])), []).append(int(r))
    turns: dict[tuple, int] = {}
    overlaps = [_axis_overlaps(d, s) for d, s in zip(dst.bounds, src.bounds)]
    src_lo, src_hi, dst_lo, dst_hi = src.lo, src.hi, dst.lo, dst.hi
    sends: list[list] = [[] for _ in range(nprocs)]
    recvs: list[list] = [[] for _ in range(nprocs)]
    ops: list[list] = [[] for _ in range(nprocs)]
    for d in map(int, np.flatnonzero(dst.held)):
        own = (tuple(src.cell[d].tolist()), int(src.summand[d])) if src.held[d] else None
        for piece in product(*(overlaps[x][c] for x, c in enumerate(dst.cell[d].tolist()))):
            cell = tuple(part for part, _, _ in piece)
            start = tuple(lo for _, lo, _ in piece)
            size = tuple(hi - lo for _, lo, hi in piece)
            at = _relative(start, dst_lo[d])
            words = math.prod(size)
            for summand in range(src.n_summands):
                key = (cell, summand)
                add = int(summand > 0)
                if key == own:
                    ops[d].append((d, add, _relative(start, src_lo[d]), size, at))
                    continue
                turn = turns.get(key, 0)
                turns[key] = turn + 1
                replicas = holders[key]
                sender = replicas[turn % len(replicas)]
                sends[sender].append((d, _relative(start, src_lo[sender]), size))
                recvs[d].append((sender, at, size, add))
                if add:
                    ops[d].append((sender, 1, (0,) * len(size), size, at))
                sent[sender] += words
                received[d] += words
    return [(int(src.held[r]), tuple((src_hi[r] - src_lo[r]).tolist()) if src.held[r] else (),
             int(dst.held[r]), tuple((dst_hi[r] - dst_lo[r]).tolist()) if dst.held[r] else (),
             tuple(sorted(sends[r])), tuple(sorted(recvs[r])), tuple(ops[r])) for r in range(nprocs)]


def _relative(start: tuple[int, ...], origin: np.ndarray) -> tuple[int, ...]:
    """Global ``start`` relative to a block whose corner is ``origin``."""
    return tuple(int(a - o) for a, o in zip(start, origin))
