"""MPI worker of bench_suite.py: time kernels from an even start, BLAS pinned per rank.

Every rank holds only its block of each input (``inputs="local"``, the even
layout) and the result stays distributed (``result="distributed"``). One
untimed warm-up call, then ``repeat`` calls between barriers with BLAS limited
to ``threads`` per rank (threadpoolctl). Rank 0 writes a JSON file: wall seconds
per call, each phase's seconds on the slowest rank per call, bytes per rank
(measured and modeled), MPI, and the BLAS libraries with the threads in force.

    mpiexec -n 2 python -m mpi4py scripts/suite_worker.py spec.json out.json
    # spec.json: {"threads": 1, "repeat": 5, "kernels": [{"name": "1MM", "equation": "ij,jk->ik",
    #                                                      "sizes": {"i": 512, "j": 512, "k": 512}}]}
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI
from threadpoolctl import threadpool_info, threadpool_limits

import deinsum
from deinsum.runtime.runner import PHASES

#: Phases that exist only because inputs start evenly distributed and the result ends so.
BOUNDARY_PHASES = ("distribute", "gather")


def time_kernel(comm, kernel: dict, repeat: int, threads: int) -> dict:
    """Per-call wall seconds, slowest-rank phase seconds and per-rank bytes of one kernel (on rank 0).

    BLAS is limited to ``threads`` after the warm-up call: deinsum may pin threads at its first run.
    """
    equation, sizes = kernel["equation"], kernel["sizes"]
    shapes = [tuple(sizes[c] for c in term) for term in equation.split("->")[0].split(",")]
    prog = deinsum.compile(equation, *shapes)
    plan = prog.plan(nprocs=comm.size, inputs="local", result="distributed")
    rng = np.random.default_rng(comm.rank)
    blocks = [rng.standard_normal(layout.local_shape(comm.rank)) for layout in plan.entry]
    prog(*blocks, comm=comm, inputs="local", result="distributed")   # plans, compiles, touches memory
    walls, runs = [], []
    with threadpool_limits(limits=threads):
        blas = sorted({" ".join(filter(None, [i["internal_api"], i.get("version"), f"x{i['num_threads']}"]))
                       for i in threadpool_info()})
        for _ in range(repeat):
            comm.Barrier()
            start = MPI.Wtime()
            prog(*blocks, comm=comm, inputs="local", result="distributed")
            comm.Barrier()
            walls.append(MPI.Wtime() - start)
            runs.append(prog.last_run)
    per_rank = comm.gather(runs, root=0)
    if comm.rank != 0:
        return {}
    slowest = {phase: [max(rank[k].seconds.get(phase, 0.0) for rank in per_rank) for k in range(repeat)]
               for phase in PHASES}
    in_grid = [max(sum(s for p, s in rank[k].seconds.items() if p not in BOUNDARY_PHASES) for rank in per_rank)
               for k in range(repeat)]
    last = [rank[-1] for rank in per_rank]
    return {"name": kernel["name"], "equation": equation, "sizes": sizes, "nprocs": comm.size,
            "grids": [f"{g.indices}={'x'.join(map(str, g.grid.dims))}" for g in plan.groups], "blas": blas,
            "wall": walls, "in_grid": in_grid, "phases": slowest,
            "bytes_sent": [r.bytes_sent for r in last], "bytes_received": [r.bytes_received for r in last],
            "model_sent": [r.model_sent for r in last], "model_received": [r.model_received for r in last],
            "matches_model": all(r.matches_model for rank in per_rank for r in rank)}


def main(argv: list[str]) -> int:
    comm = MPI.COMM_WORLD
    spec = json.loads(Path(argv[0]).read_text())
    results = []
    for kernel in spec["kernels"]:
        result = time_kernel(comm, kernel, spec["repeat"], spec["threads"])
        if comm.rank == 0:
            results.append(result)
            print(f"    P={comm.size} x {spec['threads']} thread(s) {kernel['name']:<14} "
                  f"median {np.median(result['wall']):.4f} s", flush=True)
    if comm.rank == 0:
        out = {"nprocs": comm.size, "threads_per_rank": spec["threads"], "repeat": spec["repeat"],
               "mpi": " ".join(MPI.Get_library_version().splitlines()[0].split()),
               "blas": sorted({b for r in results for b in r["blas"]}), "numpy": np.__version__,
               "kernels": results}
        tmp = Path(f"{argv[1]}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(out, indent=1))
        tmp.replace(argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
