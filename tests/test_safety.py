"""Issue 12 without ranks: the command line's one-line errors and files, repeated indices in
bounds/plans/reports, shapes, printed hints, the footprint model and the run-time checks."""
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import deinsum
from deinsum.cli import main
from deinsum.runtime import checks
from deinsum.memory import default_memory
from deinsum.footprint import footprint
from deinsum.program import check_footprint

CLI = [sys.executable, "-m", "deinsum.cli"]


def cli(*args, cwd=None, env=None):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=120, cwd=cwd, env=env)


# ---- row 12: emit onto a directory / into a missing directory; a size past int64 --------------------
@pytest.mark.parametrize("target,message", [(".", "is a directory"), ("missing/p.py", "does not exist"),
                                            ("sub/", "is a directory")])
def test_emit_checks_the_output_path_first(tmp_path, target, message):
    (tmp_path / "sub").mkdir()
    res = cli("emit", "ij,jk->ik", "--size", "i=4,j=4,k=4", "-P", "2", "-o", target, cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and message in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["sub"]    # no stray .tmp, nothing written


def test_huge_sizes_are_one_line_errors(capsys):
    assert main(["plan", "ij,jk->ik", "--size", "i=99999999999999999999,j=2,k=2", "-P", "2"]) == 2
    assert main(["plan", "ij,jk->ik", "--size", "i=9999999999,j=9999999999,k=2", "-P", "2"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["deinsum: error: operand 0 ('ij') has 2e+20 elements; at most 2**59 are supported",
                   "deinsum: error: operand 0 ('ij') has 1e+20 elements; at most 2**59 are supported"]


# ---- row 13: repeated indices in bound, plan and report ----------------------------------------------
def test_repeated_index_einsums_have_bounds_plans_and_reports(capsys):
    assert main(["bound", "ii->"]) == 0 and "SOAP I/O lower bound of ii->" in capsys.readouterr().out
    assert main(["plan", "ii->i", "--size", "i=4", "-P", "2", "--inputs", "global"]) == 0
    assert "peak memory per rank" in capsys.readouterr().out
    report = deinsum.compile("ii->i", (4, 4)).report(nprocs=2)
    assert "SOAP I/O lower bound of ii->i" in report and "deinsum plan for 'ii->i' on 2 rank(s)" in report
    x = np.arange(16.).reshape(4, 4)
    for eq in ("ii->i", "ii->", "ii", "iij->j"):
        y = np.arange(18.).reshape(3, 3, 2) if "j" in eq else x
        assert np.array_equal(deinsum.einsum(eq, y), np.einsum(eq, y)), eq


# ---- row 14: shapes are non-negative integers --------------------------------------------------------
@pytest.mark.parametrize("shape", [(4.5, 5), ("a", 5), (-1, 5), (True, 5), "ab", 3])
def test_shapes_must_be_non_negative_integers(shape):
    with pytest.raises(deinsum.DeinsumError, match="must be a sequence of non-negative integers"):
        deinsum.compile("ij,jk->ik", shape, (5, 6))
    with pytest.raises(deinsum.DeinsumError, match="must be a sequence of non-negative integers"):
        deinsum.compile("ij,jk->ik").plan([shape, (5, 6)], nprocs=2)


# ---- row 15: printed hints run as printed, without an activated environment ---------------------------
def test_the_printed_run_command_works_without_an_activated_environment(tmp_path):
    res = cli("emit", "ij,jk->ik", "--size", "i=4,j=5,k=6", "-P", "2", "-o", "p.py", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    command = shlex.split(res.stdout.split("(run: ", 1)[1].rsplit(")", 1)[0])
    assert Path(command[0]).name == "mpiexec" and command[3] == sys.executable
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = "/usr/bin:/bin"
    run = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert run.returncode == 0 and "validate: OK" in run.stdout, run.stderr


def test_broken_pipe_is_not_a_traceback():
    res = subprocess.run(" ".join(shlex.quote(c) for c in CLI) + " bound 'ijk,ja,ka->ia' | head -1", shell=True,
                         capture_output=True, text=True, timeout=120)
    assert res.stdout.startswith("SOAP I/O lower bound") and "Traceback" not in res.stderr


# ---- footprint and memory refusal ---------------------------------------------------------------------
def test_footprint_counts_replicated_results_and_shrinks_with_distribution():
    prog = deinsum.compile("i,j->ij", (1000,), (1000,))
    full = footprint(prog.plan(nprocs=4, inputs="global", result="all"))
    spread = footprint(prog.plan(nprocs=4, inputs="local", result="distributed"))
    assert full.min() >= 1000 * 1000 * 8 > spread.max() >= 1000 * 1000 * 8 // 4
    check_footprint(prog.plan(nprocs=4, inputs="local", result="distributed"), limit=int(spread.max()))
    with pytest.raises(deinsum.DeinsumError, match=rf"needs {int(full.max()):,} bytes per rank .* but 1,000 bytes"):
        check_footprint(prog.plan(nprocs=4), limit=1000)


def test_default_limit_is_memavailable_shared_by_the_ranks_on_a_node():
    whole = default_memory(1)
    assert whole > 0 and abs(default_memory(4) - whole // 4) < 2**26


# ---- files and validation helpers ---------------------------------------------------------------------
def test_atomic_write_leaves_nothing_behind_on_failure(tmp_path):
    def fail(f):
        f.write(b"half")
        raise RuntimeError("disk full")
    with pytest.raises(RuntimeError):
        checks.write_atomically(tmp_path / "out.npy", fail)
    assert list(tmp_path.iterdir()) == []
    checks.save_atomically(tmp_path / "out", np.arange(3))
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and np.load(tmp_path / "out").tolist() == [0, 1, 2]


def test_load_npy_casting_follows_numpy(tmp_path):
    np.save(tmp_path / "f.npy", np.ones(3, np.float32))
    assert checks.load_npy(tmp_path / "f.npy", (3,), np.float64).dtype == np.float64
    with pytest.raises(ValueError, match="cannot cast float32 to int64 under casting='safe'"):
        checks.load_npy(tmp_path / "f.npy", (3,), np.int64)
    assert checks.load_npy(tmp_path / "f.npy", (3,), np.int64, casting="unsafe").tolist() == [1, 1, 1]


def test_tolerance_is_loose_enough_for_float16_and_exact_for_integers():
    rng = np.random.default_rng(0)
    a, b = (rng.uniform(-1, 1, (64, 64)).astype(np.float16) for _ in range(2))
    want = np.einsum("ij,jk->ik", a, b)
    got = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)   # another summation order
    assert checks.matches(got, want, np.float16) and not checks.matches(got + np.float16(0.5), want, np.float16)
    i = np.arange(6, dtype=np.int32)
    assert checks.matches(i, i, np.int32) and not checks.matches(i + 1, i, np.int32)


def test_matches_takes_the_same_nan_and_infinities_as_equal(recwarn):
    want = np.array([1.0, np.nan, np.inf, -np.inf, 2.0])
    assert checks.matches(want.copy(), want, np.float64) and checks.max_error(want, want) == 0
    for n, other in [(0, 1.5), (1, 0.0), (2, -np.inf), (3, 1.0), (0, np.nan)]:   # inf does not widen the tolerance
        got = want.copy()
        got[n] = other
        assert not checks.matches(got, want, np.float64), (n, other)
        assert not checks.max_error(got, want) < 0.5
    assert not recwarn.list
