#!/usr/bin/env python3
"""What rounds cost: matrix multiply n^3 with a memory that forces rounds, against the plan with memory to spare.

Both programs start from the fair start (local inputs, distributed result), in one launch, called in turn
(interleaved) after a warm-up call each; a call's time is the slowest rank's. Prints medians [min, max] and
the ratio, with the conditions (CPU, ranks, threads per rank, MPI).

    mpiexec -n 2 python -m mpi4py scripts/bench_rounds.py [--n 4096] [--share 1.25] [--repeat 7] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI
from threadpoolctl import threadpool_info

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import deinsum  # noqa: E402


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def blocks_for(prog, comm, rng):
    """This rank's blocks of fresh random operands in the plan's entry layouts."""
    return [None if b is None else rng.standard_normal(tuple(s.stop - s.start for s in b))
            for b in prog.input_blocks(comm.rank, comm.size)]


def timed(prog, blocks, comm) -> float:
    comm.Barrier()
    start = MPI.Wtime()
    prog(*blocks)
    return comm.allreduce(MPI.Wtime() - start, op=MPI.MAX)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--share", type=float, default=1.25, help="memory per rank in data shares (3 n^2 / P words)")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    comm, n = MPI.COMM_WORLD, args.n
    shapes = [(n, n), (n, n)]
    share = 3 * n * n // comm.size * 8
    free = deinsum.compile("ij,jk->ik", *shapes, inputs="local", result="distributed")
    tight = deinsum.compile("ij,jk->ik", *shapes, inputs="local", result="distributed", memory=int(args.share * share))
    plans = {name: prog.plan(nprocs=comm.size) for name, prog in (("free", free), ("tight", tight))}
    rng = np.random.default_rng(comm.rank)
    blocks = {"free": blocks_for(free, comm, rng), "tight": blocks_for(tight, comm, rng)}
    progs = {"free": free, "tight": tight}
    for name in progs:                                  # warm-up: libraries, communicators, datatypes
        timed(progs[name], blocks[name], comm)
    samples = {"free": [], "tight": []}
    for _ in range(args.repeat):
        for name in progs:
            samples[name].append(timed(progs[name], blocks[name], comm))
    if comm.rank != 0:
        return
    threads = max((p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"), default=None)
    medians = {name: float(np.median(s)) for name, s in samples.items()}
    record = {
        "conditions": {"cpu": cpu_model(), "ranks": comm.size, "blas_threads_per_rank": threads,
                       "mpi": MPI.Get_library_version().splitlines()[0].strip(), "n": n, "repeat": args.repeat,
                       "memory_bytes_per_rank": plans["tight"].memory, "data_share_bytes_per_rank": share},
        "plans": {name: {"grid": list(p.groups[0].grid.dims), "rounds": p.groups[0].rounds,
                         "peak_bytes_per_rank": p.peak_bytes, "received_bytes_max": int(p.received_bytes().max())}
                  for name, p in plans.items()},
        "seconds": {name: {"median": medians[name], "min": min(s), "max": max(s)} for name, s in samples.items()},
        "ratio_tight_over_free": medians["tight"] / medians["free"],
    }
    for name, p in record["plans"].items():
        s = record["seconds"][name]
        print(f"{name:5}: grid {p['grid']} rounds {p['rounds']} peak {p['peak_bytes_per_rank']:,} B/rank, "
              f"{s['median']:.3f} s [{s['min']:.3f}, {s['max']:.3f}]")
    print(f"tight / free = {record['ratio_tight_over_free']:.3f} (medians of {args.repeat}, interleaved); "
          f"{record['conditions']}")
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
