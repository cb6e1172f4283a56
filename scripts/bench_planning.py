#!/usr/bin/env python3
"""Time full plans (decomposition, SOAP analysis, grids, rounds, moves; no ranks) at large P.

For each suite kernel at the paper's weak-scaling sizes for P, at each memory per rank (``--share``:
that many times the data share, the least any plan needs; ``default``: this machine's default memory):
the first plan of that kernel and memory in this process (cold: the analysis at this memory not yet
cached) and the median [min, max] of --repeat fresh plans (warm caches), against the target (issue 24:
1 s up to P = 65,536, 5 s beyond, memory constraints on). A plan's time includes its report without the
lower bounds (what running or emitting it needs); the "bounds" column is the time its printed lower bounds
add on top (the class bound searches every contraction path: `deinsum plan` and `str(plan)` print it).
The start is the fair one: inputs evenly distributed, result left distributed. Times are wall seconds on
this machine's CPU (noisy when shared).

    python scripts/bench_planning.py [-P 65536] [--repeat 5] [--share 1.3 default]
"""
from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_executor import KERNELS  # noqa: E402
from suite_sizes import equation_of, shapes_of, weak_scaling_sizes  # noqa: E402

from deinsum.decompose import decompose  # noqa: E402
from deinsum.plan import build_plan  # noqa: E402


def target_seconds(nprocs: int) -> float:
    """Issue 24's planning-time target: 1 s up to 65,536 ranks, 5 s beyond (2^20)."""
    return 1.0 if nprocs <= 65536 else 5.0


def memory_of(equation: str, sizes: dict[str, int], nprocs: int, share: str) -> int | None:
    """Bytes per rank (float64): ``share`` times the data share (inputs and result, an even share each), or
    None (the machine's default) for ``default``."""
    if share == "default":
        return None
    terms = equation.replace("->", ",").split(",")
    return int(float(share) * sum(-(-math.prod(sizes[c] for c in t) // nprocs) for t in terms) * 8)


def cpu_name() -> str:
    """The CPU's model name (Linux), else the machine type."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


def plan_seconds(equation: str, shapes, nprocs: int, memory: int | None) -> tuple[float, float, object]:
    """Wall and CPU seconds of one full plan and its report without the lower bounds, and the plan."""
    start, cpu = time.perf_counter(), time.process_time()
    plan = build_plan(decompose(equation, *shapes), nprocs, memory=memory, inputs="local", result="distributed")
    plan.text(bounds=False)  # the report reads the volume model of every move, the peak of every rank, group bounds
    return time.perf_counter() - start, time.process_time() - cpu, plan


def bound_seconds(plan) -> float:
    """Wall seconds of a plan's report with its lower bounds once the report without them was made (its volumes and
    peaks cached): what printing the bounds adds (the class bound: every contraction path's candidates)."""
    start = time.perf_counter()
    plan.text()
    return time.perf_counter() - start


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-P", "--nprocs", type=int, default=65536)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--share", nargs="+", default=["1.3", "default"],
                    help="memory per rank: times the data share, or 'default' (this machine's)")
    args = ap.parse_args(argv)
    target = target_seconds(args.nprocs)
    print(f"full plans on P = {args.nprocs} ranks, no MPI, on {cpu_name()}; wall seconds: cold, then median "
          f"[min, max] of {args.repeat}; CPU seconds (this process: a shared machine's load left out) likewise")
    print(f"{'kernel':<14} {'sizes':<16} {'memory':<8} {'cold':>7} {'warm median [min, max]':>26} "
          f"{'CPU: cold':>9} {'warm':>6} {'bounds':>6}  grids (rounds)")
    worst = worst_cpu = slowest_bounds = 0.0
    for kernel in KERNELS:
        equation = equation_of(kernel)
        sizes = weak_scaling_sizes(kernel, args.nprocs)
        shapes = shapes_of(equation, sizes)
        label = ",".join(f"{c}={n}" for c, n in sizes.items() if c in "ia")
        for share in args.share:
            memory = memory_of(equation, sizes, args.nprocs, share)
            cold, cold_cpu, plan = plan_seconds(equation, shapes, args.nprocs, memory)
            bounds = bound_seconds(plan)
            slowest_bounds = max(slowest_bounds, bounds)
            runs = [plan_seconds(equation, shapes, args.nprocs, memory)[:2] for _ in range(args.repeat)]
            warm, warm_cpu = np.sort([w for w, _ in runs]), float(np.median([c for _, c in runs]))
            worst = max(worst, cold, float(np.median(warm)))
            worst_cpu = max(worst_cpu, cold_cpu, warm_cpu)
            grids = " ".join("x".join(map(str, g.grid.dims)) + (f" ({g.rounds[1]} over {g.rounds[0]})" if g.rounds
                                                                 else "") for g in plan.groups)
            what = share if share == "default" else f"{share} D"
            print(f"{kernel:<14} {label:<16} {what:<8} {cold:7.3f} {np.median(warm):8.3f} "
                  f"[{warm[0]:.3f}, {warm[-1]:.3f}]      {cold_cpu:7.3f} {warm_cpu:6.3f} {bounds:6.3f}  {grids}",
                  flush=True)
    verdicts = ["PASS" if seconds <= target else "FAIL" for seconds in (worst, worst_cpu)]
    print(f"slowest {worst:.3f} s wall: {verdicts[0]}, {worst_cpu:.3f} s CPU: {verdicts[1]} (target <= {target:g} s); "
          f"printed bounds add at most {slowest_bounds:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
