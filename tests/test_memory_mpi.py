"""Peak memory measured under mpiexec: plans made for a memory budget stay within it (issue 24).

Each rank resets its VmHWM (``/proc/self/clear_refs``) after making its blocks and reads it after the call:
the peak above the resident set it had before its blocks were made must be <= 1.1 x memory + 24 MiB; on a
second call (the footprint leaves out the tables and datatypes a first call makes), the peak above the resident
set before it, with the caller's blocks, must be <= the plan's footprint (an upper bound; with prefetch, two
rounds' pieces of each move in rounds); the result equals numpy and the bytes moved equal the model.
"""
import sys

import pytest

from mpirun import check_mpi

#: What both jobs start with: the resident-set figures of /proc/self/status, in bytes.
PRELUDE = """
import contextlib, ctypes, io, sys, types
import numpy as np, deinsum
from mpi4py import MPI
from deinsum.footprint import footprint
from deinsum.peak import SLACK

comm = MPI.COMM_WORLD

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

# prog(*args) and its peak: VmHWM reset first, above the resident set then, with the caller's blocks
def measured_call(prog, args):
    before = status("VmRSS:")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    got = prog(*args)
    return got, status("VmHWM:") - before + sum(a.nbytes for a in args if a is not None)
"""

JOB = PRELUDE + """
for eq, sizes, factor, prefetch, rounds in CASES:
    shapes = [tuple(sizes[c] for c in s) for s in eq.split("->")[0].split(",")]
    deinsum.einsum(eq, *(np.ones([2] * len(s)) for s in shapes))   # libraries loaded (BLAS, MKL, MPI's paths)
    prog = deinsum.compile(eq, *shapes, inputs="local", result="distributed", prefetch=prefetch)
    prog.memory = int(factor * prog.plan(nprocs=comm.size).data_share * 8)
    plan = prog.plan(nprocs=comm.size)
    assert plan.feasible and any(g.rounds for g in plan.groups) == rounds, (eq, [g.rounds for g in plan.groups])
    assert any(m.prefetch for m in plan.moves) == prefetch, [m.label for m in plan.moves]
    blocks = prog.input_blocks(comm.rank, comm.size)
    rng = np.random.default_rng(comm.rank)
    before = status("VmRSS:")
    local = [None if b is None else rng.standard_normal(tuple(s.stop - s.start for s in b)) for b in blocks]
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    got = prog(*local)
    used = status("VmHWM:") - before          # the first call: with the tables and datatypes it makes
    assert 0 < used <= 1.1 * prog.memory + 24 * 2**20, (eq, used, prog.memory)
    assert prog.last_run.matches_model, prog.last_run
    del got                                   # a second call against the footprint, which leaves those out
    ctypes.CDLL(None).malloc_trim(0)          # (the freed heap returned: what the call makes shows in VmHWM)
    got, peak = measured_call(prog, local)
    model = int(footprint(plan)[comm.rank])
    assert peak <= model, (eq, peak, model)
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
        print(f"{eq}{' prefetched' * prefetch}: {used / prog.memory:.3f} x memory (first call), model "
              f"{model / max(peak, 1):.3f} x measured (second)", flush=True)
    del got, local, whole, arrays, a   # the next case starts from what this one leaves, its free heap returned
    ctypes.CDLL(None).malloc_trim(0)
if comm.rank == 0:
    print("OK")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and clear_refs are Linux's")
@pytest.mark.parametrize("nprocs, cases", [
    (4, [("ij,jk->ik", dict(i=1536, j=1536, k=1536), 1.5, False, True),
         ("ij,jk->ik", dict(i=1536, j=1536, k=1536), 1.5, True, True)]),   # prefetch: two rounds' pieces held
    (3, [("ijk,ja,ka->ia", dict(i=240, j=240, k=240, a=24), 1.3, False, False),   # fits without rounds
         ("ijk,ja,ka->ia", dict(i=240, j=240, k=240, a=24), 1.1, False, True),
         ("ijklm,jb,kc,ld,me->ibcde", dict(i=24, j=24, k=24, l=24, m=24, b=8, c=8, d=8, e=8), 1.3, False, True)]),
])
def test_peak_resident_memory_stays_within_the_budget(nprocs, cases, tmp_path):
    out = check_mpi(nprocs, JOB.replace("CASES", repr(cases), 1), tmp_path=tmp_path, timeout=300)
    assert out.strip().splitlines()[-1] == "OK", out


FREE_ROUNDS_JOB = PRELUDE + """
deinsum.einsum("ij,jk->ik", np.ones((2, 2)), np.ones((2, 2)))   # libraries loaded (BLAS, MPI's paths)
rng = np.random.default_rng(0)
for n, (eq, sizes, inputs, result, eighths) in enumerate(CASES):
    shapes = [tuple(sizes[c] for c in s) for s in eq.split("->")[0].split(",")]
    prog = deinsum.compile(eq, *shapes, inputs=inputs, result=result)
    free = prog.plan(nprocs=comm.size)
    share = SLACK + free.data_share * 8
    prog.memory = share + (free.peak_bytes - share) * eighths // 8
    plan = prog.plan(nprocs=comm.size)
    rounds = [g.rounds_text for g in plan.groups]
    assert plan.feasible and any(g.free_rounds for g in plan.groups), (eq, rounds)
    arrays = [rng.standard_normal(s) for s in shapes]
    want = np.einsum(eq, *arrays)
    if inputs == "local":
        args = [a[b] for a, b in zip(arrays, prog.input_blocks(comm.rank, comm.size, result=result))]
    else:
        args = arrays if inputs == "global" or comm.rank == 0 else [None] * len(arrays)
    prog(*args)                    # warm: the runtime's tables and datatypes (one per round) are made on a first call
    got, peak = measured_call(prog, args)
    model = int(footprint(plan)[comm.rank])
    assert peak <= model, (eq, rounds, peak, model)
    assert prog.last_run.matches_model, (eq, prog.last_run)
    if result == "distributed":
        assert got.block is None or np.allclose(got.local, want[got.block]), eq
    elif result == "all" or comm.rank == 0:
        assert np.allclose(got, want), eq
    del got
    path = f"{TMP}/free{n}.py"
    if comm.rank == 0:
        prog.to_script(path, nprocs=comm.size)
    comm.Barrier()
    module = types.ModuleType("emitted")   # a module, as `python -m mpi4py` runs it
    sys.modules["emitted"] = module
    exec(compile(open(path).read(), path, "exec"), module.__dict__)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = module.script_main(module.__dict__, ["--validate", "--memory", str(prog.memory)])
    text = out.getvalue()
    assert code == 0 and (comm.rank or "validate: OK" in text and "measured bytes == model" in text), (eq, text)
    if comm.rank == 0:
        print(f"{eq} {inputs}->{result}: {', '.join(r for r in rounds if r)}; peak {peak:,} <= model {model:,}",
              flush=True)
if comm.rank == 0:
    print("OK")
"""

#: Each case (equation, sizes, inputs, result, memory in eighths of the way from its data share to its unlimited
#: peak) runs in rounds over a free index at its P: moved blocks in slabs (B of the matrix multiply at P = 3, both
#: operands of the batched one), blocks cut in place, a free group after a summed one (the chain at P = 4).
_MM, _BATCHED = dict(i=8192, j=32, k=256), dict(b=32, i=64, j=4, k=64)
_TTM, _CHAIN = dict(i=64, j=64, k=4, l=64), dict(i=256, j=256, k=16, l=256)
FREE_ROUNDS_CASES = {
    1: [("ij,jk->ik", _MM, "local", "distributed", 6), ("bij,bjk->bik", _BATCHED, "root", "root", 7),
        ("ijk,kl->ijl", _TTM, "global", "all", 7), ("ij,jk,kl->il", _CHAIN, "global", "all", 1)],
    3: [("ij,jk->ik", _MM, "local", "distributed", 6), ("ij,jk->ik", dict(i=1024, j=8, k=256), "local", "distributed", 7),
        ("bij,bjk->bik", _BATCHED, "root", "root", 7), ("ijk,kl->ijl", _TTM, "global", "distributed", 4)],
    4: [("ij,jk->ik", _MM, "global", "all", 6), ("ij,jk,kl->il", _CHAIN, "local", "distributed", 7),
        ("bij,bjk->bik", _BATCHED, "global", "distributed", 3), ("ijk,kl->ijl", _TTM, "local", "distributed", 7)],
}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and clear_refs are Linux's")
@pytest.mark.parametrize("nprocs", sorted(FREE_ROUNDS_CASES))
def test_free_index_rounds_equal_numpy_and_model_in_process_and_as_scripts(nprocs, tmp_path):
    """Plans in rounds over a free index, one launch per P: in process equal to numpy with bytes == model and a
    peak (VmHWM, a warm call) within the footprint; their emitted scripts validate with bytes == model."""
    job = FREE_ROUNDS_JOB.replace("CASES", repr(FREE_ROUNDS_CASES[nprocs]), 1).replace("TMP", repr(str(tmp_path)), 1)
    out = check_mpi(nprocs, job, tmp_path=tmp_path, timeout=300)
    assert out.strip().splitlines()[-1] == "OK", out
