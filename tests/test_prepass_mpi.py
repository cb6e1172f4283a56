"""Every einsum on distributed data (issue 26): random einsums with one-operand sums, diagonals, traces,
squeezes, outer products, scalars and ``...``, whose operands are DistributedArrays in random layouts mixed
with plain arrays, local blocks (results whole or distributed), or pinned layouts: equal to numpy, bytes == model
on every rank, none refused. P = 1, 3 and 4 by default, the other P up to 8 under ``-m slow``."""
import pytest

from mpirun import check_mpi

SWEEP = r'''
import sys
import numpy as np
from mpi4py import MPI
import deinsum
from deinsum import DistributedArray

comm, P = MPI.COMM_WORLD, MPI.COMM_WORLD.size
rng = np.random.default_rng(26 + P)
LETTERS = "abcdef"


def einsum_case():
    """An equation and its operand shapes: 1-4 operands, sizes 1-13, repeated indices, sums over an index of
    one operand, scalars, '...' (broadcast over size-1 dimensions)."""
    while True:
        pool = LETTERS[:int(rng.integers(1, 6))]
        sizes = {c: int(rng.integers(1, 14)) for c in pool}
        if np.prod(list(sizes.values())) > 4000:
            continue
        terms = ["".join(rng.choice(list(pool), size=int(rng.integers(0, min(3, len(pool)) + 1)), replace=False))
                 for _ in range(int(rng.integers(1, 5)))]
        for n, t in enumerate(terms):
            if t and rng.random() < 0.3:   # a diagonal
                k = int(rng.integers(0, len(t) + 1))
                terms[n] = t[:k] + t[int(rng.integers(0, len(t)))] + t[k:]
        shapes = [[sizes[c] for c in t] for t in terms]
        if rng.random() < 0.15:            # '...' over one or two dimensions, some of them broadcast
            ell = [int(rng.integers(1, 5)) for _ in range(int(rng.integers(1, 3)))]
            for n in range(len(terms)):
                terms[n] = "..." + terms[n]
                shapes[n] = [1 if rng.random() < 0.3 else e for e in ell] + shapes[n]
        used = sorted(set("".join(terms)) - set("."))
        if rng.random() < 0.3:
            return ",".join(terms), shapes
        keep = "".join(c for c in rng.permutation(used) if rng.random() < 0.5)
        return ",".join(terms) + "->" + ("..." if "..." in terms[0] else "") + keep, shapes


def layout_spec(ndim):
    """A random layout: even, replicated, root, one axis over all ranks, nested, or a grid of P - 1 ranks."""
    kinds = ["even", "replicated", "root"] + (["one-axis", "nested", "fewer"] if ndim else [])
    kind = kinds[int(rng.integers(0, len(kinds)))]
    axis = int(rng.integers(0, ndim)) if ndim else 0
    axes = ["-"] * ndim
    if kind == "one-axis":
        axes[axis] = "0"
        return f"{P}: " + ", ".join(axes)
    if kind == "nested" and P % 2 == 0:
        axes[axis] = "1.0"
        return f"2x{P // 2}: " + ", ".join(axes)
    if kind in ("nested", "fewer") and P > 1:
        axes[axis] = "0"
        return f"{P - 1}: " + ", ".join(axes)
    return kind if kind in ("even", "replicated", "root") else "even"


def values(shape, dtype):
    x = rng.uniform(-1, 1, shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.uniform(-1, 1, shape)
    return np.asarray(x, dtype=dtype)


def whole(r):
    return r.gather() if isinstance(r, DistributedArray) else np.asarray(r)


#: Local blocks whose pre-pass leaves partial sums that a reduce-scatter sums on part of the ranks: it once ran on
#: the world (a pre-pass has no group), an error on every rank at P = 4.
KNOWN = [("a,ab->a", [[10], [10, 10]]), ("cb,c->", [[6, 4], [6]]), ("bae,dac->dea", [[4, 2, 4], [8, 2, 1]])]

failures, runs, kinds = [], 0, set()
for n in range(int(sys.argv[1])):
    eq, shapes = KNOWN[n] if n < len(KNOWN) else einsum_case()
    dtype = [np.float32, np.float64, np.complex128][n % 3]
    arrays = [values(s, dtype) for s in shapes]
    want = np.einsum(eq, *arrays)
    tol = 2e-3 if dtype == np.float32 else 1e-9
    mode = "local" if n < len(KNOWN) else ["darray", "local", "pinned"][n % 3]
    result = "distributed" if mode == "local" and (n < len(KNOWN) or n // 3 % 2) else "all"
    specs = [layout_spec(len(s)) for s in shapes]
    prog = deinsum.compile(eq, *shapes, dtype=dtype, layouts=dict(enumerate(specs)) if mode == "pinned" else None)
    kinds |= {s.kind for s in prog.decomposition.prepass}
    try:
        if mode == "darray":
            ops = [DistributedArray.from_global(a, spec, comm) if k == 0 or rng.random() < 0.7 else a
                   for k, (a, spec) in enumerate(zip(arrays, specs))]
            got = prog(*ops)
        else:
            blocks = prog.input_blocks(comm.rank, P, result=result)
            got = prog(*[a[b] for a, b in zip(arrays, blocks)], inputs="local", result=result)
        ok = np.allclose(whole(got), want, rtol=tol, atol=tol) and prog.last_run.matches_model
        if not ok:
            failures.append(f"{eq} {shapes} {mode} {specs}: " + ("bytes " + str(prog.last_run) if
                            np.allclose(whole(got), want, rtol=tol, atol=tol) else "values differ"))
    except deinsum.DeinsumError as exc:
        failures.append(f"{eq} {shapes} {mode} {specs}: refused: {exc}")
    runs += 1
    prog.close()
failures = comm.allgather(failures)
if comm.rank == 0:
    print("runs", runs, "kinds", sorted(kinds), "failures", sum(map(len, failures)))
    for f in dict.fromkeys(f for fs in failures for f in fs):
        print("FAIL", f)
'''


def _sweep(nprocs, count, tmp_path):
    out = check_mpi(nprocs, SWEEP, str(count), tmp_path=tmp_path, timeout=600)
    summary = next(line for line in out.splitlines() if line.startswith("runs"))
    assert summary.endswith("failures 0"), out
    assert all(k in summary for k in ("diagonal", "sum")), summary   # the sweep has pre-passes to run
    return summary


@pytest.mark.parametrize("nprocs", [1, 3, 4])
def test_every_einsum_runs_on_distributed_operands(nprocs, tmp_path):
    _sweep(nprocs, 45, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("nprocs", [2, 5, 6, 7, 8])
def test_every_einsum_runs_on_distributed_operands_at_every_p(nprocs, tmp_path):
    _sweep(nprocs, 60, tmp_path)
