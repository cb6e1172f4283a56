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
