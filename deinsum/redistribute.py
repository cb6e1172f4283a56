"""Plans for moving a tensor between layouts: who sends which subarray to whom.

Pure planning (no MPI): the volume model of a move, vectorised over the ranks, and the decisions taken once
for all ranks; each rank's own tables, which it executes, come from :mod:`deinsum.tables` (emitted scripts carry
that module, not this one), and move exactly what the model says.

* A partial source is summed on the way (reduce-redistribute), either directly
  (every destination receives all summands) or via a reduce-scatter inside
  each group of summands followed by a plain redistribution, whichever the
  model says the busiest rank receives less from (an allreduce thus costs
  ``2n(R-1)/R`` words per rank instead of ``n(R-1)``). :func:`reduce_split` takes
  that decision, once for all ranks.
* A phase whose blocks are regular (and, to be gathered, contiguous) runs MPI's collective of its name
  (:func:`deinsum.tables.collectives`); the model counts what its algorithm moves
  (:func:`deinsum.tables.reduction_words`).

>>> plan = plan_redistribution(Layout((8, 4), (4, 1), (0, 1)), Layout.replicated((8, 4), 4), 4)
>>> plan.words_received
(24, 24, 24, 24)
>>> print(plan)
redistribute 8x4 on 4 ranks, grid (4, 1) -> (4,): direct (MPI_Allgather); received max 24 words/rank, total 96; sent max 24
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np

from .grids import balanced_split
from .layout import KEPT_RANKS, Layout
from .tables import (COLLECTIVES, Holdings, check_pair, check_rank, check_rounds, collectives, everywhere,
                     native_reduction, phases, rank_tables, reduction_words, scattered)

__all__ = ["Redistribution", "plan_redistribution", "reduce_split", "received_words", "sent_words",
           "via_scatter", "sample_ranks", "scatter_split"]


def scatter_split(layout: Layout, gathered: bool = False) -> tuple[int, ...]:
    """How a reduce-scatter of partial ``layout`` cuts every block: :func:`balanced_split` of the
    number of summands over the largest block (C order of the summand index); where the pieces are then
    ``gathered`` on every rank (where any cut moves the same words), into pieces contiguous in C order
    where they can be (MPI gathers those without packing).

    >>> partial = Layout((8, 6), grid=(2, 4), axes=(None, 1), partial=(0,))   # blocks 8 x 2, two summands
    >>> scatter_split(partial), scatter_split(Layout((8, 8), (4,), (None, None), (0,)), gathered=True)
    ((2, 1), (4, 1))
    """
    largest = tuple(max(b[j + 1] - b[j] for j in range(len(b) - 1)) for b in
                    (layout.axis_bounds(x) for x in range(len(layout.shape))))
    return balanced_split(largest, layout.n_summands, cubic=not gathered)


def _direct_words(src: Holdings, dst: Holdings) -> np.ndarray:
    """Words each rank receives when every destination block is assembled directly from ``src``."""
    overlap = np.minimum(src.hi, dst.hi)                   # (in place: at 2^20 ranks these are large)
    overlap -= np.maximum(src.lo, dst.lo)
    np.clip(overlap, 0, None, out=overlap)
    return dst.sizes() * src.n_summands - overlap.prod(axis=1) * (src.held & dst.held)


def _direct_by_blocks(src: Layout, dst: Layout, ranks: np.ndarray) -> np.ndarray:
    """:func:`_direct_words` of the layouts' own blocks at many ranks, one axis at a time: a rank's block in ``src``
    and in ``dst`` looked up in each one's boundaries (at a million ranks, ranks x axes arrays cost more than the
    arithmetic).

    >>> rows, cols = Layout((4, 4), (2, 2), (0, 1)), Layout((4, 4), (4,), (None, 0))   # 2 x 2 blocks -> columns
    >>> _direct_by_blocks(rows, cols, np.arange(4)).tolist()
    [2, 4, 4, 2]
    """
    kept = ((ranks < src.nranks) & (ranks < dst.nranks)).astype(np.int64)
    for (have, mine), (need, theirs) in zip(src.axis_blocks(ranks), dst.axis_blocks(ranks)):
        kept *= np.maximum(np.minimum(have[mine + 1], need[theirs + 1]) - np.maximum(have[mine], need[theirs]), 0)
    size = dst.block_sizes(ranks) if dst.shape else (ranks < dst.nranks).astype(np.int64)   # (block_sizes counts
    # a 0-d tensor's word at idle ranks too: the footprint's convention, not the volume's)
    return size * src.n_summands - kept


def _blocks(layout: Layout, ranks: np.ndarray) -> Holdings:
    """:func:`holdings` with only what :func:`_direct_words` reads (blocks, who holds one, the summands): no cells,
    summand or replica indices to compute."""
    lo, hi = layout.boxes_of(ranks)
    return Holdings(None, lo, hi, None, ranks < layout.nranks, None, layout.n_summands, layout.n_replicas)


def _direct(src: Layout, dst: Layout, nprocs: int, ranks: np.ndarray, start: Holdings, end: Holdings) -> np.ndarray:
    """Words each of ``ranks`` receives in the direct move (``start``, ``end``: their holdings of ``src``, ``dst``)."""
    reduction = native_reduction(src, dst, nprocs)
    if reduction:
        return reduction_words(reduction, math.prod(src.shape), nprocs, ranks)[1]
    return _direct_words(start, end)


def via_scatter(src: Layout, dst: Layout, nprocs: int) -> bool:
    """Whether moving partial ``src`` to ``dst`` goes through a reduce-scatter inside each group of
    summands first: when that makes the busiest rank (then all ranks together) receive less.

    Decided at the rank that holds the largest block (rank 0) and in total over sample ranks, so that
    every rank, and the model at any subset of ranks, takes the same decision.
    """
    if src.n_summands == 1 or not src.shape:
        return False
    ranks = sample_ranks(nprocs)
    split = scatter_split(src, everywhere(dst, nprocs))
    start, end, middle = _blocks(src, ranks), _blocks(dst, ranks), scattered(src, ranks, split)
    words = _direct(src, dst, nprocs, ranks, start, end)
    via = _direct_words(start, middle) + _direct_words(middle, end)
    return bool((via.max(), via.sum()) < (words.max(), words.sum()))


@lru_cache(maxsize=4096)
def reduce_split(src: Layout, dst: Layout, nprocs: int) -> tuple[int, ...] | None:
    """How the move from ``src`` to ``dst`` reduce-scatters first (:func:`scatter_split`), or None when it
    goes directly (:func:`via_scatter`): the one global decision of a move, taken at plan time.

    >>> reduce_split(Layout((8,), grid=(1, 4), axes=(0,), partial=(1,)), Layout((8,), grid=(1, 4), axes=(0,)), 4)
    (4,)
    """
    return scatter_split(src, everywhere(dst, nprocs)) if via_scatter(src, dst, nprocs) else None


def received_words(src: Layout, dst: Layout, nprocs: int, ranks: np.ndarray | None = None) -> np.ndarray:
    """Modeled words each rank receives in :func:`plan_redistribution` ``(src, dst)``; vectorised.

    ``ranks`` (default: all ``nprocs``) picks the ranks to model: the grid search
    scores candidates at a sample of ranks with this same function.

    >>> partial = Layout((8,), grid=(1, 4), axes=(0,), partial=(1,))
    >>> received_words(partial, Layout((8,), grid=(1, 4), axes=(0,)), 4).tolist()   # allreduce: 2n(R-1)/R
    [12, 12, 12, 12]
    """
    check_pair(src, dst, nprocs)
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
    split = reduce_split(src, dst, nprocs)
    if split is None and ranks.size > KEPT_RANKS and not native_reduction(src, dst, nprocs):
        return _direct_by_blocks(src, dst, ranks)
    start, end = _blocks(src, ranks), _blocks(dst, ranks)
    if split is not None:
        middle = scattered(src, ranks, split)
        return _direct_words(start, middle) + _direct_words(middle, end)
    return _direct(src, dst, nprocs, ranks, start, end)


def sample_ranks(nprocs: int, count: int = 64) -> np.ndarray:
    """All ranks up to ``count``, else rank 0, the last rank and ranks spread by the golden ratio.

    >>> sample_ranks(5).tolist()
    [0, 1, 2, 3, 4]
    """
    if nprocs <= count:
        return np.arange(nprocs)
    golden = (np.arange(count - 1) * 0.6180339887498949) % 1.0
    return np.unique(np.concatenate([(golden * nprocs).astype(np.int64), [nprocs - 1]]))


def sent_words(src: Layout, dst: Layout, nprocs: int, split: tuple[int, ...] | None = None,
               rounds: tuple[int, int] | None = None) -> np.ndarray:
    """Modeled words each rank sends in :func:`rank_tables` ``(src, dst, nprocs, rank, split, rounds)``, every
    rank at once: numpy over pairs of ranks (``nprocs ** 2``, in chunks), without building a table; a native
    collective's as :func:`collectives` models it.

    >>> sent_words(Layout.on_root((5,), 2), Layout.replicated((5,), 2), 2).tolist()   # a broadcast
    [5, 0]
    """
    check_pair(src, dst, nprocs)
    sent = np.zeros(nprocs, dtype=np.int64)
    for (a, b), kind in zip(phases(src, dst, nprocs, split), collectives(src, dst, nprocs, split, rounds)):
        if kind in ("allgather", "allgatherv"):   # as many words as it receives (a reduce-scatter: the Alltoallw's)
            sent += _direct_words(a, b)
            continue
        if kind in ("allreduce", "reduce"):
            sent += reduction_words(kind, math.prod(src.shape), nprocs, np.arange(nprocs))[0]
            continue
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
        """How it moves: each phase, and the MPI collective it runs (where not ``Alltoallw``)."""
        names = ["direct"] if self.split is None else ["reduce-scatter", "direct"]
        native = [f" (MPI_{COLLECTIVES[kind]})" if kind else "" for kind in self.collectives]
        return ", then ".join(n + k for n, k in zip(names, native)) + (
            f", in {self.rounds[1]} rounds along axis {self.rounds[0]}" if self.rounds else "")

    @cached_property
    def collectives(self) -> tuple:
        """The native collective of each phase, or None (:func:`collectives`)."""
        return collectives(self.src, self.dst, self.nprocs, self.split, self.rounds)

    def table(self, rank: int) -> tuple:
        """``rank``'s tables (:func:`rank_tables`)."""
        check_rank(rank, self.nprocs)
        if rank not in self._tables:
            self._tables[rank] = rank_tables(self.src, self.dst, self.nprocs, rank, self.split, self.rounds)
        return self._tables[rank]

    def bytes_sent(self, rank: int, itemsize: int) -> int:
        """Modeled bytes ``rank`` sends for elements of ``itemsize`` bytes."""
        return self.words_sent[check_rank(rank, self.nprocs)] * itemsize

    def bytes_received(self, rank: int, itemsize: int) -> int:
        """Modeled bytes ``rank`` receives for elements of ``itemsize`` bytes."""
        return self.words_received[check_rank(rank, self.nprocs)] * itemsize

    @cached_property
    def words_sent(self) -> tuple[int, ...]:
        return tuple(sent_words(self.src, self.dst, self.nprocs, self.split, self.rounds).tolist())

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

    >>> plan = plan_redistribution(Layout.on_root((5,), 2), Layout((5,), (2,), (0,)), 2)
    >>> plan.words_sent, plan.words_received
    ((2, 0), (0, 2))
    """
    check_pair(src, dst, nprocs)
    split = reduce_split(src, dst, nprocs)
    check_rounds(src, split, rounds)
    return Redistribution(src, dst, nprocs, split, rounds)
