"""Quick start: compile MTTKRP, read its bounds and plan, run it on every rank, emit a script.

    .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py examples/quickstart.py
"""
import shlex

import numpy as np
from mpi4py import MPI

import deinsum
from deinsum.cli import launch_command

comm = MPI.COMM_WORLD
I, J, K, R = 96, 80, 64, 12
equation = "ijk,ja,ka->ia"  # MTTKRP: the core of CP-ALS

# 1. compile with the real shapes (opt_einsum splits it; SOAP fuses KRP+TDOT and sizes the grid)
prog = deinsum.compile(equation, (I, J, K), (J, R), (K, R))

# 2. report: SOAP lower bounds, fusion, grid, modeled bytes per rank (pure: no ranks needed)
if comm.rank == 0:
    print(prog.report(nprocs=comm.size))

# 3. run: every rank passes the same global arrays and gets the full result, like numpy.einsum
rng = np.random.default_rng(0)
X, A, B = rng.standard_normal((I, J, K)), rng.standard_normal((J, R)), rng.standard_normal((K, R))
result = prog(X, A, B)
assert np.allclose(result, np.einsum(equation, X, A, B))
runs = comm.gather(str(prog.last_run), root=0)

# 3b. the fair start: each rank passes only its block; the result stays distributed
blocks = prog.input_blocks(comm.rank, comm.size, result="distributed")
part = prog(X[blocks[0]], A[blocks[1]], B[blocks[2]], inputs="local", result="distributed")
if part.block is not None:
    assert np.allclose(part.local, np.einsum(equation, X, A, B)[part.block])
local_runs = comm.gather(str(prog.last_run), root=0)

if comm.rank == 0:
    print("\nrun with global inputs (measured per rank):", *runs, sep="\n  ")
    print("\nrun from distributed blocks (measured per rank):", *local_runs, sep="\n  ")
    # 4. emit a standalone mpi4py program for a cluster (needs only numpy and mpi4py there)
    path = prog.to_script("mttkrp_program.py", nprocs=comm.size)
    print(f"\nwrote {path}: {shlex.join(launch_command(comm.size, path, '--validate', '--repeat', '5'))}")
