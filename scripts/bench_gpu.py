"""device='gpu' on the suite kernels: a timed benchmark at P = 1 and a correctness check at any P.

Benchmark (one rank, ``python scripts/bench_gpu.py --bench``), per kernel at sizes whose largest
operand holds ``--gib`` GiB (matrices ``--mm-n`` square): the program's local compute time (the
``compute`` phase) against ``cupy.einsum`` of the same group on the same device arrays (the faster
of ``optimize=False`` and ``'greedy'``), achieved FLOP/s (opt_einsum's count of the cheapest path)
against a square cuBLAS GEMM measured in the same run (and, for MTTKRP, against the one GEMM of
the same shape, ``X`` as a matrix times the Khatri-Rao block), and both modes: inputs already
resident on the GPU, and inputs/result on the host with the copies timed (``--no-host`` skips
these). The local-kernel column says what each group ran: the library kernel or ``cupy.einsum``,
whichever the first call measured faster (``Device.contract``), with those timings.

Check (``mpiexec -n P python -m mpi4py scripts/bench_gpu.py --check``): the CPU path's result
equals both GPU modes (float64 rtol 1e-10, float32 rtol 1e-4) and measured bytes == model on
every rank. Inputs are generated on the GPU from one seed (the same on every rank).

Memory (``mpiexec -n P python -m mpi4py scripts/bench_gpu.py --memory``): plans made for budgets of
``--factors`` x the data share per rank, their peak GPU memory per rank measured (see :func:`memory`).
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_executor import KERNELS  # noqa: E402

import deinsum  # noqa: E402
from deinsum.runtime.gpu import CHOICES  # noqa: E402
from deinsum.runtime.kernels import group_strategy  # noqa: E402

RTOL = {"float64": 1e-10, "float32": 1e-4}


def gpu_sizes(kernel, gib, itemsize, mm_n, rank):
    """Index sizes of ``kernel`` whose tensor operand holds about ``gib`` GiB (matrices ``mm_n`` square).

    >>> gpu_sizes("MTTKRP-O3-M0", 1, 8, 1024, 24)
    {'i': 512, 'j': 512, 'k': 512, 'a': 24}
    >>> gpu_sizes("TTMc-O5-M0", 1, 8, 1024, 24)["b"], gpu_sizes("1MM", 1, 8, 1024, 24)["j"]
    (8, 1024)
    """
    eq, base = KERNELS[kernel]
    words = gib * 2**30 / itemsize
    if kernel.endswith("MM"):
        return dict.fromkeys(base, mm_n)
    order = len(eq.split(",")[0])
    n = int(round(words ** (1 / order), 6))
    small = rank if kernel.startswith("MTTKRP") else max(2, rank // 3)
    return {c: n if c in eq.split(",")[0] else small for c in base}


def shapes_of(eq, sizes):
    return [tuple(sizes[c] for c in term) for term in eq.split("->")[0].split(",")]


def timed(cp, fn, repeat, warmup=1):
    """Median seconds of ``fn()`` (device synchronized), after ``warmup`` calls; and its last value."""
    for _ in range(warmup):
        value = fn()
    cp.cuda.get_current_stream().synchronize()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        value = fn()
        cp.cuda.get_current_stream().synchronize()
        samples.append(time.perf_counter() - start)
    return float(np.median(samples)), value


def flop_count(eq, shapes):
    import opt_einsum as oe
    return float(oe.contract_path(eq, *shapes, shapes=True)[1].opt_cost)


def gemm_rate(cp, m, k, n, dtype, repeat):
    """FLOP/s of one cuBLAS GEMM (m x k) @ (k x n) on random data."""
    rng = cp.random.default_rng(7)
    a, b = rng.random((m, k), dtype=dtype), rng.random((k, n), dtype=dtype)
    seconds, _ = timed(cp, lambda: a @ b, repeat, warmup=2)
    return 2.0 * m * k * n / seconds


def bandwidths(cp, repeat, nbytes=2**30):
    """Copy rates of ``nbytes``: device to device (read + written), host to device and back from pageable
    (fresh numpy) and from page-locked memory."""
    import cupyx
    x = cp.random.default_rng(3).random(nbytes // 8)
    pageable, pinned = cp.asnumpy(x), cupyx.empty_pinned(x.shape, x.dtype)
    rates = {"device to device (read + write)": 2 * nbytes / timed(cp, lambda: x.copy(), repeat)[0],
             "host to device, pageable": nbytes / timed(cp, lambda: cp.asarray(pageable), repeat)[0],
             "host to device, pinned": nbytes / timed(cp, lambda: cp.asarray(pinned), repeat)[0],
             "device to host, new pageable array": nbytes / timed(cp, lambda: cp.asnumpy(x), repeat)[0],
             "device to host, pinned": nbytes / timed(cp, lambda: x.get(out=pinned), repeat)[0]}
    print("copies of 1 GiB: " + "; ".join(f"{k} {v / 1e9:.1f} GB/s" for k, v in rates.items()))


def chosen(group, sizes):
    """What ``group`` ran locally: the kernel's strategy or cupy.einsum, with the one-time timings that
    chose it (:data:`deinsum.runtime.gpu.CHOICES`)."""
    inputs = tuple(s for _, s in group.reads)
    shapes = tuple(tuple(sizes[c] for c in s) for s in inputs)
    name = group_strategy(inputs, group.output_subscripts, shapes, device=True)
    winner, seconds = next((v for k, v in CHOICES.items() if k[1:4] == (inputs, group.output_subscripts, shapes)),
                           ("kernel", {}))
    if len(seconds) < 2:
        return name + " (not measured)"
    timings = f"measured {1e3 * seconds['kernel']:.2f} ms kernel, {1e3 * seconds['cupy.einsum']:.2f} ms cupy.einsum"
    return f"cupy.einsum ({timings}; kernel: {name})" if winner == "cupy.einsum" else f"{name} ({timings})"


def device_inputs(cp, shapes, dtype, seed=0):
    rng = cp.random.default_rng(seed)
    return [rng.random(s, dtype=dtype) for s in shapes]


def bench(args, cp):
    dtype = np.dtype(args.dtype)
    peak = gemm_rate(cp, args.gemm_n, args.gemm_n, args.gemm_n, dtype, args.repeat)
    name = cp.cuda.runtime.getDeviceProperties(0)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    print(f"# GPU benchmark, P = 1: {name}, CuPy {cp.__version__}, {dtype.name}, median of {args.repeat} "
          f"calls after a warm-up\n")
    print(f"square cuBLAS GEMM n = {args.gemm_n}: {peak / 1e12:.2f} TFLOP/s")
    bandwidths(cp, args.repeat)
    print("\n| kernel | sizes | largest operand GiB | local kernel | compute ms | cupy.einsum ms | compute / einsum "
          "| TFLOP/s | % of square GEMM | % of same-shape GEMM | largest operand read GB/s | resident total ms "
          "| host-mode total ms (h2d + compute + d2h) | H2D GB/s |")
    print("|---" * 14 + "|")
    for kernel in args.kernels:
        eq = KERNELS[kernel][0]
        sizes = gpu_sizes(kernel, args.gib, dtype.itemsize, args.mm_n, args.rank)
        shapes = shapes_of(eq, sizes)
        inputs = device_inputs(cp, shapes, dtype)
        prog = deinsum.compile(eq, *shapes, device="gpu")
        plan = prog.plan(nprocs=1, dtype=dtype)
        computes = []

        def resident():
            out = prog(*inputs)
            computes.append(prog.last_run.seconds["compute"])
            return out
        total, out = timed(cp, resident, args.repeat, warmup=2)
        compute = float(np.median(computes[2:]))
        strategy = "; ".join(chosen(g, sizes) for g in plan.groups)
        refs = {}
        for optimize in (False, "greedy"):
            try:
                refs[optimize], ref = timed(cp, lambda: cp.einsum(eq, *inputs, optimize=optimize), args.repeat)
            except Exception as exc:  # noqa: BLE001 - e.g. out of memory for an unoptimized path
                print(f"  ({kernel}: cupy.einsum optimize={optimize} failed: {type(exc).__name__})")
                continue
            err = float(cp.max(cp.abs(ref - out)) / cp.max(cp.abs(ref)))
            assert err < 10 * RTOL[dtype.name], (kernel, optimize, err)
            del ref
        best = min(refs, key=refs.get)
        flops = flop_count(eq, shapes)
        same = ""
        if kernel.startswith("MTTKRP"):
            big = math.prod(shapes[0])
            free = sizes[eq.split("->")[1][0]]
            same = f"{100 * flops / compute / gemm_rate(cp, free, big // free, sizes['a'], dtype, args.repeat):.0f}%"
        in_bytes, largest = sum(a.nbytes for a in inputs), max(a.nbytes for a in inputs)
        host_mode = "- | -"
        if not args.no_host:
            host, phases = [cp.asnumpy(x) for x in inputs], []

            def host_call():
                out = prog(*host)
                phases.append(prog.last_run.seconds)
                return out
            host_total, _ = timed(cp, host_call, args.repeat)
            h2d, hc, d2h = (float(np.median([p.get(k, 0.0) for p in phases[1:]]))
                            for k in ("host_to_device", "compute", "device_to_host"))
            host_mode = (f"{1e3 * host_total:.1f} ({1e3 * h2d:.1f} + {1e3 * hc:.1f} + {1e3 * d2h:.1f}) "
                         f"| {in_bytes / h2d / 1e9:.1f}")
        print(f"| {kernel} | {','.join(f'{c}={n}' for c, n in sizes.items())} | {largest / 2**30:.1f} "
              f"| {strategy} | {1e3 * compute:.2f} | {1e3 * refs[best]:.2f} (optimize={best}) "
              f"| {compute / refs[best]:.2f} | {flops / compute / 1e12:.2f} | {100 * flops / compute / peak:.0f}% "
              f"| {same or '-'} | {largest / compute / 1e9:.0f} | {1e3 * total:.2f} | {host_mode} |", flush=True)
        prog.close()
        inputs = host = out = None
        cp.get_default_memory_pool().free_all_blocks()


def check(args, cp):
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    if comm.rank == 0:
        print(f"# GPU check on {comm.size} rank(s) sharing the node's GPUs: CPU path vs GPU (host and resident "
              f"modes)\n")
        print("| kernel | dtype | sizes | largest operand GiB | max rel. error host mode | resident mode "
              "| bytes == model | CPU s | GPU host-mode s | GPU resident s |")
        print("|---" * 10 + "|")
    for kernel in args.kernels:
        eq = KERNELS[kernel][0]
        for dtype in map(np.dtype, args.dtypes):
            sizes = gpu_sizes(kernel, args.gib, dtype.itemsize, args.mm_n, args.rank)
            shapes = shapes_of(eq, sizes)
            inputs = device_inputs(cp, shapes, dtype)
            host = [cp.asnumpy(x) for x in inputs]
            cpu = deinsum.compile(eq, *shapes)
            comm.Barrier()
            start = time.perf_counter()
            want = cpu(*host)
            cpu_s = time.perf_counter() - start
            gpu = deinsum.compile(eq, *shapes, device="gpu")
            errors, seconds, model = [], [], True
            for operands in (host, inputs):
                comm.Barrier()
                start = time.perf_counter()
                got = gpu(*operands)
                seconds.append(time.perf_counter() - start)
                got = cp.asnumpy(got)
                errors.append(float(np.max(np.abs(got - want) / np.abs(want))) if want.size else 0.0)
                model &= gpu.last_run.matches_model
                del got
            model = comm.allreduce(int(not model)) == 0
            errors = [comm.allreduce(e, op=MPI.MAX) for e in errors]
            ok = model and all(e <= RTOL[dtype.name] for e in errors)
            if comm.rank == 0:
                print(f"| {kernel} | {dtype.name} | {','.join(f'{c}={n}' for c, n in sizes.items())} "
                      f"| {max(a.nbytes for a in host) / 2**30:.1f} | {errors[0]:.1e} | {errors[1]:.1e} "
                      f"| {'yes' if model else 'NO'} | {cpu_s:.2f} | {seconds[0]:.2f} | {seconds[1]:.2f} |"
                      + ("" if ok else " FAIL"), flush=True)
            cpu.close()
            gpu.close()
            inputs = host = want = None
            cp.get_default_memory_pool().free_all_blocks()
            if not ok:
                comm.Abort(1)


def memory(args, cp):
    """Plans made for a memory budget on the GPU (``--factors`` x the data share per rank, fair start: local
    inputs, distributed result): the GPU memory pool's high-water mark during the call, the rank's own blocks
    included, against the budget and the plan's footprint, on every rank; the result against the same blocks
    through the plan made with memory to spare, and both times."""
    from mpi4py import MPI
    from deinsum.footprint import footprint
    comm = MPI.COMM_WORLD
    pool = cp.get_default_memory_pool()
    peak = [0]

    def malloc(nbytes):
        block = pool.malloc(nbytes)
        peak[0] = max(peak[0], pool.used_bytes())
        return block
    cp.cuda.set_allocator(malloc)
    if comm.rank == 0:
        print(f"# GPU memory budgets on {comm.size} rank(s) sharing the node's GPUs, float64\n")
        print("| kernel | sizes | memory x data share | memory per rank | rounds | peak / memory (max over ranks) "
              "| model / peak (min over ranks) | bytes == model | max rel. diff to the unlimited plan "
              "| s (budget) | s (unlimited) |")
        print("|---" * 11 + "|")
    for kernel in args.kernels:
        eq = KERNELS[kernel][0]
        sizes = gpu_sizes(kernel, args.gib, 8, args.mm_n, args.rank)
        shapes = shapes_of(eq, sizes)
        for factor in args.factors:
            prog = deinsum.compile(eq, *shapes, inputs="local", result="distributed", device="gpu")
            prog.memory = int(factor * prog.plan(nprocs=comm.size).data_share * 8)
            plan = prog.plan(nprocs=comm.size)
            spare = deinsum.compile(eq, *shapes, inputs="local", result="distributed", device="gpu", memory=2**62,
                                    layouts={"out": plan.exit})
            blocks = prog.input_blocks(comm.rank, comm.size)
            rng = cp.random.default_rng(comm.rank)
            local = [None if b is None else rng.random(tuple(s.stop - s.start for s in b)) for b in blocks]
            rng = None      # its state (12.9 MB on an H200) is not the program's: freed before the peak is taken
            seconds = []
            for run in (prog, spare):   # the peak of a first call (it makes the tables), the time of a second
                peak[0] = pool.used_bytes()
                for _ in range(2):
                    got = None
                    cp.cuda.runtime.deviceSynchronize()
                    comm.Barrier()
                    start = time.perf_counter()
                    got = run(*local)
                    cp.cuda.runtime.deviceSynchronize()
                    elapsed = time.perf_counter() - start
                seconds.append(comm.allreduce(elapsed, op=MPI.MAX))
                if run is prog:
                    used, matches, mine = peak[0], prog.last_run.matches_model, got
            diff = 0.0
            if mine.block is not None:
                diff = float(cp.max(cp.abs(mine.local - got.local)) / max(float(cp.max(cp.abs(got.local))), 1e-300))
            model = int(footprint(plan)[comm.rank])
            over = comm.allreduce(used / prog.memory, op=MPI.MAX)
            slack = comm.allreduce(model / max(used, 1), op=MPI.MIN)
            matches = comm.allreduce(int(not matches)) == 0
            diff = comm.allreduce(diff, op=MPI.MAX)
            if comm.rank == 0:
                rounds = "; ".join(g.rounds_text for g in plan.groups if g.rounds) or "none"
                print(f"| {kernel} | {','.join(f'{c}={n}' for c, n in sizes.items())} | {factor} "
                      f"| {prog.memory / 2**30:.2f} GiB | {rounds} | {over:.3f} | {slack:.3f} "
                      f"| {'yes' if matches else 'NO'} | {diff:.1e} | {seconds[0]:.2f} | {seconds[1]:.2f} |",
                      flush=True)
            prog.close()
            spare.close()
            local = got = mine = None
            pool.free_all_blocks()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--bench", action="store_true", help="time the kernels at P = 1")
    mode.add_argument("--check", action="store_true", help="CPU path vs GPU under mpiexec (any P)")
    mode.add_argument("--memory", action="store_true", help="peak GPU memory of plans for a budget (any P)")
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    parser.add_argument("--gib", type=float, default=8.0, help="GiB of each kernel's tensor operand")
    parser.add_argument("--mm-n", type=int, default=16384, help="matrix size of the MM kernels")
    parser.add_argument("--rank", type=int, default=24, help="MTTKRP rank (TTMc ranks: a third of it)")
    parser.add_argument("--dtype", default="float64", help="benchmark dtype")
    parser.add_argument("--dtypes", nargs="+", default=["float64", "float32"], help="check dtypes")
    parser.add_argument("--factors", nargs="+", type=float, default=[1.25, 1.5, 2.0],
                        help="--memory: budgets, in multiples of the data share per rank")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-host", action="store_true", help="skip the host-mode columns (copies)")
    parser.add_argument("--gemm-n", type=int, default=8192, help="size of the square reference GEMM")
    args = parser.parse_args(argv)
    import cupy as cp
    (bench if args.bench else check if args.check else memory)(args, cp)


if __name__ == "__main__":
    main()
