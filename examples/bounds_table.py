"""SOAP I/O lower bounds of the paper's suite as LaTeX, ready for a paper (needs no ranks).

Prints one booktabs summary table (kernel, einsum, fused groups, closed-form
bound) and then, per kernel, ``deinsum.soap.analyze(...).latex()``: its groups'
exponent sigma, X0, rho and bound, with the optimal tile sizes. Bounds are symbolic
in the sizes N_v and the local memory S.

    python examples/bounds_table.py > bounds.tex
    mpiexec -n 1 python -m mpi4py examples/bounds_table.py --kernels 1MM MTTKRP-O3-M0
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import sympy as sp
from mpi4py import MPI

from deinsum.decompose import decompose
from deinsum.soap import analyze

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from suite import SUITE  # noqa: E402  -- the paper's suite, shared with the tests


def summary_table(analyses: dict) -> str:
    """One booktabs row per kernel: einsum, fused groups and the total bound."""
    lines = [r"\begin{table}[t]", r"\centering", r"\caption{SOAP I/O lower bounds of the benchmark suite.}",
             r"\begin{tabular}{llll}", r"\toprule", r"Kernel & Einsum & Fused groups & $Q \geq$ \\", r"\midrule"]
    for kernel, a in analyses.items():
        groups = "; ".join(rf"\texttt{{{g.statement.equation}}}" for g in a.groups)
        lines.append(rf"{kernel} & \texttt{{{a.equation}}} & {groups} & ${sp.latex(a.Q)}$ \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines).replace("->", r"$\to$")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", nargs="+", default=list(SUITE), choices=list(SUITE), metavar="KERNEL")
    args = ap.parse_args(argv)
    if MPI.COMM_WORLD.rank != 0:     # under mpiexec the table is printed once, by rank 0
        return 0
    analyses = {k: analyze(decompose(SUITE[k][0])) for k in args.kernels}
    print(summary_table(analyses))
    for kernel, a in analyses.items():
        print(f"\n% {kernel}\n{a.latex()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
