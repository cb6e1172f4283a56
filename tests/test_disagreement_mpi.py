"""Randomized launches (issue 30): ranks that used deinsum on sub-communicators first, and calls whose options
differ between ranks (threads, device, memory, result, pinned layouts, DistributedArray method arguments).

Every step of a launch ends the same way on every rank: the right result, or the same one-line DeinsumError;
never a hang (each launch has a timeout), a raw MPI error or a wrong result. Options that the ranks combine
(memory: the least of them) run; the others must be refused everywhere. 5 launches by default, 100 under
``-m slow``.
"""
import random
import re

import pytest

from mpirun import run_mpi

PRELUDE = """
import sys
import numpy as np
import deinsum
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.rank
rng = np.random.default_rng(0)
A, B = rng.standard_normal((6, 5)), rng.standard_normal((5, 4))


def step(label, call, want):
    try:
        out = call()
    except deinsum.DeinsumError as exc:
        print(f"{label} rank {rank} ERROR {exc} @@", flush=True)
        return
    if isinstance(out, deinsum.DistributedArray):
        out = out.gather()
    good = want is None or (out is not None and np.allclose(out, want))
    print(f"{label} rank {rank} OK {'right' if good else 'WRONG'} @@", flush=True)
"""

#: Per step kind: the options of the call, each a list of values a rank may take.
OPTIONS = {"threads": ["auto", None], "device": ["cpu", "gpu"], "memory": ["64MB", "1GiB", None],
           "result": ["all", "distributed"]}


def launch(seed: int) -> tuple[int, str, dict]:
    """A random launch: its P, its script, and per step whether its ranks disagree on something that must
    be refused."""
    r = random.Random(seed)
    nprocs = r.randint(2, 4)
    lines, refused = [PRELUDE], {}
    for n in range(r.randint(3, 6)):
        kind = r.choice(["sub", "self", "call", "pins", "matmul"])
        label = f"s{n}"
        if kind == "sub":        # some ranks work on a communicator of their own first (collective on it)
            colors = [r.randint(0, 1) for _ in range(nprocs)]
            lines.append(f"part = comm.Split({colors}[rank])")
            lines.append(f"step('{label}', lambda: deinsum.einsum('ij,jk->ik', A, B, comm=part), A @ B)")
            refused[label] = False
        elif kind == "self":     # some ranks alone first
            alone = [r.random() < 0.5 for _ in range(nprocs)]
            lines.append(f"if {alone}[rank]:")
            lines.append("    deinsum.einsum('ij,jk->ik', A, B, comm=MPI.COMM_SELF)")
            lines.append(f"step('{label}', lambda: deinsum.einsum('ij,jk->ik', A, B), A @ B)")
            refused[label] = False
        elif kind == "call":     # an option that may differ between ranks
            option = r.choice(sorted(OPTIONS))
            values = [r.choice(OPTIONS[option]) for _ in range(nprocs)]
            lines.append(f"step('{label}', lambda: deinsum.einsum('ij,jk->ik', A, B, {option}={values}[rank]), "
                         f"A @ B)")
            # memory is combined (the least); a differing option is refused; gpu is refused here (no CuPy)
            refused[label] = option != "memory" and (len(set(values)) > 1 or "gpu" in values)
        elif kind == "pins":
            specs = [r.choice(["even", "replicated"]) for _ in range(nprocs)]
            lines.append(f"step('{label}', lambda: deinsum.einsum('ij,jk->ik', deinsum.DistributedArray."
                         f"from_global(A, {specs}[rank]), B, result='all'), A @ B)")
            refused[label] = len(set(specs)) > 1
        else:                    # a DistributedArray method whose argument may differ between ranks
            widths = [r.choice([4, 4, 3]) for _ in range(nprocs)]
            lines.append("x = deinsum.DistributedArray.from_global(A, 'even')")
            lines.append(f"step('{label}', lambda: x.matmul(np.ones((5, {widths}[rank]))), "
                         f"A @ np.ones((5, {widths[0]})))")
            refused[label] = len(set(widths)) > 1
    lines.append("comm.Barrier()\nif rank == 0:\n    print('DONE', flush=True)")
    return nprocs, "\n".join(lines) + "\n", refused


def check_launch(seed: int, tmp_path) -> None:
    nprocs, script, refused = launch(seed)
    res = run_mpi(nprocs, script, tmp_path=tmp_path, timeout=120)   # a hang fails here
    where = f"seed {seed}, P = {nprocs}\n{script}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr[-2000:]}"
    assert res.returncode == 0 and "DONE" in res.stdout and "Traceback" not in res.stderr, where
    for label, must_refuse in refused.items():
        lines = dict(re.findall(rf"{label} rank (\d+) (.*?) @@", res.stdout))
        assert sorted(map(int, lines)) == list(range(nprocs)), (label, where)
        outcomes = set(lines.values())
        assert len(outcomes) == 1, (label, lines, where)             # the same on every rank
        (outcome,) = outcomes
        assert outcome != "OK WRONG", (label, where)
        assert outcome.startswith("ERROR") == must_refuse, (label, outcome, where)


#: Five launches that take every kind of step between them, at P = 2, 3 and 4.
DEFAULT_SEEDS = (0, 1, 2, 3, 5)


@pytest.mark.parametrize("seed", DEFAULT_SEEDS)
def test_randomized_launches_never_hang_nor_go_wrong(seed, tmp_path):
    check_launch(seed, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [s for s in range(100) if s not in DEFAULT_SEEDS])
def test_randomized_launches_never_hang_nor_go_wrong_100(seed, tmp_path):
    check_launch(seed, tmp_path)
