"""MPI from the mpich wheel works: Cart_create, Cart_sub, Allreduce on numpy buffers."""
import pytest

from mpirun import check_mpi

SMOKE = """
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
P = comm.size
dims = MPI.Compute_dims(P, 2)
cart = comm.Create_cart(dims, reorder=False)
row = cart.Sub([False, True])
assert row.size == dims[1]
buf = np.full(3, cart.rank, dtype=np.float64)
out = np.empty_like(buf)
cart.Allreduce(buf, out, op=MPI.SUM)
assert np.all(out == P * (P - 1) / 2), out
rowsum = np.empty_like(buf)
row.Allreduce(buf, rowsum, op=MPI.SUM)
r0 = cart.Get_coords(cart.rank)[0]
expect = sum(r0 * dims[1] + c for c in range(dims[1]))
assert np.all(rowsum == expect), (rowsum, expect)
if comm.rank == 0:
    print("OK", P, dims)
"""


@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_cart_sub_allreduce(nprocs, tmp_path):
    out = check_mpi(nprocs, SMOKE, tmp_path=tmp_path, timeout=60)
    assert out.split()[:2] == ["OK", str(nprocs)]


def test_failure_on_one_rank_aborts_cleanly(tmp_path):
    from mpirun import run_mpi
    res = run_mpi(2, "from mpi4py import MPI\nif MPI.COMM_WORLD.rank == 1: raise RuntimeError('boom')\n"
                     "MPI.COMM_WORLD.Barrier()\n", tmp_path=tmp_path, timeout=60)
    assert res.returncode != 0 and "boom" in res.stderr


#: Every entry point that runs on MPI, then `deinsum info`, then an emitted script (last: it ends MPI).
MISMATCH = """
import runpy, sys
import numpy as np, deinsum
from deinsum import DistributedArray
from deinsum.cli import main
from deinsum.errors import DeinsumError
prog = sys.argv.pop(1)
A = np.ones((4, 3))
calls = {"einsum": lambda: deinsum.einsum("ij,jk->ik", A, A.T),
         "program": lambda: deinsum.compile("ij,jk->ik", (4, 3), (3, 4))(A, A.T),
         "from_global": lambda: DistributedArray.from_global(A),
         "scatter": lambda: DistributedArray.scatter(A),
         "from_blocks": lambda: DistributedArray.from_blocks(A, A.shape, "replicated"),
         "full": lambda: DistributedArray.full((4, 3), 0)}
for name, call in calls.items():
    try:
        call()
        print(name, "ran")
    except DeinsumError as exc:
        print(name, "raised", exc)
main(["info"])
sys.stdout.flush()
deinsum.compile("ij,jk->ik", (4, 3), (3, 4)).to_script(prog, nprocs=1)
try:
    runpy.run_path(prog, run_name="__main__")
except SystemExit as exc:
    print("script exit", exc.code)
"""


def test_a_launcher_mismatch_is_one_error_at_every_entry_point(tmp_path):
    """OMPI_COMM_WORLD_SIZE=4 on a plain process (what Open MPI's mpirun sets, starting ranks that each
    find one rank in COMM_WORLD): every entry point raises the same one-line error, `deinsum info` shows
    it, an emitted script prints it once and exits 2."""
    import os
    import subprocess
    import sys
    from deinsum.runtime.checks import LAUNCH_HINTS, LAUNCH_SIZES
    job = tmp_path / "job.py"
    job.write_text(MISMATCH)
    env = {k: v for k, v in os.environ.items() if k not in (*LAUNCH_SIZES, *LAUNCH_HINTS, "SLURM_STEP_ID")}
    env.update(OMPI_COMM_WORLD_SIZE="4", DEINSUM_GEMM="numpy")
    res = subprocess.run([sys.executable, str(job), str(tmp_path / "prog.py")], capture_output=True, text=True,
                         env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    raised = [line.split(" raised ", 1) for line in lines[:6]]
    assert [r[0] for r in raised] == ["einsum", "program", "from_global", "scatter", "from_blocks", "full"], lines
    messages = {r[1] for r in raised}
    assert len(messages) == 1, messages
    message = messages.pop()
    assert message.startswith("launcher mismatch: the environment says this job has several ranks "
                              "(OMPI_COMM_WORLD_SIZE=4) but MPI.COMM_WORLD has 1: mpi4py runs on ")
    assert "reinstall mpi4py" in message and "deinsum info shows which" in message
    assert any(line == f"launcher variables: OMPI_COMM_WORLD_SIZE=4; {message}" for line in lines), lines
    assert lines[-1] == "script exit 2"
    assert [line for line in res.stderr.splitlines() if line.startswith("error:")] == [f"error: {message}"]


@pytest.mark.parametrize("env, named", [
    ({}, None), ({"OMPI_COMM_WORLD_SIZE": "1"}, None), ({"OMPI_COMM_WORLD_SIZE": "4"}, "OMPI_COMM_WORLD_SIZE=4"),
    ({"OMPI_COMM_WORLD_SIZE": "4", "PMI_SIZE": "1"}, None),    # Hydra's `mpiexec -n 1` inside an Open MPI job
    ({"PMI_SIZE": "3", "MPI_LOCALNRANKS": "3"}, "PMI_SIZE=3, MPI_LOCALNRANKS=3"),
    ({"SLURM_STEP_NUM_TASKS": "8"}, None),                      # not inside srun: a batch script's variable
    ({"SLURM_STEP_NUM_TASKS": "8", "SLURM_STEP_ID": "0"}, "SLURM_STEP_NUM_TASKS=8"),
    ({"SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_ID": "0", "PMI_SIZE": "1"}, None),   # mpiexec -n 1 in a step
    ({"PMIX_RANK": "0"}, None), ({"PMIX_RANK": "3"}, "PMIX_RANK=3"), ({"MPI_LOCALNRANKS": "1"}, None),
])
def test_which_launcher_variables_make_a_mismatch(env, named, monkeypatch):
    """This process has one rank in COMM_WORLD: only variables that say the job has more, and no job size of
    1 beside them, are a mismatch."""
    from deinsum.runtime.checks import LAUNCH_HINTS, LAUNCH_SIZES, launch_mismatch
    for name in (*LAUNCH_SIZES, *LAUNCH_HINTS, "SLURM_STEP_ID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    message = launch_mismatch.__wrapped__()   # (uncached: launch_mismatch keeps this process's first answer)
    assert message is None if named is None else f"several ranks ({named})" in message, message
