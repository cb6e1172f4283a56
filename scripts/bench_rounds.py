#!/usr/bin/env python3
"""What rounds cost: matrix multiply n^3 with a memory that forces rounds, against the plan with memory to spare,
and what prefetching gains: each round's exchange posted before the previous round computes
(``compile(prefetch=True)``: two rounds' pieces held), at the same memory (so in more rounds) and, to tell the
overlap from the rounds' count, in as many rounds as without (given the memory of two more rounds' pieces: the
footprint counts room for MPI's buffers of the exchange in flight too).

The programs start from the fair start (local inputs, distributed result), in one launch, called in turn
(interleaved) after a warm-up call each; a call's time is the slowest rank's. Prints medians [min, max] and
the ratios, with the conditions (CPU, ranks, threads per rank, MPI).

    mpiexec -n 2 python -m mpi4py scripts/bench_rounds.py [--n 4096] [--share 1.25] [--repeat 7] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
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


def timed(prog, blocks, comm) -> tuple[float, float]:
    """Seconds of one call and of its exchanges (the moves' phases, prefetched rounds' waits included), each the
    slowest rank's."""
    comm.Barrier()
    start = MPI.Wtime()
    prog(*blocks)
    total = MPI.Wtime() - start
    exchange = sum(v for phase, v in prog.last_run.seconds.items() if phase != "compute")
    return tuple(comm.allreduce((total, exchange), op=MPI.MAX))


def paired(a, b) -> list[float]:
    """Median, min and max of ``a[i] / b[i]``: calls made one after the other, so a drift of the machine's speed
    cancels out."""
    ratios = [x / y for x, y in zip(a, b)]
    return [float(np.median(ratios)), min(ratios), max(ratios)]


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
    memory = int(args.share * share)
    progs = {"free": deinsum.compile("ij,jk->ik", *shapes, inputs="local", result="distributed"),
             "tight": deinsum.compile("ij,jk->ik", *shapes, inputs="local", result="distributed", memory=memory),
             "prefetch": deinsum.compile("ij,jk->ik", *shapes, inputs="local", result="distributed", memory=memory,
                                         prefetch=True)}
    tight = progs["tight"].plan(nprocs=comm.size)
    # one round's part of each block moved in rounds (and one index line more for the balanced split's remainder),
    # twice: a prefetched move counts the next round's part and room for MPI's buffers of the one in flight
    one_round = sum(m.dst.largest_block() // m.rounds[1] + m.dst.largest_block() // m.dst.shape[m.rounds[0]]
                    for m in tight.moves if m.rounds) * 8
    progs["prefetch_same_rounds"] = deinsum.compile("ij,jk->ik", *shapes, inputs="local", result="distributed",
                                                    memory=memory + 2 * one_round, prefetch=True)
    plans = {name: prog.plan(nprocs=comm.size) for name, prog in progs.items()}
    rng = np.random.default_rng(comm.rank)
    blocks = {name: blocks_for(prog, comm, rng) for name, prog in progs.items()}
    for name in progs:                                  # warm-up: libraries, communicators, datatypes
        timed(progs[name], blocks[name], comm)
    load = os.getloadavg()[0]
    runs = {name: [] for name in progs}
    for _ in range(args.repeat):
        for name in progs:
            runs[name].append(timed(progs[name], blocks[name], comm))
    if comm.rank != 0:
        return
    samples = {name: [total for total, _ in r] for name, r in runs.items()}
    exchange = {name: [e for _, e in r] for name, r in runs.items()}
    threads = max((p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"), default=None)
    medians = {name: float(np.median(s)) for name, s in samples.items()}
    record = {
        "conditions": {"cpu": cpu_model(), "ranks": comm.size, "blas_threads_per_rank": threads,
                       "mpi": MPI.Get_library_version().splitlines()[0].strip(), "n": n, "repeat": args.repeat,
                       "cores": os.cpu_count(), "oversubscribed": comm.size > (os.cpu_count() or 1),
                       "load_average_1min": [round(load, 2), round(os.getloadavg()[0], 2)],
                       "memory_bytes_per_rank": plans["tight"].memory, "data_share_bytes_per_rank": share},
        "plans": {name: {"grid": list(p.groups[0].grid.dims), "rounds": p.groups[0].rounds,
                         "prefetch": any(m.prefetch for m in p.moves),
                         "peak_bytes_per_rank": p.peak_bytes, "received_bytes_max": int(p.received_bytes().max())}
                  for name, p in plans.items()},
        "seconds": {name: {"median": medians[name], "min": min(s), "max": max(s)} for name, s in samples.items()},
        "exchange_seconds": {name: {"median": float(np.median(s)), "min": min(s), "max": max(s)}
                             for name, s in exchange.items()},
        "ratio_tight_over_free": medians["tight"] / medians["free"],
        "ratio_prefetch_over_tight": medians["prefetch"] / medians["tight"],
        "ratio_prefetch_same_rounds_over_tight": medians["prefetch_same_rounds"] / medians["tight"],
        "paired_ratios": {f"{a}/{b}": paired(samples[a], samples[b]) for a, b in
                          [("tight", "free"), ("prefetch", "tight"), ("prefetch_same_rounds", "tight")]},
    }
    for name, p in record["plans"].items():
        s, e = record["seconds"][name], record["exchange_seconds"][name]
        print(f"{name:20}: grid {p['grid']} rounds {p['rounds']} prefetch {p['prefetch']} peak "
              f"{p['peak_bytes_per_rank']:,} B/rank, {s['median']:.3f} s [{s['min']:.3f}, {s['max']:.3f}], exchanges "
              f"{e['median']:.3f} s [{e['min']:.3f}, {e['max']:.3f}]")
    print("paired ratios (median [min, max] of the calls made one after the other):",
          {k: [round(v, 3) for v in r] for k, r in record["paired_ratios"].items()})
    print(f"tight / free = {record['ratio_tight_over_free']:.3f}, prefetch / tight = "
          f"{record['ratio_prefetch_over_tight']:.3f}, prefetch_same_rounds / tight = "
          f"{record['ratio_prefetch_same_rounds_over_tight']:.3f} (medians of {args.repeat}, interleaved); "
          f"{record['conditions']}")
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
