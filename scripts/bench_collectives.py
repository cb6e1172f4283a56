#!/usr/bin/env python3
"""Each move step that runs MPI's own collective, against the subarray Alltoallw it replaced, on this machine.

Cases (float64): a scalar's partial sums on every rank reduced to every rank (Allreduce) or to rank 0 (Reduce);
an all-gather of row blocks (contiguous; n x n for n = 8, 64, 256: 512 B, 32 kB, 512 kB) from every rank
(Allgather) and from all ranks but the last (Allgatherv; none at P = 2, where one rank holds the whole); the
two phases of an allreduce of 512 x 512 partial sums (Reduce_scatter on the ranks holding them, then
Allgather). Strided blocks (column blocks, say) run the Alltoallw (bench-results/collectives.md says why).
For each, every rank builds the step's table twice (``rank_tables`` with and without ``mpi_collectives``) and
both executors (``Collective``, ``Transfer``), checks they give the same block, runs each once untimed, then
``--repeat`` rounds, the two in a new seeded order each round (interleaved). A call's time is the slowest
rank's (Barrier, Wtime, max over ranks). Prints medians [min, max] in microseconds and the ratio of the
medians, with the conditions; ``--out`` appends the rows to a markdown file. Times move from one launch to the
next (where the ranks land): run it more than once.

    mpiexec -n 4 python -m mpi4py scripts/bench_collectives.py [--repeat 41] [--out bench-results/collectives.md]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_rounds import cpu_model  # noqa: E402
from deinsum.layout import Layout  # noqa: E402
from deinsum.redistribute import plan_redistribution  # noqa: E402
from deinsum.tables import COLLECTIVES, rank_tables  # noqa: E402
from deinsum.runtime.exchange import Collective, Transfer, element_type  # noqa: E402


def cases(nprocs: int) -> list:
    """(name, source layout, destination layout, phase) of each step timed."""
    partial = Layout((512, 512), (nprocs,), (None, None), (0,))
    rows = lambda n, holders: Layout((n * holders, n), (holders,), (0, None))  # noqa: E731
    gathers = [(f"row blocks {n} x {n} {where}", rows(n, holders), Layout.replicated(rows(n, holders).shape, nprocs), 0)
               for n in (8, 64, 256) for where, holders in (("each", nprocs), ("on all ranks but the last", nprocs - 1))
               if holders]
    return [("scalar to every rank", Layout((), (nprocs,), (), (0,)), Layout.replicated((), nprocs), 0),
            ("scalar to rank 0", Layout((), (nprocs,), (), (0,)), Layout.on_root((), nprocs), 0),
            *gathers,
            ("512 x 512 partial sums to every rank, step 1", partial, Layout.replicated((512, 512), nprocs), 0),
            ("512 x 512 partial sums to every rank, step 2", partial, Layout.replicated((512, 512), nprocs), 1)]


def timed(call, comm) -> float:
    comm.Barrier()
    start = MPI.Wtime()
    call()
    return comm.allreduce(MPI.Wtime() - start, op=MPI.MAX)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=41)
    parser.add_argument("--out", default=None, help="markdown file the rows are appended to")
    args = parser.parse_args()
    comm, rank, nprocs = MPI.COMM_WORLD, MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size
    load = os.getloadavg()[0]
    element, rows = element_type(np.float64), []
    for name, src, dst, phase in cases(nprocs):
        move = plan_redistribution(src, dst, nprocs)
        kind = move.collectives[phase] if phase < len(move.collectives) else None
        if kind is None:    # (the step runs an Alltoallw at this P, or the move has one phase: nothing to compare)
            continue
        native = Collective(comm, move.table(rank)[phase], np.float64, element)
        general = Transfer(comm, rank_tables(src, dst, nprocs, rank, move.split, mpi_collectives=False)[phase],
                           np.float64, element)
        shape = native.in_shape if native.in_held else None
        block = None if shape is None else np.random.default_rng(rank).standard_normal(shape)
        a, b = native(block), general(block)
        if (a is None) != (b is None) or a is not None and not np.allclose(a, b):
            raise SystemExit(f"rank {rank}: {name}: the collective's block differs from the Alltoallw's")
        seconds = {"collective": [], "alltoallw": []}
        order = np.random.default_rng(7)
        for _ in range(args.repeat):
            for side in order.permutation(list(seconds)):
                seconds[side].append(timed(lambda: (native if side == "collective" else general)(block), comm))
        native.free()
        general.free()
        us = {side: np.array(t) * 1e6 for side, t in seconds.items()}
        rows.append(f"| {nprocs} | {name} | MPI_{COLLECTIVES[kind]} | "
                    + " | ".join(f"{np.median(t):.1f} [{t.min():.1f}, {t.max():.1f}]" for t in us.values())
                    + f" | {np.median(us['alltoallw']) / np.median(us['collective']):.2f} |")
    element.Free()
    if rank == 0:
        conditions = (f"{cpu_model()}, {nprocs} ranks on {os.cpu_count()} cores (load average {load:.1f} at the "
                      f"start), {' '.join(MPI.Get_library_version().split()[:3])}, float64, {args.repeat} rounds "
                      "interleaved")
        print(conditions)
        print("\n".join(rows))
        if args.out:
            with Path(args.out).open("a") as f:
                f.write(f"P = {nprocs}: {conditions}\n\n| P | step | MPI call | collective us: median [min, max] | "
                        "Alltoallw us: median [min, max] | Alltoallw / collective |\n|---|---|---|---|---|---|\n"
                        + "\n".join(rows) + "\n\n")
            print(f"appended to {args.out}")


if __name__ == "__main__":
    main()
