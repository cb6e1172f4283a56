"""The typed schedule: move kinds from the layouts, communicators, tables whose steps stay inside them."""
import math

import numpy as np
import pytest

import deinsum
from deinsum.layout import Layout
from deinsum.placement import even_layout
from deinsum.schedule import KINDS, WORLD, Compute, Move, classify
from deinsum.tables import contiguous

SHAPE, P = (6, 4), 4
EVEN, ROOT, EVERY = even_layout(SHAPE, P), Layout.on_root(SHAPE, P), Layout.replicated(SHAPE, P)
ROWS, COLS = Layout(SHAPE, (4,), (0, None)), Layout(SHAPE, (4,), (None, 0))
PARTIAL = Layout(SHAPE, (1, 4), (0, None), (1,))
HALF = Layout(SHAPE, (2, 2), (0, None))          # rows split in 2, each block on 2 ranks


@pytest.mark.parametrize("src, dst, kind", [
    (ROOT, EVEN, "scatter"), (ROOT, EVERY, "broadcast"), (EVEN, ROOT, "gather"), (ROWS, EVERY, "allgather"),
    (ROWS, COLS, "transpose"), (HALF, COLS, "redistribute"), (PARTIAL, ROOT, "reduce"),
    (PARTIAL, EVERY, "allreduce"), (PARTIAL, COLS, "reduce_scatter"), (PARTIAL, HALF, "redistribute"),
])
def test_kinds_follow_the_layouts(src, dst, kind):
    assert classify(src, dst, P) == kind and kind in KINDS


def test_a_two_step_reduction_runs_its_reduce_scatter_on_the_groups_cart_sub():
    move = Move("t0", "reduce", Layout((64,), (2, 4), (0,), (1,)), Layout.replicated((64,), 8), 8, group=3)
    (first, second) = move.exchanges
    assert (first.kind, first.comm.name, first.comm.remain) == ("reduce_scatter", "grid3_sum", (1,))
    assert (second.kind, second.comm) == ("allgather", WORLD)
    assert [e.mpi for e in move.exchanges] == ["Reduce_scatter", "Allgather"]   # blocks of 8, pieces of 2
    grid = np.arange(8).reshape(2, 4)
    for rank in range(8):
        table = move.table(rank)[0]
        row = grid[rank // 4].tolist()                # the ranks of rank's Cart_sub over grid dim 1
        assert table[4] == "reduce_scatter" and [p for p, *_ in table[5]] == row   # its pieces: those ranks'
        assert len(move.table(rank)) == len(move.exchanges)           # one table per collective step


def test_a_plans_schedule_is_typed_values_in_order():
    plan = deinsum.compile("ij,jk,kl->il", (30, 20), (20, 10), (10, 5)).plan(nprocs=6, inputs="root", result="root")
    assert all(isinstance(item, (Move, Compute)) for item in plan.schedule)
    computes = [item.group.index for item in plan.schedule if isinstance(item, Compute)]
    assert computes == list(range(len(plan.groups)))
    for move in plan.moves:
        assert all(e.kind in KINDS for e in move.exchanges)
        assert move.group is None if move.tensor.startswith("in") else move.group in computes
        for e in move.exchanges:
            assert e.comm == WORLD or math.prod(e.comm.grid) <= 6


def test_a_move_that_moves_nothing_calls_no_collective():
    """Whole inputs cut to a grid's blocks: every rank takes its part of what it holds, named ``slice`` in the
    listing, and the runtime makes no MPI call for it."""
    prog = deinsum.compile("ijk,ja,ka->ia", (96, 80, 64), (80, 12), (64, 12))
    plan = prog.plan(nprocs=4)
    nothing = [m for m in plan.moves if not m.words_received.any()]
    assert nothing and all([e.kind for e in m.exchanges] == ["slice"] for m in nothing)
    assert all(e.kind != "slice" for m in plan.moves if m.words_received.any() for e in m.exchanges)
    assert all(e.mpi is None for m in nothing for e in m.exchanges)
    from deinsum.emit import generate
    assert "= rt.slice(in1, move=0, comm=rt.world)  # no MPI call: a local slice" in generate(plan)


@pytest.mark.slow
def test_the_suites_regular_moves_run_the_mpi_collective_of_their_name():
    """The suite at 64 (sizes 64) on P = 64 and 4096, both entry/exit modes: every reduce-scatter on a group's
    Cart_sub runs MPI_Reduce_scatter, every all-gather of distinct contiguous blocks of one shape
    MPI_Allgather(v) (of strided ones the Alltoallw), every reduction of unsplit partial sums to every rank (or
    rank 0) no worse than all-to-all MPI_Allreduce (Reduce); a step that runs a collective moves words, one
    that moves none runs no MPI call."""
    from suite import SUITE
    seen = set()
    for nprocs in (64, 4096):
        for eq, sizes in SUITE.values():
            shapes = [tuple(64 for _ in term) for term in eq.split("->")[0].split(",")]
            for inputs, result in (("root", "root"), ("global", "all")):
                plan = deinsum.compile(eq, *shapes).plan(nprocs=nprocs, inputs=inputs, result=result)
                for m in plan.moves:
                    blocks = {m.src.local_shape(r) for r in range(min(m.src.nranks, nprocs))}
                    for step, e in enumerate(m.exchanges):
                        if e.comm.group is not None:
                            assert (e.kind, e.mpi) == ("reduce_scatter", "Reduce_scatter")
                        elif e.kind == "allgather" and step == 0 and m.src.n_replicas == 1 and len(blocks) == 1:
                            regular = contiguous(*blocks, m.src.shape)   # (strided blocks: an Alltoallw)
                            assert e.mpi in (("Allgather", "Allgatherv") if regular else ("Alltoallw",)), m
                        elif e.kind in ("allreduce", "reduce") and not m.src.split_dims and m.src.n_summands > 12:
                            assert e.mpi == e.kind.capitalize(), m
                        assert (e.mpi is None) == (not m.words_received.any()), m
                        seen.add(e.mpi)
    assert {"Reduce_scatter", "Allgather", "Alltoallw"} <= seen
