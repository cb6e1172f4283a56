"""CP-ALS (CP decomposition) with every MTTKRP run through deinsum; the tensor never leaves its blocks.

Each rank keeps only its even block of the tensor X for the whole run: all
MTTKRP programs take X in the same entry layout. A factor matrix stays
distributed too when its MTTKRP's result layout holds whole rows and equals the
entry layout the other programs expect for that factor: then the update
``A = M pinv(V)``, its Gram matrix and the fit need only R x R allreduces.
Otherwise (a mode too short for a row split, e.g. 3 rows on 2 ranks) the MTTKRP
result is gathered (``result="all"``) and every rank slices its block. The fit of
every iteration is checked against a numpy CP-ALS on the same data and start.

    mpiexec -n 4 python -m mpi4py examples/cp_als.py --shape 60 50 40 --rank 5 --iters 10
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
from mpi4py import MPI

import deinsum
from fit_check import report_fits

LETTERS = "ijklmnopq"


def mttkrp_equation(mode: int, order: int) -> str:
    """``ijk,jr,kr->ir`` for mode 0 of an order-3 tensor."""
    tensor = LETTERS[:order]
    factors = [c + "r" for n, c in enumerate(tensor) if n != mode]
    return ",".join([tensor] + factors) + "->" + tensor[mode] + "r"


def problem(shape, rank: int, seed: int):
    """A rank-``rank`` tensor plus 1% noise and random initial factors (same on every rank for the seed)."""
    rng = np.random.default_rng(seed)
    truth = [rng.standard_normal((n, rank)) for n in shape]
    order = len(shape)
    X = np.einsum(",".join(c + "r" for c in LETTERS[:order]) + "->" + LETTERS[:order], *truth)
    X += 0.01 * np.linalg.norm(X) / np.sqrt(X.size) * rng.standard_normal(shape)
    return X, [rng.standard_normal((n, rank)) for n in shape]


def fit_of(norm_x2: float, inner: float, grams) -> float:
    """1 - ||X - [[A_1..A_N]]|| / ||X|| from ||X||^2, <X, model> and the factors' Gram matrices."""
    model2 = float(np.sum(np.prod(grams, axis=0)))
    return 1 - np.sqrt(max(norm_x2 - 2 * inner + model2, 0.0) / norm_x2)


def cp_als_numpy(X: np.ndarray, factors, iters: int) -> list[float]:
    """Reference CP-ALS (numpy.einsum MTTKRPs): the fit after every sweep."""
    factors = [f.copy() for f in factors]
    order, fits = X.ndim, []
    for _ in range(iters):
        for n in range(order):
            others = [f for m, f in enumerate(factors) if m != n]
            M = np.einsum(mttkrp_equation(n, order), X, *others)
            factors[n] = M @ np.linalg.pinv(np.prod([f.T @ f for f in others], axis=0))
        fits.append(fit_of(float(np.sum(X * X)), float(np.sum(M * factors[-1])), [f.T @ f for f in factors]))
    return fits


def holds_whole_rows(layout) -> bool:
    return layout.axes[1] is None or layout.grid[layout.axes[1]] == 1


def mttkrp_programs(shape, rank_r: int) -> list:
    """One deinsum program per mode: the MTTKRP of a ``shape`` tensor with rank-``rank_r`` factors."""
    order = len(shape)
    pins = {k: "even" for k in range(order)} | {"out": "even"}   # X, factors and results in the even layout
    return [deinsum.compile(mttkrp_equation(n, order), shape, *[(shape[m], rank_r) for m in range(order) if m != n],
                            layouts=pins) for n in range(order)]


def cp_als_deinsum(comm, progs, X_block: np.ndarray, factors, iters: int):
    """Distributed CP-ALS from this rank's block of X: (fits, which factors stayed distributed)."""
    order, P, rank = len(factors), comm.size, comm.rank
    plans = [p.plan(nprocs=P, inputs="local", result="distributed") for p in progs]
    # the entry layout of each factor (the same in every program that reads it) and whether it can stay distributed
    entry = {m: plan.entry[1 + [k for k in range(order) if k != n].index(m)]
             for n, plan in enumerate(plans) for m in range(order) if m != n}
    stays = [holds_whole_rows(plans[n].exit) and plans[n].exit == entry[n] for n in range(order)]
    local = [f[entry[m].block(rank)] for m, f in enumerate(factors)]
    grams = [f.T @ f for f in factors]
    norm_x2 = comm.allreduce(float(np.sum(X_block * X_block)))
    fits = []
    for _ in range(iters):
        for n in range(order):
            others = [m for m in range(order) if m != n]
            W = np.linalg.pinv(np.prod([grams[m] for m in others], axis=0))
            operands = [X_block] + [local[m] for m in others]
            if stays[n]:
                M = progs[n](*operands, comm=comm, inputs="local", result="distributed").local
                local[n] = M @ W
                grams[n] = comm.allreduce(local[n].T @ local[n])
                inner = comm.allreduce(float(np.sum(M * local[n])))
            else:
                M = progs[n](*operands, comm=comm, inputs="local", result="all")
                A = M @ W
                local[n] = A[entry[n].block(rank)]
                grams[n] = A.T @ A
                inner = float(np.sum(M * A))
        fits.append(fit_of(norm_x2, inner, grams))
    return fits, stays


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", type=int, nargs="+", default=[60, 50, 40])
    ap.add_argument("--rank", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    shape = tuple(args.shape)
    X, start = problem(shape, args.rank, args.seed)   # a real application reads only its block
    progs = mttkrp_programs(shape, args.rank)
    x_layouts = {p.plan(nprocs=comm.size, inputs="local").entry[0] for p in progs}
    X_block = np.ascontiguousarray(X[progs[0].input_blocks(comm.rank, comm.size)[0]])
    fits, stays = cp_als_deinsum(comm, progs, X_block, start, args.iters)
    runs = comm.gather(str(progs[0].last_run), root=0)
    status = 0
    if comm.rank == 0:
        reference = cp_als_numpy(X, start, args.iters)
        print(f"CP-ALS of a {'x'.join(map(str, shape))} tensor, rank {args.rank}, on {comm.size} rank(s); "
              f"X's entry layout is the same in all {len(progs)} MTTKRPs: {len(x_layouts) == 1} "
              f"(each rank keeps its block of grid {next(iter(x_layouts)).grid})")
        for n, kept in enumerate(stays):
            print(f"  factor {n} ({shape[n]}x{args.rank}): "
                  + ("stays distributed (result layout = entry layout, whole rows)" if kept
                     else "gathered after its MTTKRP (its result layout splits columns or differs)"))
        status = report_fits(fits, reference)
        print("last mode-0 MTTKRP per rank:", *runs, sep="\n  ")
    return comm.bcast(status, root=0)


if __name__ == "__main__":
    sys.exit(main())
