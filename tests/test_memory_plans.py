"""Plans that fit the memory they are given: rounds over a summed index, the leanest grids, infeasibility."""
import json
from dataclasses import replace

import numpy as np
import pytest

from deinsum.cli import main
from deinsum.decompose import decompose
from deinsum.emit import generate
from deinsum.footprint import footprint
from deinsum.peak import SLACK
from deinsum.layout import Layout
from deinsum.placement import even_layout
from deinsum.plan import build_plan
from deinsum.redistribute import plan_redistribution
from deinsum.schedule import Move
from deinsum.tables import rank_tables, table_words
from suite import SUITE, shapes_for


def mm_plan(n, nprocs, share_factor=None, prefetch=False):
    """Matrix multiply n^3 from the fair start, with ``share_factor`` x the data share (3 n^2 / P words) per rank."""
    memory = None if share_factor is None else int(share_factor * 3 * n * n // nprocs * 8)
    return build_plan(decompose("ij,jk->ik", (n, n), (n, n)), nprocs, memory=memory, inputs="local",
                      result="distributed", prefetch=prefetch)


@pytest.mark.parametrize("rounds", [2, 3, 7, 40])
def test_rounds_move_exactly_what_the_whole_move_does(rounds):
    """Round t brings sub-range t of every destination block along the axis: the rounds partition the block,
    so every rank sends and receives what one phase would, and each round's block is that part."""
    src, dst = even_layout((13, 11), 6), Layout((13, 11), (2, 1, 3), (0, 2))
    whole = plan_redistribution(src, dst, 6)
    split = plan_redistribution(src, dst, 6, rounds=(1, rounds))
    assert split.words_received == whole.words_received and split.words_sent == whole.words_sent
    for rank in range(6):
        tables = rank_tables(src, dst, 6, rank, rounds=(1, rounds))
        assert len(tables) == rounds
        assert table_words(tables) == table_words(whole.table(rank))
        block = dst.boxes_of(np.array([rank]))
        width = int(block[1][0, 1] - block[0][0, 1])
        assert sum(t[3][1] for t in tables) == width and max(t[3][1] for t in tables) == -(-width // rounds)


def test_a_direct_reduction_runs_in_parts_a_reduce_scatter_does_not():
    """Partial sums summed directly: the parts move what the whole move does; through a reduce-scatter first
    (two phases) no rounds are cut."""
    partial = Layout((12, 6), grid=(2, 2), axes=(0, None), partial=(1,))
    dst = Layout((12, 6), grid=(2, 2), axes=((0, 1), None))
    whole = plan_redistribution(partial, dst, 4)
    assert whole.split is None
    parts = plan_redistribution(partial, dst, 4, rounds=(0, 3))
    assert parts.words_received == whole.words_received and parts.words_sent == whole.words_sent
    assert all(table_words(parts.table(r)) == table_words(whole.table(r)) for r in range(4))
    with pytest.raises(ValueError, match="through a reduce-scatter .* does not run in rounds"):
        rank_tables(partial, dst, 4, 0, split=(2, 1), rounds=(0, 2))


#: Words the busiest rank receives in the best 2.5D construction that fits (its peak <= 0.9 M; the memory
#: note's table), by (n, P) and memory in data shares.
CONSTRUCTIONS_2_5D = {(16384, 64): {1.25: 58_720_256, 2: 46_137_344, 4: 37_748_736, 8: 37_748_736},
                      (32768, 512): {1.25: 96_468_992, 2: 65_011_712, 4: 52_428_800, 8: 44_040_192},
                      (65536, 4096): {1.25: 132_120_576, 2: 99_614_720, 4: 68_157_440, 8: 47_185_920}}


@pytest.mark.parametrize("n, nprocs", [(16384, 64), (32768, 512), pytest.param(65536, 4096, marks=pytest.mark.slow)])
def test_matrix_multiply_fits_and_matches_the_best_2_5d_construction(n, nprocs):
    """Issue 24: at 1.25, 2, 4 and 8 times the data share the plan fits and receives at most 1.10x the best
    2.5D construction that fits (rounds over the summed index; the final reduction in parts)."""
    for factor, words in CONSTRUCTIONS_2_5D[n, nprocs].items():
        plan = mm_plan(n, nprocs, factor)
        assert plan.feasible, (factor, plan.peak_bytes, plan.memory)
        assert int(plan.received_bytes().max()) // 8 <= 1.10 * words, (factor, plan.groups[0].grid.dims)


@pytest.mark.parametrize("n, nprocs", [(16384, 64), (32768, 512)])
def test_matrix_multiply_fits_2_4_and_8_times_the_data_share(n, nprocs):
    """The planner trades replication of the summed index (the 2.5D family) and rounds for memory: the peak
    fits, the volume only grows as memory shrinks, and with memory to spare the plan is the unlimited one."""
    unlimited = mm_plan(n, nprocs)
    volumes = []
    for factor in (2, 4, 8):
        plan = mm_plan(n, nprocs, factor)
        assert plan.feasible and plan.peak_bytes <= plan.memory, (factor, plan.peak_bytes, plan.memory)
        volumes.append(int(plan.received_bytes().max()))
    assert volumes == sorted(volumes, reverse=True)
    assert volumes[-1] >= int(unlimited.received_bytes().max())
    assert not any(g.rounds for g in unlimited.groups) and unlimited.peak_bytes > mm_plan(n, nprocs, 2).memory


def test_memory_below_any_plan_is_infeasible_and_names_the_bytes_needed(capsys):
    """Half the data share: no plan fits; the plan, its JSON and `deinsum plan` (exit 2) say what would."""
    plan = mm_plan(4096, 64, 0.5)
    data = plan.to_dict()
    assert not plan.feasible and "INFEASIBLE" in str(plan)
    assert data["feasible"] is False and data["memory_needed_bytes_per_rank"] == plan.peak_bytes > plan.memory
    code = main(["plan", "ij,jk->ik", "--size", "i=4096,j=4096,k=4096", "-P", "64", "--inputs", "local",
                 "--result", "distributed", "--memory", str(plan.memory)])
    err = capsys.readouterr().err
    assert code == 2 and f"--memory {plan.peak_bytes}" in err and len(err.strip().splitlines()) == 1
    assert main(["plan", "ij,jk->ik", "--size", "i=4096,j=4096,k=4096", "-P", "64", "--inputs", "local",
                 "--result", "distributed", "--memory", str(plan.peak_bytes)]) == 0


@pytest.mark.parametrize("name", SUITE)
def test_plans_with_memory_to_spare_run_in_one_round(name):
    """The default memory of this machine holds the small suite whole: no group runs in rounds."""
    eq, sizes = SUITE[name]
    plan = build_plan(decompose(eq, *shapes_for(eq, sizes)), 8, inputs="local", result="distributed")
    assert plan.feasible and not any(g.rounds for g in plan.groups)


def test_rounds_are_reported_in_text_and_json():
    plan = mm_plan(4096, 16, 1.5)
    (group,) = plan.groups
    assert group.rounds is not None and plan.feasible
    index, count = group.rounds
    assert f"in {count} rounds over {index} (summed)" in str(plan)
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["groups"][0]["rounds"] == {"index": index, "count": count, "kind": "summed"}
    assert data["peak_bytes_per_rank_max"] == int(footprint(plan).max()) <= data["memory_bytes_per_rank"]
    assert plan.memory > SLACK


@pytest.mark.parametrize("nprocs", [2, 16])
def test_prefetch_holds_two_rounds_of_pieces_and_still_fits(nprocs):
    """With prefetch, each move of a group in rounds is posted a round ahead: the footprint is that of the same
    schedule without it plus two rounds' parts of each such block on every rank (the next round's, and room for
    MPI's buffers of the exchange in flight), and the planner takes more rounds so that the plan still fits,
    moving the same words. Where those parts fit at no number of rounds (the least memory any plan fits), it does
    not prefetch."""
    plain, fetched = mm_plan(2048, nprocs, 1.25), mm_plan(2048, nprocs, 1.25, prefetch=True)
    assert fetched.feasible and all(m.prefetch == bool(m.rounds) for m in fetched.moves)
    assert any(m.prefetch for m in fetched.moves) and ", prefetched" in str(fetched)
    assert fetched.groups[0].rounds[1] > plain.groups[0].rounds[1] > 1
    assert (fetched.received_bytes() == plain.received_bytes()).all()
    off = replace(fetched, schedule=tuple(replace(m, prefetch=False) if isinstance(m, Move) else m
                                          for m in fetched.schedule))
    ranks = np.arange(nprocs)
    extra = sum(m.dst.block_sizes(ranks, m.rounds) for m in fetched.moves if m.prefetch) * 2 * 8
    assert (footprint(fetched) - footprint(off) == extra).all() and extra.min() > 0
    share = 3 * 2048 * 2048 // nprocs * 8
    low, high = share, int(1.25 * share)      # the least memory a plan fits (within 4 kB)
    while high - low > 2**12:
        middle = (low + high) // 2
        low, high = (low, middle) if mm_plan(2048, nprocs, middle / share).feasible else (middle, high)
    least = mm_plan(2048, nprocs, high / share, prefetch=True)
    assert least.feasible and not any(m.prefetch for m in least.moves)


def _suite_plan(kernel, nprocs, share_factor):
    """A suite kernel at the paper's size from the fair start, with ``share_factor`` x its data share per rank."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from suite_sizes import construction_words, equation_of, shapes_of, weak_scaling_sizes
    eq = equation_of(kernel)
    d = decompose(eq, *shapes_of(eq, weak_scaling_sizes(kernel, nprocs)))
    share = build_plan(d, nprocs, memory=2**62, inputs="local", result="distributed").data_share * 8
    plan = build_plan(d, nprocs, memory=int(share_factor * share), inputs="local", result="distributed")
    return plan, construction_words(kernel, nprocs)


@pytest.mark.parametrize("nprocs", [64, pytest.param(4096, marks=pytest.mark.slow)])
@pytest.mark.parametrize("kernel", ["MTTKRP-O3-M0", "MTTKRP-O5-M0", "TTMc-O5-M0"])
def test_suite_plans_fit_tight_memory_near_the_constructions(kernel, nprocs):
    """1.3x the data share: the peak (on every rank, not only the ones the search samples) fits, and the busiest
    rank receives at most 1.10x the best known construction with memory to spare."""
    plan, construction = _suite_plan(kernel, nprocs, 1.3)
    assert plan.feasible, (plan.peak_bytes, plan.memory)
    assert int(plan.received_bytes().max()) // 8 <= 1.10 * construction


def _fair_plan(eq, sizes, nprocs, share_factor=None):
    """``eq`` from the fair start with ``share_factor`` x (its data share + SLACK) per rank (None: unlimited)."""
    d = decompose(eq, *[tuple(sizes[c] for c in sub) for sub in eq.split("->")[0].split(",")])
    unlimited = build_plan(d, nprocs, memory=2**62, inputs="local", result="distributed")
    if share_factor is None:
        return unlimited
    memory = int(share_factor * (unlimited.data_share * 8 + SLACK))
    return build_plan(d, nprocs, memory=memory, inputs="local", result="distributed")


def test_free_rounds_fit_a_matrix_multiply_whose_summed_index_is_short():
    """B (128 x 2048) small and replicated on a 16 x 1 x 1 grid, j = 128 short: rounds over j cut only A and B, which
    are small, so no plan with summed rounds fits 1.1x the data share (the planner before free rounds: INFEASIBLE,
    least peak 41,060,352 > 40,514,355 bytes); 24 rounds over k (free) bring B's all-gather a slab at a time and
    make C's block slab by slab: it fits, moving what the unlimited plan moves."""
    plan = _fair_plan("ij,jk->ik", dict(i=32768, j=128, k=2048), 16, 1.1)
    (group,) = plan.groups
    assert plan.feasible and group.free_rounds and group.rounds[0] == "k", (plan.peak_bytes, group.rounds)
    assert [m.rounds for m in plan.moves if m.tensor == "in1"] == [(1, group.rounds[1])]   # B's slabs along k
    unlimited = _fair_plan("ij,jk->ik", dict(i=32768, j=128, k=2048), 16)
    assert int(plan.received_bytes().max()) == int(unlimited.received_bytes().max())
    assert f"in {group.rounds_text}: each moves" in str(plan) and group.rounds_text.endswith("over k (free)")
    assert plan.to_dict()["groups"][0]["rounds"] == {"index": "k", "count": group.rounds[1], "kind": "free"}
    listing = generate(plan)             # the emitted script's loop: B's slab moved, C's slab made, each round
    assert f"for t in range({group.rounds[1]}):  # {group.rounds_text}: slab t of the result" in listing
    assert "in1_t = rt.allgather(in1, move=0, step=t" in listing and "= rt.contract_slab(" in listing


def test_free_rounds_lower_the_volume_of_a_chain():
    """ij,jk,kl->il (k = 16 short) at P = 4 with 1.05x the data share: the second group runs in rounds over l
    (free), which cut its large operands where k, the summed index, cannot, and keeps the volume of the plan with
    memory to spare (221,184 bytes)."""
    sizes = dict(i=2048, j=256, k=16, l=2048)
    plan = _fair_plan("ij,jk,kl->il", sizes, 4, 1.05)
    assert plan.feasible and any(g.free_rounds for g in plan.groups), [g.rounds for g in plan.groups]
    unlimited = _fair_plan("ij,jk,kl->il", sizes, 4)
    assert int(plan.received_bytes().max()) <= int(unlimited.received_bytes().max())


def test_a_free_round_holds_the_result_whole_and_one_slab_of_the_rest():
    """footprint.group_terms over a free index: the result block held whole; on top, the round's cut of every
    operand and intermediate that holds the index, and the round's slab of the result (no pieces)."""
    from deinsum.footprint import group_terms
    from deinsum.grids import GridChoice
    d = decompose("ij,jk->ik", (8, 6), (6, 10))
    grid = GridChoice("ijk", (2, 1, 1), "ik", 2)
    held, (transient,) = group_terms(grid, d.steps, "ik", d.sizes, ("k", 5))
    assert [cut for _, _, _, cut in held] == [()]
    assert [cut for _, _, _, cut in transient] == [(), (1, 5), (1, 5)]   # A whole, B's and C's slab along k
