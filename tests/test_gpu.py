"""device='gpu' (CuPy): the CPU path's results, bytes == model, both modes (host or resident inputs).

Without CuPy or a CUDA device the GPU tests skip, saying why, and the checks
that ``device='gpu'`` fails there with one line run instead. The large-size
acceptance runs are ``scripts/bench_gpu.py --check`` (see bench-results/gpu.md).
"""
import json

import numpy as np
import pytest

import deinsum
from deinsum import DeinsumError
from deinsum.cli import main
from deinsum.runtime.gpu import Device, cuda_aware, load_cupy
from mpirun import check_mpi
from random_cases import random_einsums
from suite import SUITE, shapes_for


def _why_no_gpu():
    try:
        load_cupy()
    except RuntimeError as exc:
        return str(exc)
    return None


NO_GPU = _why_no_gpu()
needs_gpu = pytest.mark.skipif(NO_GPU is not None, reason=f"no GPU here: {NO_GPU}")
without_gpu = pytest.mark.skipif(NO_GPU is None, reason="a GPU is here: device='gpu' runs (tested below)")
RTOL = {"float64": 1e-10, "float32": 1e-4, "complex128": 1e-10}


def test_device_is_cpu_or_gpu():
    with pytest.raises(DeinsumError, match="device='tpu': expected one of cpu, gpu"):
        deinsum.compile("ij,jk->ik", (2, 3), (3, 4), device="tpu")


@without_gpu
def test_gpu_without_a_gpu_is_one_line_error():
    prog = deinsum.compile("ij,jk->ik", (2, 3), (3, 4), device="gpu")
    with pytest.raises(DeinsumError, match="device='gpu'") as info:
        prog(np.ones((2, 3)), np.ones((3, 4)))
    assert "\n" not in str(info.value) and NO_GPU in str(info.value)


@without_gpu
def test_cli_run_on_gpu_without_a_gpu_exits_2_with_one_line(capfd):
    rc = main(["run", "ij,jk->ik", "--size", "i=4,j=5,k=6", "-n", "2", "--device", "gpu", "--timeout", "60"])
    err = capfd.readouterr().err
    assert rc == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: device='gpu'"), err


@without_gpu
def test_a_gpu_plan_made_without_a_gpu_says_its_memory_is_the_hosts(capsys):
    assert main(["plan", "ij,jk->ik", "--size", "i=64,j=64,k=64", "-P", "4", "--device", "gpu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["memory_default"].endswith("rank(s), no GPU here")


def test_a_script_emitted_for_the_cpu_refuses_device_gpu_in_one_line(tmp_path):
    from mpirun import run_mpi_script
    script = deinsum.compile("ij,jk->ik", (4, 5), (5, 6)).to_script(tmp_path / "p.py", nprocs=2)
    assert "OPEN_DEVICE = None" in script.read_text() and "def open_device" not in script.read_text()
    res = run_mpi_script(2, script, "--device", "gpu", timeout=120)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2 and lines == ["error: this program was emitted for the CPU: emit it with "
                                             "device='gpu' (deinsum emit --device gpu) to run it with --device gpu"]


def test_the_mpich_wheel_is_not_cuda_aware():
    from mpi4py import MPI
    if "pypi.org/p/mpich" not in MPI.Get_library_version():
        pytest.skip("another MPI library: its CUDA support is its own")
    assert cuda_aware() is False    # asked through MPIX_Query_cuda_support, which the wheel's MPICH has


@needs_gpu
def test_a_plan_beyond_the_gpu_memory_is_refused_before_work():
    device = Device(0)
    device.check_memory(1)
    with pytest.raises(RuntimeError, match="the plan needs up to 1,000,000,000,000,000 bytes per rank, GPU 0 has"):
        device.check_memory(10**15)


def _operands(shapes, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.random(s).astype(dtype) for s in shapes]


def test_the_cpu_path_measures_nothing():
    from deinsum.runtime import gpu
    before = dict(gpu.CHOICES)
    host = _operands([(6, 5, 4), (5, 3), (4, 3)], "float64")
    np.testing.assert_allclose(deinsum.compile("ijk,ja,ka->ia", (6, 5, 4), (5, 3), (4, 3))(*host),
                               np.einsum("ijk,ja,ka->ia", *host), rtol=1e-12)
    assert gpu.CHOICES == before


@needs_gpu
def test_the_local_contraction_is_measured_once_per_shape_and_equals_numpy(monkeypatch):
    import cupy
    from deinsum.runtime import gpu
    from deinsum.runtime.kernels import contract_group
    calls = []

    def kernel(*args):
        calls.append(args[:2])
        return contract_group(*args)
    monkeypatch.setattr(gpu, "contract_group", kernel)
    subs, shapes = ("ijk", "ja", "ka"), ((37, 29, 23), (29, 5), (23, 5))
    host = _operands(shapes, "float64")
    want = np.einsum("ijk,ja,ka->ia", *host)
    key = (0, subs, "ia", shapes, ("<f8",) * 3)
    gpu.CHOICES.pop(key, None)
    device = Device(0)
    for _ in range(3):
        got = device.contract(subs, "ia", *[cupy.asarray(a) for a in host])
        np.testing.assert_allclose(cupy.asnumpy(got), want, rtol=1e-10, atol=0)
    winner, seconds = gpu.CHOICES[key]
    assert set(seconds) == {"kernel", "cupy.einsum"} and winner == min(seconds, key=seconds.get)
    measuring = 1 + gpu.CHOICE_TRIALS                           # a warm-up and the timed runs, then the winner only
    assert len(calls) == measuring + (2 if winner == "kernel" else 0)
    # a program makes one choice per group shape on its first call and reuses it
    prog = deinsum.compile("ijk,ja,ka->ia", (41, 29, 23), (29, 5), (23, 5), device="gpu")
    host = _operands([(41, 29, 23), (29, 5), (23, 5)], "float32")
    for _ in range(2):
        np.testing.assert_allclose(prog(*host), np.einsum("ijk,ja,ka->ia", *host), rtol=1e-4)
        keys = [k for k in gpu.CHOICES if (41, 29, 23) in k[3]]
        assert len(keys) == 1 and keys[0][2] == "ia" and keys[0][4] == ("<f4",) * 3, keys


@needs_gpu
@pytest.mark.parametrize("name", sorted(SUITE))
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_suite_on_gpu_equals_cpu_in_both_modes(name, dtype):
    import cupy
    eq, sizes = SUITE[name]
    shapes = shapes_for(eq, {c: 4 * n for c, n in sizes.items()})
    host = _operands(shapes, dtype)
    want = deinsum.compile(eq, *shapes)(*host)
    prog = deinsum.compile(eq, *shapes, device="gpu")
    got = prog(*host)                                   # host in, host out: copies timed
    assert isinstance(got, np.ndarray) and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=RTOL[dtype], atol=0)
    assert prog.last_run.seconds["host_to_device"] > 0 and prog.last_run.seconds["device_to_host"] > 0
    resident = prog(*[cupy.asarray(a) for a in host])   # already on the GPU: result stays there
    assert isinstance(resident, cupy.ndarray)
    np.testing.assert_allclose(cupy.asnumpy(resident), want, rtol=RTOL[dtype], atol=0)
    assert "host_to_device" not in prog.last_run.seconds and prog.last_run.matches_model


@needs_gpu
def test_cupy_operands_need_device_gpu():
    import cupy
    prog = deinsum.compile("ij,jk->ik", (2, 3), (3, 4))
    with pytest.raises(DeinsumError, match="operand 0 is a GPU array: compile with device='gpu'"):
        prog(cupy.ones((2, 3)), np.ones((3, 4)))


GPU_MPI = """
import sys
import numpy as np, cupy
from mpi4py import MPI
import deinsum
sys.path.insert(0, {tests!r})
from suite import SUITE, shapes_for
from random_cases import random_einsums
comm = MPI.COMM_WORLD
cases = [(name, eq, shapes_for(eq, {{c: 3 * n for c, n in s.items()}})) for name, (eq, s) in sorted(SUITE.items())]
cases += [(f"random {{k}}", eq, shapes) for k, (eq, shapes) in enumerate(random_einsums(12, seed=5))]
for name, eq, shapes in cases:
    for dtype, rtol in (("float64", 1e-10), ("float32", 1e-4)):
        rng = np.random.default_rng(1)
        host = [rng.random(s).astype(dtype) for s in shapes]
        want = deinsum.compile(eq, *shapes)(*host)
        prog = deinsum.compile(eq, *shapes, device="gpu")
        for resident in (False, True):
            got = prog(*[cupy.asarray(a) if resident else a for a in host])
            assert isinstance(got, cupy.ndarray) == resident, (name, resident)
            np.testing.assert_allclose(cupy.asnumpy(got), want, rtol=rtol, atol=1e-12, err_msg=f"{{name}} {{eq}}")
            assert comm.allreduce(not prog.last_run.matches_model) == 0, (name, str(prog.last_run))
        prog.close()
if comm.rank == 0:
    print("OK", len(cases))
"""


@needs_gpu
@pytest.mark.parametrize("nprocs", [2, 3])
def test_suite_and_random_einsums_on_gpu_under_mpi(nprocs, tmp_path):
    from pathlib import Path
    out = check_mpi(nprocs, GPU_MPI.format(tests=str(Path(__file__).parent)), tmp_path=tmp_path, timeout=600)
    assert f"OK {len(SUITE) + len(random_einsums(12, seed=5))}" in out


@needs_gpu
def test_emitted_script_on_gpu_validates(tmp_path):
    from mpirun import run_mpi_script
    prog = deinsum.compile("ijk,ja,ka->ia", (40, 30, 20), (30, 8), (20, 8), device="gpu")
    script = prog.to_script(tmp_path / "p.py", nprocs=2)
    res = run_mpi_script(2, script, "--device", "gpu", "--validate", "--repeat", "2", timeout=300)
    assert res.returncode == 0, res.stderr
    assert "validate: OK" in res.stdout and "measured bytes == model" in res.stdout
    assert "local compute on GPU" in res.stdout and "host_to_device" in res.stdout


@needs_gpu
def test_a_gpu_program_plans_in_the_gpu_memory():
    import cupy
    pool = cupy.get_default_memory_pool()
    limit = pool.get_limit()
    a, b = _operands([(2048, 2048), (2048, 2048)], "float64")   # 3 x 32 MiB with the result
    try:
        pool.set_limit(size=pool.used_bytes() + 50 * 2**20)
        prog = deinsum.compile("ij,jk->ik", a.shape, b.shape, device="gpu")
        plan = prog.plan(nprocs=1)
        assert plan.memory <= 50 * 2**20 and "GPU" in plan.memory_default and not plan.feasible
        with pytest.raises(DeinsumError, match=r"needs [\d,]+ bytes per rank at its peak"):
            prog(a, b)
        pool.set_limit(size=pool.used_bytes() + 200 * 2**20)
        assert prog.plan(nprocs=1).feasible
        np.testing.assert_allclose(prog(a, b), a @ b, rtol=1e-10)
    finally:
        pool.set_limit(size=limit)


GPU_BUDGET = """
import numpy as np, cupy, deinsum
from mpi4py import MPI
from deinsum.footprint import footprint
comm = MPI.COMM_WORLD
pool = cupy.get_default_memory_pool()
peak = [0]

def malloc(nbytes):   # the pool's high-water mark: bytes in use on this rank's GPU
    block = pool.malloc(nbytes)
    peak[0] = max(peak[0], pool.used_bytes())
    return block
cupy.cuda.set_allocator(malloc)
for eq, sizes, factor, rounds in CASES:
    shapes = [tuple(sizes[c] for c in s) for s in eq.split("->")[0].split(",")]
    prog = deinsum.compile(eq, *shapes, inputs="local", result="distributed", device="gpu")
    limit = int(factor * prog.plan(nprocs=comm.size).data_share * 8)
    pool.set_limit(size=limit)            # the GPU memory this rank may use, its blocks included: no memory= given
    blocks = prog.input_blocks(comm.rank, comm.size)
    rng = np.random.default_rng(comm.rank)
    host = [None if b is None else rng.standard_normal(tuple(s.stop - s.start for s in b)) for b in blocks]
    peak[0] = 0
    got = prog(*[None if x is None else cupy.asarray(x) for x in host])
    plan = prog.last_plan
    model = int(footprint(plan)[comm.rank])
    assert plan.memory <= limit and plan.feasible, (eq, plan.memory, limit)
    assert any(g.rounds for g in plan.groups) == rounds, (eq, factor, [g.rounds for g in plan.groups])
    assert 0 < peak[0] <= min(limit, model), (eq, peak[0], limit, model)
    assert prog.last_run.matches_model, prog.last_run
    whole = []
    for parts, shape in zip([comm.allgather((b, x)) for b, x in zip(blocks, host)], shapes):
        whole.append(np.zeros(shape))
        for b, x in parts:
            if b is not None:
                whole[-1][b] = x
    if got.block is not None:
        np.testing.assert_allclose(cupy.asnumpy(got.local), np.einsum(eq, *whole, optimize=True)[got.block],
                                   rtol=1e-10, atol=1e-10)
    if comm.rank == 0:
        print(f"{eq}: {peak[0] / limit:.3f} x memory, model {model / peak[0]:.3f} x measured", flush=True)
    prog.close()
    got = None
    pool.set_limit(size=0)
    pool.free_all_blocks()
if comm.rank == 0:
    print("OK")
"""


#: P -> the cases of GPU_BUDGET: (einsum, sizes, memory x the data share, whether the plan needs rounds).
GPU_BUDGET_CASES = {
    4: [("ij,jk->ik", dict(i=1536, j=1536, k=1536), 1.5, True)],
    3: [("ijk,ja,ka->ia", dict(i=240, j=240, k=240, a=24), 1.3, False),   # fits without rounds
        ("ijk,ja,ka->ia", dict(i=240, j=240, k=240, a=24), 1.1, True),
        ("ijklm,jb,kc,ld,me->ibcde", dict(i=24, j=24, k=24, l=24, m=24, b=8, c=8, d=8, e=8), 1.3, True)],
}


@pytest.mark.parametrize("nprocs", list(GPU_BUDGET_CASES))
def test_the_gpu_budget_cases_plan_as_the_gpu_test_expects(nprocs):
    """Planning needs no GPU: where a change to the footprint moves a case of the GPU test across its rounds
    (as 45509cc did unseen), this fails here, not only on a machine with a GPU."""
    for eq, sizes, factor, rounds in GPU_BUDGET_CASES[nprocs]:
        shapes = [tuple(sizes[c] for c in s) for s in eq.split("->")[0].split(",")]
        prog = deinsum.compile(eq, *shapes, inputs="local", result="distributed", device="gpu")
        prog.memory = int(factor * prog.plan(nprocs=nprocs).data_share * 8)
        plan = prog.plan(nprocs=nprocs)
        assert plan.feasible and any(g.rounds for g in plan.groups) == rounds, (eq, factor, plan.groups)


@needs_gpu
@pytest.mark.parametrize("nprocs", list(GPU_BUDGET_CASES))
def test_gpu_plans_fit_the_gpu_memory_each_rank_has(nprocs, tmp_path):
    """CuPy's pool limit is the memory each rank may use (no memory= given): the plan runs within it, in rounds
    where it must (the pool refuses any byte more), under its footprint, equal to numpy, bytes == model."""
    out = check_mpi(nprocs, GPU_BUDGET.replace("CASES", repr(GPU_BUDGET_CASES[nprocs]), 1), tmp_path=tmp_path,
                    timeout=300)
    assert out.strip().splitlines()[-1] == "OK", out


#: GEMMs on strided views of X, as an MTTKRP makes them on a round's piece (``runtime.mttkrp.run``): (a, b) of X.
STRIDED_GEMMS = {
    "matrix": lambda x, kr: (kr.T, x.reshape(60, -1)[:, 20000:100000]),           # rows 120,000 apart
    "batch, KR^T X": lambda x, kr: (kr.T, x[:, 30:90, :]),                        # the piece of a round over j
    "batch, X^T KR": lambda x, kr: (x[:, 30:90, :].transpose(0, 2, 1), kr),          # its matrices column-major
}


@needs_gpu
@pytest.mark.parametrize("dtype", ["float64", "float32", "complex128"])
@pytest.mark.parametrize("gemm", list(STRIDED_GEMMS))
def test_a_strided_gemm_on_the_gpu_reads_its_operands_in_place(gemm, dtype):
    """A round's piece of X is a strided view: cuBLAS reads it in place (CuPy's matmul would copy it), also
    batched (one stride steps through the batch)."""
    import cupy
    from deinsum.runtime.blas import matmul
    pool = cupy.get_default_memory_pool()
    rng = np.random.default_rng(0)
    x = cupy.asarray(rng.random((40, 120, 1500)).astype(dtype))
    kr = cupy.asarray(rng.random((60, 5)).astype(dtype))
    a, b = STRIDED_GEMMS[gemm](x, kr)
    view = a if a.size > b.size else b
    assert not view.flags.c_contiguous and not view.flags.f_contiguous
    peak, before = [0], pool.used_bytes()

    def malloc(nbytes):
        block = pool.malloc(nbytes)
        peak[0] = max(peak[0], pool.used_bytes())
        return block
    cupy.cuda.set_allocator(malloc)
    try:
        got = matmul(a, b)
    finally:
        cupy.cuda.set_allocator(pool.malloc)
    assert peak[0] - before <= got.nbytes + 2**20 < view.nbytes
    np.testing.assert_allclose(cupy.asnumpy(got), cupy.asnumpy(a) @ cupy.asnumpy(b), rtol=RTOL[dtype])
