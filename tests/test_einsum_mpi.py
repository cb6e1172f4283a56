"""The one-shot ``deinsum.einsum`` takes numpy.einsum's arguments (issue 30): a table of numpy's call forms
at P = 1 and 3, each equal to numpy's own call, and the ways to get them wrong refused alike on every rank."""
import pytest

from mpirun import check_mpi

JOB = """
import numpy as np, deinsum
from mpi4py import MPI

comm = MPI.COMM_WORLD
rng = np.random.default_rng(0)
A, B, C = rng.standard_normal((5, 4)), rng.standard_normal((4, 3)), rng.standard_normal((4, 4))
v = rng.standard_normal(4)
CASES = [  # (args, numpy keyword arguments): each run by numpy and by deinsum
    (("ij,jk->ik", A, B), {}),
    (("ij,jk", A, B), {"optimize": "greedy"}),
    (("ij,jk->ik", A, B), {"optimize": True, "order": "F"}),
    (("ij,jk->ki", A, B), {"order": "C"}),
    (("ij,jk->ik", A, B), {"dtype": np.float32, "casting": "same_kind"}),
    (("i,i", v, v), {}),
    (("ii->i", C), {}),
    (("ii", C), {}),
    ((A, [0, 1], B, [1, 2], [0, 2]), {}),
    ((A, [0, 1], B, [1, 2]), {"optimize": "optimal"}),
    ((C, [Ellipsis, 1], v, [1]), {}),
    ((v, [30], v, [31]), {}),
]
failures = []
for n, (args, kwargs) in enumerate(CASES):
    want = np.einsum(*args, **kwargs)
    out = np.empty(want.shape, dtype=want.dtype) if want.ndim else None
    got = deinsum.einsum(*args, **kwargs)
    filled = deinsum.einsum(*args, out=out, **kwargs) if out is not None else out
    if np.shape(got) != want.shape or not np.allclose(got, want, rtol=1e-5) or np.result_type(got) != want.dtype:
        failures.append(f"case {n}: {got!r} != {want!r}")
    if kwargs.get("order") == "F" and want.ndim > 1 and not got.flags.f_contiguous:
        failures.append(f"case {n}: order F not kept")
    if out is not None and (filled is not out or not np.allclose(out, want, rtol=1e-5)):
        failures.append(f"case {n}: out not filled")
root = deinsum.einsum("ij,jk->ik", *((A, B) if comm.rank == 0 else (None, None)), inputs="root", result="root")
if (comm.rank == 0) != (root is not None) or (root is not None and not np.allclose(root, A @ B)):
    failures.append("inputs='root'")
prog = deinsum.compile("ij,jk->ik", A.shape, B.shape, inputs="local")
blocks = prog.input_blocks(comm.rank, comm.size, result="all")
local = deinsum.einsum("ij,jk->ik", A[blocks[0]], B[blocks[1]], inputs="local", shapes=[A.shape, B.shape])
if not np.allclose(local, A @ B):
    failures.append("inputs='local'")
WRONG = {
    "local without shapes": (lambda: deinsum.einsum("ij,jk->ik", A[blocks[0]], B[blocks[1]], inputs="local"),
                             "pass shapes="),
    "None on one rank": (lambda: deinsum.einsum("ij,jk->ik", None if comm.rank == comm.size - 1 else A, B),
                         "operand 0 is None"),
    "out of another shape": (lambda: deinsum.einsum("ij,jk->ik", A, B, out=np.empty((2, 2))), "out: shape"),
    "out of a narrower type": (lambda: deinsum.einsum("ij,jk->ik", A, B, out=np.empty((5, 3), np.int32)),
                               "cannot cast float64 to int32"),
    "a sublist label out of range": (lambda: deinsum.einsum(A, [0, 99], B, [1, 2]), "sublist 0 holds 99"),
    "an unknown order": (lambda: deinsum.einsum("ij,jk->ik", A, B, order="X"), "order='X'"),
}
for name, (call, words) in WRONG.items():
    try:
        call()
        failures.append(f"{name}: no error")
    except deinsum.DeinsumError as exc:
        messages = comm.allgather(str(exc))
        if len(set(messages)) != 1 or words not in messages[0] or "\\n" in messages[0]:
            failures.append(f"{name}: {messages}")
failures = comm.allreduce(failures)
if comm.rank == 0:
    print("FAILURES", failures)
"""


@pytest.mark.parametrize("nprocs", [1, 3])
def test_einsum_takes_numpys_arguments(nprocs, tmp_path):
    out = check_mpi(nprocs, JOB, tmp_path=tmp_path, timeout=300)
    assert out.strip().splitlines()[-1] == "FAILURES []", out
