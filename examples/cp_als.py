"""CP-ALS (CP decomposition) on distributed arrays: X and the factors never leave their blocks.

The sweep's five (or three) MTTKRPs are planned together (``deinsum.plan_sequence``):
X gets one home layout for the whole run, and each factor lives where its own
MTTKRP leaves it, which is where the other MTTKRPs all-gather it from. The
update ``A = M pinv(V)`` and the Gram matrices are :class:`deinsum.DistributedArray`
one-liners (R x R allreduces); the fit is numpy's own ``np.linalg.norm`` and ``np.vdot`` on the
distributed X, M and factor (each one allreduce). Every
iteration prints the bytes each rank moved next to the plan's model, and the
fit of every iteration is checked against a numpy CP-ALS on the same data.

    mpiexec -n 4 python -m mpi4py examples/cp_als.py --shape 60 50 40 --rank 5 --iters 10
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
from mpi4py import MPI

import deinsum
from fit_check import report_fits, report_traffic, run_step

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


def factor_name(mode: int) -> str:
    return "ABCDEFGHI"[mode]


def sweep_plan(shape, rank_r: int, nprocs: int) -> deinsum.SequencePlan:
    """The MTTKRPs of one sweep, planned together: ``A = MTTKRP(X, B, C)``, ``B = MTTKRP(X, A, C)``, ..."""
    order = len(shape)
    steps = [(mttkrp_equation(n, order), ("X",) + tuple(factor_name(m) for m in range(order) if m != n),
              factor_name(n)) for n in range(order)]
    shapes = {"X": tuple(shape)} | {factor_name(n): (shape[n], rank_r) for n in range(order)}
    return deinsum.plan_sequence(steps, shapes, nprocs)


def cp_als_deinsum(sweep: deinsum.SequencePlan, X: deinsum.DistributedArray, factors, iters: int):
    """Distributed CP-ALS: (fits, per iteration the bytes this rank received and whether every call
    matched the model and left X in place)."""
    comm = X.comm
    tensors = {"X": X} | {name: deinsum.DistributedArray.from_global(f, sweep.layouts[name], comm)
                          for name, f in zip(map(factor_name, range(len(factors))), factors)}
    grams = {name: tensors[name].gram() for name in map(factor_name, range(len(factors)))}
    norm_x2 = np.linalg.norm(X) ** 2
    fits, traffic = [], []
    for _ in range(iters):
        received, exact = 0, True
        for step, mttkrp in zip(sweep.steps, sweep.programs):
            others = step.inputs[1:]
            pinv = np.linalg.pinv(np.prod([grams[name] for name in others], axis=0))
            moved, matched = run_step(step, mttkrp, tensors)
            M = tensors[step.output]
            tensors[step.output] = M.matmul(pinv)
            grams[step.output] = tensors[step.output].gram()
            received, exact = received + moved, exact and matched
        fits.append(fit_of(norm_x2, np.vdot(M, tensors[step.output]), list(grams.values())))
        traffic.append((received, exact))
    return fits, traffic


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", type=int, nargs="+", default=[60, 50, 40])
    ap.add_argument("--rank", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-bounds", action="store_true",
                    help="print the sweep's traffic without its lower bounds (seconds per order-5 MTTKRP)")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    shape = tuple(args.shape)
    X_full, start = problem(shape, args.rank, args.seed)   # a real application reads only its block
    sweep = sweep_plan(shape, args.rank, comm.size)
    X = deinsum.DistributedArray.from_global(X_full, sweep.layouts["X"], comm)
    fits, traffic = cp_als_deinsum(sweep, X, start, args.iters)
    per_rank = comm.gather(traffic, root=0)
    status = 0
    if comm.rank == 0:
        reference = cp_als_numpy(X_full, start, args.iters)
        print(f"CP-ALS of a {'x'.join(map(str, shape))} tensor, rank {args.rank}, on {comm.size} rank(s)")
        print(sweep.text(bounds=not args.no_bounds))
        status = report_traffic(per_rank) | report_fits(fits, reference)
    return comm.bcast(status, root=0)


if __name__ == "__main__":
    sys.exit(main())
