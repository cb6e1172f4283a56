"""examples/: each runs under mpiexec at small sizes and checks itself (fits against numpy, blocks, bytes)."""
from pathlib import Path

import pytest
from mpirun import run_mpi_script

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(nprocs: int, name: str, *args: str) -> str:
    res = run_mpi_script(nprocs, EXAMPLES / name, *args, timeout=90)
    assert res.returncode == 0, f"{name} on {nprocs} ranks failed\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    return res.stdout


def sweep_holds(out: str, iters: int) -> bool:
    """Every iteration's line says: bytes == model on every rank, X in place."""
    rows = [line.split() for line in out.splitlines() if line.strip().split(" ")[0].isdigit()
            and len(line.split()) == 5 and line.split()[2] == "/"]
    return len(rows) == iters and all(r[-1] == "True" for r in rows)


@pytest.mark.parametrize("nprocs", [4, *[pytest.param(p, marks=pytest.mark.slow) for p in (1, 2, 3, 5, 6, 7, 8)]])
def test_cp_als_order_3_matches_numpy_with_x_in_place(nprocs):
    out = run_example(nprocs, "cp_als.py", "--shape", "30", "24", "3", "--rank", "4", "--iters", "4")
    assert "OK" in out and "never moved): X" in out and sweep_holds(out, 4)


@pytest.mark.parametrize("nprocs", [2, *[pytest.param(p, marks=pytest.mark.slow) for p in (1, 3, 4, 5, 6, 7, 8)]])
def test_cp_als_order_5_matches_numpy_with_x_in_place(nprocs):
    out = run_example(nprocs, "cp_als.py", "--shape", "7", "6", "5", "4", "3", "--rank", "3", "--iters", "3",
                      "--no-bounds")   # the bounds of five order-5 MTTKRPs: most of a minute; order 3 prints them
    assert "OK" in out and "never moved): X" in out and sweep_holds(out, 3)


@pytest.mark.parametrize("nprocs", [3, *[pytest.param(p, marks=pytest.mark.slow) for p in (1, 2, 4, 5, 6, 7, 8)]])
def test_tucker_hooi_matches_numpy_with_x_in_place(nprocs):
    out = run_example(nprocs, "tucker_hooi.py", "--shape", "12", "10", "9", "8", "--ranks", "3", "3", "2", "2",
                      "--iters", "3")
    assert "OK" in out and "core = einsum('abcl,ld->abcd', Y3, U3)" in out and sweep_holds(out, 3)
    assert "never moved): X" in out


def test_tucker_hooi_rejects_mismatched_ranks_in_one_line():
    res = run_mpi_script(1, EXAMPLES / "tucker_hooi.py", "--shape", "8", "8", "--ranks", "2", timeout=60)
    assert res.returncode == 2 and "--shape and --ranks need the same length" in res.stderr


def test_matrix_chain_prints_groups_and_moves_and_matches_numpy():
    out = run_example(4, "matrix_chain.py", "--sizes", "40", "6", "40", "6", "40")
    assert "groupings, best first:" in out and "[t0+t1+out]" in out and "group 1:" in out
    assert "reduce" in out
    assert "result blocks match numpy and bytes match the plan: True" in out


@pytest.mark.parametrize("nprocs", [2, pytest.param(1, marks=pytest.mark.slow)])
def test_bounds_table_prints_latex_for_the_suite_once(nprocs):
    out = run_example(nprocs, "bounds_table.py", "--kernels", "1MM", "MTTKRP-O3-M0")
    assert out.count(r"\begin{tabular}") == 3          # the summary and one table per kernel, once per job
    assert r"\frac{2 N_{i} N_{j} N_{k}}{\sqrt{S}}" in out
    assert r"\frac{3 N_{a} N_{i} N_{j} N_{k}}{S^{\frac{2}{3}}}" in out
