"""deinsum's GEMM routes against the GEMM libraries installed, side by side in one process (P = 1).

1MM 2048^3 float64: numpy's ``@`` (its OpenBLAS), MKL's dgemm (where the `fast` extra installed it, called
as deinsum calls it) and deinsum's compiled ``ij,jk->ik`` (``inputs="local"``, the routes as measured here);
then every suite kernel's local kernel (``contract_group``) on the measured routes and on the routes an
install without `fast` has (numpy's BLAS, the streaming kernels on their shapes: ``DEINSUM_GEMM=stream``).
Sides interleave (a new seeded order each repetition); medians with [min, max]. One thread: BLAS and
OpenMP thread variables set to 1 before numpy loads, threadpoolctl limits 1. Benchmark the CPU's own
OpenBLAS kernels: run it with ``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE`` where the machine sets them.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=. python scripts/bench_gemm.py --repeat 9
    python scripts/bench_gemm.py --repeat 3 --kernels 1MM    # a quick look

Writes bench-results/gemm.json (every timing) and bench-results/gemm.md (tables + conditions).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TBLIS_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402  (after the thread variables)
from threadpoolctl import threadpool_info, threadpool_limits  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import deinsum  # noqa: E402
from bench_peers import KERNELS, cpu_text, median  # noqa: E402
from deinsum.runtime import blas as B  # noqa: E402
from deinsum.runtime import kernels as K  # noqa: E402
from deinsum.runtime import libraries as L  # noqa: E402
from deinsum.runtime.gemm import machine_key  # noqa: E402


def interleaved(calls: dict, repeat: int, seed: int) -> dict:
    """``{side: [seconds]}``: each call once untimed, then ``repeat`` rounds in a new seeded order."""
    order, seconds = list(calls), {side: [] for side in calls}
    for call in calls.values():
        call()
    rng = random.Random(seed)
    for _ in range(repeat):
        rng.shuffle(order)
        for side in order:
            start = time.perf_counter()
            calls[side]()
            seconds[side].append(time.perf_counter() - start)
    return seconds


def on_routes(state, fn):
    """``fn`` run with the GEMMs routed as ``state`` says, the measured routes back afterwards."""
    def call():
        measured = B.gemm_routes()
        B.use_gemm_routes(state)
        try:
            return fn()
        finally:
            B.use_gemm_routes(measured)
    return call


def gemm_sides(repeat: int) -> dict:
    """1MM 2048^3: the libraries and deinsum's compiled program, every result checked against numpy."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2048, 2048)), rng.standard_normal((2048, 2048))
    prog = deinsum.compile("ij,jk->ik", a.shape, b.shape)
    run = lambda: prog(a, b, inputs="local", result="distributed").local     # (P = 1: the whole result)
    calls = {"numpy": lambda: a @ b, "deinsum": run}
    if np.dtype(np.float64) in L._GEMM:
        calls["mkl"] = lambda: B.matmul(a, b, "mkl")
    want = a @ b
    for side, call in calls.items():
        assert np.allclose(call(), want), side
    return interleaved(calls, repeat, 1)


def kernel_sides(name: str, repeat: int, scale: float) -> dict:
    """One suite kernel's local kernel on the measured routes and on an install's without `fast`."""
    eq, sizes = KERNELS[name]
    sizes = {c: max(1, round(n * scale)) if n > 24 else n for c, n in sizes.items()}
    lhs, out = eq.split("->")
    subs = lhs.split(",")
    rng = np.random.default_rng(0)
    ops = [rng.standard_normal([sizes[c] for c in s]) for s in subs]
    without = {"why": "DEINSUM_GEMM=stream", "routes": B.forced_routes("stream"), "rates": None}
    calls = {"measured routes": lambda: K.contract_group(subs, out, *ops),
             "without fast": on_routes(without, lambda: K.contract_group(subs, out, *ops))}
    want = np.einsum(eq, *ops, optimize=True)
    for side, call in calls.items():
        assert np.allclose(call(), want), (name, side)
    strategies = {side: on_routes(state, lambda: K.group_strategy(subs, out, [o.shape for o in ops]))()
                  for side, state in (("measured routes", B.gemm_routes()), ("without fast", without))}
    return {"sizes": sizes, "seconds": interleaved(calls, repeat, 2), "strategies": strategies}


def spread(values: list) -> str:
    return f"{1e3 * median(values):.1f} [{1e3 * min(values):.1f}, {1e3 * max(values):.1f}]"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS), metavar="KERNEL")
    ap.add_argument("--scale", type=float, default=1.0, help="scale the suite kernels' large sizes")
    ap.add_argument("--out", default=str(ROOT / "bench-results" / "gemm"), help="output stem")
    args = ap.parse_args(argv)
    with threadpool_limits(limits=1):
        load = os.getloadavg()
        start = time.perf_counter()
        routes = B.gemm_library()    # measured here unless cached for this machine
        routing = time.perf_counter() - start
        gemm = gemm_sides(args.repeat)
        kernels = {name: kernel_sides(name, args.repeat, args.scale) for name in args.kernels if name != "1MM"}
        blas = sorted(f"{i['internal_api']} {i.get('version')} {i.get('architecture') or ''} x{i['num_threads']}"
                      for i in threadpool_info())
    key = machine_key(B.gemm_libraries())
    flops = 2 * 2048 ** 3
    rates = {side: flops / median(s) / 1e9 for side, s in gemm.items()}
    fastest = max((side for side in rates if side != "deinsum"), key=rates.get)
    lines = [
        "# deinsum's GEMM routes against the GEMM libraries installed (P = 1, 1 thread)", "",
        "| 1MM 2048^3 float64 | ms: median [min, max] | GFLOP/s | share of the fastest library |", "|---|---|---|---|",
        *[f"| {side} | {spread(s)} | {rates[side]:.1f} | {rates[side] / rates[fastest]:.3f} |" for side, s in gemm.items()],
        "", f"deinsum / fastest library ({fastest}): **{rates['deinsum'] / rates[fastest]:.3f}** (target >= 0.97)", ""]
    if kernels:
        lines += ["| local kernel (sizes) | measured routes ms | without `fast` ms | ratio | strategy (measured routes) |",
                  "|---|---|---|---|---|"]
        for name, k in kernels.items():
            s = k["seconds"]
            lines.append(f"| {name} ({', '.join(f'{c}={n}' for c, n in k['sizes'].items())}) | "
                         f"{spread(s['measured routes'])} | {spread(s['without fast'])} | "
                         f"{median(s['measured routes']) / median(s['without fast']):.3f} | "
                         f"{k['strategies']['measured routes']} |")
        lines.append("")
    commit = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True,
                            text=True).stdout.strip()
    lines += [
        "Conditions:", "",
        f"- date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; deinsum {commit}; {os.cpu_count()} cores; "
        f"CPU {cpu_text(key['cpu'])}; numpy {np.__version__}",
        f"- BLAS: {'; '.join(blas)}; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}, "
        f"OPENBLAS_L2_SIZE={os.environ.get('OPENBLAS_L2_SIZE', '(unset)')}",
        f"- routes ({routing:.2f} s to resolve, measured unless cached): {routes}",
        f"- one process, 1 thread; median of {args.repeat} interleaved calls [min, max], each side once untimed "
        "first; load average (1 min) before/after: "
        f"{load[0]:.2f}/{os.getloadavg()[0]:.2f}",
    ]
    text = "\n".join(lines) + "\n"
    Path(args.out + ".md").write_text(text)
    Path(args.out + ".json").write_text(json.dumps({"machine": key, "routes": B.gemm_routes(), "blas": blas,
                                                    "gemm": gemm, "kernels": kernels}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
