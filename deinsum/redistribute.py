"""Plans for moving a tensor between layouts: who sends which subarray to whom.

Pure planning (no MPI; numpy and the standard library only, so emitted scripts
carry it). :func:`rank_tables` gives one rank its own plain integer tables,
which :class:`deinsum.runtime.exchange.Transfer` executes with one
``Alltoallw`` per phase; every rank builds its own from the two layouts alone,
at a cost of a few numpy passes over the ranks plus its own pieces.

* A destination block is assembled from the boxes of the source blocks it
  meets, so any sizes (uneven blocks, more blocks than elements) are exact.
* A piece a rank already holds is copied locally and costs nothing; every other
  piece comes from the replica whose index is the destination rank modulo the
  number of replicas: both sides compute it locally, and it spreads the load.
* A partial source is summed on the way (reduce-redistribute), either directly
  (every destination receives all summands) or via a reduce-scatter inside
  each group of summands followed by a plain redistribution, whichever the
  model says the busiest rank receives less from (an allreduce thus costs
  ``2n(R-1)/R`` words per rank instead of ``n(R-1)``). :func:`reduce_split` takes
  that decision, once for all ranks.

>>> plan = plan_redistribution(Layout.even((6, 4), 4), Layout.replicated((6, 4), 4), 4)
>>> plan.words_received
(18, 18, 18, 18)
>>> print(plan)
redistribute 6x4 on 4 ranks, grid (2, 2) -> (4,): direct; received max 18 words/rank, total 72; sent max 18
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np

from .errors import DeinsumError
from .layout import Layout, balanced_split, block_range

__all__ = ["Redistribution", "plan_redistribution", "rank_tables", "reduce_split", "received_words", "sent_words",
           "via_scatter", "sample_ranks", "scatter_split", "table_words"]


@dataclass(frozen=True, eq=False)
class _Holdings:
    """Who holds what at ``ranks``: rank ``ranks[k]`` (if ``held[k]``) holds the box ``lo[k]:hi[k]``, cell
    ``cell[k]`` (per axis, which interval of the layout's boundaries) of summand ``summand[k]`` (of
    ``n_summands`` partial sums), as copy ``replica[k]`` of ``n_replicas`` identical ones.
    """

    cell: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    summand: np.ndarray
    held: np.ndarray
    replica: np.ndarray
    n_summands: int
    n_replicas: int

    def sizes(self) -> np.ndarray:
        """Words each rank holds (0 for ranks holding nothing)."""
        return np.prod(self.hi - self.lo, axis=1) * self.held


def _holdings(layout: Layout, ranks: np.ndarray) -> _Holdings:
    """Holdings of ``layout`` at ``ranks``: one cell per block, one summand per partial sum (read-only arrays)."""
    lo, hi, cell, summand, replica, held = layout.holdings_of(ranks)
    return _Holdings(cell, lo, hi, summand, held, replica, layout.n_summands, layout.n_replicas)


def scatter_split(layout: Layout) -> tuple[int, ...]:
    """How a reduce-scatter of partial ``layout`` cuts every block: :func:`balanced_split` of the
    number of summands over the largest block (C order of the summand index).

    >>> scatter_split(Layout((8, 6), grid=(2, 4), axes=(None, 1), partial=(0,)))   # blocks 8 x 2, two summands
    (2, 1)
    """
    largest = tuple(max(b[j + 1] - b[j] for j in range(len(b) - 1)) for b in
                    (layout.axis_bounds(x) for x in range(len(layout.shape))))
    return balanced_split(largest, layout.n_summands)


def _scattered(layout: Layout, ranks: np.ndarray, split: tuple[int, ...]) -> _Holdings:
    """Holdings after a reduce-scatter of partial ``layout`` inside each group of summands.

    Every block is cut nested by ``split`` (:func:`scatter_split`); the rank holding summand
    ``k`` keeps the fully summed sub-block ``k`` (C order).
    """
    base = _holdings(layout, ranks)
    sub = np.stack(np.unravel_index(base.summand, split), axis=1) if split else np.zeros((ranks.size, 0), np.int64)
    lo, hi = base.lo.copy(), base.hi.copy()
    for x, p in enumerate(split):
        start, stop = block_range(base.hi[:, x] - base.lo[:, x], p, sub[:, x])
        lo[:, x], hi[:, x] = (base.lo[:, x] + start) * base.held, (base.lo[:, x] + stop) * base.held
    return _Holdings(base.cell * np.array(split, dtype=np.int64) + sub, lo, hi, np.zeros_like(base.summand),
                     base.held, base.replica, 1, base.n_replicas)


def _round_slab(held: _Holdings, axis: int, rounds: int, t: int) -> _Holdings:
    """``held`` with every block cut to its part of round ``t`` of ``rounds``: the balanced sub-range ``t``
    of the block along ``axis`` (the rounds of a block partition it, so they move what the whole move does)."""
    start, stop = block_range(held.hi[:, axis] - held.lo[:, axis], rounds, t)
    lo, hi = held.lo.copy(), held.hi.copy()
    lo[:, axis], hi[:, axis] = held.lo[:, axis] + start, held.lo[:, axis] + stop
    return _Holdings(held.cell, lo, hi, held.summand, held.held, held.replica, held.n_summands, held.n_replicas)


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
    start, end, middle = _holdings(src, ranks), _holdings(dst, ranks), _scattered(src, ranks, scatter_split(src))
    words = _direct_words(start, end)
    via = _direct_words(start, middle) + _direct_words(middle, end)
    return bool((via.max(), via.sum()) < (words.max(), words.sum()))


@lru_cache(maxsize=4096)
def reduce_split(src: Layout, dst: Layout, nprocs: int) -> tuple[int, ...] | None:
    """How the move from ``src`` to ``dst`` reduce-scatters first (:func:`scatter_split`), or None when it
    goes directly (:func:`via_scatter`): the one global decision of a move, taken at plan time.

    >>> reduce_split(Layout((8,), grid=(1, 4), axes=(0,), partial=(1,)), Layout((8,), grid=(1, 4), axes=(0,)), 4)
    (4,)
    """
    return scatter_split(src) if via_scatter(src, dst, nprocs) else None


def received_words(src: Layout, dst: Layout, nprocs: int, ranks: np.ndarray | None = None) -> np.ndarray:
    """Modeled words each rank receives in :func:`plan_redistribution` ``(src, dst)``; vectorised.

    ``ranks`` (default: all ``nprocs``) picks the ranks to model: the grid search
    scores candidates at a sample of ranks with this same function.

    >>> partial = Layout((8,), grid=(1, 4), axes=(0,), partial=(1,))
    >>> received_words(partial, Layout((8,), grid=(1, 4), axes=(0,)), 4).tolist()   # allreduce: 2n(R-1)/R
    [12, 12, 12, 12]
    """
    _check_pair(src, dst, nprocs)
    if ranks is None:
        return _received_by_all(src, dst, nprocs)
    return _received_at(src, dst, nprocs, np.asarray(ranks, dtype=np.int64))


@lru_cache(maxsize=16)
def _received_by_all(src: Layout, dst: Layout, nprocs: int) -> np.ndarray:
    """:func:`received_words` at every rank (cached, read-only: the planner's assembly and the plan's moves ask
    for the same)."""
    words = _received_at(src, dst, nprocs, np.arange(nprocs))
    words.flags.writeable = False
    return words


def _received_at(src: Layout, dst: Layout, nprocs: int, ranks: np.ndarray) -> np.ndarray:
    start, end = _holdings(src, ranks), _holdings(dst, ranks)
    split = reduce_split(src, dst, nprocs)
    if split is not None:
        middle = _scattered(src, ranks, split)
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


def _check_rounds(src: Layout, split: tuple[int, ...] | None, rounds: tuple[int, int] | None) -> None:
    """Rounds cut a direct move only: one through a reduce-scatter first (``split``) has two phases."""
    if rounds is not None and split is not None:
        raise DeinsumError(f"a move of partial sums through a reduce-scatter ({src}) does not run in rounds")


def _check_rank(rank: int, nprocs: int) -> int:
    if not 0 <= rank < nprocs:
        raise DeinsumError(f"rank {rank} outside a redistribution on {nprocs} ranks")
    return rank


@lru_cache(maxsize=64)
def _every(layout: Layout, nprocs: int) -> _Holdings:
    """The holdings of every rank (cached: moves share layouts)."""
    return _holdings(layout, np.arange(nprocs))


@lru_cache(maxsize=32)
def _phases(src: Layout, dst: Layout, nprocs: int, split: tuple[int, ...] | None,
            rounds: tuple[int, int] | None = None) -> tuple:
    """The (source, destination) holdings of every rank, per phase (cached: a move's ranks share them); in
    ``rounds`` ``(axis, T)``, T phases, each bringing one round's part of every destination block."""
    start, end = _every(src, nprocs), _every(dst, nprocs)
    if rounds is not None:
        return tuple((start, _round_slab(end, rounds[0], rounds[1], t)) for t in range(rounds[1]))
    if split is None:
        return ((start, end),)
    middle = _scattered(src, np.arange(nprocs), split)
    return (start, middle), (middle, end)


def rank_tables(src: Layout, dst: Layout, nprocs: int, rank: int, split: tuple[int, ...] | None = None,
                rounds: tuple[int, int] | None = None) -> tuple:
    """Plain-int tables of ``rank`` for moving ``src`` to ``dst`` on ``nprocs`` ranks, one per phase:
    directly (``split`` None) or a reduce-scatter cutting blocks by ``split`` first (:func:`reduce_split`);
    or, with ``rounds`` ``(axis, T)`` (a direct move: ``split`` None), in T phases, phase ``t`` bringing the
    balanced sub-range ``t`` along ``axis`` of every destination block (its output block is that part).

    A phase is ``(in_held, in_shape, out_held, out_shape, sends, recvs, ops)``, peers numbered in the
    world: ``sends`` = ``((peer, starts, subsizes), ...)`` subarrays of the input block; ``recvs`` =
    ``((peer, starts, subsizes, add), ...)``: ``add=0`` lands directly at ``starts`` of the output block,
    ``add=1`` in staging; ``ops`` = ``((peer, add, from_starts, subsizes, to_starts), ...)`` run in order
    after the exchange: copy (``add=0``) or add (``add=1``) a piece of the input block (``peer == rank``)
    or of ``peer``'s staging into the output. Summands are combined in summand order on every
    destination, so replicas get bit-identical sums.

    >>> rank_tables(Layout.on_root((5,), 2), Layout.even((5,), 2), 2, 1)   # rank 1 receives 2 words from rank 0
    ((0, (), 1, (2,), (), ((0, (0,), (2,), 0),), ()),)
    """
    _check_pair(src, dst, nprocs)
    _check_rank(rank, nprocs)
    _check_rounds(src, split, rounds)
    return tuple(_rank_phase(a, b, rank) for a, b in _phases(src, dst, nprocs, split, rounds))


def _rank_phase(src: _Holdings, dst: _Holdings, rank: int) -> tuple:
    """``rank``'s table of one phase. A piece of key (cell, summand) that ``rank`` does not hold comes from
    the holder of that key whose replica index is the destination's rank modulo the number of replicas."""
    ranks = np.arange(src.held.size)
    in_held, out_held = bool(src.held[rank]), bool(dst.held[rank])
    # ranks whose source key (cell and summand) is this rank's own
    same_key = in_held & src.held & (src.cell == src.cell[rank]).all(axis=1) & (src.summand == src.summand[rank])
    sends, recvs, ops = [], [], []
    if out_held:
        lo, hi = np.maximum(src.lo, dst.lo[rank]), np.minimum(src.hi, dst.hi[rank])
        chosen = src.held & (hi > lo).all(axis=1) & np.where(same_key, ranks == rank,
                                                             src.replica == rank % src.n_replicas)
        senders = np.flatnonzero(chosen)
        order = np.lexsort((src.summand[senders],) + tuple(src.cell[senders].T[::-1]))
        senders = senders[order]
        pieces = zip(senders.tolist(), (hi[senders] - lo[senders]).tolist(), (lo[senders] - dst.lo[rank]).tolist(),
                     (src.summand[senders] > 0).tolist())
        for peer, size, at, add in pieces:
            size, at, add = tuple(size), tuple(at), int(add)
            if peer == rank:
                ops.append((rank, add, tuple((lo[peer] - src.lo[rank]).tolist()), size, at))
                continue
            recvs.append((peer, at, size, add))
            if add:
                ops.append((peer, 1, (0,) * len(size), size, at))
    if in_held:
        lo, hi = np.maximum(dst.lo, src.lo[rank]), np.minimum(dst.hi, src.hi[rank])
        to = dst.held & (hi > lo).all(axis=1) & ~same_key & (ranks % src.n_replicas == src.replica[rank])
        to = np.flatnonzero(to)
        sends = [(peer, tuple(start), tuple(size)) for peer, start, size in
                 zip(to.tolist(), (lo[to] - src.lo[rank]).tolist(), (hi[to] - lo[to]).tolist())]
    return (int(in_held), tuple((src.hi[rank] - src.lo[rank]).tolist()) if in_held else (),
            int(out_held), tuple((dst.hi[rank] - dst.lo[rank]).tolist()) if out_held else (),
            tuple(sends), tuple(sorted(recvs)), tuple(ops))


def table_words(tables: tuple) -> tuple[int, int]:
    """(words sent, words received) of one rank's tables (:func:`rank_tables`).

    >>> table_words(rank_tables(Layout.on_root((5,), 2), Layout.even((5,), 2), 2, 0))
    (2, 0)
    """
    return (sum(math.prod(size) for t in tables for _, _, size in t[4]),
            sum(math.prod(size) for t in tables for _, _, size, _ in t[5]))


def sent_words(src: Layout, dst: Layout, nprocs: int, split: tuple[int, ...] | None = None) -> np.ndarray:
    """Modeled words each rank sends in :func:`rank_tables` ``(src, dst, nprocs, rank, split)``, every rank at
    once: numpy over pairs of ranks (``nprocs ** 2``, in chunks), without building a table.

    >>> sent_words(Layout.on_root((5,), 2), Layout.replicated((5,), 2), 2).tolist()   # a broadcast
    [5, 0]
    """
    _check_pair(src, dst, nprocs)
    sent = np.zeros(nprocs, dtype=np.int64)
    for a, b in _phases(src, dst, nprocs, split):
        senders, receivers = np.flatnonzero(a.held), np.flatnonzero(b.held)
        step = max(1, 2**20 // max(1, receivers.size))
        for first in range(0, senders.size, step):
            s = senders[first:first + step, None]   # senders (rows) x receivers (columns), as in _rank_phase
            other_key = (a.summand[receivers] != a.summand[s]) | ~a.held[receivers]
            words = np.ones(other_key.shape, dtype=np.int64)
            for x in range(a.lo.shape[1]):
                words *= np.clip(np.minimum(b.hi[receivers, x], a.hi[s, x]) - np.maximum(b.lo[receivers, x], a.lo[s, x]),
                                 0, None)
                other_key |= a.cell[receivers, x] != a.cell[s, x]
            to = other_key & (receivers % a.n_replicas == a.replica[s])
            sent[senders[first:first + step]] += (words * to).sum(axis=1)
    return sent


@dataclass(frozen=True, eq=False)
class Redistribution:
    """A planned move of one tensor from layout ``src`` to ``dst`` on ``nprocs`` ranks, through a
    reduce-scatter that cuts blocks by ``split`` first unless it is None (:func:`reduce_split`).

    :meth:`table` is what rank ``r`` executes, one ``Alltoallw`` per phase (built on demand, per rank);
    ``words_sent[r]`` / ``words_received[r]`` are the modeled words rank ``r`` sends / receives (local
    copies excluded; :func:`sent_words`, :func:`received_words`), which the tables move exactly.
    """

    src: Layout
    dst: Layout
    nprocs: int
    split: tuple[int, ...] | None
    rounds: tuple[int, int] | None = None
    _tables: dict = field(default_factory=dict, repr=False)

    @property
    def method(self) -> str:
        return ("direct" if self.split is None else "reduce-scatter, then direct") + (
            f", in {self.rounds[1]} rounds along axis {self.rounds[0]}" if self.rounds else "")

    def table(self, rank: int) -> tuple:
        """``rank``'s tables (:func:`rank_tables`)."""
        _check_rank(rank, self.nprocs)
        if rank not in self._tables:
            self._tables[rank] = rank_tables(self.src, self.dst, self.nprocs, rank, self.split, self.rounds)
        return self._tables[rank]

    def bytes_sent(self, rank: int, itemsize: int) -> int:
        """Modeled bytes ``rank`` sends for elements of ``itemsize`` bytes."""
        return self.words_sent[_check_rank(rank, self.nprocs)] * itemsize

    def bytes_received(self, rank: int, itemsize: int) -> int:
        """Modeled bytes ``rank`` receives for elements of ``itemsize`` bytes."""
        return self.words_received[_check_rank(rank, self.nprocs)] * itemsize

    @cached_property
    def words_sent(self) -> tuple[int, ...]:
        return tuple(sent_words(self.src, self.dst, self.nprocs, self.split).tolist())

    @cached_property
    def words_received(self) -> tuple[int, ...]:
        return tuple(received_words(self.src, self.dst, self.nprocs).tolist())

    @property
    def max_words_received(self) -> int:
        """Words the busiest receiver gets."""
        return max(self.words_received)

    def __str__(self) -> str:
        shape = "x".join(map(str, self.src.shape)) or "scalar"
        partial = f" partial over {self.src.partial}" if self.src.partial else ""
        return (f"redistribute {shape} on {self.nprocs} ranks, grid {self.src.grid}{partial} -> {self.dst.grid}: "
                f"{self.method}; received max {self.max_words_received} words/rank, "
                f"total {sum(self.words_received)}; sent max {max(self.words_sent)}")


def plan_redistribution(src: Layout, dst: Layout, nprocs: int, rounds: tuple[int, int] | None = None) -> Redistribution:
    """Plan moving a tensor from ``src`` to ``dst`` (summing ``src``'s partial sums) on ``nprocs`` ranks, in
    ``rounds`` ``(axis, T)`` if given (see :func:`rank_tables`); the rounds move exactly what one phase would.

    >>> plan = plan_redistribution(Layout.on_root((5,), 2), Layout.even((5,), 2), 2)
    >>> plan.words_sent, plan.words_received
    ((2, 0), (0, 2))
    """
    _check_pair(src, dst, nprocs)
    split = reduce_split(src, dst, nprocs)
    _check_rounds(src, split, rounds)
    return Redistribution(src, dst, nprocs, split, rounds)
