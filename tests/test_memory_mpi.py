"""Peak memory measured under mpiexec: plans made for a memory budget stay within it (issue 24).

Each rank resets its VmHWM (``/proc/self/clear_refs``) after making its blocks and reads it after the call:
the peak above the resident set it had before its blocks were made must be <= 1.1 x memory + 24 MiB, and
<= the plan's footprint (an upper bound; with prefetch, two rounds' pieces of each move in rounds); the result
equals numpy and the bytes moved equal the model.
"""
import sys

import pytest

from mpirun import check_mpi

JOB = """
import ctypes
import numpy as np, deinsum
from mpi4py import MPI
from deinsum.footprint import footprint

comm = MPI.COMM_WORLD

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

for eq, sizes, factor, prefetch in CASES:
    shapes = [tuple(sizes[c] for c in s) for s in eq.split("->")[0].split(",")]
    deinsum.einsum(eq, *(np.ones([2] * len(s)) for s in shapes))   # libraries loaded (BLAS, MKL, MPI's paths)
    prog = deinsum.compile(eq, *shapes, inputs="local", result="distributed", prefetch=prefetch)
    prog.memory = int(factor * prog.plan(nprocs=comm.size).data_share * 8)
    plan = prog.plan(nprocs=comm.size)
    assert plan.feasible and any(g.rounds for g in plan.groups), (eq, [g.rounds for g in plan.groups])
    assert any(m.prefetch for m in plan.moves) == prefetch, [m.label for m in plan.moves]
    blocks = prog.input_blocks(comm.rank, comm.size)
    rng = np.random.default_rng(comm.rank)
    before = status("VmRSS:")
    local = [None if b is None else rng.standard_normal(tuple(s.stop - s.start for s in b)) for b in blocks]
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    got = prog(*local)
    used = status("VmHWM:") - before
    model = int(footprint(plan)[comm.rank])
    assert 0 < used <= 1.1 * prog.memory + 24 * 2**20 and used <= model, (eq, used, prog.memory, model)
    assert prog.last_run.matches_model, prog.last_run
    whole = [comm.allgather((b, x)) for b, x in zip(blocks, local)]
    arrays = []
    for parts, shape in zip(whole, shapes):
        a = np.zeros(shape)
        for b, x in parts:
            if b is not None:
                a[b] = x
        arrays.append(a)
    if got.block is not None:
        assert np.allclose(got.local, np.einsum(eq, *arrays, optimize=True)[got.block]), eq
    if comm.rank == 0:
        print(f"{eq}{' prefetched' * prefetch}: {used / prog.memory:.3f} x memory, model {model / max(used, 1):.3f} x "
              f"measured", flush=True)
    del got, local, whole, arrays, a   # the next case starts from what this one leaves, its free heap returned
    ctypes.CDLL(None).malloc_trim(0)
if comm.rank == 0:
    print("OK")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and clear_refs are Linux's")
@pytest.mark.parametrize("nprocs, cases", [
    (4, [("ij,jk->ik", dict(i=1536, j=1536, k=1536), 1.5, False),
         ("ij,jk->ik", dict(i=1536, j=1536, k=1536), 1.5, True)]),   # prefetch: two rounds' pieces held
    (3, [("ijk,ja,ka->ia", dict(i=240, j=240, k=240, a=24), 1.3, False),
         ("ijklm,jb,kc,ld,me->ibcde", dict(i=24, j=24, k=24, l=24, m=24, b=8, c=8, d=8, e=8), 1.3, False)]),
])
def test_peak_resident_memory_stays_within_the_budget(nprocs, cases, tmp_path):
    out = check_mpi(nprocs, JOB.replace("CASES", repr(cases), 1), tmp_path=tmp_path, timeout=300)
    assert out.strip().splitlines()[-1] == "OK", out
