"""Tucker decomposition by HOOI on distributed arrays: X and each TTMc result never leave their blocks.

One sweep is planned as a sequence (``deinsum.plan_sequence``): for each mode n
the TTMc ``Y_n = X x_{m != n} U_m^T``, then the Gram ``Y_(n) Y_(n)^T`` read
straight from where the TTMc left ``Y_n``; the core ``G = Y_N x_N U_N^T`` reuses
the last TTMc result. X gets one home for the whole run; the factors are small
and replicated (plain numpy arrays beside the distributed ones). Every
iteration prints the bytes each rank moved next to the plan's model, and the
fit ``1 - sqrt(||X||^2 - ||G||^2) / ||X||`` of every sweep is checked against a
numpy HOOI on the same data and start.

    mpiexec -n 4 python -m mpi4py examples/tucker_hooi.py --shape 40 36 32 --ranks 5 4 3 --iters 5
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
from mpi4py import MPI

import deinsum
from fit_check import report_fits, report_traffic, run_step

TENSOR, CORE, GRAM = "ijklm", "abcde", "z"


def ttmc_equation(mode: int, order: int) -> str:
    """``ijk,jb,kc->ibc`` for mode 0 of an order-3 tensor: X times every factor but U_mode."""
    factors = [TENSOR[m] + CORE[m] for m in range(order) if m != mode]
    return ",".join([TENSOR[:order]] + factors) + "->" + result_of(mode, order)


def result_of(mode: int, order: int) -> str:
    return "".join(TENSOR[m] if m == mode else CORE[m] for m in range(order))


def gram_equation(mode: int, order: int) -> str:
    """``ibc,zbc->iz``: the Gram matrix of the mode-``mode`` unfolding."""
    y = result_of(mode, order)
    return f"{y},{y.replace(TENSOR[mode], GRAM)}->{TENSOR[mode]}{GRAM}"


def core_equation(order: int) -> str:
    """``abk,kc->abc``: the core from the last mode's TTMc result."""
    last = order - 1
    return f"{result_of(last, order)},{TENSOR[last]}{CORE[last]}->{CORE[:order]}"


def problem(shape, ranks, seed: int):
    """Low multilinear rank plus 1% noise, and a random orthonormal start (same on every rank for the seed)."""
    rng = np.random.default_rng(seed)
    order = len(shape)
    core = rng.standard_normal(ranks)
    bases = [np.linalg.qr(rng.standard_normal((n, r)))[0] for n, r in zip(shape, ranks)]
    X = np.einsum(",".join([CORE[:order]] + [TENSOR[m] + CORE[m] for m in range(order)]) + "->" + TENSOR[:order],
                  core, *bases)
    X += 0.01 * np.linalg.norm(X) / np.sqrt(X.size) * rng.standard_normal(shape)
    start = [np.linalg.qr(rng.standard_normal((n, r)))[0] for n, r in zip(shape, ranks)]
    return X, start


def leading_vectors(gram: np.ndarray, count: int) -> np.ndarray:
    """Eigenvectors of the ``count`` largest eigenvalues of a symmetric matrix, largest first."""
    return np.linalg.eigh(gram)[1][:, ::-1][:, :count]


def fit_of(norm_x2: float, core: np.ndarray) -> float:
    return 1 - np.sqrt(max(norm_x2 - float(np.sum(core * core)), 0.0) / norm_x2)


def hooi_numpy(X: np.ndarray, start, iters: int) -> list[float]:
    """Reference HOOI with numpy.einsum: the fit after every sweep."""
    factors, order, fits = [u.copy() for u in start], X.ndim, []
    for _ in range(iters):
        for n in range(order):
            Y = np.einsum(ttmc_equation(n, order), X, *[u for m, u in enumerate(factors) if m != n])
            factors[n] = leading_vectors(np.einsum(gram_equation(n, order), Y, Y), start[n].shape[1])
        fits.append(fit_of(float(np.sum(X * X)), np.einsum(core_equation(order), Y, factors[-1])))
    return fits


def sweep_plan(shape, ranks, nprocs: int) -> deinsum.SequencePlan:
    """TTMc and Gram per mode, then the core, with X placed once and the factors ``U0, U1, ...`` replicated."""
    order = len(shape)
    steps = []
    for n in range(order):
        steps.append((ttmc_equation(n, order), ("X",) + tuple(f"U{m}" for m in range(order) if m != n), f"Y{n}"))
        steps.append((gram_equation(n, order), (f"Y{n}", f"Y{n}"), f"G{n}"))
    steps.append((core_equation(order), (f"Y{order - 1}", f"U{order - 1}"), "core"))
    shapes = {"X": tuple(shape)} | {f"U{m}": (shape[m], ranks[m]) for m in range(order)}
    return deinsum.plan_sequence(steps, shapes, nprocs, layouts={f"U{m}": "replicated" for m in range(order)})


def hooi_deinsum(sweep: deinsum.SequencePlan, X: deinsum.DistributedArray, start, iters: int):
    """Distributed HOOI: (fits, per iteration the bytes this rank received and whether every call matched
    the model and left X in place)."""
    comm = X.comm
    tensors = {f"U{m}": u.copy() for m, u in enumerate(start)} | {"X": X}
    norm_x2 = X.norm() ** 2
    fits, traffic = [], []
    for _ in range(iters):
        received, exact = 0, True
        for step, program in zip(sweep.steps, sweep.programs):
            moved, matched = run_step(step, program, tensors)
            received, exact = received + moved, exact and matched
            if step.output.startswith("G"):       # the new factor: leading eigenvectors of the Gram matrix
                n = int(step.output[1:])
                gram = tensors[step.output].gather()
                tensors[f"U{n}"] = comm.bcast(leading_vectors(gram, start[n].shape[1]) if comm.rank == 0
                                              else None, root=0)
        fits.append(fit_of(norm_x2, tensors["core"].gather()))
        traffic.append((received, exact))
    return fits, traffic


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", type=int, nargs="+", default=[40, 36, 32])
    ap.add_argument("--ranks", type=int, nargs="+", default=[5, 4, 3])
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if len(args.shape) != len(args.ranks) or not 2 <= len(args.shape) <= len(TENSOR):
        ap.error(f"--shape and --ranks need the same length, 2 to {len(TENSOR)}")
    comm = MPI.COMM_WORLD
    shape, ranks = tuple(args.shape), tuple(args.ranks)
    X_full, start = problem(shape, ranks, args.seed)   # a real application reads only its block
    sweep = sweep_plan(shape, ranks, comm.size)
    X = deinsum.DistributedArray.from_global(X_full, sweep.layouts["X"], comm)
    fits, traffic = hooi_deinsum(sweep, X, start, args.iters)
    per_rank = comm.gather(traffic, root=0)
    status = 0
    if comm.rank == 0:
        reference = hooi_numpy(X_full, start, args.iters)
        print(f"HOOI of a {'x'.join(map(str, shape))} tensor, ranks {ranks}, on {comm.size} rank(s)")
        print(sweep)
        status = report_traffic(per_rank) | report_fits(fits, reference)
    return comm.bcast(status, root=0)


if __name__ == "__main__":
    sys.exit(main())
