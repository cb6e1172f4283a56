"""The sequence planner (issue 13), model only: a CP-ALS sweep's MTTKRP traffic against the per-sweep
construction of ../shared/notes/optimal-plans.md section 1, X placed once and never moved."""
import pytest

import deinsum
from deinsum.errors import DeinsumError

MTTKRP3 = {8: (1724, 42), 64: (2900, 68), 512: (4872, 120), 4096: (8192, 192)}
ORDER5 = {8: (85, 34), 64: (120, 48), 512: (192, 68), 4096: (240, 96)}
SWEEP = {3: ((244377, 415969, 647443, 881280), MTTKRP3), 5: ((41735, 62550, 97282, 115059), ORDER5)}
PROCS = (8, 64, 512, 4096)


def cp_als_sweep(order: int, size: int, rank: int, nprocs: int) -> deinsum.SequencePlan:
    idx, names = "ijklm"[:order], "ABCDE"[:order]
    steps = [(idx + "," + ",".join(c + "a" for m, c in enumerate(idx) if m != n) + "->" + idx[n] + "a",
              ("X",) + tuple(names[m] for m in range(order) if m != n), names[n]) for n in range(order)]
    shapes = {"X": (size,) * order} | {f: (size, rank) for f in names}
    return deinsum.plan_sequence(steps, shapes, nprocs)


@pytest.mark.parametrize("order, nprocs", [(3, 8), (3, 64), *[pytest.param(o, p, marks=pytest.mark.slow) for o, p in
                                                               [(5, 8), (5, 64), (3, 512), (5, 512), (3, 4096), (5, 4096)]]])
def test_cp_als_sweep_within_ten_percent_of_the_construction(order, nprocs):
    figures, sizes_at = SWEEP[order]
    sweep = cp_als_sweep(order, *sizes_at[nprocs], nprocs)
    assert not sweep.moved("X") and all("in0" not in {m.tensor for m in p.moves} for p in sweep.plans)
    assert sweep.total_words <= 1.10 * figures[PROCS.index(nprocs)]
    assert sweep.total_words >= sum(sweep.bound_words)
    # a factor lives where its MTTKRP leaves it, and the other MTTKRPs read it from there
    for step, plan in zip(sweep.steps, sweep.plans):
        assert plan.exit == sweep.layouts[step.output]
        assert [sweep.layouts[t] for t in step.inputs] == list(plan.entry)


def test_report_names_steps_totals_and_homes():
    sweep = cp_als_sweep(3, 40, 5, 8)
    text = str(sweep)
    assert "A = einsum('ijk,ja,ka->ia', X, B, C)" in text and "total per sweep" in text
    assert f"{sweep.total_words * 8:,}" in text and "never moved): X" in text
    lean = sweep.text(bounds=False)       # the same rows, traffic only
    assert "bound" not in lean and "ratio" not in lean
    assert all(full.startswith(row) for row, full in zip(lean.splitlines()[1:], text.splitlines()[1:], strict=True))
    data = sweep.to_dict()
    assert data["total_received_bytes"] == 8 * sum(sweep.step_words)
    assert data["homes"]["X"] == sweep.layouts["X"].spec()


def test_pinned_homes_are_kept_and_shapes_derived():
    steps = [("ij,jk->ik", ("A", "B"), "C"), ("ik,kl->il", ("C", "D"), "E")]
    sweep = deinsum.plan_sequence(steps, {"A": (30, 20), "B": (20, 10), "D": (10, 5)}, 4,
                                  layouts={"D": "replicated", "A": "2x2: 0, 1"})
    assert sweep.layouts["D"] == deinsum.Layout.replicated((10, 5), 4)
    assert sweep.layouts["A"].spec() == "2x2: 0, 1" and dict(sweep.shapes)["E"] == (30, 5)
    assert sweep.plans[1].entry[0] == sweep.layouts["C"] == sweep.plans[0].exit


@pytest.mark.parametrize("steps, shapes, message", [
    ([], {}, "no steps"),
    ([("ij,jk->ik", ("A", "B"), "C")], {"A": (3, 4)}, "the shape of 'B'"),
    ([("ij,jk->ik", ("A", "B"), "C")], {"A": (3, 4), "B": (4, 5), "C": (3, 6)}, "given as (3, 6)"),
    ([("ij,jk->ik", "A", "C")], {"A": (3, 4)}, "has 2 operand(s) but 1 were given"),
])
def test_bad_sequences_are_one_line_errors(steps, shapes, message):
    with pytest.raises(DeinsumError, match=message.replace("(", r"\(").replace(")", r"\)")):
        deinsum.plan_sequence(steps, shapes, 4)
