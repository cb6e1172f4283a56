"""Layouts and the grid planner (pure, no ranks)."""
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from deinsum.errors import DeinsumError
from deinsum.grids import GridChoice, candidate_grids, estimate_words, ordered_factorisations
from deinsum.layout import Layout, block_bounds
from deinsum.placement import even_layout, spread

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
    layout = even_layout(tuple(shape), nprocs)
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
    assert even_layout((10, 10, 10), 8).grid == (2, 2, 2)
    assert even_layout((3, 4), 7).grid == (1, 7)           # prime larger than every axis: empty blocks
    assert even_layout((3, 4), 7).local_shape(6) == (3, 0)
    assert even_layout((), 5) == Layout.on_root((), 5)


def test_layout_blocks_replicas_and_idle_ranks():
    layout = Layout((5, 7), grid=(2, 3), axes=(None, 0), partial=(1,))
    assert layout.block(4) == (slice(0, 5), slice(4, 7))
    assert layout.local_shape(0) == (5, 4)
    assert layout.block(6) is None and layout.local_shape(9) is None
    assert layout.n_summands == 3 and list(layout.summand_index(np.arange(7))) == [0, 1, 2, 0, 1, 2, 0]
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
    (lambda: even_layout((3,), 0), "nprocs must be"),
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


# ----------------------------------------------------------------------------- nested layouts

@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=3), st.lists(st.integers(1, 4), min_size=1, max_size=3),
       st.data())
def test_spread_layouts_partition_the_tensor(shape, grid, data):
    """A compute-grid layout spread over its replication dims: every element on exactly one rank."""
    shape, grid = tuple(shape), tuple(grid)
    axes = [None] * len(shape)
    for g in data.draw(st.permutations(range(len(grid)))):
        x = data.draw(st.integers(-1, len(shape) - 1))
        if x >= 0 and axes[x] is None:
            axes[x] = g
    home = spread(Layout(shape, grid, tuple(axes)))
    assert home.replicated_dims == tuple(g for g in range(len(grid)) if grid[g] == 1 and g not in home.split_dims)
    count = np.zeros(shape, dtype=int)
    for rank in range(home.nranks):
        count[home.block(rank)] += 1
    assert (count == 1).all()
    lo, hi = home.boxes(home.nranks)
    assert [tuple(h - l) for l, h in zip(lo, hi)] == [home.local_shape(r) for r in range(home.nranks)]


def test_nested_blocks_refine_the_outer_split():
    outer = Layout((10, 4), (2, 3), (0, None))
    inner = Layout((10, 4), (2, 3), ((0, 1), None))
    for rank in range(6):
        o, i = outer.block(rank)[0], inner.block(rank)[0]
        assert o.start <= i.start <= i.stop <= o.stop
    assert inner.axis_bounds(0) == (0, 2, 4, 5, 7, 9, 10)
    assert inner.largest_block() == 2 * 4


def test_candidate_grids_and_estimates():
    rows, note = candidate_grids(8, "ijk", mm_sizes(16))
    assert sorted(map(tuple, rows.tolist())) == sorted(
        r for r in itertools.product((1, 2, 4, 8), repeat=3) if math.prod(r) == 8)
    rows, note = candidate_grids(7, "ij", dict(i=3, j=2))       # no grid of 7 ranks fits: fewer ranks compete
    assert "on" in note and rows.prod(axis=1).max() < 7
    est = estimate_words("ijk", mm_sizes(16), np.array([[2, 2, 2], [8, 1, 1]]), 8, [("ij", None), ("jk", None)],
                         "ik", None)
    assert est.tolist() == [96, 224]   # 2x2x2: blocks of 64, groups of 2, x3; 8x1x1: all of jk, 256 (7/8)


def test_grid_choice_layouts():
    choice = GridChoice("ijka", (2, 2, 2, 1), "ia", 8, 0, "")
    sizes = mttkrp_sizes(10, 10)
    assert choice.layout("ia", sizes) == Layout((10, 10), (2, 2, 2, 1), (0, None), (1, 2))
    assert choice.layout("ja", sizes) == Layout((10, 10), (2, 2, 2, 1), (1, None))
    assert choice.layout("ia", sizes, partial=False).partial == ()
    assert GridChoice("ijk", (2, 1, 2), "ik", 4, 0, "").layout("ik", mm_sizes(3)).partial == ()
    assert "i=2, j=2, k=2, a=1" in str(choice)
