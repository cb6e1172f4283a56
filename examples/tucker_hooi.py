"""Tucker decomposition by HOOI with every TTMc through deinsum; X and each TTMc result stay distributed.

Each rank keeps only its even block of the tensor X for the whole run. For mode
n the TTMc ``Y = X x_{m != n} U_m^T`` is a deinsum program whose result stays
distributed, and its block feeds the next program, the Gram ``Y_(n) Y_(n)^T``,
directly: that program's entry layout for Y is Y's exit layout (checked). The
small Gram matrix comes back on every rank (``result="all"``); rank 0 takes its
leading eigenvectors as the new factor U_n and broadcasts it. Factors are small
and replicated; each call slices its blocks from them. The core
``G = Y_N x_N U_N^T`` reuses the last TTMc result the same way, and the fit
``1 - sqrt(||X||^2 - ||G||^2) / ||X||`` of every sweep is checked against a numpy
HOOI on the same data and start.

    mpiexec -n 4 python -m mpi4py examples/tucker_hooi.py --shape 40 36 32 --ranks 5 4 3 --iters 5
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

import deinsum
from fit_check import report_fits

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


def operand_shapes(equation: str, size: dict[str, int]) -> list[tuple[int, ...]]:
    return [tuple(size[c] for c in term) for term in equation.split("->")[0].split(",")]


@dataclass(frozen=True)
class HOOIPrograms:
    """The deinsum programs of HOOI: one TTMc and one Gram per mode, and the core."""

    ttmc: list
    gram: list
    core: object


def hooi_programs(shape, ranks) -> HOOIPrograms:
    order = len(shape)
    size = dict(zip(TENSOR, shape)) | dict(zip(CORE, ranks))

    def program(equation: str, result_even: bool = False, **extra: int):
        # every input pinned to the fixed even layout (and the TTMc results, which the others read)
        pins = {n: "even" for n in range(equation.count(",") + 1)} | ({"out": "even"} if result_even else {})
        return deinsum.compile(equation, *operand_shapes(equation, size | extra), layouts=pins)

    return HOOIPrograms([program(ttmc_equation(n, order), result_even=True) for n in range(order)],
                        [program(gram_equation(n, order), **{GRAM: shape[n]}) for n in range(order)],
                        program(core_equation(order)))


def check_results_feed_on(progs: HOOIPrograms, nprocs: int) -> None:
    """Raise unless each TTMc result's layout is the entry layout of the programs that read it."""
    def plan(prog):
        return prog.plan(nprocs=nprocs, inputs="local", result="distributed")

    last = len(progs.ttmc) - 1
    for n, ttmc in enumerate(progs.ttmc):
        readers = list(plan(progs.gram[n]).entry) + ([plan(progs.core).entry[0]] if n == last else [])
        if any(layout != plan(ttmc).exit for layout in readers):
            raise RuntimeError(f"mode {n}: the TTMc result's layout differs from its readers' entry layout")


def hooi_deinsum(comm, progs: HOOIPrograms, X_block: np.ndarray, start, iters: int) -> list[float]:
    """Distributed HOOI from this rank's block of X: the fit after every sweep."""
    order, P, rank = len(start), comm.size, comm.rank
    check_results_feed_on(progs, P)
    factors = [u.copy() for u in start]
    norm_x2 = comm.allreduce(float(np.sum(X_block * X_block)))
    fits = []
    for _ in range(iters):
        for n in range(order):
            others = [m for m in range(order) if m != n]
            blocks = progs.ttmc[n].input_blocks(rank, P)
            operands = [X_block] + [factors[m][b] for m, b in zip(others, blocks[1:])]
            Y = progs.ttmc[n](*operands, comm=comm, inputs="local", result="distributed")
            gram = progs.gram[n](Y.local, Y.local, comm=comm, inputs="local", result="all")
            factors[n] = comm.bcast(leading_vectors(gram, start[n].shape[1]) if rank == 0 else None, root=0)
        last = progs.core.input_blocks(rank, P)[1]
        core = progs.core(Y.local, factors[-1][last], comm=comm, inputs="local", result="all")
        fits.append(fit_of(norm_x2, core))
    return fits


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
    X, start = problem(shape, ranks, args.seed)   # a real application reads only its block
    start = comm.bcast(start if comm.rank == 0 else None, root=0)
    progs = hooi_programs(shape, ranks)
    X_block = np.ascontiguousarray(X[progs.ttmc[0].input_blocks(comm.rank, comm.size)[0]])
    fits = hooi_deinsum(comm, progs, X_block, start, args.iters)
    status = 0
    if comm.rank == 0:
        reference = hooi_numpy(X, start, args.iters)
        print(f"HOOI of a {'x'.join(map(str, shape))} tensor, ranks {ranks}, on {comm.size} rank(s); X, each "
              f"TTMc result and the core's input stay distributed; factors (small) are replicated")
        for n in range(len(shape)):
            print(f"  mode {n}: TTMc {ttmc_equation(n, len(shape))} -> Gram {gram_equation(n, len(shape))}")
        print(f"  core: {core_equation(len(shape))}")
        status = report_fits(fits, reference)
    return comm.bcast(status, root=0)


if __name__ == "__main__":
    sys.exit(main())
