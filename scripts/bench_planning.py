#!/usr/bin/env python3
"""Time full plans (decomposition, SOAP analysis, grids, moves; no ranks) at large P.

For each suite kernel at the paper's weak-scaling sizes for P: the first plan in
this process (cold: SymPy closed forms not yet cached) and the median [min, max]
of --repeat fresh plans (warm caches), against the 1 s target. The start is the
fair one: inputs evenly distributed, result left distributed.

    python scripts/bench_planning.py [-P 65536] [--repeat 5]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_executor import KERNELS  # noqa: E402
from suite_sizes import equation_of, shapes_of, weak_scaling_sizes  # noqa: E402

from deinsum.decompose import decompose  # noqa: E402
from deinsum.plan import build_plan  # noqa: E402

TARGET_SECONDS = 1.0


def plan_seconds(equation: str, shapes, nprocs: int) -> tuple[float, object]:
    start = time.perf_counter()
    plan = build_plan(decompose(equation, *shapes), nprocs, inputs="local", result="distributed")
    str(plan)  # the report reads the volume model of every move
    return time.perf_counter() - start, plan


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-P", "--nprocs", type=int, default=65536)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    print(f"full plans on P = {args.nprocs} ranks, no MPI; seconds: cold, then median [min, max] of {args.repeat}")
    print(f"{'kernel':<14} {'sizes':<16} {'cold':>7} {'warm median [min, max]':>26}  grids")
    worst = 0.0
    for kernel in KERNELS:
        equation = equation_of(kernel)
        sizes = weak_scaling_sizes(kernel, args.nprocs)
        shapes = shapes_of(equation, sizes)
        cold, plan = plan_seconds(equation, shapes, args.nprocs)
        warm = np.sort([plan_seconds(equation, shapes, args.nprocs)[0] for _ in range(args.repeat)])
        worst = max(worst, cold, float(np.median(warm)))
        grids = " ".join("x".join(map(str, g.grid.dims)) for g in plan.groups)
        label = ",".join(f"{c}={n}" for c, n in sizes.items() if c in "ia")
        print(f"{kernel:<14} {label:<16} {cold:7.3f} {np.median(warm):8.3f} [{warm[0]:.3f}, {warm[-1]:.3f}]  {grids}")
    verdict = "PASS" if worst <= TARGET_SECONDS else "FAIL"
    print(f"slowest {worst:.3f} s (target <= {TARGET_SECONDS} s): {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
