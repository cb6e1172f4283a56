"""Each rank's tables for moving a tensor between layouts: who sends which subarray to whom, or which MPI
collective a phase runs. What a rank executes (emitted scripts carry it; numpy only); the volume model and a
plan's decisions are :mod:`deinsum.redistribute`'s.

:func:`rank_tables` gives one rank its own plain integer tables, from the two layouts alone (a few numpy passes
over the ranks): a destination block is assembled from the boxes of the source blocks it meets (any sizes are
exact); a piece a rank holds is copied locally, every other one comes from the replica whose index is the
destination rank modulo the number of replicas; partial sums are added on the way, directly or through a
reduce-scatter first (``split``). A phase whose blocks are regular runs MPI's collective of its name
(:func:`collectives`), its words what the collective's algorithm moves as the model states them.

>>> rank_tables(Layout((), (2,), (), (0,)), Layout.replicated((), 2), 2, 1)   # an MPI_Allreduce of a scalar
((1, (), 1, (), 'allreduce', ((1, (), ()),), (1, 1)),)
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .errors import DeinsumError
from .layout import Layout, block_range

__all__ = ["COLLECTIVES", "Holdings", "check_pair", "check_rank", "check_rounds", "collectives", "distinct",
           "everywhere", "holdings", "native", "native_reduction", "on_one_rank", "phases", "rank_tables",
           "reduction_words", "scattered", "table_words"]


COLLECTIVES = {"allreduce": "Allreduce", "reduce": "Reduce", "allgather": "Allgather", "allgatherv": "Allgatherv",
               "reduce_scatter": "Reduce_scatter"}


def on_one_rank(layout: Layout) -> bool:
    """Whether one rank holds the whole tensor (summed)."""
    return layout.nranks == 1 and not layout.partial


def _unsplit(layout: Layout) -> bool:
    """Whether every block is the whole tensor."""
    return all(layout.grid[g] == 1 for g in layout.split_dims)


def everywhere(layout: Layout, nprocs: int) -> bool:
    """Whether every one of ``nprocs`` ranks holds the whole tensor (summed)."""
    return _unsplit(layout) and not layout.partial and layout.nranks >= nprocs


def distinct(layout: Layout) -> bool:
    """No block (of one summand) is held by two ranks."""
    return all(layout.grid[g] == 1 for g in layout.replicated_dims)


@dataclass(frozen=True, eq=False)
class Holdings:
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


def holdings(layout: Layout, ranks: np.ndarray) -> Holdings:
    """Holdings of ``layout`` at ``ranks``: one cell per block, one summand per partial sum (read-only arrays)."""
    lo, hi, cell, summand, replica, held = layout.holdings_of(ranks)
    return Holdings(cell, lo, hi, summand, held, replica, layout.n_summands, layout.n_replicas)


def scattered(layout: Layout, ranks: np.ndarray, split: tuple[int, ...]) -> Holdings:
    """Holdings after a reduce-scatter of partial ``layout`` inside each group of summands.

    Every block is cut nested by ``split`` (:func:`scatter_split`); the rank holding summand
    ``k`` keeps the fully summed sub-block ``k`` (C order).
    """
    base = holdings(layout, ranks)
    sub = np.stack(np.unravel_index(base.summand, split), axis=1) if split else np.zeros((ranks.size, 0), np.int64)
    lo, hi = base.lo.copy(), base.hi.copy()
    for x, p in enumerate(split):
        start, stop = block_range(base.hi[:, x] - base.lo[:, x], p, sub[:, x])
        lo[:, x], hi[:, x] = (base.lo[:, x] + start) * base.held, (base.lo[:, x] + stop) * base.held
    return Holdings(base.cell * np.array(split, dtype=np.int64) + sub, lo, hi, np.zeros_like(base.summand),
                     base.held, base.replica, 1, base.n_replicas)


def _round_slab(held: Holdings, axis: int, rounds: int, t: int) -> Holdings:
    """``held`` with every block cut to its part of round ``t`` of ``rounds``: the balanced sub-range ``t``
    of the block along ``axis`` (the rounds of a block partition it, so they move what the whole move does)."""
    start, stop = block_range(held.hi[:, axis] - held.lo[:, axis], rounds, t)
    lo, hi = held.lo.copy(), held.hi.copy()
    lo[:, axis], hi[:, axis] = held.lo[:, axis] + start, held.lo[:, axis] + stop
    return Holdings(held.cell, lo, hi, held.summand, held.held, held.replica, held.n_summands, held.n_replicas)


def check_pair(src: Layout, dst: Layout, nprocs: int) -> None:
    if src.shape != dst.shape:
        raise DeinsumError(f"redistribution between shapes {src.shape} and {dst.shape}")
    if dst.partial:
        raise DeinsumError(f"destination layout {dst} is partial: redistribution always sums partial sources")
    if max(src.nranks, dst.nranks) > nprocs:
        raise DeinsumError(f"layouts on grids {src.grid} and {dst.grid} do not fit {nprocs} ranks")


def check_rounds(src: Layout, split: tuple[int, ...] | None, rounds: tuple[int, int] | None) -> None:
    """Rounds cut a direct move only: one through a reduce-scatter first (``split``) has two phases."""
    if rounds is not None and split is not None:
        raise DeinsumError(f"a move of partial sums through a reduce-scatter ({src}) does not run in rounds")


def check_rank(rank: int, nprocs: int) -> int:
    if not 0 <= rank < nprocs:
        raise DeinsumError(f"rank {rank} outside a redistribution on {nprocs} ranks")
    return rank


def reduction_words(kind: str, n: int, nprocs: int, ranks) -> tuple[np.ndarray, np.ndarray]:
    """(words sent, words received) at ``ranks`` in an ``MPI_Allreduce`` (``kind`` ``allreduce``) or an
    ``MPI_Reduce`` to rank 0 (``reduce``) of ``n`` words on ``nprocs`` ranks, as the model states them: recursive
    doubling, ceil(log2 P) exchanges of the whole vector on every rank (MPICH's algorithm for short vectors; for
    a long one a reduce-scatter, then an all-gather, moves fewer: :func:`via_scatter` then takes it); a
    binomial tree, each rank receiving the vector from each of its children and sending the sum to its parent.
    Linear in ``n``: a reduction run in parts costs what it costs in one.

    >>> [w.tolist() for w in reduction_words("allreduce", 1, 65536, [0, 9])]
    [[16, 16], [16, 16]]
    >>> [w.tolist() for w in reduction_words("reduce", 2, 5, range(5))]    # 0 <- 1, 2, 4 and 2 <- 3
    [[0, 2, 2, 2, 2], [6, 0, 2, 0, 0]]
    """
    ranks = np.asarray(ranks, dtype=np.int64)
    steps = (nprocs - 1).bit_length()
    if kind == "allreduce":
        every = np.full(ranks.size, n * steps, dtype=np.int64)
        return every, every
    children = np.zeros(ranks.size, dtype=np.int64)
    for k in range(steps):
        children += (ranks % (2 << k) == 0) & (ranks + (1 << k) < nprocs)
    return n * (ranks > 0), n * children


def native_reduction(src: Layout, dst: Layout, nprocs: int) -> str | None:
    """``allreduce`` or ``reduce`` where the direct move of ``src`` to ``dst`` runs that MPI collective on every
    rank: partial sums of the whole tensor (a scalar result's, say) to every rank or to rank 0 only, where the
    busiest rank receives no more than from an ``Alltoallw`` (every summand but one it holds); else None."""
    if nprocs == 1 or src.n_summands == 1 or not math.prod(src.shape) or not _unsplit(src):
        return None
    steps = (nprocs - 1).bit_length()
    if everywhere(dst, nprocs) and steps <= src.n_summands - (src.nranks >= nprocs):
        return "allreduce"
    return "reduce" if on_one_rank(dst) and steps < src.n_summands else None


def _gather_kind(held: Holdings, shape: tuple) -> str | None:
    """``allgather`` where every rank holds a block of one shape, none empty, each :func:`contiguous` in
    ``shape`` and rank ``q``'s ``q`` blocks into it (what ``MPI_Allgather`` places), ``allgatherv`` where such
    blocks are held by some ranks only or lie in another order, else None (MPICH's all-gather of strided blocks
    ran 2.5-2.8x slower than the ``Alltoallw``: scripts/bench_collectives.py)."""
    extents = (held.hi - held.lo)[held.held]
    if not (len(extents) and (extents > 0).all() and (extents == extents[0]).all()
            and contiguous(tuple(extents[0].tolist()), shape)):
        return None
    in_order = held.held.all() and (np.ravel_multi_index(tuple(held.lo.T), shape)
                                    == np.arange(held.held.size) * extents[0].prod()).all()
    return "allgather" if in_order else "allgatherv"


def collectives(src: Layout, dst: Layout, nprocs: int, split: tuple[int, ...] | None = None,
                rounds: tuple[int, int] | None = None) -> tuple:
    """The collective (a key of :data:`COLLECTIVES`) each phase of the move from ``src`` to ``dst`` runs, None
    where it runs one ``Alltoallw`` (``split``, ``rounds`` as in :func:`rank_tables`): ``allreduce`` or
    ``reduce`` for a direct move :func:`native_reduction` takes (each phase); ``allgather`` for distinct contiguous
    blocks of one shape to every rank at once, one per rank in rank order (``allgatherv`` where some rank holds
    none or they lie in another order); ``reduce_scatter`` for the first phase of a move through a
    reduce-scatter of distinct blocks (on the ranks holding one block's summands).

    >>> scalar = Layout((), (4,), (), (0,))                            # a scalar's partial sums
    >>> collectives(scalar, Layout.replicated((), 4), 4), collectives(scalar, Layout.on_root((), 4), 4)
    (('allreduce',), ('reduce',))
    >>> rows = Layout((7, 4), (4,), (0, None))                         # blocks of 2, 2, 2 and 1 rows
    >>> collectives(Layout((8, 4), (4,), (0, None)), Layout.replicated((8, 4), 4), 4), collectives(
    ...     rows, Layout.replicated((7, 4), 4), 4)
    (('allgather',), (None,))
    >>> collectives(Layout((8, 4), (4,), (0, None)), Layout.replicated((8, 4), 5), 5)   # rank 4 holds none
    ('allgatherv',)
    """
    count = rounds[1] if rounds else 1 if split is None else 2
    reduction = native_reduction(src, dst, nprocs) if split is None else None
    if reduction:
        return (reduction,) * count
    if rounds or not distinct(src):
        return (None,) * count
    if split is not None:
        middle = phases(src, dst, nprocs, split)[1][0]
        return "reduce_scatter", (_gather_kind(middle, src.shape) if everywhere(dst, nprocs) else None)
    gather = not src.partial and not on_one_rank(src) and everywhere(dst, nprocs)
    return (_gather_kind(_every(src, nprocs), src.shape) if gather else None,)


def contiguous(subsizes, shape) -> bool:
    """Whether a box of ``subsizes`` in an array of ``shape`` is one run of elements in C order.

    >>> contiguous((2, 8), (4, 8)), contiguous((4, 2), (4, 8)), contiguous((1, 3, 8), (2, 4, 8))
    (True, False, True)
    """
    lead = next((k for k, n in enumerate(subsizes) if n != 1), len(subsizes))
    return tuple(subsizes[lead + 1:]) == tuple(shape[lead + 1:])


def native(table: tuple) -> bool:
    """Whether one phase's table (of :func:`rank_tables`) is a native collective's (it names the collective
    where an ``Alltoallw``'s has its sends; both begin ``in_held, in_shape, out_held, out_shape``)."""
    return isinstance(table[4], str)


@lru_cache(maxsize=64)
def _every(layout: Layout, nprocs: int) -> Holdings:
    """The holdings of every rank (cached: moves share layouts)."""
    return holdings(layout, np.arange(nprocs))


@lru_cache(maxsize=32)
def phases(src: Layout, dst: Layout, nprocs: int, split: tuple[int, ...] | None,
            rounds: tuple[int, int] | None = None) -> tuple:
    """The (source, destination) holdings of every rank, per phase (cached: a move's ranks share them); in
    ``rounds`` ``(axis, T)``, T phases, each bringing one round's part of every destination block."""
    start, end = _every(src, nprocs), _every(dst, nprocs)
    if rounds is not None:
        return tuple((start, _round_slab(end, rounds[0], rounds[1], t)) for t in range(rounds[1]))
    if split is None:
        return ((start, end),)
    middle = scattered(src, np.arange(nprocs), split)
    return (start, middle), (middle, end)


def rank_tables(src: Layout, dst: Layout, nprocs: int, rank: int, split: tuple[int, ...] | None = None,
                rounds: tuple[int, int] | None = None, mpi_collectives: bool = True) -> tuple:
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
    destination, so replicas get bit-identical sums. A phase that runs MPI's own collective
    (:func:`collectives`) has a table that names it instead (see ``_native_phase``); with
    ``mpi_collectives`` False none does (what they replace: ``scripts/bench_collectives.py`` times both).

    >>> rank_tables(Layout.on_root((5,), 2), Layout((5,), (2,), (0,)), 2, 1)   # rank 1 receives 2 words from rank 0
    ((0, (), 1, (2,), (), ((0, (0,), (2,), 0),), ()),)
    """
    check_pair(src, dst, nprocs)
    check_rank(rank, nprocs)
    check_rounds(src, split, rounds)
    kinds = collectives(src, dst, nprocs, split, rounds) if mpi_collectives else itertools.repeat(None)
    return tuple(_rank_phase(a, b, rank) if kind is None else _native_phase(kind, a, b, rank, nprocs)
                 for (a, b), kind in zip(phases(src, dst, nprocs, split, rounds), kinds))


def _native_phase(kind: str, src: Holdings, dst: Holdings, rank: int, nprocs: int) -> tuple:
    """``rank``'s table of a phase that runs MPI's collective ``kind`` (:func:`collectives`): ``(in_held,
    in_shape, out_held, out_shape, kind, pieces, (words sent, words received))``, ``pieces`` = ``((peer, starts,
    subsizes), ...)``, peers numbered in the world. A reduction's (``out_shape``: the vector's, wherever it
    lands): the part of this rank's block it adds (none without a summand, or for a replica's copy); an
    all-gather's: every block and where it lands; a reduce-scatter's: the piece each rank of the group keeps."""
    in_held, out_held = bool(src.held[rank]), bool(dst.held[rank])
    extent = lambda held, r: tuple((held.hi[r] - held.lo[r]).tolist())  # noqa: E731
    at = lambda held, r, origin: tuple((held.lo[r] - origin.lo[rank]).tolist())  # noqa: E731
    if kind in ("allreduce", "reduce"):   # of the whole tensor (or of one part), which rank 0 receives in both
        pieces = ((rank, at(dst, 0, src), extent(dst, 0)),) if in_held and src.replica[rank] == 0 else ()
        sent, received = (int(w[0]) for w in reduction_words(kind, math.prod(extent(dst, 0)), nprocs, [rank]))
        return int(in_held), extent(src, rank) if in_held else (), int(out_held), extent(dst, 0), kind, pieces, (
            sent, received)
    if kind in ("allgather", "allgatherv"):  # every block but its own comes, and as many words leave
        pieces = tuple((q, at(src, q, dst), extent(src, q)) for q in np.flatnonzero(src.held).tolist())
        sent = received = math.prod(extent(dst, rank)) - (math.prod(extent(src, rank)) if in_held else 0)
    else:   # reduce_scatter: the pieces of this rank's block; its own, summed, from every other summand
        group = src.held & (src.cell == src.cell[rank]).all(axis=1) if in_held else np.zeros_like(src.held)
        pieces = tuple((q, at(dst, q, src), extent(dst, q)) for q in np.flatnonzero(group).tolist())
        own = math.prod(extent(dst, rank)) if out_held else 0
        sent, received = (math.prod(extent(src, rank)) - own if in_held else 0), own * (len(pieces) - 1)
    return (int(in_held), extent(src, rank) if in_held else (), int(out_held),
            extent(dst, rank) if out_held else (), kind, pieces, (sent, received))


def _rank_phase(src: Holdings, dst: Holdings, rank: int) -> tuple:
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

    >>> table_words(rank_tables(Layout.on_root((5,), 2), Layout((5,), (2,), (0,)), 2, 0))
    (2, 0)
    """
    return (sum(t[6][0] if native(t) else sum(math.prod(size) for _, _, size in t[4]) for t in tables),
            sum(t[6][1] if native(t) else sum(math.prod(size) for _, _, size, _ in t[5]) for t in tables))
