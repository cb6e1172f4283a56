#!/usr/bin/env python3
"""Sequential executor vs opt_einsum.contract on the paper suite, one core.

Both sides plan once (deinsum.decompose / opt_einsum.contract_expression) and
are then timed on the same operands; medians and spread over --repeat runs.

    python scripts/bench_executor.py [--repeat 7] [--scale 1.0] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import opt_einsum
from threadpoolctl import threadpool_info, threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from deinsum.decompose import decompose  # noqa: E402
from deinsum.program import execute  # noqa: E402

# moderate sizes: a few hundred ms or less per contraction on one core
KERNELS = {
    "1MM": ("ij,jk->ik", dict(i=1024, j=1024, k=1024)),
    "2MM": ("ij,jk,kl->il", dict(i=768, j=768, k=768, l=768)),
    "3MM": ("ij,jk,kl,lm->im", dict(i=640, j=640, k=640, l=640, m=640)),
    "MTTKRP-O3-M0": ("ijk,ja,ka->ia", dict(i=256, j=256, k=256, a=24)),
    "MTTKRP-O3-M1": ("ijk,ia,ka->ja", dict(i=256, j=256, k=256, a=24)),
    "MTTKRP-O3-M2": ("ijk,ia,ja->ka", dict(i=256, j=256, k=256, a=24)),
    "MTTKRP-O5-M0": ("ijklm,ja,ka,la,ma->ia", dict(i=30, j=30, k=30, l=30, m=30, a=24)),
    "MTTKRP-O5-M2": ("ijklm,ia,ja,la,ma->ka", dict(i=30, j=30, k=30, l=30, m=30, a=24)),
    "MTTKRP-O5-M4": ("ijklm,ia,ja,ka,la->ma", dict(i=30, j=30, k=30, l=30, m=30, a=24)),
    "TTMc-O5-M0": ("ijklm,jb,kc,ld,me->ibcde", dict(i=30, j=30, k=30, l=30, m=30, b=12, c=12, d=12, e=12)),
}


def median_spread(samples):
    s = np.sort(np.asarray(samples))
    return float(np.median(s)), float(s[0]), float(s[-1])


def time_it(fn, repeat):
    fn()  # warm-up
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return median_spread(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every size (e.g. 0.5 for a quick run)")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    rows = []
    with threadpool_limits(limits=1):
        blas = ", ".join(f"{i['internal_api']} {i.get('version')} x{i['num_threads']}" for i in threadpool_info())
        print(f"one core: BLAS {blas}; numpy {np.__version__}; opt_einsum {opt_einsum.__version__}; "
              f"median [min, max] of {args.repeat} runs, float64")
        print(f"{'kernel':<14} {'deinsum s':>24} {'opt_einsum s':>24} {'ratio':>6}")
        for name, (eq, sizes) in KERNELS.items():
            sizes = {c: max(1, int(round(n * args.scale))) for c, n in sizes.items()}
            shapes = [tuple(sizes[c] for c in t) for t in eq.split("->")[0].split(",")]
            ops = [rng.standard_normal(s) for s in shapes]
            plan = decompose(eq, *shapes)
            expr = opt_einsum.contract_expression(eq, *shapes)
            ours = time_it(lambda: execute(plan, *ops), args.repeat)
            theirs = time_it(lambda: expr(*ops), args.repeat)
            ratio = ours[0] / theirs[0]
            rows.append(dict(kernel=name, equation=eq, sizes=sizes, deinsum=ours, opt_einsum=theirs, ratio=ratio))
            print(f"{name:<14} {ours[0]:8.4f} [{ours[1]:.4f},{ours[2]:.4f}] "
                  f"{theirs[0]:8.4f} [{theirs[1]:.4f},{theirs[2]:.4f}] {ratio:6.3f}")
    worst = max(r["ratio"] for r in rows)
    print(f"worst ratio {worst:.3f} (target <= 1.05): {'PASS' if worst <= 1.05 else 'FAIL'}")
    if args.json:
        args.json.write_text(json.dumps(dict(blas=blas, repeat=args.repeat, rows=rows), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
