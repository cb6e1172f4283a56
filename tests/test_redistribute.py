"""Redistribution planning (pure): piece plans agree with the volume model and, executed in-process, move data exactly."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from deinsum.errors import DeinsumError
from deinsum.layout import Layout
from deinsum.placement import even_layout
from deinsum.redistribute import plan_redistribution, received_words
from deinsum.tables import native, table_words


def box(starts, subsizes):
    return tuple(slice(a, a + n) for a, n in zip(starts, subsizes))


def collective(tables, blocks):
    """Every rank's output of a native collective's phase, as MPI computes it (sums in any order)."""
    new = []
    for rank, (in_held, in_shape, out_held, out_shape, kind, pieces, _) in enumerate(tables):
        assert kind == tables[0][4] and (not in_held or blocks[rank].shape == in_shape)
        out = np.zeros(out_shape, dtype=np.int64)
        if kind in ("allreduce", "reduce"):     # every rank's contribution, added (kept on rank 0 for a reduce)
            for r, (_, _, _, _, _, theirs, _) in enumerate(tables):
                for peer, starts, subsizes in theirs:
                    assert peer == r
                    out += blocks[r][box(starts, subsizes)]
        elif kind in ("allgather", "allgatherv"):   # an allgather's blocks: one per rank, in rank order
            assert kind == "allgatherv" or [(p, np.ravel_multi_index(s, out_shape)) for p, s, _ in pieces] == [
                (r, r * blocks[r].size) for r in range(len(tables))]
            for peer, starts, subsizes in pieces:
                assert blocks[peer].shape == subsizes
                out[box(starts, subsizes)] = blocks[peer]
        elif pieces:                # reduce_scatter: this rank's piece of every member's block
            (starts, subsizes), = [(s, z) for peer, s, z in pieces if peer == rank]
            assert subsizes == out_shape
            out = sum(blocks[peer][box(starts, subsizes)] for peer, _, _ in pieces)
        new.append(out if out_held else None)
    return new


def simulate(plan, blocks):
    """Execute every rank's tables in-process, mirroring ``exchange``; ``blocks[r]`` is rank r's source block."""
    for phase in range(len(plan.table(0))):
        tables = [plan.table(r)[phase] for r in range(plan.nprocs)]
        if native(tables[0]):
            blocks = collective(tables, blocks)
            continue
        new = []
        for rank, (in_held, in_shape, out_held, out_shape, sends, recvs, ops) in enumerate(tables):
            assert not in_held or blocks[rank].shape == in_shape
            out = np.full(out_shape, -7, dtype=blocks[0].dtype if blocks[0] is not None else int) if out_held else None
            staged = {}
            for peer, starts, subsizes, add in recvs:
                (match,) = [s for s in tables[peer][4] if s[0] == rank]
                assert match[2] == subsizes and peer != rank
                piece = blocks[peer][tuple(slice(a, a + n) for a, n in zip(match[1], subsizes))]
                if add:
                    staged[peer] = piece
                else:
                    out[tuple(slice(a, a + n) for a, n in zip(starts, subsizes))] = piece
            for peer, add, src, subsizes, dst in ops:
                piece = blocks[rank][tuple(slice(a, a + n) for a, n in zip(src, subsizes))] if peer == rank \
                    else staged[peer]
                region = tuple(slice(a, a + n) for a, n in zip(dst, subsizes))
                out[region] = out[region] + piece if add else piece
            new.append(out)
        blocks = new
    return blocks


def source_blocks(layout, nprocs, x):
    """Rank blocks of ``x`` in ``layout``; partial summand k holds ``(k + 1) * block`` (exact in integers)."""
    summand = layout.summand_index(np.arange(nprocs))
    return [None if layout.block(r) is None else x[layout.block(r)] * (summand[r] + 1) for r in range(nprocs)]


def layouts(shape, nprocs):
    """A deterministic zoo of layouts of ``shape`` on at most ``nprocs`` ranks."""
    nd = len(shape)
    zoo = [even_layout(shape, nprocs), Layout.on_root(shape, nprocs), Layout.replicated(shape, nprocs)]
    for rows in range(1, nprocs + 1):
        cols = nprocs // rows
        zoo.append(Layout(shape, (rows, cols), tuple([None] * (nd - 1) + [1]) if nd else ()))
        if nd >= 2:
            zoo.append(Layout(shape, (rows, cols, 1), (1, 0) + (None,) * (nd - 2)))
    return zoo


@st.composite
def layout_pairs(draw, ranks=st.integers(1, 9), extent=7, side=4):
    """``(src, dst, nprocs)``: layouts of one shape (sides up to ``extent``) on grids of sides up to ``side``."""
    nprocs = draw(ranks)
    shape = tuple(draw(st.lists(st.integers(0, extent), min_size=0, max_size=3)))

    def layout(partial_ok):
        grid = tuple(draw(st.lists(st.integers(1, side), min_size=1, max_size=4 if side > 4 else 3)))
        while math.prod(grid) > nprocs:
            grid = grid[:-1] or (1,)
        dims = list(range(len(grid)))
        axes = tuple(dims.pop(draw(st.integers(0, len(dims) - 1))) if dims and draw(st.booleans()) else None
                     for _ in shape)
        partial = tuple(g for g in dims if partial_ok and draw(st.booleans()))
        return Layout(shape, grid, axes, partial)

    return layout(True), layout(False), nprocs


@settings(max_examples=300, deadline=None)
@given(layout_pairs())
def test_plan_moves_data_exactly_and_matches_model(pair):
    src, dst, nprocs = pair
    plan = plan_redistribution(src, dst, nprocs)
    x = np.arange(1, math.prod(src.shape) + 1, dtype=np.int64).reshape(src.shape)
    result = simulate(plan, source_blocks(src, nprocs, x))
    expect = x * (src.n_summands * (src.n_summands + 1) // 2)
    for rank in range(nprocs):
        block = dst.block(rank)
        assert (result[rank] is None) == (block is None)
        if block is not None:
            assert np.array_equal(result[rank], expect[block])
    # every rank's tables move exactly what the vectorised models say
    assert [table_words(plan.table(r)) for r in range(nprocs)] == list(zip(plan.words_sent, plan.words_received))
    assert plan.words_received == tuple(received_words(src, dst, nprocs).tolist())
    assert sum(plan.words_sent) == sum(plan.words_received)
    assert all(plan.bytes_received(r, 8) == 8 * plan.words_received[r] for r in range(nprocs))


@settings(max_examples=40, deadline=None)
@given(layout_pairs(ranks=st.integers(257, 1200), extent=40, side=12))
def test_the_model_at_every_rank_equals_it_rank_by_rank(pair):
    """Past KEPT_RANKS ranks the volume model reads the layouts' blocks axis by axis (no ranks x axes arrays: a
    million ranks): it says what it says a few ranks at a time, and what the ranks' own tables move."""
    src, dst, nprocs = pair
    every = received_words(src, dst, nprocs).tolist()
    assert every == sum((received_words(src, dst, nprocs, np.arange(a, min(a + 200, nprocs))).tolist()
                         for a in range(0, nprocs, 200)), [])
    assert received_words(src, dst, nprocs, np.arange(1, nprocs)).tolist() == every[1:]   # not from rank 0
    plan = plan_redistribution(src, dst, nprocs)
    ranks = (0, nprocs // 2, nprocs - 1)
    assert [table_words(plan.table(r))[1] for r in ranks] == [every[r] for r in ranks]


@pytest.mark.parametrize("shape", [(7,), (5, 1, 3), (2, 11), (1,), (), (0, 3)])
@pytest.mark.parametrize("nprocs", [1, 2, 3, 5, 6, 8])
def test_layout_zoo_round_trips(shape, nprocs):
    x = np.arange(math.prod(shape), dtype=np.int32).reshape(shape)
    zoo = layouts(shape, nprocs)
    for src in zoo:
        for dst in zoo:
            plan = plan_redistribution(src, dst, nprocs)
            result = simulate(plan, source_blocks(src, nprocs, x))
            for r in range(nprocs):   # a 0-d block is (), which is falsy: compare with None
                assert (result[r] is None) == (dst.block(r) is None)
                if dst.block(r) is not None:
                    assert result[r].shape == x[dst.block(r)].shape and np.array_equal(result[r], x[dst.block(r)])


def test_local_data_costs_nothing():
    shape = (6, 5)
    assert plan_redistribution(even_layout(shape, 4), even_layout(shape, 4), 4).max_words_received == 0
    assert plan_redistribution(Layout.replicated(shape, 4), even_layout(shape, 4), 4).max_words_received == 0
    scatter = plan_redistribution(Layout.on_root(shape, 4), even_layout(shape, 4), 4)
    assert scatter.words_sent[0] == 30 - math.prod(even_layout(shape, 4).local_shape(0))
    assert scatter.words_received[1:] == tuple(math.prod(even_layout(shape, 4).local_shape(r)) for r in (1, 2, 3))


@pytest.mark.parametrize("fan_in", [2, 3, 4, 8])
def test_allreduce_is_reduce_scatter_then_allgather(fan_in):
    n = 3 * 24
    partial = Layout((n,), (3, fan_in), (0,), (1,))
    plan = plan_redistribution(partial, Layout((n,), (3, fan_in), (0,)), 3 * fan_in)
    block = n // 3
    assert set(plan.words_received) == {2 * block * (fan_in - 1) // fan_in}
    assert plan.method == ("direct" if fan_in == 2 else "reduce-scatter (MPI_Reduce_scatter), then direct")


def test_a_scalar_results_reduction_costs_log_p_words():
    """The 6-operand ring's last move at P = 65,536 (3840 partial sums of a scalar on grid (64, 60)) runs
    MPI_Allreduce to every rank, MPI_Reduce to rank 0: 16 words (128 B) per rank at most in the model and in
    every rank's table (recursive doubling; a binomial tree), where all-to-all it was 3840."""
    src = Layout((), (64, 60), (), (0, 1))
    for dst, kind in ((Layout.replicated((), 65536), "allreduce"), (Layout.on_root((), 65536), "reduce")):
        plan = plan_redistribution(src, dst, 65536)
        assert plan.collectives == (kind,) and plan.max_words_received * 8 == 128
        assert sum(plan.words_sent) == sum(plan.words_received)
        for rank in (0, 1, 3839, 3840, 65535):
            assert table_words(plan.table(rank)) == (plan.words_sent[rank], plan.words_received[rank])
    few = plan_redistribution(Layout((), (2,), (), (0,)), Layout.replicated((), 64), 64)   # 6 steps for 2 summands
    assert few.collectives == (None,) and few.max_words_received == 2


def test_reduce_to_root_uses_reduce_scatter():
    partial = Layout((16, 4), (4,), (None, None), (0,))
    plan = plan_redistribution(partial, Layout.on_root(partial.shape, 4), 4)
    assert plan.method == "reduce-scatter (MPI_Reduce_scatter), then direct"
    assert plan.words_received[0] == 3 * 16 + (64 - 16)


def test_replicas_share_the_sending():
    src = Layout.replicated((12,), 4)
    dst = Layout((12,), (1, 4), (None,))
    plan = plan_redistribution(Layout((12,), (2, 2), (0,)), Layout.replicated((12,), 4), 4)
    assert plan_redistribution(src, dst, 4).max_words_received == 0
    assert max(plan.words_sent) == min(plan.words_sent) == 6


def test_tables_are_plain_ints():
    plan = plan_redistribution(Layout((5, 3), (2, 2), (0, None), (1,)), even_layout((5, 3), 4), 4)

    def plain(value):
        return isinstance(value, tuple) and all(plain(v) for v in value) or type(value) is int

    assert all(plain(plan.table(r)) for r in range(4))
    assert eval(repr(plan.table(2))) == plan.table(2)


def test_readable_summary():
    text = str(plan_redistribution(even_layout((6, 4), 4), Layout.on_root((6, 4), 4), 4))
    assert "6x4" in text and "max 18 words/rank" in text


@pytest.mark.parametrize("call, message", [
    (lambda: plan_redistribution(even_layout((3,), 2), even_layout((4,), 2), 2), "between shapes"),
    (lambda: plan_redistribution(even_layout((4,), 2), Layout((4,), (2,), (None,), (0,)), 2), "is partial"),
    (lambda: plan_redistribution(even_layout((4,), 4), even_layout((4,), 2), 2), "do not fit 2 ranks"),
    (lambda: plan_redistribution(even_layout((4,), 2), even_layout((4,), 2), 2).table(2), "rank 2 outside"),
])
def test_bad_input_is_a_one_line_deinsum_error(call, message):
    with pytest.raises(DeinsumError, match=message) as info:
        call()
    assert "\n" not in str(info.value)



SCALE = 4096
SCALE_CASES = [   # MTTKRP 64^3 x 8 on a 16^3 grid: scatter, a replicated factor re-split, the partial result to rank 0
    (Layout.on_root((64, 64, 64), SCALE), Layout((64, 64, 64), (16, 16, 16), (0, 1, 2))),
    (Layout((64, 8), (16, 16, 16, 1), (1, None)), Layout((64, 8), (16, 16, 16, 1), (0, None))),
    (Layout((64, 8), (16, 16, 16, 1), (0, None), (1, 2)), Layout.on_root((64, 8), SCALE)),
]


@pytest.mark.parametrize("src, dst", SCALE_CASES)
def test_each_rank_builds_its_own_tables_and_they_match_the_models(src, dst):
    """At P = 4096 a rank's tables, built from the two layouts alone, move what the vectorised models say."""
    plan = plan_redistribution(src, dst, SCALE)
    for rank in (0, 1, 2049, SCALE - 1):
        assert table_words(plan.table(rank)) == (plan.words_sent[rank], plan.words_received[rank])
    assert sum(plan.words_sent) == sum(plan.words_received) > 0
