"""The printed lower bounds: the class bound (even shares, the least over fusions of the largest group
bound) never above a plan deinsum scored, the atomic bound equal to the published ones, the wording. The class
bound of the suite's plans at the paper's sizes is checked where those plans are made once: tests/test_plan.py.

Published atomic bounds: ../shared/notes/citable-bounds.md section 4 (words received by the busiest
rank, fair start: inputs spread without replication at the start, result at the end).
"""
import re
import shutil
import subprocess

import numpy as np
import pytest

from deinsum.cli import main
from deinsum.decompose import decompose
from deinsum.plan import bound_notes, build_plan
from deinsum.soap import analyze
from deinsum.soap.fusion import contraction_paths
from random_cases import random_einsums
from test_plan import KERNELS, PROCS, busiest, fair_plan, paper_sizes

PUBLISHED_ATOMIC = {"1MM": (25165824, 37748736, 44040192, 47185920), "MTTKRP-O3-M0": (81459, 138656, 215814, 293760),
                    "MTTKRP-O5-M0": (7727, 12086, 18619, 21798), "TTMc-O5-M0": (10115, 22680, 13404125, 80003336)}
MODES = [(i, r) for i in ("local", "global", "root") for r in ("distributed", "all", "root")]


def shapes_of(equation: str, sizes: dict) -> list[tuple[int, ...]]:
    return [tuple(sizes[c] for c in t) for t in equation.split("->")[0].split(",")]


@pytest.mark.parametrize("nprocs", PROCS)
@pytest.mark.parametrize("kernel", PUBLISHED_ATOMIC)
def test_atomic_bound_is_the_published_one(kernel, nprocs):
    eq = KERNELS[kernel]
    a = analyze(decompose(eq, *shapes_of(eq, paper_sizes(kernel, nprocs))), P=nprocs)
    published = PUBLISHED_ATOMIC[kernel][PROCS.index(nprocs)]
    assert abs(a.atomic_words - published) <= 0.01 * published, (a.atomic_words, published)


def validity_cases(count: int, seed: int):
    """Random einsums (2-5 operands, uneven sizes up to 40, no unary pre-pass) at P log-uniform in
    [2, 4096], cycling through every start and end mode."""
    rng = np.random.default_rng(seed)
    cases = [(eq, shapes) for eq, shapes in random_einsums(count * 4, seed=seed, max_ops=5, max_size=40)
             if not decompose(eq, *shapes).prepass][:count]
    return [(eq, shapes, int(round(2 ** rng.uniform(1, 12))), *MODES[k % len(MODES)])
            for k, (eq, shapes) in enumerate(cases)]


def check_validity(eq, shapes, nprocs, inputs, result):
    """The class bound (at the chosen plan's balance) below every candidate scored. A candidate's own bound may
    exceed its plan where that plan is less balanced than the chosen one (``c,dea,c`` on 11 ranks, 59 words > 56
    at exact balance, for a plan that idles ranks)."""
    plan = build_plan(decompose(eq, *shapes), nprocs, inputs=inputs, result=result)
    b, ours = plan.bound, busiest(plan)
    for partition, _, words in b.candidates:
        assert words is None or b.words <= words, (partition, b.words, words)
    assert b.words <= ours and b.chosen_words <= ours and b.words <= b.atomic
    assert ("outside that class" in str(plan)) == (ours < b.atomic)


def with_sweep(default: list, sweep: list) -> list:
    """``default`` cases, then ``sweep`` marked slow."""
    return default + [pytest.param(*case, marks=pytest.mark.slow) for case in sweep]


def one_of_five_operands(cases: list) -> tuple[list, list]:
    """``cases`` split into those of fewer than five operands and the first of five, and the other five-operand
    ones (105 contraction paths for the class bound: seconds each)."""
    five = [c for c in cases if c[0].split("->")[0].count(",") == 4]
    return [c for c in cases if c not in five[1:]], five[1:]


def validity_sweep() -> list:
    """27 cases by default (but five of five operands: -m slow) and 306 more under -m slow."""
    default, later = one_of_five_operands(validity_cases(27, seed=31))
    return with_sweep(default, later + validity_cases(306, seed=37))


@pytest.mark.parametrize("eq, shapes, nprocs, inputs, result", validity_sweep())
def test_class_bound_below_every_scored_candidate(eq, shapes, nprocs, inputs, result):
    check_validity(eq, shapes, nprocs, inputs, result)


def check_other_paths(eq, shapes, nprocs, inputs, result):
    """The class bound (over every contraction path) below the plan built along each path: the
    decomposition forced along it, planned from the same start to the same end. Each plan's bound is at its own
    balance; the same on every path at the same balance."""
    d = decompose(eq, *shapes)
    first = build_plan(d, nprocs, inputs=inputs, result=result)
    exact = first.analysis.class_bound[0]
    for path in contraction_paths(len(d.input_subscripts)):
        other = build_plan(decompose(eq, *shapes, optimize=list(path)), nprocs, inputs=inputs, result=result)
        assert other.analysis.class_bound[0] == pytest.approx(exact, rel=1e-9, abs=1e-6), path
        assert other.bound.words <= busiest(other), (path, other.bound.words, busiest(other))
        assert other.balance != first.balance or other.bound.words == first.bound.words, path


def path_cases(count: int, seed: int):
    """Validity cases of 3 or 4 operands (their paths are few: 3 and 15)."""
    return [c for c in validity_cases(count * 4, seed) if 3 <= len(c[0].split("->")[0].split(",")) <= 4][:count]


#: By default three einsums (of 3 and 4 operands, every start mode); the fourth of that draw (4 operands, root to all:
#: 15 plans with their bounds, 10-20 s) and 60 more under -m slow.
@pytest.mark.parametrize("eq, shapes, nprocs, inputs, result",
                         with_sweep(path_cases(3, seed=41), path_cases(4, seed=41)[3:] + path_cases(60, seed=43)))
def test_class_bound_below_the_plans_of_every_path(eq, shapes, nprocs, inputs, result):
    check_other_paths(eq, shapes, nprocs, inputs, result)


def test_uneven_plans_lie_inside_their_class():
    """The bounds assume every rank computes at most rho |V_g|/P iterations of every group, rho the plan's own
    balance: the exact-balance bound is above plans that split unevenly or idle ranks (a TTMc-like chain on 7
    ranks, one group on 3 of them: 27 words > 22); at the plan's rho it is below them, equal at rho = 1, and
    every output states rho where it is above 1, in the same words."""
    chain = build_plan(decompose("ijklm,jb,kc,ld,me->ibcde", (5, 4, 3, 4, 3), (4, 2), (3, 3), (4, 2), (3, 2)), 7)
    assert chain.balance == 2.8 and chain.analysis.class_bound[0] > busiest(chain) >= chain.bound.words > 0
    mm = decompose("ij,jk->ik", (5, 5), (5, 5))
    plan = build_plan(mm, 4)                                   # grid 2 x 1 x 2: a busiest block of 3 x 5 x 3
    assert [g.grid.dims for g in plan.groups] == [(2, 1, 2)] and plan.balance == plan.bound.rho == 1.44
    exact = analyze(mm, P=4, owned=None).class_bound[0]
    assert plan.analysis.balanced(1.0) is plan.analysis and plan.analysis.class_bound[0] == exact
    assert 0 < plan.bound.words <= busiest(plan) and plan.bound.words < exact
    assert plan.bound_analysis.class_bound[0] <= plan.bound.words == plan.to_dict()["lower_bound_bytes_per_rank"] / 8
    wording = "every rank computes at most rho |V_g|/P of the |V_g| iterations of every group g, rho = 1.44 "
    text, data = str(plan), plan.to_dict()
    assert wording in text and data["lower_bound_assumptions"].startswith(wording) and data["lower_bound_balance"] == 1.44
    assert plan.bound_analysis.to_dict()["per_rank"]["balance"].startswith(wording)
    assert "exactly balanced" not in text and "lies outside the class" not in text
    assert wording.replace("rho = 1.44", "rho = 1.44 at P = 4") in " ".join(bound_notes([plan]))
    even = build_plan(decompose("ij,jk->ik", (8, 8), (8, 8)), 8)
    assert even.balance == 1.0 and "exactly balanced" in str(even) and "rho =" not in str(even)
    assert "exactly balanced" in str(analyze(mm, P=4))      # no plan: exact balance, and it says so


@pytest.mark.parametrize("args", [
    ["ij,jk,kl->il", "--size", "i=300,j=20,k=200,l=30", "-P", "3", "--inputs", "local", "--result", "distributed"],
    ["ijk,ja,ka->ia", "--size", "i=96,j=80,k=64,a=12", "-P", "4"],                 # the README's quick start
    ["ijk,ja,ka->ia", "--size", "i=96,j=80,k=64,a=12", "-P", "4", "--inputs", "local", "--result", "distributed"]])
def test_bound_command_prints_no_class_bound_above_its_plan(args, capsys):
    """``deinsum bound -P`` printed 5,522 words for the first einsum, whose plan moves 800: that is the
    atomic bound, now labelled one-statement only, beside the class bound."""
    assert main(["bound", *args, "--memory", "1GiB"]) == 0
    text = capsys.readouterr().out
    ours = int(re.search(r"total received per rank: max ([\d,]+) bytes", text)[1].replace(",", "")) // 8
    analysis = int(re.search(r"class bound >= ([\d,]+):", text)[1].replace(",", ""))
    printed = [int(w.replace(",", "")) for w in re.findall(r"\(([\d,]+)\)  (?:this plan's|class bound)", text)]
    assert analysis <= ours and len(printed) == 2 and max(printed) <= ours
    assert "one-statement algorithms only" in text and "a rank owning" not in text
    for needed in ("balance per group", "no recomputation", "one copy", "classical arithmetic", "busiest rank",
                   "any memory per rank"):
        assert needed in text


@pytest.mark.parametrize("nprocs", [64, pytest.param(4096, marks=pytest.mark.slow)])
@pytest.mark.parametrize("kernel", ["1MM", "MTTKRP-O3-M0"])
def test_memory_dependent_bound_below_every_candidate_that_fits(kernel, nprocs):
    """Memory from 1.25x to 8x the data share: the memory-dependent bound, printed where the plan fits (and it is
    positive), is below every scored candidate whose plan fits that memory."""
    sizes = paper_sizes(kernel, nprocs)
    share = fair_plan(KERNELS[kernel], sizes, nprocs).data_share
    for factor in (1.25, 2, 4, 8):
        plan = fair_plan(KERNELS[kernel], sizes, nprocs, memory=int(factor * share * 8))
        words = plan.memory_bound_words
        assert plan.feasible and words is not None
        assert ("memory-dependent bound at" in str(plan)) == (words > 0)    # printed where it binds at all
        assert plan.to_dict()["memory_dependent_lower_bound_bytes_per_rank"] == words * 8
        fitting = [w for (_, _, w), fits in zip(plan.bound.candidates, plan.bound.fits) if fits]
        assert fitting and all(words <= w for w in fitting), (factor, words, fitting)
    small = fair_plan(KERNELS[kernel], sizes, nprocs, memory=share * 4)   # half the data share: nothing fits
    assert not small.feasible and small.memory_bound_words is None and "memory-dependent" not in str(small)


def test_a_chain_beyond_its_class_bound_says_no_tight_bound_is_known():
    """TTMc at P = 512: the chain of two statements moves 5.3x the class bound; the text and JSON say that no
    tight bound is known for its class (the atomic bound covers one statement)."""
    plan = fair_plan(KERNELS["TTMc-O5-M0"], paper_sizes("TTMc-O5-M0", 512), 512)
    assert len(plan.groups) == 2 and plan.unknown_bound and "no tight lower bound is known" in str(plan)
    assert plan.to_dict()["tight_bound_unknown"] == plan.unknown_bound
    fused = fair_plan(KERNELS["TTMc-O5-M0"], paper_sizes("TTMc-O5-M0", 8), 8)
    assert fused.unknown_bound is None and "no tight" not in str(fused)


def test_latex_has_a_per_p_table_and_compiles(capsys, tmp_path):
    """`bound --latex --per-p`: the sequential table with clamped tiles clamped and its total, the per-P table
    (class bound, atomic bound, plan, plan / bound) equal to the plans, the class and assumptions; it compiles
    with pdflatex where one is installed."""
    args = ["bound", "ijk,ja,ka->ia", "--size", "i=96,j=80,k=64,a=12", "-P", "4", "--per-p", "2,8", "--latex",
            "--inputs", "local", "--result", "distributed", "--memory", "1GiB"]
    assert main(args) == 0
    tex = capsys.readouterr().out
    d = decompose("ijk,ja,ka->ia", (96, 80, 64), (80, 12), (64, 12))
    for nprocs in (2, 4, 8):
        plan = build_plan(d, nprocs, inputs="local", result="distributed", memory="1GiB")
        row = (f"${nprocs}$ & ${plan.bound.words:,}$ & ${plan.bound.atomic:,}$ & ${busiest(plan):,}$ & "
               f"${busiest(plan) / plan.bound.words:.3f}$").replace(",", r"\,")
        assert row in tex, row
    assert "t_{a} = 12 = N_{a}" in tex and "Total over the groups of the chosen fusion" in tex
    for needed in ("balance per group", "no recomputation", "classical arithmetic", "busiest rank",
                   "contraction paths", "one-statement algorithms only"):
        assert needed in tex
    engine = shutil.which("pdflatex")
    if engine is None:
        pytest.skip("no LaTeX engine installed (pdflatex)")
    (tmp_path / "doc.tex").write_text("\\documentclass{article}\n\\usepackage{booktabs,amsmath}\n"
                                      "\\begin{document}\n" + tex + "\n\\end{document}\n")
    done = subprocess.run([engine, "-interaction=nonstopmode", "-halt-on-error", "doc.tex"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and (tmp_path / "doc.pdf").exists(), done.stdout[-2000:]
