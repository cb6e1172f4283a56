"""Layouts and the grid planner (pure, no ranks)."""
import doctest
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import deinsum.grids
from deinsum.errors import DeinsumError
from deinsum.grids import (GridChoice, Layout, block_bounds, grid_volume, ordered_factorisations, plan_grid)
from deinsum.redistribute import plan_redistribution

MM = ("ijk", ("ij", "jk"), "ik")
MTTKRP3 = ("ijka", ("ijk", "ja", "ka"), "ia")


def mm_sizes(n):
    return dict(i=n, j=n, k=n)


def mttkrp_sizes(i, r):
    return dict(i=i, j=i, k=i, a=r)


# ----------------------------------------------------------------------------- blocks and layouts

@given(st.integers(0, 50), st.integers(1, 60))
def test_block_bounds_are_balanced(n, p):
    bounds = block_bounds(n, p)
    sizes = np.diff(bounds)
    assert bounds[0] == 0 and bounds[-1] == n and len(bounds) == p + 1
    assert sizes.max() - sizes.min() <= 1 and list(sizes) == sorted(sizes, reverse=True)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=0, max_size=4), st.integers(1, 40))
def test_even_layout_partitions_the_tensor_over_all_ranks(shape, nprocs):
    layout = Layout.even(tuple(shape), nprocs)
    assert layout.replicated_dims == () or math.prod(layout.grid) == 1
    count = np.zeros(shape, dtype=int)
    for rank in range(nprocs):
        block = layout.block(rank)
        if block is not None:
            count[block] += 1
    assert (count == 1).all()
    assert layout.nranks == (nprocs if shape else 1)
    lo, hi = layout.boxes(nprocs)
    assert [tuple(hi[r] - lo[r]) for r in range(layout.nranks)] == [layout.local_shape(r) for r in range(layout.nranks)]


def test_even_layout_choices():
    assert Layout.even((10, 10, 10), 8).grid == (2, 2, 2)
    assert Layout.even((3, 4), 7).grid == (1, 7)           # prime larger than every axis: empty blocks
    assert Layout.even((3, 4), 7).local_shape(6) == (3, 0)
    assert Layout.even((), 5) == Layout.on_root((), 5)


def test_layout_blocks_replicas_and_idle_ranks():
    layout = Layout((5, 7), grid=(2, 3), axes=(None, 0), partial=(1,))
    assert layout.block(4) == (slice(0, 5), slice(4, 7))
    assert layout.local_shape(0) == (5, 4)
    assert layout.block(6) is None and layout.local_shape(9) is None
    assert layout.n_summands == 3 and list(layout.summand_index(7)) == [0, 1, 2, 0, 1, 2, 0]
    assert Layout.on_root((2, 2), 3).block(1) is None
    assert Layout.replicated((2, 2), 3).block(2) == (slice(0, 2), slice(0, 2))
    assert "5x7 on grid (2, 3)" in str(layout)
    assert hash(layout) == hash(Layout([5, 7], [2, 3], [None, 0], [1]))


@pytest.mark.parametrize("make, message", [
    (lambda: Layout((3,), (2,), (0, None)), "2 axes given"),
    (lambda: Layout((3, 3), (2,), (0, 0)), "splits two tensor axes"),
    (lambda: Layout((3,), (2,), (1,)), "grid dimension 1 does not exist"),
    (lambda: Layout((3,), (0,), (None,)), "layout grid must be"),
    (lambda: Layout((3,), (2,), (0,), (0,)), "partial"),
    (lambda: Layout((-1,), (2,), (0,)), "layout shape must be"),
    (lambda: Layout.even((3,), 0), "nprocs must be"),
    (lambda: Layout((4,), (2,), (0,)).block(-1), "rank must be"),
    (lambda: block_bounds(3, 0), "p must be"),
])
def test_bad_layouts_are_one_line_deinsum_errors(make, message):
    with pytest.raises(DeinsumError, match=message) as info:
        make()
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("n, caps", [(12, (12, 12, 12)), (30, (5, 6, 30)), (7, (3, 3)), (1, ()), (64, (4, 4, 4)),
                                     (13, (13, 1, 13))])
def test_ordered_factorisations_are_complete(n, caps):
    brute = {row for row in itertools.product(*(range(1, c + 1) for c in caps)) if math.prod(row) == n}
    got = [tuple(row) for row in ordered_factorisations(n, caps).tolist()]
    assert sorted(got) == sorted(brute) and len(got) == len(brute)


# ----------------------------------------------------------------------------- the grid planner

def exhaustive(indices, sizes, inputs, output, nprocs):
    """Best (volume, dims) over every grid on 1..nprocs ranks with dims[v] <= sizes."""
    rows = [row for row in itertools.product(*(range(1, max(1, sizes[c]) + 1) for c in indices))
            if math.prod(row) <= nprocs]
    return {row: grid_volume(indices, sizes, inputs, output, nprocs, row) for row in rows}


@pytest.mark.parametrize("kernel, sizes", [
    (MM, mm_sizes(6)), (MM, dict(i=7, j=1, k=5)), (MTTKRP3, mttkrp_sizes(5, 3)), (("ijk", ("ij", "jk"), "ijk"), mm_sizes(4)),
])
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4, 6, 7, 8, 11])
def test_branch_and_bound_finds_the_best_grid_of_the_searched_counts(kernel, sizes, nprocs):
    indices, inputs, output = kernel
    choice = plan_grid(indices, sizes, inputs, output, nprocs)
    volumes = exhaustive(indices, sizes, inputs, output, nprocs)
    counts = {int(c) for c in choice.reason.split(" grids on ")[1].split(" ranks")[0].split(", ")}
    assert nprocs in counts or not any(math.prod(row) == nprocs for row in volumes)
    searched = {row: v for row, v in volumes.items() if math.prod(row) in counts}
    assert choice.volume == volumes[choice.dims] == min(searched.values())
    assert choice.used == math.prod(choice.dims) and choice.idle == nprocs - choice.used
    if choice.idle:
        assert choice.volume < min((v for row, v in volumes.items() if math.prod(row) == nprocs), default=math.inf)


KERNELS = [MM, MTTKRP3, ("ijka", ("ijk", "ia", "ja"), "ka"), ("ijk", ("ij", "jk"), "ijk"), ("ij", ("ij",), "")]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(KERNELS), st.lists(st.integers(0, 9), min_size=4, max_size=4), st.integers(1, 40),
       st.data())
def test_pruning_bounds_never_exceed_the_exact_volume(kernel, extents, nprocs, data):
    """Branch and bound is exact only if the sampled bounds are lower bounds, also for partial sources."""
    indices, inputs, output = kernel
    sizes = dict(zip(indices, extents))

    def source(t):
        shape = tuple(sizes[c] for c in t)
        fan_in = data.draw(st.sampled_from([1, 2, 3]))
        if fan_in == 1 or not shape or fan_in > nprocs:
            return None
        return Layout(shape, (nprocs // fan_in, fan_in), (0,) + (None,) * (len(shape) - 1), (1,))

    sources = [source(t) for t in inputs]
    model = deinsum.grids._GroupModel.build(indices, sizes, inputs, output, nprocs, sources, None)
    candidates, _ = deinsum.grids._candidate_grids(nprocs, tuple(max(1, sizes[c]) for c in indices))
    rows = candidates[data.draw(st.lists(st.integers(0, len(candidates) - 1), min_size=1, max_size=5))]
    exact = [model.volume(tuple(int(p) for p in row)) for row in rows]
    assert (model.lower_bound(rows, exact_scatter=False) <= exact).all()
    assert (model.lower_bound(rows, exact_scatter=True) <= exact).all()


@pytest.mark.parametrize("nprocs", [1, 3, 4, 6])
def test_volume_is_the_executed_redistributions(nprocs):
    """grid_volume = max over ranks of the planned input and output redistributions' words."""
    indices, inputs, output = MTTKRP3
    sizes = mttkrp_sizes(5, 3)
    choice = plan_grid(indices, sizes, inputs, output, nprocs)
    words = np.zeros(nprocs, dtype=int)
    for t in inputs:
        shape = tuple(sizes[c] for c in t)
        words += plan_redistribution(Layout.even(shape, nprocs), choice.layout(t, sizes), nprocs).words_received
    out = choice.layout(output, sizes)
    words += plan_redistribution(out, Layout.even(out.shape, nprocs), nprocs).words_received
    assert words.max() == choice.volume


def test_paper_checkpoint_mttkrp_sizes_10():
    indices, inputs, output = MTTKRP3
    choice = plan_grid(indices, mttkrp_sizes(10, 10), inputs, output, 8)
    assert choice.dims == (2, 2, 2, 1) and choice.reduction_dims == (1, 2)


@pytest.mark.parametrize("nprocs, paper, ours", [(16, (2, 2, 4), (4, 1, 4)), (32, (2, 4, 4), (4, 2, 4)),
                                                 (8, (2, 2, 2), (4, 1, 2)), (64, (4, 4, 4), (4, 4, 4)),
                                                 (512, (8, 8, 8), (8, 8, 8))])
def test_paper_checkpoint_1mm_weak_scaling(nprocs, paper, ours):
    """1MM at N = 4096 P^(1/3): the paper's (2,2,4) at 16 ranks and (2,4,4) at 32 ranks versus ours.

    Our model starts every input evenly distributed over all ranks (no
    replication; the paper pre-replicated inputs in the compute layout and did
    not time it) and ends the output evenly distributed. At P=16 the grid
    (4,1,4) lines up exactly with the even 4x4 layouts of A, B and C: every
    rank already owns 1/16 of each block it needs and nothing is reduced,
    0.375 N^2 words/rank against 0.4375 N^2 for (2,2,4), whose blocks straddle
    the owners'. Likewise (4,2,4) beats (2,4,4) at P=32 and (4,1,2), aligned
    with the even 4x2 layouts, beats (2,2,2) at P=8 (0.5 N^2 against
    0.625 N^2). At P = 64 and 512 we reproduce the paper.
    """
    n = round(4096 * nprocs ** (1 / 3))
    indices, inputs, output = MM
    choice = plan_grid(indices, mm_sizes(n), inputs, output, nprocs)
    assert choice.dims == ours
    paper_volume = grid_volume(indices, mm_sizes(n), inputs, output, nprocs, paper)
    assert choice.volume < paper_volume if ours != paper else choice.volume == paper_volume


@pytest.mark.parametrize("nprocs", [7, 11, 13])
@pytest.mark.parametrize("kernel, sizes", [(MM, mm_sizes(4096)), (MTTKRP3, mttkrp_sizes(1024, 24))])
def test_no_idle_ranks_unless_explained(kernel, sizes, nprocs):
    indices, inputs, output = kernel
    choice = plan_grid(indices, sizes, inputs, output, nprocs)
    if choice.idle:
        # the reason names the best all-rank grid; check that it really costs more
        full = tuple(int(p) for p in choice.reason.split("ranks, (")[1].split(")")[0].split(","))
        assert math.prod(full) == nprocs
        assert grid_volume(indices, sizes, inputs, output, nprocs, full) > choice.volume
        assert choice.reason.startswith(f"{choice.idle} idle rank")
    else:
        assert choice.reason.startswith(f"all {nprocs} ranks busy")


def test_idle_ranks_when_no_grid_fits():
    choice = plan_grid("ij", dict(i=2, j=2), ("ij",), "ij", 5)
    assert choice.idle and "no grid of 5 ranks fits" in choice.reason


def test_tile_breaks_ties_and_planning_is_deterministic():
    """Outer product, inputs everywhere, output wanted everywhere: (4,1), (2,2), (1,4) all cost the same."""
    sizes = dict(i=8, j=8)
    ends = dict(sources=[Layout.replicated((8,), 4)] * 2, target=Layout.replicated((8, 8), 4))
    wide = plan_grid("ij", sizes, ("i", "j"), "ij", 4, tile={"i": 1, "j": 8}, **ends)
    tall = plan_grid("ij", sizes, ("i", "j"), "ij", 4, tile={"i": 8, "j": 1}, **ends)
    square = plan_grid("ij", sizes, ("i", "j"), "ij", 4, **ends)
    assert wide.volume == tall.volume == square.volume
    assert (wide.dims, tall.dims, square.dims) == ((4, 1), (1, 4), (2, 2))
    assert plan_grid("ij", sizes, ("i", "j"), "ij", 4) == plan_grid("ij", sizes, ("i", "j"), "ij", 4)


def test_source_and_target_layouts_steer_the_grid():
    sizes = mm_sizes(12)
    indices, inputs, output = MM
    replicated = [Layout.replicated((12, 12), 4)] * 2
    choice = plan_grid(indices, sizes, inputs, output, 4, sources=replicated, target=Layout((12, 12), (2, 1, 2), (0, 2)))
    assert choice.volume == 0 and choice.dims == (2, 1, 2)


def test_grid_choice_layouts():
    choice = GridChoice("ijka", (2, 2, 2, 1), "ia", 8, 0, "")
    sizes = mttkrp_sizes(10, 10)
    assert choice.layout("ia", sizes) == Layout((10, 10), (2, 2, 2, 1), (0, 3), (1, 2))
    assert choice.layout("ja", sizes) == Layout((10, 10), (2, 2, 2, 1), (1, 3))
    assert choice.layout("ia", sizes, partial=False).partial == ()
    assert GridChoice("ijk", (2, 1, 2), "ik", 4, 0, "").layout("ik", mm_sizes(3)).partial == ()
    assert "i=2, j=2, k=2, a=1" in str(choice)


@pytest.mark.parametrize("call, message", [
    (lambda: plan_grid("iji", mm_sizes(2), ("ij",), "i", 2), "repeated index"),
    (lambda: plan_grid("ij", dict(i=2), ("ij",), "i", 2), "no size given for index 'j'"),
    (lambda: plan_grid("ij", dict(i=2, j=2), ("ik",), "i", 2), "'ik' has an index outside"),
    (lambda: plan_grid("ij", dict(i=2, j=2), "ij", "i", 2), "sequence of subscripts"),
    (lambda: plan_grid("ij", dict(i=2, j=-1), ("ij",), "i", 2), "size of index 'j'"),
    (lambda: plan_grid("ij", dict(i=2, j=2), ("ij",), "i", 0), "nprocs must be"),
    (lambda: plan_grid("ij", dict(i=2, j=2), ("ij",), "i", 2, sources=[Layout.even((3, 2), 2)]), "does not fit"),
    (lambda: grid_volume("ij", dict(i=2, j=2), ("ij",), "i", 2, (2, 2)), "does not fit"),
    (lambda: GridChoice("ij", (1, 1), "i", 1, 0, "").layout("ik", dict(i=1, k=1)), "unknown index 'k'"),
])
def test_bad_group_is_a_one_line_deinsum_error(call, message):
    with pytest.raises(DeinsumError, match=message) as info:
        call()
    assert "\n" not in str(info.value)


ORDER5 = dict(i=381, j=381, k=381, l=381, m=381, a=152, b=152, c=152, d=152, e=152)
SUITE_65536 = {
    "1MM": ("ijk", ("ij", "jk"), "ik", mm_sizes(165140)),
    "MTTKRP-O3-M0": ("ijka", ("ijk", "ja", "ka"), "ia", mttkrp_sizes(16384, 384)),
    "MTTKRP-O3-M2": ("ijka", ("ijk", "ia", "ja"), "ka", mttkrp_sizes(16384, 384)),
    "MTTKRP-O5-M0": ("ijklma", ("ijklm", "ja", "ka", "la", "ma"), "ia", ORDER5),
    "MTTKRP-O5-M4": ("ijklma", ("ijklm", "ia", "ja", "ka", "la"), "ma", ORDER5),
    "TTMc-O5 step": ("ijklme", ("ijklm", "me"), "ijkle", ORDER5),
    "TTMc-O5 fused (9 indices)": ("ijklmbcde", ("ijklm", "jb", "kc", "ld", "me"), "ibcde", ORDER5),
}


@pytest.mark.parametrize("name", SUITE_65536)
def test_plans_65536_ranks(name):
    """Weak-scaled suite sizes at P = 65536 plan without ranks and use them all
    (its speed target, <= 1 s, is measured by scripts/bench_planning.py)."""
    indices, inputs, output, sizes = SUITE_65536[name]
    choice = plan_grid(indices, {c: sizes[c] for c in indices}, inputs, output, 65536)
    assert choice.used == 65536


def test_doctests():
    assert doctest.testmod(deinsum.grids).failed == 0
