"""The typed schedule of a Plan: compute steps and moves, each move a sequence of named collectives.

A :class:`Move` takes one tensor from a ``src`` to a ``dst`` layout. It runs as
one or two :class:`Exchange` steps, each with a kind named after the MPI
collective it amounts to (:func:`classify`, a pure function of the layouts)
and the :class:`Communicator` it runs on: every rank (``world``), or the
``Cart_sub`` of a group's grid that holds the partial sums of one block.
A step whose blocks are regular runs MPI's collective of its name (``Allreduce``,
``Allgather(v)``, ``Reduce_scatter``: :func:`deinsum.tables.collectives`), every
other one a subarray ``Alltoallw``, a ``slice`` none: ``Exchange.mpi`` says which.

>>> from deinsum.layout import Layout
>>> classify(Layout.on_root((6, 4), 4), Layout((6, 4), (2, 2), (0, 1)), 4)
'scatter'
>>> partial = Layout((8,), grid=(1, 4), axes=(0,), partial=(1,))
>>> move = Move("t0", "reduce", partial, Layout.replicated((8,), 4), 4, group=0)
>>> [(e.kind, e.comm.name, e.mpi) for e in move.exchanges]     # an allreduce as reduce-scatter + all-gather
[('reduce_scatter', 'grid0_sum', 'Reduce_scatter'), ('allgather', 'world', 'Allgather')]
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .layout import Layout
from .redistribute import Redistribution, plan_redistribution, received_words
from .tables import COLLECTIVES, distinct, everywhere, on_one_rank

#: Every kind of exchange step, named after the collective it amounts to.
KINDS = ("scatter", "broadcast", "gather", "allgather", "transpose", "reduce", "allreduce", "reduce_scatter",
         "redistribute", "slice")


@dataclass(frozen=True)
class Communicator:
    """Where an exchange runs: every rank (no ``grid``), or the ``Cart_sub`` keeping grid dims ``remain`` of the
    Cartesian grid ``grid`` (``Create_cart(grid, reorder=False)`` of the world) of group ``group``, or of a
    pre-pass (``group`` None).

    >>> Communicator((2, 3), (1,), group=0).name, Communicator((2, 3, 2), (0, 2)).name
    ('grid0_sum', 'prepass2x3x2_sum')
    """

    grid: tuple[int, ...] = ()
    remain: tuple[int, ...] = ()
    group: int | None = None

    @property
    def world(self) -> bool:
        """Whether it is every rank."""
        return not self.grid

    @property
    def name(self) -> str:
        """``world``, or ``grid<g>_sum`` (``prepass<dims>_sum`` for a pre-pass's grid): the ranks of that grid that
        hold partial sums of one block."""
        if self.world:
            return "world"
        return f"grid{self.group}_sum" if self.group is not None else f"prepass{'x'.join(map(str, self.grid))}_sum"


WORLD = Communicator()


@dataclass(frozen=True)
class Exchange:
    """One collective step of a move: what it amounts to (one of :data:`KINDS`), where it runs and the MPI call
    that runs it (None for a ``slice``: none)."""

    kind: str
    comm: Communicator
    mpi: str | None = "Alltoallw"


@dataclass(frozen=True)
class Compute:
    """The local steps of one fused group on its grid (``group`` is a :class:`deinsum.plan.GroupPlan`)."""

    group: object


@dataclass(frozen=True)
class Prepass:
    """A unary pre-pass step (``step``, a :class:`deinsum.decompose.Step`: diagonals, sums over indices no other
    operand has, squeezes, transposes) run by every rank on its block of ``src``, making its block of ``dst``
    (see :func:`unary_layouts`); no communication."""

    step: object
    src: Layout
    dst: Layout


def unary_layouts(layout: Layout, sub: str, out: str) -> tuple[Layout, Layout]:
    """``(src, dst)`` of a unary step ``sub -> out`` on an operand held in ``layout``: ``src`` is ``layout`` with
    every repeated index split along one of its axes only (the first one split; the grid dimensions that split
    its other axes nest under it, so blocks keep their size), each rank's block then holding the diagonal of its
    range; ``dst`` is the layout of the blocks the step makes there, partial sums over the grid dimensions that
    split a summed index.

    >>> src, dst = unary_layouts(Layout((4, 4, 6), (2, 2), (0, 1, None)), "iij", "j")
    >>> src.axes, dst
    (((0, 1), None, None), Layout(shape=(6,), grid=(2, 2), axes=(None,), partial=(0, 1)))
    """
    axes = [list(layout.axis_dims(k)) for k in range(len(sub))]
    for c in dict.fromkeys(sub):
        where = [k for k, x in enumerate(sub) if x == c]
        first = next((k for k in where if any(layout.grid[g] > 1 for g in axes[k])), where[0])
        for k in where:
            if k != first:
                axes[first] += axes[k]
                axes[k] = []
    axes = [tuple(dims) if len(dims) > 1 else dims[0] if dims else None for dims in axes]
    src = Layout(layout.shape, layout.grid, tuple(axes), layout.partial)
    position = {c: next((m for m, x in enumerate(sub) if x == c and axes[m] is not None), sub.index(c)) for c in sub}
    summed = tuple(g for k, c in enumerate(sub) if c not in out for g in src.axis_dims(k) if src.grid[g] > 1)
    dst = Layout(tuple(src.shape[position[c]] for c in out), src.grid, tuple(axes[position[c]] for c in out),
                 tuple(sorted(set(src.partial) | set(summed))))
    return src, dst


def _plain_kind(distinct_src: bool, dst: Layout, nprocs: int) -> str:
    if on_one_rank(dst):
        return "gather"
    if everywhere(dst, nprocs):
        return "allgather"
    return "transpose" if distinct_src and distinct(dst) else "redistribute"


def classify(src: Layout, dst: Layout, nprocs: int) -> str:
    """The collective a one-step move from ``src`` to ``dst`` amounts to (one of :data:`KINDS`).

    >>> from deinsum.layout import Layout
    >>> even, root, every = Layout((6, 4), (2, 2), (0, 1)), Layout.on_root((6, 4), 4), Layout.replicated((6, 4), 4)
    >>> classify(even, root, 4), classify(even, every, 4), classify(root, every, 4)
    ('gather', 'allgather', 'broadcast')
    >>> classify(Layout((6, 4), (4,), (0, None)), Layout((6, 4), (4,), (None, 0)), 4)
    'transpose'
    """
    if src.partial:
        if on_one_rank(dst):
            return "reduce"
        if everywhere(dst, nprocs):
            return "allreduce"
        return "reduce_scatter" if distinct(dst) else "redistribute"
    if on_one_rank(src):
        return "broadcast" if everywhere(dst, nprocs) else "scatter"
    return _plain_kind(distinct(src), dst, nprocs)


@dataclass(frozen=True)
class Move:
    """A planned redistribution of one tensor from ``src`` to ``dst`` layout on ``nprocs`` ranks.

    ``phase`` names the timer it counts under; ``group`` is the group whose grid
    made ``src`` (None for an input). The exchange tables are built on first use
    (running or emitting); the volume model answers reports for any number of
    ranks without them. With ``rounds`` ``(axis, T)`` the move runs inside the
    group that reads it, one exchange step per round, each bringing one round's
    part of the destination block along ``axis`` (the same words in all); with
    ``prefetch`` each round's step is posted (nonblocking) before the previous round
    computes, so two rounds' parts are held at once. With
    ``parts`` ``(axis, T)`` (a direct reduction of a group run in rounds) it runs
    where it stands, in T steps whose parts fill the destination block, so that
    its staging holds one part's summands at a time.
    """

    tensor: str
    phase: str
    src: Layout
    dst: Layout
    nprocs: int
    group: int | None = None
    rounds: tuple[int, int] | None = None
    parts: tuple[int, int] | None = None
    prefetch: bool = False

    @cached_property
    def redistribution(self) -> Redistribution:
        return plan_redistribution(self.src, self.dst, self.nprocs, self.rounds or self.parts)

    @cached_property
    def words_received(self) -> np.ndarray:
        """Modeled words each rank receives (vectorised; equal to the tables' counts)."""
        return received_words(self.src, self.dst, self.nprocs)

    @cached_property
    def exchanges(self) -> tuple[Exchange, ...]:
        """The collective steps, in order: a reduce-scatter first where the redistribution sums in two steps.

        The reduce-scatter keeps every block inside the ranks holding its partial
        sums (the output of a group or a pre-pass has one holder per block and summand), so it
        runs on the ``Cart_sub`` of the producing grid over ``src.partial``.
        """
        mpi = [COLLECTIVES.get(kind, "Alltoallw") for kind in self.redistribution.collectives]
        if self.redistribution.split is None:
            if not self.words_received.any():   # no rank receives a word: each takes its part of what it holds
                return (Exchange("slice", WORLD, None),)
            return (Exchange(classify(self.src, self.dst, self.nprocs), WORLD, mpi[0]),)
        sums = WORLD   # (a partial block made by a pre-pass sums on its grid too: it has no group)
        if distinct(self.src):
            sums = Communicator(self.src.grid, tuple(sorted(self.src.partial)), self.group)
        return (Exchange("reduce_scatter", sums, mpi[0]),
                Exchange(_plain_kind(True, self.dst, self.nprocs), WORLD, mpi[1]))

    def table(self, rank: int) -> tuple:
        """``rank``'s table of every exchange step, peers numbered in the world
        (see :func:`deinsum.tables.rank_tables`); the runtime renumbers them in each step's communicator."""
        return self.redistribution.table(rank)

    @property
    def manner(self) -> str:
        """How it runs in steps, if it does: `` in T rounds`` (``, prefetched``) or `` in T parts``."""
        return (f" in {self.rounds[1]} rounds" if self.rounds else "") + (", prefetched" if self.prefetch else "") + (
            f" in {self.parts[1]} parts" if self.parts else "")

    @property
    def label(self) -> str:
        return f"{self.tensor}: {self.phase}{self.manner}"

