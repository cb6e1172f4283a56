"""numpy's functions, ufuncs and operators on DistributedArrays under real mpiexec (issue 26): equal numpy in
every layout, the same one-line error on every rank where the ranks disagree or a call is not supported.
One launch per P runs every check (each prints one line on rank 0); the tests read its output."""
from pathlib import Path

import pytest

from mpirun import check_mpi

CHECKS = r'''
import numpy as np
from mpi4py import MPI
import deinsum
from deinsum import DistributedArray, Layout
from deinsum.runtime.checks import matches

comm = MPI.COMM_WORLD
P, rank = comm.size, comm.rank
rng = np.random.default_rng(26)   # the same arrays on every rank


def kinds(shape):
    """even, nested (one axis cut by two grid dimensions), replicated, root, a (P-1)-rank grid, one axis."""
    n = len(shape)
    nested = Layout(shape, (2, P // 2) if P >= 4 else (P, 1), ((0, 1),) + (None,) * (n - 1))
    yield from ("even", nested, "replicated", "root")
    yield Layout(shape, (max(P - 1, 1),), (None,) * (n - 1) + (0,))
    yield Layout(shape, (P,), (None,) * (n - 1) + (0,)) if n > 1 else "even"


def dist(whole, k=0):
    """``whole`` distributed in the k-th layout kind of its shape (cycling)."""
    options = list(kinds(whole.shape))
    return DistributedArray.from_global(whole, options[k % len(options)], comm)


def real(*shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


def cplx(*shape):
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


def check(family, label, call, want):
    """Rank 0 prints ``family label ok`` if ``call()`` equals numpy's ``want`` on every rank: a DistributedArray
    for an array result, a numpy scalar (identical on every rank) for a 0-d one, with numpy's dtype."""
    failure = None
    try:
        got = call()
        want = np.asarray(want)
        if want.ndim:
            if not isinstance(got, DistributedArray):
                failure = f"a {type(got).__name__}, not a DistributedArray"
            else:
                whole = np.asarray(got)          # through __array__: a gather to every rank
                if got.dtype != want.dtype or not matches(whole, want, want.dtype):
                    failure = f"{got!r} differs from numpy's {want.dtype}"
        elif isinstance(got, DistributedArray) or np.ndim(got) or np.asarray(got).dtype != want.dtype:
            failure = f"{type(got).__name__} {np.asarray(got).dtype}, not a {want.dtype} scalar"
        elif not matches(got, want, want.dtype) or len(set(comm.allgather(repr(got)))) != 1:
            failure = f"{got!r} (numpy {want!r}), or not the same on every rank"
    except Exception as exc:  # noqa: BLE001 - reported
        failure = f"{type(exc).__name__}: {exc}"
    failures = [f for f in comm.allgather(failure) if f]
    if rank == 0:
        print(f"CHECK {family} {label} " + ("ok" if not failures else "FAIL " + failures[0]), flush=True)


def error(label, call):
    """Rank 0 prints ``ERROR label | message`` where every rank raised the same one-line DeinsumError."""
    try:
        call()
        mine = "no error"
    except deinsum.DeinsumError as exc:
        mine = str(exc)
    except Exception as exc:  # noqa: BLE001 - reported
        mine = f"{type(exc).__name__}: {exc}"
    every = comm.allgather(mine)
    if rank == 0:
        same = len(set(every)) == 1 and "\n" not in mine
        print(f"ERROR {label} | " + (mine if same else f"DIFFER {every}"), flush=True)


def one_of(family, k, *cases):
    """Check the (k mod n)-th of the n ``(label, call, want)`` cases: each kind of call meets other layouts as k
    runs."""
    label, call, want = cases[k % len(cases)]
    check(family, f"{label}{k}", call, want)


# ---- einsum-like ---------------------------------------------------------------------------------------
X, B, C = real(7, 5, 4), real(5, 3), real(4, 3)
A, W, Z = real(6, 5), real(5, 4), cplx(4, 5)
T, U = real(3, 6, 5), real(3, 5, 4)
for k in range(6):
    x, c, a, w, v = dist(X, k), dist(C, k + 1), dist(A, k), dist(W, k + 2), dist(W[:, 0], k + 3)
    check("einsum", f"mttkrp{k}", lambda: np.einsum("ijk,ja,ka->ia", x, B, c), np.einsum("ijk,ja,ka->ia", X, B, C))
    one_of("einsum", k, ("interleaved", lambda: np.einsum(a, [0, 1], w, [1, 2], [0, 2], optimize=True), A @ W),
           ("scalar", lambda: np.einsum("ij,ij->", a, A), np.einsum("ij,ij->", A, A)),
           ("complex", lambda: np.einsum("ij,kj->ik", dist(Z, k), dist(Z.conj(), k + 1), dtype=np.complex128),
            Z @ Z.conj().T))
    one_of("tensordot", k, ("int", lambda: np.tensordot(x, c, axes=1), np.tensordot(X, C, axes=1)),
           ("pairs", lambda: np.tensordot(x, B, axes=([1], [0])), np.tensordot(X, B, axes=([1], [0]))),
           ("plain-left", lambda: np.tensordot(X[:, :, :1], x, axes=([0, 1], [0, 1])),
            np.tensordot(X[:, :, :1], X, axes=([0, 1], [0, 1]))),
           ("all", lambda: np.tensordot(x, x, axes=3), np.tensordot(X, X, axes=3)))
    one_of("matmul", k, ("2d", lambda: a @ w, A @ W), ("plain-left", lambda: A.T @ a, A.T @ A),
           ("vector", lambda: a @ W[:, 0], A @ W[:, 0]), ("vector-left", lambda: v @ w, W[:, 0] @ W),
           ("dot", lambda: np.matmul(v, v), W[:, 0] @ W[:, 0]),
           ("batched", lambda: dist(T, k) @ dist(U, k + 3), T @ U))
check("matmul", "batched-plain", lambda: dist(T, 2) @ W, T @ W)
check("einsum", "dtype", lambda: np.einsum("ij,jk->ik", dist(A, 0), W, dtype=np.float32, casting="same_kind"),
      np.einsum("ij,jk->ik", A, W, dtype=np.float32, casting="same_kind"))

# ---- reductions and transposes on blocks ------------------------------------------------------------------
I = rng.integers(-5, 5, (6, 4, 5)).astype(np.int32)
F = X.astype(np.float32)
U8 = rng.integers(0, 256, (6, 4, 5)).astype(np.uint8)
AXES = [None, 0, -1, (0, 2), 1, (2, 0)]
for k in range(6):
    x, i, s = dist(X, k), dist(I, k + 1), dist(A[:5], k)
    check("sum", f"float{k}", lambda: np.sum(x, axis=AXES[k], keepdims=k > 3), np.sum(X, axis=AXES[k], keepdims=k > 3))
    kind = [None, np.float32, np.int16][k % 3]
    check("sum", f"int{k}", lambda: np.sum(i, axis=AXES[5 - k], dtype=kind), np.sum(I, axis=AXES[5 - k], dtype=kind))
    check("trace", f"2d{k}", lambda: np.trace(s, offset=1 - k), np.trace(A[:5], offset=1 - k))
    check("trace", f"3d{k}", lambda: np.trace(x if k % 2 else i, offset=k % 3 - 1, axis1=2, axis2=k % 2),
          np.trace(X if k % 2 else I, offset=k % 3 - 1, axis1=2, axis2=k % 2))
    order = [None, (1, 0, 2), (2, 0, 1)][k % 3]
    check("transpose", f"axes{k}", lambda: np.transpose(x, order) + 1, np.transpose(X, order) + 1)
    check("transpose", f"T{k}", lambda: dist(A, k).T @ dist(A, k + 1), A.T @ A)
    one_of("vdot", k, ("same", lambda: np.vdot(x, x), np.vdot(X, X)),
           ("layouts", lambda: np.vdot(dist(Z, k), dist(Z * 2j, k + 1)), np.vdot(Z, Z * 2j)),
           ("plain-right", lambda: np.vdot(dist(Z, k), Z.ravel()[::-1]), np.vdot(Z, Z.ravel()[::-1])),
           ("plain-left", lambda: np.vdot(Z * 1j, dist(Z, k)), np.vdot(Z * 1j, Z)))
    one_of("norm", k, ("3d", lambda: np.linalg.norm(x), np.linalg.norm(X)),
           ("fro", lambda: np.linalg.norm(dist(Z, k), "fro"), np.linalg.norm(Z, "fro")),
           ("vector", lambda: np.linalg.norm(dist(W[0], k), ord=2, axis=0), np.linalg.norm(W[0], ord=2, axis=0)),
           ("float32-", lambda: np.linalg.norm(dist(F, k)), np.linalg.norm(F)),
           ("uint8-", lambda: np.linalg.norm(dist(U8, k)), np.linalg.norm(U8)))   # squares that wrap in uint8

# ---- elementwise --------------------------------------------------------------------------------------------
Y = real(7, 5, 4)
for k in range(6):
    x, y, y2 = dist(X, k), dist(Y, k), dist(Y, k + 1)
    check("elementwise", f"layouts{k}", lambda: (x * y2).layout == x.layout and x * y2 + y, X * Y + Y)
    one_of("elementwise", k, ("scalars", lambda: 2 - x / 3.0 + np.float64(1) ** x, 2 - X / 3.0 + 1.0 ** X),
           ("ufuncs", lambda: (x ** 2 - abs(-y)) / np.sqrt(np.exp(y2)), (X ** 2 - abs(-Y)) / np.sqrt(np.exp(Y))),
           ("compare", lambda: x < y, X < Y))
    one_of("elementwise", k, ("plain-full", lambda: x - Y, X - Y),
           ("plain-row", lambda: Y[0, 0] * x + Y[0], Y[0, 0] * X + Y[0]),
           ("zero-d", lambda: np.maximum(np.array(0.5), x), np.maximum(0.5, X)))
    one_of("elementwise", k, ("int", lambda: dist(I, k) * 3 + dist(I, k + 2) // 2, I * 3 + I // 2),
           ("complex", lambda: np.conj(dist(Z, k)) * 1j, np.conj(Z) * 1j),
           ("divmod", lambda: np.divmod(dist(I, k), 3)[0] * 10 + np.divmod(dist(I, k), 3)[1],
            np.divmod(I, 3)[0] * 10 + np.divmod(I, 3)[1]))
check("elementwise", "dtype", lambda: np.add(dist(I, 0), 1, dtype=np.float32), np.add(I, 1, dtype=np.float32))
check("elementwise", "list", lambda: dist(X, 2) + Y[0, 0].tolist(), X + Y[0, 0])
check("sum", "bool", lambda: np.sum(dist(X, 1) < dist(Y, 4), axis=(0, 2)), np.sum(X < Y, axis=(0, 2)))
got = np.array(dist(X, 3), dtype=np.float32)
ok = isinstance(got, np.ndarray) and got.dtype == np.float32 and np.array_equal(got, X.astype(np.float32))
x = dist(X, 1)
ok = ok and np.shape(x) == X.shape and np.ndim(x) == 3 and np.size(x) == X.size and np.size(x, 2) == 4
ok = comm.allreduce(int(ok), op=MPI.MIN)
if rank == 0:
    print(f"CHECK asarray float32-and-metadata {'ok' if ok else 'FAIL'}", flush=True)

# one-operand einsums: pre-passes on blocks
for k in range(3):
    check("einsum", f"sum{k}", lambda: np.einsum("ijk->i", dist(X, k)), np.einsum("ijk->i", X))
    check("einsum", f"trace{k}", lambda: np.einsum("ii->", dist(A[:5], k + 3)), np.trace(A[:5]))
    check("einsum", f"diagonal{k}", lambda: np.einsum("iji->ji", dist(X[:4, :, :4], k + 1)),
          np.einsum("iji->ji", X[:4, :, :4]))

# ---- errors: the same one line on every rank -------------------------------------------------------------
x, i = dist(X, 0), dist(I, 0)
error("out", lambda: np.einsum("ijk,ja->ia", x, B, out=np.zeros((7, 3))))
error("ufunc out", lambda: np.add(x, 1, out=x))
error("reduce", lambda: np.add.reduce(x))
error("matmul shapes", lambda: x @ B)
error("ufunc shapes", lambda: x + dist(Y[:, :, :2], 0))
error("broadcast", lambda: x + np.ones((2, 7, 5, 4)))
error("norm ord", lambda: np.linalg.norm(dist(A, 0), ord=2))
error("negative power", lambda: i ** -1)
error("huge", lambda: np.asarray(DistributedArray.from_blocks(
    np.broadcast_to(np.float64(0), (10**7, 10**7)) if rank == 0 else None, (10**7, 10**7), "root", comm)))
error("copy", lambda: np.array(x, copy=False))
try:
    np.mean(x)
    unsupported = "no error"
except TypeError as exc:
    unsupported = "TypeError" if "no implementation found for 'numpy.mean'" in str(exc) else str(exc)
if rank == 0:
    print(f"ERROR unsupported | {unsupported}", flush=True)
if P > 1:   # the ranks disagree
    odd = rank % 2
    error("sum axis", lambda: np.sum(x, axis=odd))
    error("sum keepdims", lambda: np.sum(x, axis=0, keepdims=bool(odd)))
    error("tensordot axes", lambda: np.tensordot(x, X, axes=([0], [0]) if odd else ([1], [1])))
    error("einsum equation", lambda: np.einsum("ij,jk->ik" if odd else "ij,jk->ki", dist(A, 0), W))
    error("trace offset", lambda: np.trace(x, offset=odd))
    error("transpose axes", lambda: np.transpose(x, (0, 1, 2) if odd else (1, 0, 2)))
    error("norm ord differs", lambda: np.linalg.norm(dist(A, 0), ord="fro" if odd else None))
    error("scalar", lambda: x + rank)
    error("plain shape", lambda: x + np.ones(4 if odd else 1))
    error("plain dtype", lambda: x + np.ones(4, dtype=np.float32 if odd else np.float64))
    error("vdot shapes", lambda: np.vdot(x, X if odd else X[:, :, :2]))
    error("matmul plain", lambda: dist(A, 0) @ (W if odd else W[:, :2]))
    even, root = dist(X, 0), dist(X, 3)
    error("layouts", lambda: np.add(even if odd else root, 1.0))
    error("asarray dtype", lambda: np.asarray(x, dtype=np.float32 if odd else np.float64))
    error("sum dtype", lambda: np.sum(i, dtype=np.float32 if odd else None))
if rank == 0:
    print("DONE", flush=True)
'''

_RUNS = {}


def readme_snippet() -> str:
    """The README's example of numpy's functions on distributed arrays."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    start = text.index("```python", text.index("### numpy's functions on distributed arrays")) + len("```python")
    return text[start:text.index("```", start)]


def run(nprocs, tmp_path_factory) -> str:
    """The checks' output on ``nprocs`` ranks, then the README's example's (one launch per P, shared by the
    tests)."""
    if nprocs not in _RUNS:
        script = CHECKS + f"exec({readme_snippet()!r}, {{}})\nif rank == 0:\n    print('README ok')\n"
        _RUNS[nprocs] = check_mpi(nprocs, script, tmp_path=tmp_path_factory.mktemp(f"np{nprocs}"), timeout=240)
    assert "DONE" in _RUNS[nprocs], _RUNS[nprocs]
    return _RUNS[nprocs]


def lines(out: str, prefix: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(prefix)]


P_RUNS = [1, 3, 4]
FAMILIES = ["einsum", "tensordot", "matmul", "sum", "trace", "transpose", "vdot", "norm", "elementwise", "asarray"]


@pytest.mark.parametrize("nprocs", P_RUNS)
@pytest.mark.parametrize("family", FAMILIES)
def test_numpy_functions_on_distributed_arrays_equal_numpy(family, nprocs, tmp_path_factory):
    found = lines(run(nprocs, tmp_path_factory), f"CHECK {family} ")
    assert found and all(line.endswith(" ok") for line in found), "\n".join(l for l in found if not l.endswith(" ok"))


@pytest.mark.parametrize("nprocs", P_RUNS)
def test_readme_example_runs_as_printed(nprocs, tmp_path_factory):
    assert "README ok" in run(nprocs, tmp_path_factory)


ERRORS = {
    "out": "np.einsum: out= is not supported on DistributedArrays",
    "ufunc out": "np.add: out= is not supported on DistributedArrays",
    "reduce": "np.add.reduce on DistributedArrays: only elementwise calls",
    "matmul shapes": "np.matmul: (7, 5, 4) @ (5, 3): 4 columns, 5 rows",
    "ufunc shapes": "distributed operands need one shape",
    "broadcast": "a plain operand of shape (2, 7, 5, 4) does not broadcast",
    "norm ord": "np.linalg.norm(ord=2, axis=None, keepdims=False)",
    "negative power": "Integers to negative integer powers are not allowed",
    "huge": "the whole array is 800,000,000,000,000 bytes, more than the",
    "copy": "copy=False): gathering a distributed array copies it",
    "unsupported": "TypeError",
}
DISAGREEMENTS = {
    "sum axis": "the ranks disagree on np.sum axis: (0,) on ranks 0, 2; (1,) on rank",
    "sum keepdims": "the ranks disagree on keepdims",
    "tensordot axes": "the ranks disagree on np.tensordot",
    "einsum equation": "the ranks disagree on equation",
    "trace offset": "the ranks disagree on offset",
    "transpose axes": "the ranks disagree on np.transpose axes",
    "norm ord differs": "the ranks disagree on np.linalg.norm",
    "scalar": "the ranks disagree on np.add",
    "plain shape": "the ranks disagree on np.add",
    "plain dtype": "the ranks disagree on",
    "vdot shapes": "np.vdot",
    "matmul plain": "the ranks disagree on np.matmul operand 1: ('array', (5, 2), '<f8') on ranks 0, 2",
    "layouts": "the ranks disagree on np.add",
    "asarray dtype": "the ranks disagree on np.asarray dtype",
    "sum dtype": "the ranks disagree on dtype",
}


@pytest.mark.parametrize("nprocs", P_RUNS)
def test_errors_are_one_line_and_the_same_on_every_rank(nprocs, tmp_path_factory):
    out = run(nprocs, tmp_path_factory)
    expected = ERRORS | (DISAGREEMENTS if nprocs > 1 else {})
    found = {line.split(" | ")[0][len("ERROR "):]: line.split(" | ", 1)[1] for line in lines(out, "ERROR ")}
    assert set(found) == set(expected), sorted(set(found) ^ set(expected))
    for label, needle in expected.items():
        assert needle in found[label] and "DIFFER" not in found[label], (label, found[label])
