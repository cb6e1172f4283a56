#!/usr/bin/env python3
"""The footprint model against the measured peak resident set, one einsum under mpiexec (issue 24 item 4).

Fair start (local inputs, distributed result), ``--share`` times the data share as the memory per rank.
Each rank makes its blocks, resets its VmHWM (``/proc/self/clear_refs``), runs the call, and reads the
peak above the resident set it had before its blocks were made (as ``tests/test_memory_mpi.py`` does);
the model is :func:`deinsum.footprint.footprint` of the plan on that rank. Target: measured <= model
<= 1.1 x measured. Linux only; run the cases one at a time (they use much memory).

    mpiexec -n 4 python -m mpi4py scripts/bench_footprint.py 'ij,jk->ik' i=4096,j=4096,k=4096 --share 1.5
    mpiexec -n 3 python -m mpi4py scripts/bench_footprint.py 'ijk,ja,ka->ia' i=400,j=400,k=400,a=24 --share 1.3
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import deinsum  # noqa: E402
from deinsum.footprint import footprint  # noqa: E402


def status(key: str) -> int:
    """Bytes of a ``/proc/self/status`` field (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("equation")
    ap.add_argument("sizes", help="index=size,... for every index")
    ap.add_argument("--share", type=float, default=1.3, help="memory per rank in data shares")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    sizes = {k: int(v) for k, v in (item.split("=") for item in args.sizes.split(","))}
    shapes = [tuple(sizes[c] for c in term) for term in args.equation.split("->")[0].split(",")]
    deinsum.einsum(args.equation, *(np.ones([2] * len(s)) for s in shapes))   # libraries loaded, BLAS warm
    prog = deinsum.compile(args.equation, *shapes, inputs="local", result="distributed")
    prog.memory = int(args.share * prog.plan(nprocs=comm.size).data_share * 8)
    plan = prog.plan(nprocs=comm.size)
    rng = np.random.default_rng(comm.rank)
    before = status("VmRSS:")
    local = [None if b is None else rng.standard_normal(tuple(s.stop - s.start for s in b))
             for b in prog.input_blocks(comm.rank, comm.size)]
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    prog(*local)
    rows = comm.gather((status("VmHWM:") - before, int(footprint(plan)[comm.rank])), root=0)
    if comm.rank == 0:
        mib = 2.0 ** 20
        rounds = "; ".join(f"grid {'x'.join(map(str, g.grid.dims))}" + (f", {g.rounds[1]} rounds over {g.rounds[0]}"
                                                                      if g.rounds else "") for g in plan.groups)
        print(f"{args.equation} {args.sizes} on {comm.size} ranks, memory {args.share} x the data share "
              f"({prog.memory / mib:.1f} MiB per rank); {rounds}")
        for rank, (used, model) in enumerate(rows):
            print(f"  rank {rank}: measured {used / mib:7.1f} MiB, model {model / mib:7.1f} MiB, "
                  f"model / measured {model / max(used, 1):.3f}")
        used, model = max(u for u, _ in rows), max(m for _, m in rows)
        verdict = "PASS" if used <= model <= 1.1 * used else "FAIL"
        print(f"busiest: measured {used / mib:.1f} MiB, model {model / mib:.1f} MiB, model / measured "
              f"{model / max(used, 1):.3f} (target 1 to 1.1): {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
