"""The runtime is real code: tracebacks name its files, and a compiled program keeps its MPI objects."""
import linecache
import traceback
from pathlib import Path

import numpy as np
import pytest

import deinsum
import deinsum.runtime.kernels as kernels
import deinsum.runtime.runner as runtime
import deinsum.program as program
from mpirun import check_mpi


def test_error_in_a_local_kernel_points_at_the_runtime_files(monkeypatch):
    def broken(*args, **kwargs):
        raise ZeroDivisionError("deliberate")

    monkeypatch.setattr(kernels, "_matrix", broken)
    prog = deinsum.compile("ij,jk->ik", (4, 5), (5, 6), threads=None)
    with pytest.raises(ZeroDivisionError) as err:
        prog(np.ones((4, 5)), np.ones((5, 6)))
    frames = traceback.extract_tb(err.value.__traceback__)
    where = [(Path(f.filename), f.name) for f in frames]
    for module, function in [(program, "run_schedule"), (runtime, "contract_group"), (kernels, "contract_pair")]:
        assert (Path(module.__file__), function) in where, where
    kernel = next(f for f in frames if f.name == "contract_pair")
    assert "_matrix(" in linecache.getline(kernel.filename, kernel.lineno)   # the real source line
    assert all(Path(f.filename).is_file() for f in frames)


BUILT_ONCE = """
import resource
import numpy as np
from mpi4py import MPI
import deinsum
comm = MPI.COMM_WORLD
shapes = [(30, 20), (20, 10), (10, 5)]
rng = np.random.default_rng(1)
arrays = [rng.standard_normal(s) for s in shapes]
want = np.einsum("ij,jk,kl->il", *arrays)
with deinsum.compile("ij,jk,kl->il", *shapes) as prog:
    plan = prog.plan(nprocs=comm.size, inputs="local", result="distributed")
    assert any(e.comm.name != "world" for m in plan.moves for e in m.exchanges), "expected a Cart_sub"
    blocks = [a[b] for a, b in zip(arrays, prog.input_blocks(comm.rank, comm.size, result="distributed"))]
    counts, rss = [], []
    for call in range(200):
        got = prog(*blocks, inputs="local", result="distributed")
        assert prog.last_run.matches_model, (call, prog.last_run)
        if got.block is not None:
            assert np.allclose(got.local, want[got.block])
        ((rt,),) = (kept.values() for kept in prog._runtimes.values())
        counts.append(dict(rt.created))
        rss.append(int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize())
    assert counts[0]["datatypes"] > 0 and counts[0]["communicators"] > 0, counts[0]
    assert all(c == counts[0] for c in counts), (counts[0], counts[-1])
    assert rss[-1] - rss[20] < 4 << 20, (rss[20], rss[-1])
assert not prog._runtimes and not rt._transfers and not rt._subs
if comm.rank == 0:
    print("OK", counts[0])
"""


def test_a_compiled_program_creates_its_mpi_objects_once(tmp_path):
    """200 calls: datatypes and communicators created at the first call only, RSS flat, bytes == model."""
    out = check_mpi(6, BUILT_ONCE, tmp_path=tmp_path, timeout=300)
    assert out.startswith("OK")
