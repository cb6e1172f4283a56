"""deinsum side by side with CTF (Cyclops) on the suite kernels, one mpiexec launch per P.

In each launch every rank builds the same global operands (same seed), then per kernel:
CTF ``ctf.einsum`` on tensors made before timing, the compiled deinsum program
(``inputs="local"``: each rank passes its block; ``result="distributed"``), the
local kernel alone (``contract_group`` of the whole statement on a 1/P slab: the
first output index split evenly, factors whole), and at P = 1 ``opt_einsum.contract``.
Calls are interleaved (in a new seeded order each repetition), each between barriers and, with
``--cache cold`` (the default), after a pass over twice the last-level cache, so every side starts
cold (with the 260 MiB L3 here the operands would otherwise stay cached from the side before,
which favoured whichever side ran next); ``--cache warm`` runs each call three times untimed just
before (steady state: here a kernel's first three calls after a 200 ms pause run up to 40% slower),
with 1 BLAS/OpenMP thread per rank (environment set before import, enforced with
threadpoolctl; TBLIS set to 1 thread). Every result is checked against numpy.
GFLOP/s count opt_einsum's optimal-path FLOPs; at P = 1 a 1-thread 2048^3 dgemm through
deinsum's own GEMM (the library its routes measured fastest for square GEMMs) is one more interleaved side
of every kernel (the share of dgemm compares medians of the same
repetitions; the machine's load changes between kernels). The roofline of a kernel is
min(dgemm, bandwidth x intensity): bandwidth from a 1-thread numpy copy of 256 MB (read + write
bytes), intensity = FLOPs / bytes of the local kernel's inputs and output. The local kernel's
peak memory is traced (tracemalloc, one untimed call) as (inputs + peak allocation) / (inputs +
output). At P = 1 the launch also fits t = t0 + n t1 to GEMMs (numpy's, and deinsum's own)
streaming a 24^5 tensor against n = 8..32 columns as KR^T X (the first step of many MTTKRP/TTMc
strategies): OpenBLAS packs the streamed tensor (t0) before computing (t1 per column), so a
one-pass GEMM kernel on it reaches at most n t1 / (t0 + n t1) of its compute rate.

    . /tmp/ctf-peer/env.sh     # CTF's venv (see ../shared/peers/ctf/README.md); without ctf: CTF skipped
    PYTHONPATH=. python scripts/bench_peers.py --procs 1 2 --repeat 9
    python scripts/bench_peers.py --kernels 1MM --scale 0.25 --repeat 3    # a quick look

Writes bench-results/peers.json (every timing) and bench-results/peers.md (table + conditions), or
peers-warm.{json,md} with ``--cache warm``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _where(path: str) -> str:
    """``path`` as a record names it: relative to this repository, else from its ``site-packages`` on (no
    machine's folders in a committed record).

    >>> _where(str(ROOT / "deinsum" / "__init__.py")), _where("/x/venv/lib/site-packages/ctf/__init__.py")
    ('deinsum/__init__.py', 'site-packages/ctf/__init__.py')
    """
    resolved = Path(path).resolve()
    if resolved.is_relative_to(ROOT):
        return str(resolved.relative_to(ROOT))
    parts = resolved.parts
    return str(Path(*parts[parts.index("site-packages"):])) if "site-packages" in parts else resolved.name

#: name -> (equation, sizes): the suite kernels of issue 14's table.
KERNELS = {
    "1MM": ("ij,jk->ik", dict(i=2048, j=2048, k=2048)),
    "MTTKRP-O3-M0": ("ijk,ja,ka->ia", dict(i=256, j=256, k=256, a=24)),
    "MTTKRP-O3-M1": ("ijk,ia,ka->ja", dict(i=256, j=256, k=256, a=24)),
    "MTTKRP-O3-M2": ("ijk,ia,ja->ka", dict(i=256, j=256, k=256, a=24)),
    "MTTKRP-O5-M0": ("ijklm,ja,ka,la,ma->ia", dict(i=24, j=24, k=24, l=24, m=24, a=24)),
    "MTTKRP-O5-M2": ("ijklm,ia,ja,la,ma->ka", dict(i=24, j=24, k=24, l=24, m=24, a=24)),
    "MTTKRP-O5-M4": ("ijklm,ia,ja,ka,la->ma", dict(i=24, j=24, k=24, l=24, m=24, a=24)),
    "TTMc-O5-M0": ("ijklm,jb,kc,ld,me->ibcde", dict(i=24, j=24, k=24, l=24, m=24, b=8, c=8, d=8, e=8)),
}
SIDES = ("ctf", "deinsum", "local", "opt_einsum", "dgemm")
DGEMM_FLOPS = 2 * 2048 ** 3


# ---------------------------------------------------------------------------------------------------------
# worker: runs under mpiexec
# ---------------------------------------------------------------------------------------------------------
def worker(spec_path: str, out_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    import numpy as np
    import opt_einsum
    from mpi4py import MPI
    from threadpoolctl import threadpool_info, threadpool_limits

    import deinsum
    from deinsum.runtime.gemm import machine_key
    from deinsum.runtime.blas import gemm_libraries, gemm_library, matmul
    from deinsum.runtime.kernels import contract_group, group_strategy
    from deinsum.runtime.libraries import _tblis

    comm = MPI.COMM_WORLD
    try:
        import ctf
        ctf_error = None
    except ImportError as exc:
        ctf, ctf_error = None, f"import ctf failed ({exc}): CTF skipped"
    if _tblis is not None:
        _tblis.set_num_threads(1)

    flush = np.zeros(max(1 << 20, 2 * last_level_cache() // comm.size // 8)) if spec["cache"] == "cold" else None

    def timed(fn):
        if flush is not None:   # every call starts cold: the ranks pass over twice the last-level cache
            np.add(flush, 1.0, out=flush)
        else:                   # warm: the same call three times, untimed, just before (steady state)
            for _ in range(3):
                fn()
        comm.Barrier()
        start = time.perf_counter()
        value = fn()
        comm.Barrier()
        return time.perf_counter() - start, value

    def dgemm(repeat, gemm=matmul):
        a = np.random.default_rng(0).standard_normal((2048, 2048))
        gemm(a, a)
        seconds = [timed(lambda: gemm(a, a))[0] for _ in range(repeat)]
        return {"seconds": seconds, "gflops": 2 * 2048 ** 3 / float(np.median(seconds)) / 1e9}

    def bandwidth(repeat):
        """Streaming bandwidth of one rank (all ranks at once): numpy copy of 256 MB, read + write bytes."""
        src = np.ones(32 << 20)
        dst = np.empty_like(src)
        np.copyto(dst, src)
        seconds = [timed(lambda: np.copyto(dst, src))[0] for _ in range(repeat)]
        return {"seconds": seconds, "gbs": 2 * src.nbytes / float(np.median(seconds)) / 1e9}

    def packing(repeat, matmul):
        """t = t0 + n t1 fitted to GEMMs (n x 576) @ (24 x 576 x 576): a 24^5 tensor streamed once."""
        rng = np.random.default_rng(1)
        x = rng.standard_normal((24, 576, 576))
        widths = (8, 16, 24, 32)
        mats = {n: rng.standard_normal((576, n)).T for n in widths}
        seconds = {n: [] for n in widths}
        for n in widths:
            matmul(mats[n], x)
        for _ in range(repeat):
            for n in widths:
                seconds[n].append(timed(lambda: matmul(mats[n], x))[0])
        t1, t0 = np.polyfit(widths, [float(np.median(seconds[n])) for n in widths], 1)
        return {"widths": widths, "seconds": {str(n): v for n, v in seconds.items()}, "t0": float(t0),
                "t1": float(t1), "bytes": x.nbytes}

    results = []
    with threadpool_limits(limits=1):
        blas = sorted({f"{i['internal_api']} {i.get('version')} {i['filepath'].split('/')[-1]} "
                       f"{i.get('architecture') or ''} x{i['num_threads']}" for i in threadpool_info()})
        gemm_before, numpy_gemm = dgemm(spec["repeat"]), dgemm(spec["repeat"], np.matmul)
        stream = bandwidth(spec["repeat"])
        for name in spec["kernels"]:
            eq, sizes = KERNELS[name]
            sizes = {c: max(1, round(n * spec["scale"])) if n > 24 else n
                     for c, n in sizes.items()}
            results.append(run_kernel(name, eq, sizes, spec["repeat"], comm, np, opt_einsum, deinsum, ctf,
                                      contract_group, group_strategy, timed))
        gemm_after = dgemm(spec["repeat"])
        pack = {"numpy": packing(spec["repeat"], np.matmul), "deinsum": packing(spec["repeat"], matmul)} \
            if comm.size == 1 else None
    if comm.rank == 0:
        Path(out_path).write_text(json.dumps({
            "nprocs": comm.size, "mpi": MPI.Get_library_version().strip().splitlines()[0],
            "blas": blas, "ctf": None if ctf is None else _where(ctf.__file__), "ctf_skipped": ctf_error,
            "deinsum": _where(deinsum.__file__), "tblis": _tblis is not None, "gemm": gemm_library(),
            "cpu": machine_key(gemm_libraries(), 1)["cpu"],
            "dgemm": {"before": gemm_before, "after": gemm_after, "numpy": numpy_gemm}, "bandwidth": stream,
            "packing": pack,
            "kernels": results}, indent=1))
    return 0


def run_kernel(name, eq, sizes, repeat, comm, np, opt_einsum, deinsum, ctf, contract_group, group_strategy, timed):
    """Interleaved timings of every side on one kernel; results checked against numpy."""
    lhs, out = eq.split("->")
    subs = lhs.split(",")
    shapes = [tuple(sizes[c] for c in s) for s in subs]
    from deinsum.runtime.blas import matmul
    from deinsum.program import local_kernels
    rng = np.random.default_rng(42)
    ops = [rng.standard_normal(s) for s in shapes]
    ref = np.einsum(eq, *ops, optimize=True)
    flops = float(opt_einsum.contract_path(eq, *ops, optimize="optimal")[1].opt_cost)
    rank, size = comm.rank, comm.size
    errors = {}

    def close(got, want):
        return bool(np.allclose(got, want, rtol=1e-9, atol=1e-9 * float(np.abs(ref).max())))

    # deinsum: the compiled program, each rank holding its block of the planner's entry layout
    prog = deinsum.compile(eq, *shapes)
    plan = prog.plan(nprocs=size, inputs="local", result="distributed")
    blocks = [np.ascontiguousarray(op[layout.block(rank)]) if layout.block(rank) is not None
              else None for op, layout in zip(ops, plan.entry)]
    res = prog(*blocks, comm=comm, inputs="local", result="distributed")
    ok = res.local is None or res.block is None or close(res.local, ref[res.block])
    errors["deinsum"] = not comm.allreduce(ok, op=_op("LAND"))

    # the local kernel: the whole statement on a 1/P slab of the first output index, factors whole
    split = out[0]
    n = sizes[split]
    lo, hi = rank * n // size, (rank + 1) * n // size
    slab = [np.ascontiguousarray(op[tuple(slice(lo, hi) if c == split else slice(None) for c in s)])
            for op, s in zip(ops, subs)]
    local = contract_group(subs, out, *slab)
    local_flops = float(opt_einsum.contract_path(eq, *slab, optimize="optimal")[1].opt_cost)
    local_bytes = sum(b.nbytes for b in slab) + local.nbytes
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        contract_group(subs, out, *slab)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    memory = comm.allreduce((sum(b.nbytes for b in slab) + peak) / local_bytes, op=_op("MAX"))
    errors["local"] = not comm.allreduce(close(local, ref[(slice(None),) * out.index(split) + (slice(lo, hi),)]),
                                         op=_op("LAND"))
    strategy = group_strategy(subs, out, [b.shape for b in slab])
    group_strategies = local_kernels(plan, rank)

    calls = {"deinsum": lambda: prog(*blocks, comm=comm, inputs="local", result="distributed"),
             "local": lambda: contract_group(subs, out, *slab)}
    if ctf is not None:
        tensors = [ctf.astensor(op) for op in ops]           # rank 0 writes every element: before timing
        got = ctf.einsum(eq, *tensors)
        inds, vals = got.read_local()
        errors["ctf"] = not comm.allreduce(close(vals, ref.ravel()[inds]), op=_op("LAND"))
        calls["ctf"] = lambda: ctf.einsum(eq, *tensors)
    if size == 1:
        calls["opt_einsum"] = lambda: opt_einsum.contract(eq, *ops)
        errors["opt_einsum"] = not close(opt_einsum.contract(eq, *ops), ref)
        gemm = rng.standard_normal((2048, 2048))
        calls["dgemm"] = lambda: matmul(gemm, gemm)         # the reference, interleaved with the kernel
    for side in calls:
        calls[side]()                                          # warm
    seconds = {side: [] for side in calls}
    order = [s for s in SIDES if s in calls]
    for k in range(repeat):   # a new order each repetition (the same on every rank): no side always follows another
        for side in random.Random(k).sample(order, len(order)):
            seconds[side].append(timed(calls[side])[0])
    if rank == 0:
        print(f"P={size} {name}: " + ", ".join(f"{s} {1e3 * float(np.median(v)):.1f} ms" for s, v in seconds.items())
              + (f"; WRONG: {[s for s, e in errors.items() if e]}" if any(errors.values()) else ""), flush=True)
    return {"name": name, "equation": eq, "sizes": sizes, "flops": flops, "seconds": seconds,
            "local_flops": local_flops, "local_bytes": local_bytes, "local_memory": memory,
            "wrong": [s for s, e in errors.items() if e], "local_strategy": strategy,
            "group_strategies": group_strategies,
            "grids": [f"{g.indices}={'x'.join(map(str, g.grid.dims))}" for g in plan.groups]}


def _op(name):
    """An MPI reduction operation by name (mpi4py is imported in the worker only)."""
    from mpi4py import MPI
    return getattr(MPI, name)


# ---------------------------------------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------------------------------------
def last_level_cache() -> int:
    """Bytes of the largest CPU cache (sysfs), 256 MiB where it cannot be read."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip()
        sizes.append(int(text[:-1]) << {"K": 10, "M": 20, "G": 30}[text[-1]] if text[-1] in "KMG" else int(text))
    return max(sizes, default=256 << 20)


def median(values):
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])


def cpu_text(cpu: dict) -> str:
    """The CPU as /proc/cpuinfo names it (deinsum's GEMM routes are cached per this key).

    >>> cpu_text({"vendor_id": "AuthenticAMD", "model name": "AMD EPYC", "cpu family": "25", "model": "17"})
    'AuthenticAMD AMD EPYC (family 25, model 17)'
    """
    rest = ", ".join(f"{k.replace('cpu ', '')} {cpu[k]}" for k in ("cpu family", "model", "stepping") if k in cpu)
    return " ".join(cpu.get(k, "") for k in ("vendor_id", "model name")).strip() + (f" ({rest})" if rest else "")


def blas_coretype() -> str:
    """The OpenBLAS kernel numpy's OpenBLAS picks here, for every OpenBLAS in the launch (CTF's Debian
    OpenBLAS 0.3.21 does not know this VM's CPU model and would fall back to its generic Prescott kernels)."""
    if os.environ.get("OPENBLAS_CORETYPE"):
        return os.environ["OPENBLAS_CORETYPE"]
    __import__("numpy")   # loads numpy's OpenBLAS
    from threadpoolctl import threadpool_info
    return next((i["architecture"] for i in threadpool_info() if i["internal_api"] == "openblas"
                 and i.get("architecture")), "")


def launch(nprocs: int, spec: dict, workdir: Path, timeout: float) -> dict:
    spec_path, out_path = workdir / f"spec{nprocs}.json", workdir / f"out{nprocs}.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               TBLIS_NUM_THREADS="1", OPENBLAS_CORETYPE=blas_coretype(),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    mpiexec = Path(sys.executable).with_name("mpiexec")
    cmd = [str(mpiexec) if mpiexec.exists() else "mpiexec", "-n", str(nprocs), sys.executable, "-m", "mpi4py",
           str(Path(__file__).resolve()), "--worker", str(spec_path), str(out_path)]
    subprocess.run(cmd, env=env, timeout=timeout, check=True)
    return json.loads(out_path.read_text())


def table(runs: list[dict]) -> list[str]:
    lines = ["| kernel (sizes) | P | CTF ms | deinsum ms | deinsum / CTF | local kernel ms | local / CTF "
             "| opt_einsum ms | GFLOP/s deinsum, local (share of dgemm) | local: roofline GFLOP/s (share) "
             "| local peak memory / (in + out) | local strategy |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        for k in run["kernels"]:
            s = k["seconds"]
            fmt = lambda side: (f"{1e3 * median(s[side]):.1f} [{1e3 * min(s[side]):.1f}, {1e3 * max(s[side]):.1f}]"
                                if side in s else "-")
            ratio = lambda side: f"{median(s[side]) / median(s['ctf']):.2f}" if "ctf" in s else "-"
            rate = roof = ""
            if "dgemm" in s:
                gemm = DGEMM_FLOPS / median(s["dgemm"])
                rates = [k["flops"] / median(s[side]) for side in ("deinsum", "local")]
                rate = ", ".join(f"{r / 1e9:.1f} ({100 * r / gemm:.0f}%)" for r in rates) + f"; dgemm {gemm / 1e9:.1f}"
                top = roofline(k, gemm, run["bandwidth"]["gbs"] * 1e9)
                roof = f"{top / 1e9:.1f} ({100 * k['local_flops'] / median(s['local']) / top:.0f}%)"
            sizes = " ".join(f"{c}={n}" for c, n in k["sizes"].items())
            wrong = f" **WRONG: {', '.join(k['wrong'])}**" if k["wrong"] else ""
            lines.append(f"| {k['name']} ({sizes}){wrong} | {run['nprocs']} | {fmt('ctf')} | {fmt('deinsum')} | "
                         f"{ratio('deinsum')} | {fmt('local')} | {ratio('local')} | {fmt('opt_einsum')} | {rate} | "
                         f"{roof} | {k['local_memory']:.2f} | {k['local_strategy']} |")
    return lines


def roofline(kernel: dict, gemm: float, bandwidth: float) -> float:
    """min(dgemm, bandwidth x intensity) in FLOP/s for the local kernel (intensity: FLOPs per byte in + out)."""
    return min(gemm, bandwidth * kernel["local_flops"] / kernel["local_bytes"])


def packing_note(run: dict) -> str:
    """The fitted GEMM streaming cost (t0 + n t1) and what it allows a one-pass GEMM kernel."""
    return "\n".join(_packing_line(run["packing"][who], f"{who}'s", run["dgemm"]["numpy" if who == "numpy" else
                                                                                 "before"]["gflops"])
                     for who in ("numpy", "deinsum") if who in run["packing"])


def _packing_line(pack, who, gemm):
    t0, t1 = pack["t0"], pack["t1"]
    return (f"- {who} GEMM streaming a 24^5 tensor ({pack['bytes'] / 2 ** 20:.0f} MiB) against n columns (P=1 launch, "
            f"n = {', '.join(map(str, pack['widths']))}): t = {1e3 * t0:.2f} ms + n x {1e3 * t1:.3f} ms, i.e. the "
            f"tensor is read once at {pack['bytes'] / t0 / 1e9:.1f} GB/s (not overlapped with compute) and "
            f"each column costs {2 * pack['bytes'] / 8 / t1 / 1e9:.1f} GFLOP/s; a one-pass GEMM MTTKRP at R = 24 "
            f"reaches at most {100 * 24 * t1 / (t0 + 24 * t1):.0f}% of that compute rate, the first TTM of TTMc "
            f"(n = 8) {100 * 8 * t1 / (t0 + 8 * t1):.0f}% (dgemm before the kernels: {gemm:.1f} GFLOP/s)")


def acceptance(runs: list[dict]) -> list[str]:
    """One line per target of issue 14: which kernels meet it and which do not."""
    rows = []
    for run in runs:
        for k in run["kernels"]:
            rows.append((run["nprocs"], k["name"], {side: median(v) for side, v in k["seconds"].items()}, k["flops"]))

    def line(target, checks):
        bad = [f"{name} P={p} ({value})" for p, name, ok, value in checks if not ok]
        good = [f"{name} P={p} ({value})" for p, name, ok, value in checks if ok]
        verdict = "HOLDS" if checks and not bad else "NOT MET" if checks else "not measured"
        return f"- {target}: **{verdict}**" + (f"; misses: {', '.join(bad)}" if bad else "") + \
            (f"; meets: {', '.join(good)}" if good else "")

    out = []
    for who in ("deinsum", "local"):
        checks = [(p, n, t[who] / t["ctf"] <= (0.9 if n == "1MM" else 0.5), f"{t[who] / t['ctf']:.2f}")
                  for p, n, t, _ in rows if "ctf" in t]
        out.append(line(f"{who} / CTF <= 0.5 on MTTKRP and TTMc, <= 0.9 on 1MM", checks))
        checks = [(p, n, f / t[who] / (DGEMM_FLOPS / t["dgemm"]) >= (0.3 if n.startswith("TTMc") else 0.5),
                   f"{100 * f / t[who] / (DGEMM_FLOPS / t['dgemm']):.0f}%")
                  for p, n, t, f in rows if "dgemm" in t and n != "1MM"]
        out.append(line(f"{who} at P=1 >= 50% of dgemm on MTTKRP, >= 30% on TTMc", checks))
        checks = [(p, n, t[who] <= t["opt_einsum"], f"{t[who] / t['opt_einsum']:.2f}x")
                  for p, n, t, _ in rows if "opt_einsum" in t]
        out.append(line(f"{who} at P=1 not slower than opt_einsum.contract", checks))
    for p, n, t, f in rows:
        if n == "1MM" and "ctf" in t and "dgemm" in t:
            share = f / t["ctf"] / (DGEMM_FLOPS / t["dgemm"])
            out.append(f"- 1MM P={p}: CTF runs at {100 * share:.0f}% of the same repetitions' dgemm, so any "
                       f"deinsum at most as fast as dgemm has deinsum / CTF >= {share:.2f} (target 0.9)")
    checks = [(run["nprocs"], k["name"], k["local_memory"] <= 1.5, f"{k['local_memory']:.2f}")
              for run in runs for k in run["kernels"]]
    out.append(line("local kernel peak memory <= 1.5x its inputs plus output", checks))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--procs", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS), metavar="KERNEL")
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--scale", type=float, default=1.0, help="scale the large sizes (quick looks)")
    ap.add_argument("--cache", choices=("cold", "warm"), default="cold",
                    help="cold: each timed call after a pass over twice the last-level cache; warm: right after "
                         "the same call three times, untimed (steady state, its operands in cache)")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", help="output stem (default bench-results/peers, or peers-warm with --cache warm)")
    args = ap.parse_args(argv)
    if args.worker:
        return worker(*args.worker)
    spec = {"kernels": args.kernels, "repeat": args.repeat, "scale": args.scale, "cache": args.cache}
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for p in args.procs:
            load = os.getloadavg()
            run = launch(p, spec, Path(tmp), args.timeout)
            run["load_before"] = load
            run["load_after"] = os.getloadavg()
            runs.append(run)
    commit = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True,
                            text=True).stdout.strip()
    first = runs[0]
    conditions = [
        f"- date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; deinsum {commit} ({first['deinsum']}); "
        f"host {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        f"- CPU: {cpu_text(first['cpu'])}",
        f"- one mpiexec launch per P ({', '.join(str(r['nprocs']) for r in runs)}), {first['mpi']}; "
        f"1 thread per rank (OMP/OPENBLAS_NUM_THREADS=1 before import, threadpoolctl limits=1, TBLIS 1 thread)",
        f"- BLAS in the processes: {'; '.join(first['blas'])} (OPENBLAS_CORETYPE={blas_coretype()} for every "
        "OpenBLAS: CTF's Debian OpenBLAS 0.3.21 would otherwise run its generic Prescott kernels on this VM)",
        f"- CTF: {first['ctf'] or first['ctf_skipped']}",
        f"- median of {args.repeat} interleaved calls per side [min, max] (a new seeded order of the sides each "
        "repetition), each between barriers and "
        + (f"cold: before each call the ranks write over twice the last-level cache (2 x {last_level_cache() >> 20} MiB), "
           f"so no side finds the operands the side before it left in cache; " if args.cache == "cold" else
           "warm: each timed call right after the same call three times, untimed (its operands in the "
           f"{last_level_cache() >> 20} MiB last-level cache where they fit; here a kernel's first three calls after a "
           "200 ms pause, of any kind, run up to 40% slower); ")
        + "inputs already distributed (deinsum inputs='local', result='distributed'; CTF tensors made before timing)",
        "- local kernel: contract_group of the whole statement on this rank's 1/P slab (first output index split "
        "evenly, other operands whole); its GFLOP/s count opt_einsum's optimal-path FLOPs",
        f"- deinsum's GEMMs: {first['gemm']}; dgemm "
        "through them (2048^3 on the square-GEMM route; 1 thread, same launch, before/after; numpy's own in brackets): "
        + "; ".join(
            f"P={r['nprocs']}: {r['dgemm']['before']['gflops']:.1f}/{r['dgemm']['after']['gflops']:.1f} "
            f"({r['dgemm']['numpy']['gflops']:.1f}) GFLOP/s" for r in runs),
        "- streaming bandwidth (numpy copy of 256 MB, read + write bytes, every rank at once): " + "; ".join(
            f"P={r['nprocs']}: {r['bandwidth']['gbs']:.1f} GB/s per rank" for r in runs),
        *[packing_note(r) for r in runs if r.get("packing")],
        "- load average (1 min) before/after each launch: " + "; ".join(
            f"P={r['nprocs']}: {r['load_before'][0]:.1f}/{r['load_after'][0]:.1f}" for r in runs)
        + " (the machine is shared: other jobs ran at the same time)",
    ]
    grids = ["", "Plans and group strategies (per rank 0's blocks):", ""] + [
        f"- P={r['nprocs']} {k['name']}: grids {', '.join(k['grids'])}; groups: {' | '.join(k['group_strategies'])}"
        for r in runs for k in r["kernels"]]
    text = "\n".join(["# deinsum side by side with CTF", "", "Conditions:", ""] + conditions + [""] + table(runs)
                     + ["", "Acceptance (issue 14), deinsum = the compiled program; local = contract_group alone:", ""]
                     + acceptance(runs) + grids) + "\n"
    out = Path(args.out or ROOT / "bench-results" / ("peers" if args.cache == "cold" else "peers-warm"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps({"conditions": conditions, "runs": runs}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
