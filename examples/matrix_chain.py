"""A matrix chain through deinsum: the fusion search, each group's grid, and the moves between grids.

``ij,jk,kl,lm->im`` becomes three GEMMs in the cheapest order (opt_einsum). The
fusion search may group any connected steps (partial sums flow into later steps
and are reduced once, at the group's end); the candidate groupings are printed,
best first. Each chosen group
runs on its own process grid, and a tensor that a group needs in another layout
is redistributed: every move is printed with its source and destination grid
and the bytes of the busiest rank. The run starts from blocks in the layouts the
planner chose (no replication), leaves the result distributed, and checks it against numpy and the
measured bytes against the plan.

    mpiexec -n 4 python -m mpi4py examples/matrix_chain.py --sizes 400 30 400 30 400
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
from mpi4py import MPI

import deinsum
from deinsum.soap import valid_groups

EQUATION = "ij,jk,kl,lm->im"


def describe(plan) -> str:
    """The fusion search, the groups with their grids, and the moves between them."""
    a, steps = plan.analysis, plan.decomposition.steps

    def name(group) -> str:
        return "+".join(steps[k].name for k in group)

    lines = [f"{len(steps)} binary steps: " + "; ".join(f"{s.name} = {s.operation}" for s in steps),
             "fusible groups (partial sums may flow into a later step of a group): "
             + ", ".join(f"[{name(g)}]" for g in valid_groups(steps)),
             "groupings, best first: " + ", ".join(" ".join(f"[{name(g)}]" for g in c.partition)
                                                   for c in a.candidates), ""]
    for g in plan.groups:
        dims = ", ".join(f"{c}={p}" for c, p in zip(g.indices, g.grid.dims))
        lines.append(f"group {g.index}: {'; '.join(s.operation for s in g.steps)} on grid ({dims})")
    lines.append("")
    size = plan.dtype.itemsize
    for m in plan.moves:
        busiest = max(m.redistribution.bytes_received(r, size) for r in range(plan.nprocs))
        lines.append(f"{m.label:<18} {busiest:>10,} B  {m.src}  ->  {m.dst}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs=5, default=[400, 30, 400, 30, 400], metavar="N",
                    help="sizes of i j k l m")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    n = args.sizes
    shapes = [(n[0], n[1]), (n[1], n[2]), (n[2], n[3]), (n[3], n[4])]
    prog = deinsum.compile(EQUATION, *shapes)
    plan = prog.plan(nprocs=comm.size, inputs="local", result="distributed")
    rng = np.random.default_rng(args.seed)
    matrices = [rng.standard_normal(s) for s in shapes]   # a real application creates only its blocks
    blocks = prog.input_blocks(comm.rank, comm.size, result="distributed")
    part = prog(*[m[b] for m, b in zip(matrices, blocks)], comm=comm, inputs="local", result="distributed")
    want = matrices[0] @ matrices[1] @ matrices[2] @ matrices[3]
    ok = part.block is None or np.allclose(part.local, want[part.block])
    ok = comm.allreduce(ok and prog.last_run.matches_model, op=MPI.LAND)
    runs = comm.gather(str(prog.last_run), root=0)
    if comm.rank == 0:
        print(f"{EQUATION} with i,j,k,l,m = {n} on {comm.size} rank(s)\n")
        print(describe(plan))
        print("\nmeasured per rank:", *runs, sep="\n  ")
        print(f"result blocks match numpy and bytes match the plan: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
