"""compile(...)(*arrays) under real mpiexec at P = 1..8 (1, 3, 4, 8 by default): equals numpy, bytes == model."""
import json
from pathlib import Path

import pytest

from mpirun import check_mpi, run_mpi_script, some_p
from random_cases import random_einsums
from suite import SUITE, shapes_for

CASES = [(eq, shapes_for(eq, sizes)) for eq, sizes in SUITE.values()] + random_einsums(200, seed=7)
#: The default run: the suite and 14 random einsums, so that case n's (mode n % 3, dtype n % 4) takes all 12 pairs.
SUBSET = CASES[:len(SUITE) + 14]

DRIVER = """
import json, sys
import numpy as np
from mpi4py import MPI
import deinsum
from deinsum.peak import SLACK

comm = MPI.COMM_WORLD
cases = json.load(open(sys.argv[1]))
tight = len(sys.argv) > 2            # each plan given half the way from its unconstrained peak to the data's share
prefetch = "prefetch" in sys.argv[2:]  # and groups in rounds posting the next round's moves early where that fits
modes = [("global", "all"), ("root", "root"), ("local", "distributed")]
rng = np.random.default_rng(0)
failures, runs, in_rounds, refused, prefetched = [], 0, 0, 0, 0
for n, (eq, shapes) in enumerate(cases):
    dtype = [np.float64, np.complex64, np.float32, np.complex128][n % 4]
    arrays = [np.asarray(rng.uniform(-1, 1, s), dtype=dtype) for s in shapes]
    want = np.einsum(eq, *arrays)
    tol = 1e-4 if dtype in (np.float32, np.complex64) else 1e-10
    inputs, result = modes[n % 3]
    prog = deinsum.compile(eq, *shapes, dtype=dtype, prefetch=prefetch)
    if tight:
        free = prog.plan(nprocs=comm.size, inputs=inputs, result=result)
        share = SLACK + free.data_share * free.dtype.itemsize
        prog.memory = share + max(0, free.peak_bytes - share) // 2
        plan = prog.plan(nprocs=comm.size, inputs=inputs, result=result)
        in_rounds += any(g.rounds for g in plan.groups)
        prefetched += any(m.prefetch for m in plan.moves)
    if inputs == "local":
        blocks = prog.input_blocks(comm.rank, comm.size, result=result)
        args = [a[b] for a, b in zip(arrays, blocks)]
    elif inputs == "root":
        args = arrays if comm.rank == 0 else [None] * len(arrays)
    else:
        args = arrays
    try:
        got = prog(*args, inputs=inputs, result=result)
    except deinsum.DeinsumError as exc:
        if not (tight and not plan.feasible and f"{plan.peak_bytes:,} bytes" in str(exc)):
            failures.append(f"{eq} {shapes}: {exc}")
        refused += 1
        runs += 1
        continue
    if tight and not plan.feasible:
        failures.append(f"{eq} {shapes}: ran a plan over its memory")
    runs += 1
    if result == "distributed":
        block = got.block
        got, want = (None, None) if block is None else (got.local, want[block])
    elif result == "root" and comm.rank != 0:
        got, want = None, None
    if got is not None:
        scale = np.max(np.abs(want), initial=0) + 1
        if np.shape(got) != np.shape(want) or not np.allclose(got, want, rtol=tol, atol=tol * scale):
            failures.append(f"{eq} {shapes} {inputs}->{result}: wrong values on rank {comm.rank}")
    if not prog.last_run.matches_model:
        failures.append(f"{eq} {shapes}: bytes {prog.last_run} != model")
failures = comm.gather(failures, root=0)
if comm.rank == 0:
    bad = [f for rank in failures for f in rank]
    print(json.dumps({"runs": runs, "failures": bad[:20], "nfail": len(bad), "rounds": in_rounds,
                      "refused": refused, "prefetched": prefetched}))
"""


def check_cases(nprocs, cases, tmp_path, tight=False, prefetch=False):
    """Run ``cases`` on ``nprocs`` ranks; with ``tight`` memory and ``prefetch`` (see DRIVER); return the driver's
    summary."""
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    flags = (["tight"] if tight else []) + (["prefetch"] if prefetch else [])
    res = run_mpi_script(nprocs, script, str(tmp_path / "cases.json"), *flags, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["runs"] == len(cases)
    assert summary["nfail"] == 0, summary["failures"]
    return summary


@pytest.mark.parametrize("nprocs", some_p(1, 3, 4))   # (P = 8, four ranks a core here: slow; test_emit runs it)
def test_program_matches_numpy_and_model(nprocs, tmp_path):
    check_cases(nprocs, SUBSET, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("nprocs", range(1, 9))
def test_program_matches_numpy_and_model_on_210_einsums(nprocs, tmp_path):
    check_cases(nprocs, CASES, tmp_path)


@pytest.mark.parametrize("nprocs", some_p(3))
def test_tight_memory_plans_run_in_rounds_equal_numpy_and_model(nprocs, tmp_path):
    """Every case given half the way from its unconstrained peak to its data share: a plan that fits (rounds,
    leaner grids) runs equal to numpy with bytes == model, one that cannot is refused on every rank with the
    bytes it needs."""
    summary = check_cases(nprocs, SUBSET, tmp_path, tight=True)
    assert summary["rounds"] >= 3, summary


@pytest.mark.parametrize("nprocs", some_p(1, 4, every=(1, 3, 4)))
def test_prefetching_plans_equal_numpy_and_model(nprocs, tmp_path):
    """The same tight cases with prefetch on: groups in rounds post each round's moves before the previous round
    computes (Ialltoallw, two rounds' pieces held) where that fits, and still equal numpy with bytes == model (at
    P = 1 nothing moves, so nothing is prefetched: the option must leave those plans alone)."""
    summary = check_cases(nprocs, SUBSET, tmp_path, tight=True, prefetch=True)
    assert summary["prefetched"] >= 3 if nprocs > 1 else summary["prefetched"] == 0, summary


CART_SUB = """
import numpy as np
from mpi4py import MPI
import deinsum
comm = MPI.COMM_WORLD
shapes = [(30, 20), (20, 10), (10, 5)]
prog = deinsum.compile("ij,jk,kl->il", *shapes)
plan = prog.plan(nprocs=comm.size, inputs="local", result="distributed")
assert any(e.comm.name == "grid0_sum" for m in plan.moves for e in m.exchanges), "expected a reduce-scatter on a Cart_sub"
rng = np.random.default_rng(1)
arrays = [rng.standard_normal(s) for s in shapes]
blocks = prog.input_blocks(comm.rank, comm.size, result="distributed")
got = prog(*[a[b] for a, b in zip(arrays, blocks)], inputs="local", result="distributed")
want = np.einsum("ij,jk,kl->il", *arrays)
if got.block is not None:
    assert np.allclose(got.local, want[got.block])
assert prog.last_run.matches_model, prog.last_run
if comm.rank == 0:
    print("OK")
"""


def test_reduce_scatter_phase_runs_on_cart_sub(tmp_path):
    """The plan puts the reduce-scatter of t0's partial sums on the reduction group's Cart_sub."""
    assert check_mpi(6, CART_SUB, tmp_path=tmp_path, timeout=120).strip() == "OK"


PINNED = """
import sys
sys.path.insert(0, TESTS)
import numpy as np
from mpi4py import MPI
import deinsum
from deinsum.layout import Layout
from suite import SUITE, shapes_for

comm = MPI.COMM_WORLD
rng = np.random.default_rng(3)
checked = 0
for n, (name, (eq, sizes)) in enumerate(SUITE.items()):
    shapes = shapes_for(eq, sizes)
    out_shape = tuple(sizes[c] for c in eq.split("->")[1])
    dtype = [np.float64, np.complex64, np.float32, np.complex128][n % 4]
    for pins in ({0: "even", "out": "even"}, {1: "root"}, {"out": Layout.on_root(out_shape, comm.size)}):
        prog = deinsum.compile(eq, *shapes, dtype=dtype, layouts=pins)
        arrays = [np.asarray(rng.uniform(-1, 1, s), dtype=dtype) for s in shapes]
        blocks = prog.input_blocks(comm.rank, comm.size, result="distributed")
        got = prog(*[a[b] for a, b in zip(arrays, blocks)], inputs="local", result="distributed")
        want = np.einsum(eq, *arrays)
        tol = 1e-4 if dtype in (np.float32, np.complex64) else 1e-10
        if got.block is not None:
            assert np.allclose(got.local, want[got.block], rtol=tol, atol=tol * (np.abs(want).max() + 1)), (eq, pins)
        assert prog.last_run.matches_model, (eq, pins, prog.last_run)
        plan = prog.plan(nprocs=comm.size, inputs="local", result="distributed")
        for key, spec in pins.items():
            name_ = f"in{key}" if isinstance(key, int) else key
            assert name_ in plan.pinned
        checked += 1
checked = comm.allreduce(checked)
if comm.rank == 0:
    print("OK", checked)
"""


@pytest.mark.parametrize("nprocs", some_p(3))
def test_pinned_layouts_run_and_match_the_model(nprocs, tmp_path):
    """Pinned inputs (even, root) and results (even, root) under mpiexec: equal numpy, bytes == model."""
    tests = str(Path(__file__).resolve().parent)
    out = check_mpi(nprocs, PINNED.replace("TESTS", repr(tests), 1), tmp_path=tmp_path, timeout=600)
    assert out.split()[0] == "OK"


PINNED_WHOLE = """
import numpy as np
from mpi4py import MPI
import deinsum

comm = MPI.COMM_WORLD
rng = np.random.default_rng(4)
checked = 0
for eq, shapes in (("ij,jk->ik", [(6, 4), (4, 3)]), ("ijk,ja,ka->ia", [(7, 6, 5), (6, 3), (5, 3)])):
    arrays = [rng.uniform(-1, 1, s) for s in shapes]
    want = np.einsum(eq, *arrays)
    for inputs in ("global", "root"):
        args = arrays if inputs == "global" or comm.rank == 0 else [None] * len(arrays)
        for pins in ({0: "even"}, {1: "even"}, {0: "replicated"}, {1: "replicated"}, {0: "root", 1: "even"},
                     {1: f"{comm.size}: -, 0"}):
            for result in ("all", "distributed"):
                with deinsum.compile(eq, *shapes, inputs=inputs, result=result, layouts=pins) as prog:
                    got = prog(*args)
                got = got.gather() if result == "distributed" else got
                assert np.allclose(got, want), (eq, inputs, pins, result)
                assert prog.last_run.matches_model, (eq, inputs, pins, result, prog.last_run)
                checked += 1
checked = comm.allreduce(checked)
if comm.rank == 0:
    print("OK", checked)
"""


@pytest.mark.parametrize("nprocs", some_p(3, every=(2, 3)))
def test_pinned_inputs_start_whole_then_move_into_their_layout(nprocs, tmp_path):
    """Global or root inputs with pinned layouts (even, replicated, root, a grid), results all or distributed:
    equal numpy on every rank, bytes == model (the plan once took a pinned input to start in its pinned layout,
    so a rank passed the whole array for its block: a ValueError deep in an exchange, or a hang)."""
    out = check_mpi(nprocs, PINNED_WHOLE, tmp_path=tmp_path, timeout=300)
    assert out.split() == ["OK", str(2 * 2 * 6 * 2 * nprocs)]


NATIVE = """
import numpy as np
from mpi4py import MPI
import deinsum
comm = MPI.COMM_WORLD
rng = np.random.default_rng(0)
seen = set()
for eq, shapes in [("ab,bc,cd,de,ef,fa->", [(6, 6)] * 6), ("ijk,ja,ka->ia", [(8, 8, 8), (8, 4), (8, 4)]),
                   ("ijk,jk->i", [(32, 8, 8), (8, 8)])]:
    arrays = [rng.standard_normal(s) for s in shapes]
    for inputs, result in (("global", "all"), ("root", "root")):
        prog = deinsum.compile(eq, *shapes)
        got = prog(*(arrays if inputs == "global" or comm.rank == 0 else [None] * len(arrays)), inputs=inputs,
                   result=result)
        if result == "all" or comm.rank == 0:
            assert np.allclose(got, np.einsum(eq, *arrays)), (eq, result)
        assert prog.last_run.matches_model, prog.last_run
        seen |= {e.mpi for m in prog.plan(nprocs=comm.size, inputs=inputs, result=result).moves for e in m.exchanges}
if comm.rank == 0:
    print(sorted(s for s in seen if s))
"""


def test_native_collectives_equal_numpy_and_log_the_model(tmp_path):
    """MPI's own Allreduce, Reduce (a scalar's partial sums), Allgather and Reduce_scatter run in programs at
    P = 4, their results equal numpy's and the bytes logged equal the model on every rank."""
    seen = check_mpi(4, NATIVE, tmp_path=tmp_path, timeout=300).strip().splitlines()[-1]
    assert seen == str(["Allgather", "Allreduce", "Alltoallw", "Reduce", "Reduce_scatter"])
