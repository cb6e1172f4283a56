"""Never a wrong result, never a hang (issue 12): one test per row of the issue's table, under real
``mpiexec`` with timeouts where ranks are involved, plus randomized disagreement launches.

A job prints ``LABEL rank R OK right|WRONG @@`` or ``LABEL rank R ERROR <message> @@`` per attempt; the
checks below read those lines: the same one-line error on every rank, or the right result.
"""
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import deinsum
from mpirun import MPIEXEC, run_mpi, run_mpi_script

PRELUDE = '''
import sys
import numpy as np
import deinsum
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, P = comm.rank, comm.size
failed = False


def attempt(label, call, want=None):
    """Run call(); print one line: OK with a checksum matching `want`, or the DeinsumError."""
    global failed
    try:
        out = call()
    except deinsum.DeinsumError as exc:
        failed = True
        print(f"{label} rank {rank} ERROR {exc} @@", flush=True)
        return None
    good = want is None or np.allclose(np.asarray(out), want)
    print(f"{label} rank {rank} OK {'right' if good else 'WRONG'} @@", flush=True)
    return out
'''


def job(code: str) -> str:
    return PRELUDE + textwrap.dedent(code) + "\nsys.exit(3 if failed else 0)\n"


def outcome(stdout: str, label: str, nprocs: int) -> str:
    """'right' if every rank got the right result; else the one error message all ranks share."""
    lines = dict(re.findall(rf"{re.escape(label)} rank (\d+) (.*?) @@", stdout))   # ranks' lines may interleave
    assert sorted(map(int, lines)) == list(range(nprocs)), (label, stdout)
    values = set(lines.values())
    assert len(values) == 1, f"{label}: ranks differ: {lines}"
    value = values.pop()
    assert value in ("OK right", "ERROR " + value[6:]), value
    return "right" if value == "OK right" else value[6:]


def assert_clean(res, stray_dir: Path | None = None, code: int | None = None):
    assert "Traceback" not in res.stderr + res.stdout, res.stderr
    if code is not None:
        assert res.returncode == code, (res.returncode, res.stderr)
    if stray_dir is not None:
        assert not [p.name for p in stray_dir.iterdir() if "tmp" in p.name], list(stray_dir.iterdir())


# ---- row 1: different shapes or equations with global inputs ---------------------------------------
def test_ranks_with_different_shapes_or_equations_all_raise_the_same_error(tmp_path):
    res = run_mpi(3, job('''
        A, B = np.ones((4, 5)), np.ones((5, 6))
        attempt("shape", lambda: deinsum.einsum("ij,jk->ik", A if rank != 1 else np.ones((4, 6)), B))
        attempt("equation", lambda: deinsum.einsum("ij,jk->ik" if rank != 2 else "ij,jk->ki", A, B))
        prog = deinsum.compile("ij,jk->ik")   # parametric: shapes come from the call
        attempt("call", lambda: prog(A, B if rank != 0 else np.ones((5, 7))))
        attempt("after", lambda: deinsum.einsum("ij,jk->ik", A, B), want=A @ B)
    '''), tmp_path=tmp_path, timeout=120)
    assert_clean(res, code=3)
    assert re.search(r"disagree on shapes: \(\(4, 5\), \(5, 6\)\) on ranks 0, 2; \(\(4, 6\), \(5, 6\)\) on rank 1",
                     outcome(res.stdout, "shape", 3))
    assert re.search(r"disagree on equation: .*ij,jk->ik.* on ranks 0-1; .*ij,jk->ki.* on rank 2",
                     outcome(res.stdout, "equation", 3))
    assert re.search(r"disagree on shapes: .*\(5, 7\).* on rank 0; .*\(5, 6\).* on ranks 1-2",
                     outcome(res.stdout, "call", 3))
    assert outcome(res.stdout, "after", 3) == "right"   # the ranks are still in step


# ---- row 2: different dtypes or operand counts -----------------------------------------------------
def test_ranks_with_different_dtypes_or_operand_counts_all_raise_the_same_error(tmp_path):
    res = run_mpi(2, job('''
        A, B = np.ones((4, 5)), np.ones((5, 6))
        prog = deinsum.compile("ij,jk->ik", (4, 5), (5, 6))
        attempt("dtype", lambda: prog(A.astype(np.float32) if rank else A, B.astype(np.float32) if rank else B))
        attempt("count", lambda: prog(A, B) if rank == 0 else prog(A, B, B))
        attempt("after", lambda: prog(A, B), want=A @ B)
    '''), tmp_path=tmp_path, timeout=120)
    assert_clean(res, code=3)
    assert re.search(r"disagree on dtype: dtype\('float64'\) on rank 0; dtype\('float32'\) on rank 1",
                     outcome(res.stdout, "dtype", 2))
    assert "rank 1: 'ij,jk->ik' takes 2 operands, got 3" in outcome(res.stdout, "count", 2)
    assert outcome(res.stdout, "after", 2) == "right"


# ---- row 3: one rank's bad block shape, caught by the application -----------------------------------
def test_a_bad_local_block_on_one_rank_raises_on_every_rank_and_nobody_hangs(tmp_path):
    res = run_mpi(4, job('''
        X, A = np.arange(48.).reshape(6, 8), np.arange(40.).reshape(8, 5)
        prog = deinsum.compile("ij,jk->ik", (6, 8), (8, 5), inputs="local", result="all")
        blocks = prog.input_blocks(rank, P)
        x, a = X[blocks[0]], A[blocks[1]]
        attempt("first", lambda: prog(x, a), want=X @ A)
        attempt("bad", lambda: prog(x[:, :-1] if rank == 2 else x, a))   # the app catches the error
        attempt("good", lambda: prog(x, a), want=X @ A)
        planned = []
        prog.plan = lambda *args, **kw: planned.append(1) or type(prog).plan(prog, *args, **kw)
        attempt("again", lambda: prog(x, a), want=X @ A)                 # a repeated call: not planned again
        attempt("unplanned", lambda: None if planned else x, want=x)
        del prog.plan
        prog.memory = 10                                                 # a changed program: planned again
        attempt("small", lambda: prog(x, a))
    '''), tmp_path=tmp_path, timeout=120)
    assert_clean(res, code=3)
    assert outcome(res.stdout, "first", 4) == "right"
    assert re.match(r"rank 2: operand 0: rank 2 must pass its block of shape \(\d+, \d+\)",
                    outcome(res.stdout, "bad", 4))
    assert outcome(res.stdout, "good", 4) == "right"
    assert outcome(res.stdout, "again", 4) == "right"
    assert outcome(res.stdout, "unplanned", 4) == "right"
    assert "memory" in outcome(res.stdout, "small", 4)


# ---- repeated calls reuse their plan only when every rank repeats the same call -----------------------
def test_a_plan_is_reused_only_when_every_rank_repeats_its_call(tmp_path):
    res = run_mpi(3, job('''
        X, A = np.arange(30.).reshape(6, 5), np.arange(20.).reshape(5, 4)
        prog = deinsum.compile("ij,jk->ik", memory="80MB")
        attempt("first", lambda: prog(X, A), want=X @ A)
        if rank == 0:                                   # a call of rank 0 alone: only its cache moves on
            attempt("alone", lambda: prog(X, A, comm=MPI.COMM_SELF), want=X @ A)
        attempt("after alone", lambda: prog(X, A), want=X @ A)
        if rank == 1:                                   # one rank's memory changes: everyone plans again
            prog.memory = 16 * 10**7
        attempt("one memory", lambda: prog(X, A), want=X @ A)
        prog.equation = "ij,jk->ki"                     # a changed equation is planned again
        attempt("equation", lambda: prog(X, A), want=(X @ A).T)
        part = comm.Split(rank // 2)                    # another communicator of the same size as an old one
        attempt("split", lambda: prog(X, A, comm=part), want=(X @ A).T)
    '''), tmp_path=tmp_path, timeout=120)
    assert_clean(res, code=0)
    for label in ("first", "after alone", "one memory", "equation", "split"):
        assert outcome(res.stdout, label, 3) == "right", label


# ---- issue 30: one-time set-up (thread pin, node layout, device) and options decided collectively ----
@pytest.mark.parametrize("nprocs", [2, 3])
@pytest.mark.parametrize("first", ["alone", "sub"])
def test_a_first_use_by_part_of_the_ranks_leaves_no_rank_waiting(nprocs, first, tmp_path):
    """Some ranks' first call (rank 0 alone on COMM_SELF, or the others on a sub-communicator) pins their
    BLAS threads and learns the node layout: the first call of all ranks together must not wait on them."""
    res = run_mpi(nprocs, job(f'''
        A, B = np.ones((4, 3)), np.ones((3, 2))
        part = comm.Split(int(rank == 0))
        if {first!r} == "alone" and rank == 0:
            attempt("first", lambda: deinsum.einsum("ij,jk->ik", A, B, comm=MPI.COMM_SELF), want=A @ B)
        if {first!r} == "sub" and rank != 0:
            attempt("first", lambda: deinsum.einsum("ij,jk->ik", A, B, comm=part), want=A @ B)
        attempt("together", lambda: deinsum.einsum("ij,jk->ik", A, B), want=A @ B)
    '''), tmp_path=tmp_path, timeout=60)
    assert_clean(res, code=0)
    assert outcome(res.stdout, "together", nprocs) == "right"


@pytest.mark.parametrize("nprocs", [2, 3])
def test_options_and_distributed_array_arguments_are_agreed_before_any_collective(nprocs, tmp_path):
    res = run_mpi(nprocs, job('''
        A, B = np.ones((4, 3)), np.ones((3, 2))
        one = rank == 0
        attempt("threads", lambda: deinsum.einsum("ij,jk->ik", A, B, threads=None if one else "auto"))
        attempt("device", lambda: deinsum.einsum("ij,jk->ik", A, B, device="gpu" if one else "cpu"))
        attempt("gpu", lambda: deinsum.einsum("ij,jk->ik", A, B, device="gpu"), want=A @ B)   # no CuPy: one error
        attempt("nprocs", lambda: deinsum.einsum("ij,jk->ik", A, B, nprocs=P + 1 if one else None))
        X, M = np.arange(48.).reshape(6, 8), np.arange(64.).reshape(8, 8)
        x = deinsum.DistributedArray.from_global(X, f"{P}: 0, -")   # last axis whole: no move before the product
        attempt("matmul", lambda: x.matmul(M[:, :5] if one else M).norm())
        attempt("with_local", lambda: x.with_local(x.local[:, :5] if one else x.local, (6, 5) if one else None))
        attempt("vdot", lambda: x.vdot(X if one else x))
        attempt("gram", lambda: x.matmul(M).gram(), want=(X @ M).T @ (X @ M))
        attempt("norm", lambda: x.matmul(M).norm(), want=np.linalg.norm(X @ M))
    '''), tmp_path=tmp_path, timeout=90)
    assert_clean(res, code=3)
    others = "rank 1" if nprocs == 2 else "ranks 1-2"
    for label, message in [("threads", f"disagree on threads: None on rank 0; 'auto' on {others}"),
                           ("device", f"disagree on device: 'gpu' on rank 0; 'cpu' on {others}"),
                           ("nprocs", f"disagree on compiled nprocs: {nprocs + 1} on rank 0; None on {others}"),
                           ("matmul", f"disagree on matmul matrix shape: (8, 5) on rank 0; (8, 8) on {others}"),
                           ("with_local", f"disagree on with_local shape: (6, 5) on rank 0; (6, 8) on {others}"),
                           ("vdot", "rank 0: vdot: expected a DistributedArray of shape (6, 8)")]:
        assert message in outcome(res.stdout, label, nprocs), label
    gpu = outcome(res.stdout, "gpu", nprocs)
    assert gpu == "right" or gpu.startswith("device='gpu'"), gpu
    assert outcome(res.stdout, "gram", nprocs) == "right" and outcome(res.stdout, "norm", nprocs) == "right"


def test_agreement_reduces_three_integers_and_gathers_only_to_explain(tmp_path):
    """``agree``: ranks that agree do one Allreduce and no allgather (nothing that grows with P); a
    disagreement or one rank's failure then gathers what is needed for the same one-line error everywhere."""
    res = run_mpi(3, '''
        from mpi4py import MPI
        from deinsum.runtime.checks import agree
        rank = MPI.COMM_WORLD.rank

        class Counting:
            def __init__(self, comm):
                self.comm, self.calls = comm, []

            def __getattr__(self, name):
                self.calls.append(name)
                return getattr(self.comm, name)

        comm, lines = Counting(MPI.COMM_WORLD), []
        agree(comm, {"shapes": ((4, 5),), "dtype": "float64"})
        lines.append(f"agreeing {rank} {sorted(set(comm.calls) - {'Get_size'})}")
        comm.calls.clear()
        for facts, failure in [({"n": rank % 2}, None), ({}, "bad  block" if rank == 2 else None)]:
            try:
                agree(comm, facts, failure)
            except ValueError as exc:
                lines.append(f"error {rank} {exc}")
        lines.append(f"explaining {rank} {sorted(set(comm.calls) - {'Get_size'})}")
        every = MPI.COMM_WORLD.gather(lines)
        if rank == 0:
            print("\\n".join(line for ranks in every for line in ranks))
    ''', tmp_path=tmp_path, timeout=60)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert sorted(x for x in lines if x.startswith("agreeing")) == [f"agreeing {r} ['Allreduce']" for r in range(3)]
    assert sorted(x for x in lines if x.startswith("error")) == sorted(
        [f"error {r} the ranks disagree on n: 0 on ranks 0, 2; 1 on rank 1" for r in range(3)]
        + [f"error {r} rank 2: bad block" for r in range(3)])
    assert sorted(x for x in lines if x.startswith("explaining")) == [
        f"explaining {r} ['Allreduce', 'allgather']" for r in range(3)]


# ---- row 4: a plan that does not fit in memory is refused before anything is allocated --------------
def test_a_plan_over_the_memory_limit_is_refused_before_allocation(tmp_path):
    res = run_mpi(2, job('''
        import resource
        x = np.ones(100_000)
        attempt("default", lambda: deinsum.einsum("i,j->ij", x, x))   # 40 GB per rank: more than this machine has
        attempt("given", lambda: deinsum.einsum("i,j->ij", x[:1000], x[:1000], memory=8 * 10**5))
        attempt("fits", lambda: deinsum.einsum("i,j->ij", x[:100], x[:100], memory="8MB"), want=np.ones((100, 100)))
        print(f"rank {rank} maxrss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss} KiB", flush=True)
    '''), tmp_path=tmp_path, timeout=120)
    assert_clean(res, code=3)
    default = outcome(res.stdout, "default", 2)
    assert re.search(r"needs 1\d\d,\d{3},\d{3},\d{3} bytes per rank at its peak \(rank 0\) but [\d,]+ bytes are "
                     r"available per rank", default), default
    # the least peak where no plan fits: 1,000 rounds over i (a free index), 499 words below summed rounds
    assert "needs 13,076,584 bytes per rank at its peak (rank 0) but 800,000 bytes" in outcome(res.stdout, "given", 2)
    assert outcome(res.stdout, "fits", 2) == "right"
    assert max(int(k) for k in re.findall(r"maxrss (\d+) KiB", res.stdout)) < 1_000_000   # under 1 GB, not 40


def test_footprint_bounds_the_measured_peak_on_every_rank(tmp_path):
    res = run_mpi(3, job('''
        import tracemalloc
        from deinsum.footprint import footprint
        rng = np.random.default_rng(0)
        cases = [("ijk,ja,ka->ia", [(30, 24, 20), (24, 6), (20, 6)]), ("ij,jk->ik", [(40, 50), (50, 30)]),
                 ("i,j->ij", [(300,), (200,)]), ("bij,bjk->bik", [(4, 20, 30), (4, 30, 10)]), ("ii->i", [(50, 50)])]
        for eq, shapes in cases:
            ops = [rng.standard_normal(s) for s in shapes]
            for inputs, result in [("global", "all"), ("root", "root"), ("local", "distributed")]:
                if inputs == "local" and eq == "ii->i":
                    continue
                prog = deinsum.compile(eq, *shapes, inputs=inputs, result=result, threads=None)
                plan = prog.plan(nprocs=P)
                args = ([x[b] for x, b in zip(ops, prog.input_blocks(rank, P))] if inputs == "local"
                        else ops if inputs == "global" or rank == 0 else [None] * len(ops))
                prog(*args)                        # warm: the program's text is compiled once
                tracemalloc.start()
                prog(*args)
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
                held = sum(a.nbytes for a in args if a is not None)   # allocated before tracing
                bound = int(footprint(plan)[rank])
                print(f"{eq} {inputs} rank {rank} measured {peak + held} bound {bound} "
                      f"{'OK' if peak + held <= bound else 'UNDER'} @@", flush=True)
    '''), tmp_path=tmp_path, timeout=150)
    assert_clean(res, code=0)
    rows = re.findall(r"(\S+ \w+) rank \d+ measured (\d+) bound (\d+) (\w+) @@", res.stdout)
    assert len(rows) == 3 * 14 and all(ok == "OK" for *_, ok in rows), [r for r in rows if r[3] != "OK"]


# ---- row 5: dtype=int32 with float inputs raises like numpy -------------------------------------------
def test_float_inputs_with_an_int_dtype_raise_like_numpy():
    a = np.linspace(0.5, 2, 6).reshape(2, 3)
    with pytest.raises(TypeError):
        np.einsum("ij,jk->ik", a, a.T, dtype=np.int32)
    with pytest.raises(deinsum.DeinsumError, match=r"operand 0: cannot cast float64 to int32 under casting='safe'"):
        deinsum.einsum("ij,jk->ik", a, a.T, dtype=np.int32)
    got = deinsum.einsum("ij,jk->ik", a, a.T, dtype=np.int32, casting="unsafe")
    want = np.einsum("ij,jk->ik", a, a.T, dtype=np.int32, casting="unsafe")
    assert got.dtype == want.dtype and np.array_equal(got, want)


def test_results_follow_numpy_types_and_scalar_returns():
    i32, f32 = np.arange(1, 7, dtype=np.int32).reshape(2, 3), np.ones((3, 2), dtype=np.float32)
    for eq, ops in [("ij,jk->ik", (i32, f32)), ("ij,ij->", (i32, i32)), ("ii", (np.eye(3),)), ("i,i", (f32[:, 0],) * 2),
                    ("ij,jk->ik", (i32, i32.T.astype(np.int64)))]:
        got, want = deinsum.einsum(eq, *ops), np.einsum(eq, *ops)
        assert type(got) is type(want) and np.asarray(got).dtype == np.asarray(want).dtype, eq
        assert np.array_equal(got, want), eq


# ---- row 6: complex inputs to a float64 program, in process and in an emitted script ----------------
def test_complex_inputs_to_a_float64_program_raise(tmp_path):
    prog = deinsum.compile("ij,jk->ik", (3, 4), (4, 2), dtype="float64")
    z = np.ones((3, 4)) * (1 + 2j)
    with pytest.raises(deinsum.DeinsumError, match="operand 0: cannot cast complex128 to float64"):
        prog(z, np.ones((4, 2)))
    script = prog.to_script(tmp_path / "p.py", nprocs=2)
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "b.npy", np.ones((4, 2)))
    res = run_mpi_script(2, script, "--load", str(tmp_path / "z.npy"), str(tmp_path / "b.npy"), "--validate",
                         timeout=90)
    assert_clean(res, tmp_path, code=2)
    assert "cannot cast complex128 to float64 under casting='safe'" in res.stderr
    assert "validate" not in res.stdout and len(res.stderr.strip().splitlines()) == 1


# ---- rows 7 and 8: output paths and bad .npy files in emitted scripts, with and without -m mpi4py -----
def _script_run(script, *args, mpi4py=True, timeout=90):
    cmd = [MPIEXEC, "-n", "2", sys.executable] + (["-m", "mpi4py"] if mpi4py else []) + [str(script), *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"hang: {shlex.join(cmd)}") from None


def launch_ways(n: int, both: bool) -> tuple[bool, ...]:
    """Whether case ``n`` runs under ``python -m mpi4py``, plain, or both: the default run alternates (each way
    refuses some files and runs the good one), ``-m slow`` runs every case both ways."""
    return (True, False) if both else (n % 2 == 0,)


BOTH_WAYS = pytest.mark.parametrize("both", [False, pytest.param(True, marks=pytest.mark.slow)],
                                    ids=["alternating", "both-ways"])


@BOTH_WAYS
def test_emitted_script_checks_its_output_path_before_computing(tmp_path, both):
    script = deinsum.compile("ij,jk->ik", (6, 5), (5, 4)).to_script(tmp_path / "p.py", nprocs=2)
    (tmp_path / "adir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    for n, (target, message) in enumerate([(tmp_path / "missing" / "o.npy", "does not exist"),
                                           (tmp_path / "adir", "is a directory"),
                                           (f"{tmp_path / 'adir'}/", "is a directory"),
                                           (tmp_path / "fifo", "is a FIFO"), ("", "is an empty path")]):
        for mpi4py in launch_ways(n, both):
            res = _script_run(script, "--save", str(target), mpi4py=mpi4py)
            assert_clean(res, tmp_path, code=2)
            assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
            assert "total" not in res.stdout    # nothing was computed
            assert list((tmp_path / "adir").iterdir()) == []
    for mpi4py in (True, False):
        (tmp_path / "o.npy").unlink(missing_ok=True)
        res = _script_run(script, "--save", str(tmp_path / "o.npy"), "--validate", mpi4py=mpi4py)
        assert_clean(res, tmp_path, code=0)
        assert np.load(tmp_path / "o.npy").shape == (6, 4)


@BOTH_WAYS
def test_emitted_script_rejects_bad_npy_files_in_one_line(tmp_path, both):
    script = deinsum.compile("ij,jk->ik", (6, 5), (5, 4)).to_script(tmp_path / "p.py", nprocs=2)
    np.save(tmp_path / "b.npy", np.ones((5, 4)))
    (tmp_path / "empty.npy").write_bytes(b"")
    np.savez(tmp_path / "a.npz", a=np.ones((6, 5)))
    np.save(tmp_path / "s.npy", np.array([["x"] * 5] * 6))
    np.save(tmp_path / "i.npy", np.ones((6, 5), dtype=np.int64))    # int64 -> float64 is 'safe': accepted
    for n, (name, message) in enumerate([("empty.npy", "the file is empty"), ("a.npz", "not an .npz archive"),
                                         ("s.npy", "non-numeric data of dtype <U1"), ("none.npy", "no such file")]):
        for mpi4py in launch_ways(n, both):
            res = _script_run(script, "--load", str(tmp_path / name), str(tmp_path / "b.npy"), mpi4py=mpi4py)
            assert_clean(res, tmp_path, code=2)
            assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    for mpi4py in (True, False):
        res = _script_run(script, "--load", str(tmp_path / "i.npy"), str(tmp_path / "b.npy"), "--validate",
                          mpi4py=mpi4py)
        assert_clean(res, code=0)
        assert "validate: OK" in res.stdout


# ---- rows 9 and 10: --validate is not vacuous for integers, and not falsely strict for float16 ---------
@pytest.mark.parametrize("dtype", ["int32", "uint8", "float16"])
def test_validate_with_integer_and_float16_dtypes(tmp_path, dtype):
    prog = deinsum.compile("ijk,ja,ka->ia", (12, 10, 8), (10, 3), (8, 3), dtype=dtype)
    script = prog.to_script(tmp_path / "p.py", nprocs=2)
    res = run_mpi_script(2, script, "--validate", timeout=90)
    assert_clean(res, code=0)
    assert "validate: OK" in res.stdout
    ns = {}
    exec(compile(script.read_text(), str(script), "exec"), ns)
    ops = ns["validation_operands"](ns["INPUT_SHAPES"], dtype, 0)
    assert all(np.count_nonzero(x) == x.size for x in ops)          # no vacuous zero inputs
    want = np.einsum("ijk,ja,ka->ia", *ops)
    matches = sys.modules[ns["validation_operands"].__module__].matches   # the script's own runtime's checks
    assert matches(want, want, dtype) and not matches(want + np.asarray(1, want.dtype), want, dtype)


# ---- row 11: the README quick start under mpiexec -n 4 -----------------------------------------------
README = Path(__file__).resolve().parents[1] / "README.md"


def quickstart_snippet() -> str:
    text = README.read_text()
    start = text.index("```python", text.index("## Quick start")) + len("```python")
    return text[start:text.index("```", start)]


def _quickstart(tmp_path, runs):
    ok = 0
    for _ in range(runs):
        for p in tmp_path.iterdir():
            if p.is_file():
                p.unlink()
        res = run_mpi(4, quickstart_snippet(), tmp_path=tmp_path, timeout=120)
        ok += (res.returncode == 0 and res.stdout.count("SOAP I/O lower bound") == 1
               and res.stdout.count("(model ") == 4 and (tmp_path / "prog.py").exists()
               and sorted(p.name for p in tmp_path.iterdir()) == ["mpi_job_4.py", "prog.py"])
    return ok


def test_readme_quick_start_prints_and_writes_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _quickstart(tmp_path, 1) == 1


@pytest.mark.slow
def test_readme_quick_start_twenty_times(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _quickstart(tmp_path, 20) == 20


def test_to_script_on_every_rank_is_safe(tmp_path):
    res = run_mpi(4, job(f'''
        prog = deinsum.compile("ijk,ja,ka->ia", (30, 20, 10), (20, 4), (10, 4))
        for _ in range(20):
            prog.to_script({str(tmp_path / "prog.py")!r}, nprocs=2)
        print(f"rank {{rank}} done", flush=True)
    '''), tmp_path=tmp_path, timeout=120)
    assert_clean(res, tmp_path, code=0)
    assert res.stdout.count("done") == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mpi_job_4.py", "prog.py"]
    compile((tmp_path / "prog.py").read_text(), "prog.py", "exec")


# ---- randomized disagreement: one random rank perturbs one random thing ----------------------------
RANDOM_JOB = '''
import random
seed = int(sys.argv[1])
rng = random.Random(seed)
bad, what = rng.randrange(P), rng.choice(["equation", "shape", "dtype", "mode", "count", "block", "none"])
eq, shapes = "ijk,ja,ka->ia", [(6, 5, 4), (5, 3), (4, 3)]
X, A, B = (np.random.default_rng(0).standard_normal(s) for s in shapes)
want = np.einsum(eq, X, A, B)
mine = rank == bad
if what == "block":   # local blocks: the bad rank passes a block one row short
    prog = deinsum.compile(eq, *shapes, inputs="local")
    blocks = prog.input_blocks(rank, P)
    ops = [x[b] for x, b in zip((X, A, B), blocks)]
    if mine:
        ops[1] = ops[1][:-1] if ops[1].shape[0] else np.ones((1,) + ops[1].shape[1:])
    attempt("random", lambda: prog(*ops), want=want)
else:
    ops = [X, A, B]
    kwargs = {}
    if mine and what == "equation":
        eq = "ijk,ja,ka->ai"
    if mine and what == "shape":
        ops[0] = np.ones((6, 5, 5))
    if mine and what == "dtype":
        ops = [x.astype(np.float32) for x in ops]
    if mine and what == "count":
        ops = ops + [A]
    if mine and what == "mode":
        kwargs["result"] = "root"
    attempt("random", lambda: deinsum.einsum(eq, *ops, **kwargs), want=want)
if rank == 0:
    print(f"case {seed} {bad} {what} @@", flush=True)   # (terminated: ranks' lines may interleave)
'''


def _random_launches(tmp_path, seeds):
    counts = {"right": 0, "error": 0}
    for seed in seeds:
        nprocs = 2 + seed % 3
        res = run_mpi(nprocs, job(RANDOM_JOB), str(seed), tmp_path=tmp_path, timeout=90)   # a hang fails here
        case = re.search(r"case \d+ (\d+) (\w+) @@", res.stdout).groups()
        assert "Traceback" not in res.stderr, (case, res.stderr)
        result = outcome(res.stdout, "random", nprocs)   # never WRONG; the same error on every rank
        if case[1] == "none":
            assert result == "right" and res.returncode == 0, case
        else:
            assert result != "right" and f"rank {case[0]}" in result + " " and res.returncode == 3, (case, result)
        counts["right" if result == "right" else "error"] += 1
    return counts


def test_randomized_disagreement(tmp_path):
    counts = _random_launches(tmp_path, range(5))
    assert sum(counts.values()) == 5


@pytest.mark.slow
def test_randomized_disagreement_hundred_launches(tmp_path):
    counts = _random_launches(tmp_path, range(5, 105))
    assert sum(counts.values()) == 100


# ---- large messages: pieces over a forced small limit go point-to-point, bit-exact, bytes == model ---
@pytest.mark.parametrize("nprocs", [3, 4])
def test_exchange_splits_pieces_over_the_message_limit(nprocs, tmp_path):
    from test_redistribute_mpi import JOB
    forced = "import deinsum.runtime.exchange as _x\n_x.MAX_MESSAGE_BYTES = 24\n" + JOB
    out = run_mpi(nprocs, forced, tmp_path=tmp_path, timeout=170)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:2] == ["OK", str(nprocs)], out.stdout


# ---- a parametric program keeps a bounded number of runtimes --------------------------------------------
def test_a_parametric_program_keeps_the_runtimes_of_its_last_plans_per_communicator(tmp_path):
    res = run_mpi(2, job('''
        from deinsum.program import RUNTIMES_KEPT
        prog = deinsum.compile("ij,jk->ik")
        for n in range(1, 3 * RUNTIMES_KEPT):
            attempt(f"shape {n}", lambda: prog(np.ones((n, 3)), np.ones((3, 2))), want=np.full((n, 2), 3.0))
        half = comm.Split(rank)                       # another communicator: runtimes of its own
        attempt("half", lambda: prog(np.ones((2, 3)), np.ones((3, 2)), comm=half), want=np.full((2, 2), 3.0))
        kept = sorted(len(runtimes) for runtimes in prog._runtimes.values())
        attempt("kept", lambda: kept, want=[1, RUNTIMES_KEPT])
        prog.close()
        attempt("closed", lambda: len(prog._runtimes), want=0)
    '''), tmp_path=tmp_path, timeout=120)
    assert_clean(res, code=0)
    assert "WRONG" not in res.stdout and outcome(res.stdout, "kept", 2) == "right"


@pytest.mark.slow
def test_4096_shapes_through_one_parametric_program_keep_memory_flat(tmp_path):
    """Issue 30: RSS growth <= 10 MB over 4,096 distinct shapes (8.6 MB measured at P = 2, planner caches full)."""
    res = run_mpi(2, job('''
        def rss():
            for line in open("/proc/self/status"):
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        prog = deinsum.compile("ij,jk->ik")
        for n in range(1, 65):                      # the caches fill first
            prog(np.ones((n, 3)), np.ones((3, 2)))
        base = rss()
        for n in range(65, 4096 + 65):
            prog(np.ones((n % 97 + 1, n // 97 + 1)), np.ones((n // 97 + 1, 2)))
        attempt("flat", lambda: rss() - base <= 10 * 10**6, want=True)
    '''), tmp_path=tmp_path, timeout=900)
    assert_clean(res, code=0)
    assert outcome(res.stdout, "flat", 2) == "right"
