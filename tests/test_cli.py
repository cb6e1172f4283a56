"""The `deinsum` command: help everywhere, one-line errors with exit code 2, real outputs."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import deinsum
from deinsum.cli import main
from mpirun import check_mpi

DEINSUM = [str(Path(sys.executable).with_name("deinsum"))]
MTTKRP = "ijk,ja,ka->ia"
SIZES = "i=12,j=10,k=8,a=3"


def run(*args, timeout=120):
    return subprocess.run(DEINSUM + list(args), capture_output=True, text=True, timeout=timeout)


def cli(capsys, *args) -> subprocess.CompletedProcess:
    """:func:`run` inside this process: ``deinsum.cli.main``, which the ``deinsum`` command exits with (no
    interpreter to start; :func:`test_the_command_exits_with_mains_code` checks the command itself)."""
    try:
        code = main(list(args))
    except SystemExit as exc:           # argparse: --help, --version and its usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["deinsum", *args], code, out, err)


def test_the_command_exits_with_mains_code():
    """The installed ``deinsum`` command: help and version exit 0, an error is one line with exit code 2."""
    res = run("--version")
    assert res.returncode == 0 and res.stdout.startswith("deinsum ")
    res = run("plan", "--help")
    assert res.returncode == 0 and "usage: deinsum" in res.stdout
    for args, message in ((["plan", MTTKRP, "--size", "i=x", "-P", "4"], "expected INDEX=INT"),
                          (["nonsense"], "invalid choice")):
        res = run(*args)
        assert res.returncode == 2 and len(res.stderr.splitlines()) == 1 and message in res.stderr, res.stderr


@pytest.mark.parametrize("args", [["--help"], ["bound", "--help"], ["plan", "--help"], ["emit", "--help"],
                                  ["run", "--help"], ["info", "--help"]])
def test_help(args, capsys):
    res = cli(capsys, *args)
    assert res.returncode == 0 and "usage: deinsum" in res.stdout


def test_version(capsys):
    res = cli(capsys, "--version")
    assert res.returncode == 0 and res.stdout.startswith("deinsum ")


def test_bound_symbolic_text_latex_json(capsys):
    text = cli(capsys, "bound", MTTKRP)
    assert text.returncode == 0 and "3*N_a*N_i*N_j*N_k/S**(2/3)" in text.stdout
    latex = cli(capsys, "bound", MTTKRP, "--latex")
    assert latex.returncode == 0 and "\\toprule" in latex.stdout
    data = json.loads(cli(capsys, "bound", MTTKRP, "--json").stdout)
    assert data["analysis"]["equation"] == MTTKRP


def test_plan_any_p_without_ranks(capsys):
    res = cli(capsys, "plan", MTTKRP, "--size", SIZES, "-P", "13")
    assert res.returncode == 0 and "on 13 rank(s)" in res.stdout and "grid (" in res.stdout
    data = json.loads(cli(capsys, "plan", MTTKRP, "--size", SIZES, "-P", "6", "--json").stdout)
    assert len(data["received_bytes_per_rank"]) == 6


def test_emit_then_run(tmp_path):
    out = tmp_path / "prog.py"
    res = run("emit", MTTKRP, "--size", SIZES, "-P", "2", "-o", str(out))
    assert res.returncode == 0 and out.exists()
    res = run("run", MTTKRP, "--size", SIZES, "-n", "2", "--validate", "--repeat", "2", "--timeout", "120")
    assert res.returncode == 0, res.stderr
    assert "validate: OK" in res.stdout and "measured bytes == model" in res.stdout


def test_run_on_local_blocks_loads_and_saves(tmp_path):
    """``--inputs local --result distributed``: each rank reads its blocks of the --load files and writes its
    block of --save."""
    import numpy as np
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s) for s in [(12, 10, 8), (10, 3), (8, 3)]]
    files = [str(tmp_path / f"{n}.npy") for n in range(3)]
    for path, array in zip(files, arrays):
        np.save(path, array)
    out = tmp_path / "out.npy"
    res = run("run", MTTKRP, "--size", SIZES, "-n", "2", "--inputs", "local", "--result", "distributed", "--load",
              *files, "--save", str(out), "--validate", "--repeat", "1", "--timeout", "120")
    assert res.returncode == 0 and "validate: OK" in res.stdout and "(each rank its block)" in res.stdout, res.stderr
    np.testing.assert_allclose(np.load(out), np.einsum(MTTKRP, *arrays), rtol=1e-12)


@pytest.mark.parametrize("nprocs, inputs", [(2, "global"), (3, "root")])
def test_pinned_input_is_planned_emitted_and_run(nprocs, inputs, capsys):
    """``--layout 0=even`` with whole inputs: the plan shows the move into the pinned layout, the script runs it."""
    args = ["ij,jk->ik", "--size", "i=64,j=64,k=64", "--nprocs", str(nprocs), "--inputs", inputs,
            "--layout", "0=even"]
    res = cli(capsys, "plan", *args)
    assert res.returncode == 0 and "pinned: in0" in res.stdout, res.stderr
    assert "in0: distribute (convert pinned layout)" in res.stdout
    res = run("run", *args, "--validate", "--repeat", "1", "--timeout", "120")
    assert res.returncode == 0, res.stderr
    assert "validate: OK" in res.stdout and "measured bytes == model" in res.stdout


def test_an_equation_starting_with_an_arrow_is_not_an_option(capsys):
    """numpy's 0-d einsum "->": every command takes it (it has no index to size)."""
    assert cli(capsys, "bound", "->").returncode == 0
    res = cli(capsys, "bound", "->", "-P", "2", "--layout", "out=replicated", "--result", "distributed")
    assert res.returncode == 0, res.stderr
    res = cli(capsys, "plan", "->", "-P", "2")
    assert res.returncode == 0 and "deinsum plan for '->' on 2 rank(s)" in res.stdout, res.stderr


@pytest.mark.parametrize("args,message", [
    (["plan", MTTKRP, "-P", "4"], "plan needs sizes"),
    (["plan", MTTKRP, "--size", "i=12,j=10,k=8", "-P", "4"], "no size given for index 'a'"),
    (["plan", MTTKRP, "--size", SIZES + ",z=3", "-P", "4"], "--size names z"),
    (["plan", MTTKRP, "--size", "i=x", "-P", "4"], "expected INDEX=INT"),
    (["plan", MTTKRP, "--size", SIZES, "-P", "0"], "-P=0: expected a number of ranks"),
    (["plan", MTTKRP, "--size", SIZES, "-P", "1000000000"], "-P=1000000000: expected a number of ranks, an integer from 1"),
    (["plan", "ij,jk->iq", "--size", "i=2,j=3,k=4", "-P", "2"], "index 'q' does not appear"),
    (["emit", MTTKRP, "--size", SIZES, "-P", "2"], "the following arguments are required: -o"),
    (["bound", "ij,jk->ik", "--dtype", "float1024"], "not a numpy data type"),
    (["plan", MTTKRP, "--size", SIZES, "-P", "2", "--dtype", "bool"], "expected an integer, float or complex"),
    (["plan", "ij,jk->ik", "--size", "i=2,j=3,k=4", "-P", "2", "--layout", "out=even"],
     "pass result='distributed', not 'all'"),
    (["plan", "ij->i", "-P", "2"], "plan needs sizes"),
    (["bound", MTTKRP, "--layout", "0=even"], "--layout needs --size and -P"),
    (["bound", MTTKRP, "--size", SIZES, "--layout", "0=even"], "--layout needs --size and -P"),
    (["bound", MTTKRP, "--layout", "7=even", "--size", SIZES, "-P", "2"], "'in7' is not a tensor of"),
    (["nonsense"], "invalid choice"),
])
def test_errors_are_one_line_exit_2(args, message, capsys):
    res = cli(capsys, *args)
    assert res.returncode == 2
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], res.stderr


INFO_KEYS = {"deinsum", "python", "numpy", "mpi4py", "mpi", "launcher", "ranks", "nodes", "ranks_per_node",
             "memory_per_rank", "cpu", "blas", "gemm", "gpus"}


def test_info_text_and_json():
    """`deinsum info` as a plain process: versions, MPI, one rank, memory, GEMM routes, GPUs; --json the same."""
    env = dict(os.environ, DEINSUM_GEMM="numpy")
    res = subprocess.run(DEINSUM + ["info"], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["deinsum", "MPI:", "launcher", "ranks:", "CPU:", "GEMM",
                                                         "GEMM", "GPUs:"], lines
    assert lines[0].startswith(f"deinsum {deinsum.__version__} (Python ") and "mpi4py 4." in lines[0]
    assert "ranks: 1 on 1 node(s), 1 per node; memory per rank: " in res.stdout
    assert "GEMM routes (DEINSUM_GEMM=numpy): square GEMMs" in res.stdout
    res = subprocess.run(DEINSUM + ["info", "--json"], capture_output=True, text=True, timeout=120, env=env)
    facts = json.loads(res.stdout)
    assert set(facts) == INFO_KEYS and facts["ranks"] == 1 and facts["launcher"]["mismatch"] is None
    assert set(facts["mpi"]) == {"library", "library_version", "standard", "libmpi", "mpi4py_module",
                                 "mpi4py_config", "cuda_aware"}
    assert facts["mpi"]["library"] in lines[1] and facts["memory_per_rank"] > 0
    assert facts["gemm"]["routes"] == {"square": "numpy", "narrow": "numpy", "ttm": "numpy", "streamed": "numpy"}


def test_info_and_a_run_under_mpiexec(tmp_path):
    """Under `mpiexec -n 2` rank 0 prints one report (2 ranks on a node, the launcher's variables, no mismatch),
    and an einsum runs as before."""
    out = check_mpi(2, """
        import numpy as np, deinsum
        from deinsum.cli import main
        A = np.arange(12.0).reshape(4, 3)
        assert np.allclose(deinsum.einsum("ij,kj->ik", A, A), A @ A.T)
        main(["info", "--json"])
        """, tmp_path=tmp_path, timeout=120)
    facts = json.loads(out)
    assert set(facts) == INFO_KEYS and (facts["ranks"], facts["nodes"], facts["ranks_per_node"]) == (2, 1, [2])
    assert facts["launcher"]["variables"]["PMI_SIZE"] == "2" and facts["launcher"]["mismatch"] is None
