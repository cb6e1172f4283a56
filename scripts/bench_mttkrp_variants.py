#!/usr/bin/env python3
"""Every MTTKRP GEMM variant timed, next to the one the kernel's cost model picks (one core).

For each shape and mode, ``contract_group``'s MTTKRP runs every variant (which run of factored
axes one GEMM contracts, X^T KR or KR^T X; all rank columns at once, the model's pick as it runs;
variants with a Khatri-Rao product over 32 MB are left out) on the same operands, one after another;
medians of --repeat calls after a warm-up. The report lists, per shape and mode, the fastest
variant, the model's pick and its loss (pick / fastest - 1), and the sum of losses: the
constants of ``deinsum.runtime.cost.MTTKRP_FIT`` were fitted on this table. Every variant runs
on each GEMM library here: numpy's BLAS, and Intel MKL where the `fast` extra installed it; deinsum's
streaming kernels stay off (they take over the variants they can read, whatever the library, and the
constants model the libraries). With ``--kernels`` they stay on: variants run as float64 blocks run them
(on the streaming kernels, fused with the Hadamard-sum, where they can), next to the pick of the model
with them as ``contract_group`` makes it (on MKL only where this machine's GEMM routes send narrow GEMMs;
``_FUSED_RATE`` was fitted on that table).

    python scripts/bench_mttkrp_variants.py [--repeat 5] [--out bench-results/mttkrp-variants.md]
    python scripts/bench_mttkrp_variants.py --kernels [--out bench-results/mttkrp-variants-kernels.md]
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from deinsum.peak import mttkrp_runs  # noqa: E402
from deinsum.runtime import blas as B  # noqa: E402
from deinsum.runtime import kernels as K  # noqa: E402
from deinsum.runtime import libraries as L  # noqa: E402
from deinsum.runtime import mttkrp as M  # noqa: E402


#: (X's dims, R): the suite's orders 3 and 5, and shapes around them (in and out of cache, uneven, R = 8..48)
SHAPES = [((256, 256, 256), 24), ((24,) * 5, 24), ((128, 128, 128), 16), ((32,) * 4, 32),
          ((512, 64, 256), 24), ((16,) * 5, 48), ((64, 256, 512), 8), ((512, 64, 512), 16)]
LABELS = "ijklm"
#: Whether a variant's GEMMs run on MKL: both where the `fast` extra installed it.
LIBRARIES = (False, True)[:1 + bool(L._GEMM)]


def median_seconds(fn, repeat):
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def measure(dims, nr, repeat, rng):
    """[(mode, {(s, e, orient, mkl): seconds}, the model's pick)] for X of ``dims`` and rank ``nr``: every
    variant on every GEMM library here (numpy's BLAS; Intel MKL with the `fast` extra)."""
    x = rng.standard_normal(dims)
    factors = [rng.standard_normal((n, nr)) for n in dims]
    sx = LABELS[:len(dims)]
    rows = []
    for mode in range(len(dims)):
        subs = [sx] + [c + "a" for q, c in enumerate(sx) if q != mode]
        ops = [x] + [f for q, f in enumerate(factors) if q != mode]
        out = sx[mode] + "a"
        axes = [q for q in range(len(dims)) if q != mode]
        mkl = B.mkl_routed("narrow", x.dtype) if B._STREAM else bool(L._GEMM)     # (as contract_group, or any)
        picked = K._strategy(tuple(subs), out, tuple(o.shape for o in ops), mkl, 8, B._STREAM is not None)[2][2]
        pick = picked[:3] + picked[4:]
        times = {}
        for (s, e, orient), mkl in itertools.product(M._variants(mttkrp_runs(len(dims), axes)), LIBRARIES):
            if (s, e, orient, mkl) != pick and math.prod(dims[s:e]) * nr > 4e6:   # a Khatri-Rao product of
                continue                                                         # over 32 MB: no contender
            params = (0, "a", picked if (s, e, orient, mkl) == pick else (s, e, orient, nr, mkl))
            times[(s, e, orient, mkl)] = median_seconds(lambda: M.run(subs, out, ops, x.dtype, params),
                                                        repeat)
        rows.append((mode, times, pick))
    return rows


def variant_name(dims, mode, variant, nr):
    s, e, orient, mkl = variant
    name = f"GEMM over ({','.join(LABELS[s:e])}) {'X^T KR' if orient == 'rows' else 'KR^T X'}"
    summed = [q for q in range(len(dims)) if q != mode and not s <= q < e]
    if M._fusion(dims, s, e, orient, summed, nr):       # (None with the kernels off)
        return name + ", fused"          # (the same pass on either library)
    return name + " (MKL)" * mkl


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--kernels", action="store_true", help="deinsum's streaming kernels on (see the docstring)")
    ap.add_argument("--out", type=Path, default=None,
                    help="default bench-results/mttkrp-variants.md (-kernels.md with --kernels)")
    ap.add_argument("--json", type=Path, help="also write every timing here (what the constants are fitted on)")
    args = ap.parse_args(argv)
    state = B.gemm_routes()     # resolved before the first pick: whether the streaming kernels run is a route
    if not args.kernels:        # the BLAS libraries only
        B.use_gemm_routes({**state, "routes": {**state["routes"], "streamed": "numpy"}})
    K._strategy.cache_clear()
    args.out = args.out or ROOT / "bench-results" / f"mttkrp-variants{'-kernels' * args.kernels}.md"
    rng = np.random.default_rng(0)
    lines = ["# MTTKRP variants: every GEMM variant timed, and the cost model's pick", "",
             f"- {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {platform.node()}, "
             f"{os.cpu_count()} cores; numpy {np.__version__}, GEMMs: {B.gemm_library()}, 1 thread; float64; median of "
             f"{args.repeat} calls after a warm-up", "",
             "| X | R | mode | variants | fastest (ms) | model's pick (ms) | loss |", "|---|---|---|---|---|---|---|"]
    total, timings = 0.0, []
    with threadpool_limits(limits=1):
        for dims, nr in SHAPES:
            for mode, times, picked in measure(dims, nr, args.repeat, rng):
                timings.append({"dims": dims, "rank": nr, "mode": mode, "pick": picked,
                                "seconds": [[*variant, t] for variant, t in times.items()]})
                fastest = min(times, key=times.get)
                loss = times[picked] / times[fastest] - 1
                total += loss
                lines.append(f"| {'x'.join(map(str, dims))} | {nr} | {LABELS[mode]} | {len(times)} | "
                             f"{variant_name(dims, mode, fastest, nr)} ({1e3 * times[fastest]:.2f}) | "
                             f"{variant_name(dims, mode, picked, nr)} ({1e3 * times[picked]:.2f}) | {100 * loss:.0f}% |")
                print(lines[-1], flush=True)
    lines += ["", f"Sum of losses: {total:.2f} (0 = the model picks the fastest variant everywhere)."]
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    if args.json:
        args.json.write_text(json.dumps(timings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
