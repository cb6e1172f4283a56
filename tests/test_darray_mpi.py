"""Distributed arrays under real mpiexec (issue 13): bit-exact round trips, bad layouts as one line on every
rank, programs that take and return them without moving what already fits, the local algebra."""
from pathlib import Path

import pytest

from mpirun import check_mpi, run_mpi

ROUND_TRIPS = r'''
import itertools
import numpy as np
from mpi4py import MPI
from deinsum import DistributedArray, Layout
from deinsum.grids import balanced_split

comm = MPI.COMM_WORLD
P = comm.size
SHAPES = [(7,), (1, 5), (13, 1, 3), (5, 7), (2, 3, 5), (11, 2), (1, 1), (0, 4), ()]
DTYPES = [np.float32, np.float64, np.complex128, np.int64]


def layouts(shape):
    """even, replicated, root, and a few grids over all or some ranks with nested and replicated splits."""
    yield "even"; yield "replicated"; yield "root"
    if shape:
        yield Layout(shape, (P,), (0,) + (None,) * (len(shape) - 1))
        yield Layout(shape, (P,), (None,) * len(shape))
        grid = balanced_split(shape, P)
        yield Layout(shape, tuple(reversed(grid)), tuple(reversed(range(len(shape)))))
        if P >= 2:
            yield Layout(shape, (2, P // 2), ((0, 1),) + (None,) * (len(shape) - 1))
            yield Layout(shape, (P - 1,), (None,) * (len(shape) - 1) + (0,))


count = 0
for shape in SHAPES:
    # every ordered pair of layouts, each in one of the four dtypes, every dtype once per pair across shapes
    for k, (a, b) in enumerate(list(itertools.product(list(layouts(shape)), repeat=2))[len(shape)::3]):
        dtype = DTYPES[(k + len(shape)) % len(DTYPES)]
        rng = np.random.default_rng(k)
        whole = (rng.standard_normal(shape) * 1000).astype(dtype) if shape else np.array(3, dtype=dtype)
        if np.dtype(dtype).kind == "c":
            whole = whole + 1j * np.flip(whole)
        x = DistributedArray.from_global(whole, a, comm) if count % 2 else DistributedArray.scatter(
            whole if comm.rank == 0 else None, a, comm)
        y = x.redistribute(b)
        assert y.dtype == whole.dtype and y.shape == whole.shape
        assert (y.local is None) == (y.block is None)
        root = count % P if count % 3 else None
        got = y.gather(root=root)
        assert (got is None) == (root is not None and comm.rank != root), (root, comm.rank)
        assert got is None or (got.dtype == whole.dtype and np.array_equal(got, whole)), (shape, dtype, a, b)
        count += 1
if comm.rank == 0:
    print("round trips", count)
'''


@pytest.mark.parametrize("nprocs", [3, *[pytest.param(p, marks=pytest.mark.slow) for p in (1, 2, 4, 5, 6, 7, 8)]])
def test_round_trips_are_bit_exact(nprocs, tmp_path):
    out = check_mpi(nprocs, ROUND_TRIPS, tmp_path=tmp_path, timeout=240)
    assert "round trips" in out and int(out.split("round trips")[1].split()[0]) > 80


BAD = r'''
import numpy as np
from mpi4py import MPI
import deinsum
from deinsum import DistributedArray, Layout
from deinsum.placement import even_layout

comm = MPI.COMM_WORLD
x = np.arange(24.0).reshape(4, 6)


def attempt(label, call):
    try:
        call()
        print(f"{label} rank {comm.rank} NO ERROR @@", flush=True)
    except deinsum.DeinsumError as exc:
        print(f"{label} rank {comm.rank} ERROR {exc} @@", flush=True)


attempt("grid", lambda: DistributedArray.from_global(x, "5x1: 0, -", comm))
attempt("axis", lambda: DistributedArray.from_global(x, "2: 0, 3", comm))
attempt("text", lambda: DistributedArray.from_global(x, "two by two", comm))
attempt("naxes", lambda: DistributedArray.from_global(x, "1: 0", comm))
block = np.zeros((3, 6)) if comm.rank == 1 else x[even_layout(x.shape, comm.size).block(comm.rank)]
attempt("block", lambda: DistributedArray.from_blocks(block, x.shape, "even", comm))
attempt("redistribute", lambda: DistributedArray.from_global(x, "even", comm).redistribute("9: -, 0"))
mixed = DistributedArray.from_global(x, "even", comm)
attempt("call", lambda: deinsum.einsum("ij,jk->ik", mixed, None))
attempt("fill", lambda: DistributedArray.full((4,), "abc", "2: 0", comm=comm))
attempt("ragged", lambda: DistributedArray.scatter([[1.0, 2.0], [3.0]] if comm.rank == 0 else None, "even", comm))
attempt("disagree", lambda: mixed.redistribute("2: 0, -" if comm.rank == 0 else "replicated"))
attempt("root", lambda: mixed.gather(root=comm.rank % 2))
attempt("bad root", lambda: mixed.gather(root=comm.size if comm.rank == 1 else 0))
attempt("matmul", lambda: mixed.matmul(np.ones((6 if comm.rank != 2 else 5, 2))))
attempt("with_local", lambda: mixed.with_local(mixed.local, (4, 7) if comm.rank == 3 else (4, 6)))
attempt("with_local block", lambda: mixed.with_local(np.ones((1, 1)) if comm.rank == 2 else mixed.local))
attempt("comm", lambda: deinsum.einsum("ij,jk->ik", x, x.T, comm="world" if comm.rank == 1 else comm))
attempt("root None", lambda: deinsum.compile("ij,jk->ik", inputs="root")(*([None, None] if comm.rank == 0 else [x, x.T])))
attempt("bool", lambda: DistributedArray.from_global(x > 3, "even", comm))
attempt("bool blocks", lambda: mixed.map_blocks(lambda b: b > 3))
'''


def test_bad_layouts_are_one_line_errors_on_every_rank(tmp_path):
    res = run_mpi(4, BAD, tmp_path=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = [line.strip() for line in res.stdout.split("@@") if " rank " in line]
    for label, needle in [("grid", "needs 5 ranks, only 4 given"), ("axis", "grid dimension 3 does not exist"),
                          ("text", "is not a mode"), ("naxes", "names 1 axes, the tensor has 2"),
                          ("block", "rank 1: from_blocks: block of shape (3, 6), layout 2x2: 0, 1 gives this rank (2, 3)"),
                          ("redistribute", "needs 9 ranks"),
                          ("call", "operand 1 is None: beside DistributedArrays pass whole arrays"),
                          ("fill", "full: fill 'abc' is not a float64"), ("ragged", "scatter: rank 0's array"),
                          ("disagree", "the ranks disagree on layout"),
                          ("root", "the ranks disagree on gather root"),
                          ("bad root", "rank 1: gather: root 4 is not a rank of a communicator of 4"),
                          ("matmul", "rank 2: matmul: (4, 6) @ (5, 2): the matrix must be (6, n)"),
                          ("with_local", "rank 3: with_local: new shape (4, 7) from (4, 6)"),
                          ("with_local block", "rank 2: with_local: block of shape (1, 1), layout 2x2: 0, 1 "
                                               "gives this rank (2, 3)"),
                          ("comm", "rank 1: comm='world': expected an mpi4py communicator such as MPI.COMM_WORLD"),
                          ("root None", "rank 0: operand 0 is None: with inputs='root' rank 0 passes the whole arrays"),
                          ("bool", "from_global: an array of dtype bool: expected an integer, float or complex type"),
                          ("bool blocks", "map_blocks: blocks of dtype bool: expected an integer, float or complex")]:
        mine = [line for line in lines if line.startswith(label + " rank")]
        assert len(mine) == 4, (label, mine)
        messages = {line.split(" ERROR ", 1)[-1] for line in mine}
        assert all(" ERROR " in line for line in mine) and len(messages) == 1, (label, mine)
        assert needle in messages.pop(), (label, mine)


PROGRAMS = r'''
import numpy as np
from mpi4py import MPI
import deinsum
from deinsum import DistributedArray
from deinsum.placement import even_layout

comm = MPI.COMM_WORLD
rng = np.random.default_rng(1)
X, B, C = rng.standard_normal((9, 7, 5)), rng.standard_normal((7, 3)), rng.standard_normal((5, 3))
want = np.einsum("ijk,ja,ka->ia", X, B, C)
prog = deinsum.compile("ijk,ja,ka->ia")
home = prog.plan([X.shape, B.shape, C.shape], comm.size, inputs="local", result="distributed").entry[0]
x = DistributedArray.from_global(X, home, comm)
m = prog(x, B, C)                                 # X where the plan wants it: it does not move
assert isinstance(m, DistributedArray) and prog.last_run.matches_model
assert "in0" not in {mv.tensor for mv in prog.last_plan.moves}
assert np.allclose(m.gather(), want)
even = DistributedArray.from_global(X, "even", comm)
m2 = prog(even, DistributedArray.from_global(B, "root", comm), C, result="even")
assert m2.layout == even_layout(want.shape, comm.size) and prog.last_run.matches_model
assert np.allclose(m2.gather(), want)
assert np.allclose(deinsum.einsum("ijk,ja,ka->ia", even, B, C, result="all"), want)
W = rng.standard_normal((3, 4))
full = m.gather()
for a in (m, m2):
    assert np.allclose(a.matmul(W).gather(), full @ W) and a.matmul(W).layout.grid == a.layout.grid
    assert np.allclose(a.gram(), full.T @ full)
    assert np.isclose(a.norm(), np.linalg.norm(full)) and np.isclose(a.vdot(m), np.vdot(full, full))
assert np.allclose(m.map_blocks(np.negative).gather(), -full)
assert np.allclose(deinsum.einsum("ijk,ja,ka->ia", x, B.tolist(), C, result="all"), want)   # a list beside them
at_root = deinsum.compile("ijk,ja,ka->ia", result="root")(x, B, C)           # a compiled result mode holds
assert (at_root is None) == (comm.rank != 0) and (at_root is None or np.allclose(at_root, want))
# one dtype on every rank, also where a rank holds nothing ("2: 0" leaves ranks >= 2 empty)
k = DistributedArray.from_global(np.arange(12).reshape(6, 2), "2: 0, -" if comm.size > 1 else "even", comm)
assert k.map_blocks(np.sqrt).gather().dtype == np.float64 and np.allclose(k.map_blocks(np.sqrt).gather(),
                                                                          np.sqrt(np.arange(12).reshape(6, 2)))
K = np.arange(12).reshape(6, 2)
assert k.gram().dtype == np.int64 and np.array_equal(k.gram(), K.T @ K)
z = DistributedArray.from_global(np.arange(6.0).reshape(3, 2) * (1 + 1j), "replicated", comm)
assert np.isclose(z.vdot(z), np.vdot(z.gather(), z.gather())) and np.allclose(z.matmul(1j * np.eye(2)).gather(),
                                                                                z.gather() @ (1j * np.eye(2)))
z = DistributedArray.full((5, 3), 2, "even", dtype=np.int32, comm=comm)
assert z.gather().dtype == np.int32 and np.array_equal(z.gather(), np.full((5, 3), 2))
e = DistributedArray.full((5, 3), None, "replicated", comm=comm)
assert e.local.shape == (5, 3) and e.dtype == np.float64
print("programs ok", comm.rank)
'''


@pytest.mark.parametrize("nprocs", [1, 3, pytest.param(4, marks=pytest.mark.slow)])
def test_programs_take_and_return_distributed_arrays(nprocs, tmp_path):
    out = check_mpi(nprocs, PROGRAMS, tmp_path=tmp_path, timeout=120)
    assert out.count("programs ok") == nprocs


def readme_snippet() -> str:
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    start = text.index("```python", text.index("## Distributed arrays")) + len("```python")
    return text[start:text.index("```", start)]


def test_readme_distributed_array_example_runs_on_four_ranks_as_printed(tmp_path):
    out = check_mpi(4, readme_snippet(), tmp_path=tmp_path, timeout=120)
    assert out.startswith("DistributedArray(40x30x20 float64") and out.count("rank") >= 1
