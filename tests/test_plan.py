"""The planner against known constructions, COSMA, CP-ALS sweeps and its own lower bounds (model, no ranks).

Targets come from ../shared/notes/optimal-plans.md section 1 (words received by the busiest rank,
inputs evenly spread without replication at the start, result at the end: the fair start).
"""
import json
import math

import numpy as np
import pytest

from deinsum.decompose import decompose
from deinsum.errors import DeinsumError
from deinsum.layout import Layout
from deinsum.placement import even_layout
from deinsum.plan import RESULT_COPIES, build_plan, mode_layout
from random_cases import random_einsums
from suite import SUITE, shapes_for

PROCS = (8, 64, 512, 4096)
MTTKRP3 = {8: (1724, 42), 64: (2900, 68), 512: (4872, 120), 4096: (8192, 192)}
ORDER5 = {8: (85, 34), 64: (120, 48), 512: (192, 68), 4096: (240, 96)}
BEST = {"1MM": (25165824, 37748736, 44040192, 47185920), "MTTKRP-O3": (81459, 138656, 215814, 293760),
        "MTTKRP-O5": (8347, 12510, 19456, 23012), "TTMc-O5-M0": (10115, 22680, 21026586, 12948458)}
KERNELS = {"1MM": "ij,jk->ik", "MTTKRP-O3-M0": "ijk,ja,ka->ia", "MTTKRP-O3-M1": "ijk,ia,ka->ja",
           "MTTKRP-O3-M2": "ijk,ia,ja->ka", "MTTKRP-O5-M0": "ijklm,ja,ka,la,ma->ia",
           "MTTKRP-O5-M2": "ijklm,ia,ja,la,ma->ka", "MTTKRP-O5-M4": "ijklm,ia,ja,ka,la->ma",
           "TTMc-O5-M0": "ijklm,jb,kc,ld,me->ibcde"}


def paper_sizes(kernel: str, nprocs: int) -> dict[str, int]:
    if kernel == "1MM":
        return dict.fromkeys("ijk", round(4096 * nprocs ** (1 / 3)))
    if kernel.startswith("MTTKRP-O3"):
        i, r = MTTKRP3[nprocs]
        return dict(i=i, j=i, k=i, a=r)
    i, r = ORDER5[nprocs]
    return dict.fromkeys("ijklm", i) | dict.fromkeys("abcde", r)


def fair_plan(equation: str, sizes: dict, nprocs: int, **options):
    shapes = [[sizes[c] for c in t] for t in equation.split("->")[0].split(",")]
    return build_plan(decompose(equation, *shapes), nprocs, inputs="local", result="distributed", **options)


def busiest(plan) -> int:
    return int(plan.received_bytes().max(initial=0)) // plan.dtype.itemsize


def best_known(kernel: str, nprocs: int) -> int:
    family = "TTMc-O5-M0" if kernel.startswith("TTMc") else kernel[:9] if kernel.startswith("MTTKRP") else kernel
    return BEST[family][PROCS.index(nprocs)]


def scored(plan):
    return [(partition, words) for partition, _, words in plan.bound.candidates if words is not None]


def check_plan_bound(plan, *context):
    """No candidate's bound above its own scored plan; the plan's bounds below the plan."""
    for partition, bound, words in plan.bound.candidates:
        assert words is None or bound <= words, (*context, partition, bound, words)
    assert plan.bound.words <= busiest(plan), context
    assert plan.bound.chosen_words <= busiest(plan), context


def check_suite_bound(plan):
    """:func:`check_plan_bound`, and the bound below every scored candidate."""
    check_plan_bound(plan)
    assert plan.bound.words <= min(w for _, w in scored(plan))


#: Most plan / class bound allowed (issue 25); TTMc has no tight bound for its plan's class. Order-5 MTTKRP at
#: P = 8 splits 85 as 43/42: its plan's own balance rho = 1.036 leaves 1.12 (issue 25 asks 1.70 of order 5).
CLASS_RATIO = {"1MM": 1.10, "MTTKRP-O3-M0": 1.10, "MTTKRP-O5-M0": 1.15}


def check_class_bound(kernel, plan):
    """Positive on MM and MTTKRP, within CLASS_RATIO of the plan; where the plan moves less than the atomic
    bound (TTMc at P = 4096), the report says the plan lies outside that class."""
    ours, b = busiest(plan), plan.bound
    assert ("outside that class" in str(plan)) == (ours < b.atomic)
    if kernel in CLASS_RATIO:
        assert 0 < b.words and ours <= CLASS_RATIO[kernel] * b.words, (ours, b.words)


def suite_cases():
    """Every kernel at P = 8 and 64, but for two order-5 MTTKRPs at 64 (MTTKRP-O5-M0 stands for them: seconds
    each); all at every P under -m slow."""
    for kernel in KERNELS:
        for nprocs in PROCS:
            slow = nprocs > 64 or nprocs == 64 and kernel in ("MTTKRP-O5-M2", "MTTKRP-O5-M4")
            yield pytest.param(kernel, nprocs, marks=pytest.mark.slow if slow else ())


@pytest.mark.parametrize("kernel, nprocs", list(suite_cases()))
def test_suite_within_ten_percent_of_the_best_known_construction_and_above_its_bounds(kernel, nprocs):
    """One plan per (kernel, P) at the paper's sizes: near the best construction, its bounds valid, its class
    bound near it (the class bound's other checks: tests/test_bounds.py)."""
    plan = fair_plan(KERNELS[kernel], paper_sizes(kernel, nprocs), nprocs)
    assert busiest(plan) <= 1.10 * best_known(kernel, nprocs), [g.grid.dims for g in plan.groups]
    check_suite_bound(plan)
    check_class_bound(kernel, plan)


def test_order5_mttkrp_is_one_fused_statement_with_x_stationary():
    plan = fair_plan(KERNELS["MTTKRP-O5-M0"], paper_sizes("MTTKRP-O5-M0", 512), 512)
    assert len(plan.groups) == 1 and len(plan.groups[0].steps) == 4
    assert "in0" not in {m.tensor for m in plan.moves}               # X never moves
    assert dict(zip(plan.groups[0].indices, plan.groups[0].grid.dims))["a"] == 1


def test_ttmc_finds_the_chain_with_one_transpose():
    plan = fair_plan(KERNELS["TTMc-O5-M0"], paper_sizes("TTMc-O5-M0", 512), 512)
    assert len(plan.groups) == 2 and "in0" not in {m.tensor for m in plan.moves}
    assert [m.tensor for m in plan.moves if not m.tensor.startswith("in")] == ["t2"]


@pytest.mark.parametrize("nprocs, fraction", [(2, 1 / 2), (4, 1 / 2), (8, 3 / 8), (16, 5 / 16), (64, 9 / 64)])
def test_matrix_multiply_moves_no_more_than_cosma(nprocs, fraction):
    plan = fair_plan("ij,jk->ik", dict(i=4096, j=4096, k=4096), nprocs)
    assert busiest(plan) <= fraction * 4096 ** 2


def few_ranks_cases():
    """Every kernel on 3 ranks, but for two order-5 MTTKRPs (MTTKRP-O5-M0 stands for them: seconds each); all on 2
    and 3 ranks under -m slow."""
    for kernel in KERNELS:
        for nprocs in (3, 2):
            slow = nprocs == 2 or kernel in ("MTTKRP-O5-M2", "MTTKRP-O5-M4")
            yield pytest.param(kernel, nprocs, marks=pytest.mark.slow if slow else ())


@pytest.mark.parametrize("kernel, nprocs", list(few_ranks_cases()))
def test_bound_never_exceeds_a_scored_plan_on_the_suite_at_few_ranks(kernel, nprocs):
    """The paper's P = 8 sizes on 3 and 2 ranks (P = 8 ... 4096: the test above)."""
    check_suite_bound(fair_plan(KERNELS[kernel], paper_sizes(kernel, 8), nprocs))


def bound_cases(count, seed):
    """Random einsums (2-5 operands, uneven sizes up to 40) without a unary pre-pass, at random P <= 4096."""
    rng = np.random.default_rng(seed)
    cases = [(eq, shapes) for eq, shapes in random_einsums(count * 4, seed=seed, max_ops=5, max_size=40)
             if not decompose(eq, *shapes).prepass]
    return [(eq, shapes, int(rng.integers(1, 4097))) for eq, shapes in cases[:count]]


def check_bound(eq, shapes, nprocs, inputs="local", result="distributed", layouts=None):
    plan = build_plan(decompose(eq, *shapes), nprocs, inputs=inputs, result=result, layouts=layouts)
    check_plan_bound(plan, eq, shapes, nprocs)


@pytest.mark.parametrize("eq, shapes, nprocs", bound_cases(40, seed=11))
def test_bound_never_exceeds_a_scored_plan_on_random_einsums(eq, shapes, nprocs):
    check_bound(eq, shapes, nprocs)


MODES = [("global", "distributed"), ("global", "all"), ("root", "root"), ("local", "all"), ("root", "distributed")]


def mode_cases():
    """The matrix product below in every mode; the random einsums each in one mode by default (every mode taken;
    the first, at P = 3670, not with global inputs: seconds), in all under -m slow."""
    yield from (pytest.param("ij,jk->ik", [(64, 64), (64, 64)], 2, *mode) for mode in MODES)
    for n, case in enumerate(bound_cases(6, seed=13)):
        for m, mode in enumerate(MODES):
            yield pytest.param(*case, *mode, marks=() if m == (n + 2) % len(MODES) else pytest.mark.slow)


@pytest.mark.parametrize("eq, shapes, nprocs, inputs, result", list(mode_cases()))
def test_bound_holds_wherever_inputs_start_and_the_result_ends(eq, shapes, nprocs, inputs, result):
    """A global input is whole on every rank: a plan that moves nothing has bound 0 (it printed 1,596
    words for this 64^3 matrix product on 2 ranks, a plan that received none)."""
    check_bound(eq, shapes, nprocs, inputs, result)


def test_a_result_whole_on_every_rank_bounds_the_busiest_rank():
    """The rank that computes fewest iterations completes at most |out| / P result elements and receives a
    word for each other one: order-5 MTTKRP on 2 ranks, result on every rank, receives exactly that."""
    plan = build_plan(decompose("ijklm,ja,ka,la,ma->ia", (24,) * 5, *[(24, 24)] * 4), 2, inputs="global", result="all")
    assert plan.bound.words == plan.bound.chosen_words == 24 * 24 // 2 == busiest(plan)
    assert plan.bound.binding == RESULT_COPIES and "1.000x" in str(plan)
    assert build_plan(decompose("ij,jk->ik", (4, 5), (5, 6)), 3, inputs="global", result="root").bound.words == 0


def fewer_than_five_operands_by_default(cases):
    """``cases``, those of five operands (seconds of bounds each) marked slow."""
    return [pytest.param(*c, marks=pytest.mark.slow) if c[0].count(",") >= 4 else c for c in cases]


@pytest.mark.parametrize("eq, shapes, nprocs", fewer_than_five_operands_by_default(
    [c for c in bound_cases(12, seed=14) if decompose(c[0], *c[1]).output]))
def test_a_result_pinned_with_copies_bounds_the_busiest_rank(eq, shapes, nprocs):
    """A result pinned with its first axis split in two and each half copied on half the ranks: the rank
    computing fewest iterations completes at most |out| / P elements of its half."""
    d = decompose(eq, *shapes)
    out = tuple(d.sizes[c] for c in d.output)
    pinned = Layout(out, (2, nprocs // 2), (0,) + (None,) * (len(out) - 1)) if nprocs % 2 == 0 else \
        Layout.replicated(out, nprocs)
    copies = pinned.smallest_block(nprocs) - math.prod(out) // nprocs
    plan = build_plan(d, nprocs, layouts={"out": pinned})
    assert plan.bound.words >= copies and plan.bound.per_group[-1] >= copies
    check_bound(eq, shapes, nprocs, layouts={"out": pinned})


@pytest.mark.slow
@pytest.mark.parametrize("eq, shapes, nprocs", bound_cases(320, seed=12))
def test_bound_never_exceeds_a_scored_plan_on_many_random_einsums(eq, shapes, nprocs):
    check_bound(eq, shapes, nprocs)


def test_pinned_layouts_are_kept_and_their_conversion_reported():
    sizes = dict(i=40, j=30, k=20, a=6)
    eq = "ijk,ja,ka->ia"
    even = even_layout((40, 30, 20), 8)
    aligned = fair_plan(eq, sizes, 8, layouts={"in0": "even", "out": even_layout((40, 6), 8)})
    assert aligned.entry[0] == even and aligned.exit == even_layout((40, 6), 8)
    assert aligned.pinned == ("in0", "out") and "in0" not in {m.tensor for m in aligned.moves}  # grid fits X
    plan = fair_plan(eq, sizes, 8, layouts={"in0": "root"})
    assert "in0: scatter (convert pinned layout)" in str(plan) or "in0: distribute (convert pinned layout)" in str(plan)
    assert busiest(fair_plan(eq, sizes, 8)) <= busiest(plan)
    with pytest.raises(DeinsumError, match="'in7' is not a tensor"):
        fair_plan(eq, sizes, 8, layouts={"in7": "even"})
    with pytest.raises(DeinsumError, match="is for shape"):
        fair_plan(eq, sizes, 8, layouts={0: even_layout((4, 4), 8)})


@pytest.mark.parametrize("inputs", ["global", "root"])
@pytest.mark.parametrize("nprocs", [2, 3, 8])
def test_pinned_global_or_root_inputs_start_whole_then_move_into_their_layout(inputs, nprocs):
    """Whole inputs start where ``inputs`` says, pinned or not; the first move of a pinned one takes it into its
    pinned layout (none where it already holds it), and the plan reads it from there."""
    shapes = [(40, 30, 20), (30, 6), (20, 6)]
    pins = {0: even_layout(shapes[0], nprocs), 1: Layout.replicated(shapes[1], nprocs),
            2: Layout.on_root(shapes[2], nprocs)}
    plan = build_plan(decompose("ijk,ja,ka->ia", *shapes), nprocs, inputs=inputs, result="all", layouts=pins)
    whole = [mode_layout(inputs, shape, nprocs) for shape in shapes]
    assert plan.entry == tuple(whole) and plan.pinned == ("in0", "in1", "in2")
    for n, pinned in pins.items():
        moves = [m for m in plan.moves if m.tensor == f"in{n}"]
        if pinned == whole[n]:
            assert not moves or moves[0].src == pinned
        else:
            assert (moves[0].src, moves[0].dst) == (whole[n], pinned) and moves[0].group is None
            assert len(moves) == 1 or moves[1].src == pinned
    assert "in0: distribute (convert pinned layout)" in str(plan)
    unpinned = build_plan(decompose("ijk,ja,ka->ia", *shapes), nprocs, inputs=inputs, result="all")
    assert busiest(plan) >= busiest(unpinned) and plan.bound.words == unpinned.bound.words


def test_plan_json_carries_the_whole_plan():
    plan = fair_plan("ijk,ja,ka->ia", dict(i=40, j=30, k=20, a=6), 8)
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["inputs"] == "local" and data["result"] == "distributed" and data["dtype"] == "float64"
    assert data["received_bytes_per_rank"] == plan.received_bytes().tolist()
    assert 0 <= data["lower_bound_bytes_per_rank"] <= data["received_bytes_max"] == max(data["received_bytes_per_rank"])
    group = data["groups"][0]
    assert set(group["grid"]) == set("ijka") and group["ranks_used"] + group["ranks_idle"] == 8
    assert {"in0", "in1", "in2", "out"} <= set(group["tensors"])
    for move in data["moves"]:
        assert len(move["bytes_received_per_rank"]) == 8 and len(move["bytes_sent_per_rank"]) == 8
        assert sum(move["bytes_received_per_rank"]) == sum(move["bytes_sent_per_rank"])
    assert data["memory_bytes_per_rank"] == plan.memory
    assert data["memory_default"].startswith("this machine's free memory / ")


def test_memory_below_the_data_share_is_reported_infeasible():
    sizes = dict(i=40, j=30, k=20, a=6)
    share = sum(-(-n // 8) for n in (40 * 30 * 20, 30 * 6, 20 * 6, 40 * 6))
    tight = fair_plan("ijk,ja,ka->ia", sizes, 8, memory=8 * share - 1)
    assert not tight.holds_data_share and not tight.feasible and "INFEASIBLE" in str(tight)
    assert tight.to_dict()["feasible"] is False and tight.to_dict()["memory_needed_bytes_per_rank"] == tight.peak_bytes
    assert fair_plan("ijk,ja,ka->ia", sizes, 8, memory=f"{8 * share} B").holds_data_share
    assert fair_plan("ijk,ja,ka->ia", sizes, 8, memory=tight.peak_bytes).feasible


#: The default run plans each order-5 kernel at one of these P (their bounds take seconds each); -m slow at every P.
ORDER5_DEFAULT_P = {"MTTKRP-O5-M0": 7, "MTTKRP-O5-M2": 5, "MTTKRP-O5-M4": 8, "TTMc-O5-M0": 3}


def small_suite_cases():
    """Every suite kernel at P = 1, 2, 3, 5, 7, 8; the order-5 ones outside ORDER5_DEFAULT_P marked slow."""
    for name in SUITE:
        for nprocs in (1, 2, 3, 5, 7, 8):
            slow = ORDER5_DEFAULT_P.get(name, nprocs) != nprocs
            yield pytest.param(name, nprocs, marks=pytest.mark.slow if slow else ())


@pytest.mark.parametrize("name, nprocs", list(small_suite_cases()))
def test_small_suite_plans_fit_every_p(name, nprocs):
    eq, sizes = SUITE[name]
    plan = build_plan(decompose(eq, *shapes_for(eq, sizes)), nprocs, inputs="local", result="distributed")
    assert all(g.grid.used <= nprocs for g in plan.groups)
    # the bounds assume the plan's own balance (idle ranks included): they cover it
    assert plan.bound.words <= busiest(plan) and plan.bound.rho == plan.balance


def test_global_inputs_over_the_memory_make_the_plan_infeasible_and_drop_the_segment_bound():
    """A rank holding whole global inputs beyond its memory breaks the segment argument's premise: the plan
    says INFEASIBLE and its bound is the memory-independent one (717 words here, before, for a plan
    that received none)."""
    plan = build_plan(decompose("ij,jk->ik", (128, 128), (128, 128)), 64, memory=6400, inputs="global")
    assert not plan.feasible and plan.data_share == 2 * 128 * 128 + 128 * 128 // 64
    assert plan.bound.words <= busiest(plan) == 0 and "INFEASIBLE" in str(plan)
