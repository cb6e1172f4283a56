"""The redistribution layer under real ``mpiexec`` at P = 1..8: bit-exact data, measured bytes == modeled bytes.

One launch per P runs every check (oversubscribed ranks are slow to start); P = 1, 3, 4, 8 by default, every P
under ``-m slow``.
"""
import pytest

from mpirun import DEFAULT_P, check_mpi, some_p

JOB = r'''
import math
import numpy as np
from mpi4py import MPI
from deinsum.decompose import decompose
from deinsum.grids import GridChoice
from deinsum.layout import Layout
from deinsum.placement import even_layout
from deinsum.plan import build_plan
from deinsum.redistribute import plan_redistribution
from deinsum.runtime.exchange import ByteLog, Collective, Transfer, element_type, exchange
from deinsum.tables import rank_tables

comm = MPI.COMM_WORLD
P, rank = comm.size, comm.rank
DTYPES = [np.float32, np.float64, np.complex64, np.complex128, np.int64, np.uint8, np.int16, np.float16,
          np.longdouble, np.clongdouble]
SHAPES = [(7,), (5, 1, 3), (2, 11), (13, 2, 1), (1,), ()]   # primes, sizes below grid dims, size 1, 0-d
log = ByteLog()
checks = 0


def run(plan, local, dtype, label):
    """Exchange, and check the bytes handed to MPI against the model."""
    global checks
    block = exchange(comm, plan.table(rank), local, dtype, log, label)
    _, sent, received = log.records[-1]
    size = np.dtype(dtype).itemsize
    assert (sent, received) == (plan.bytes_sent(rank, size), plan.bytes_received(rank, size)), (label, sent, received)
    checks += 1
    return block


def same(a, b):
    """Bit-exact, except the padding bytes of x87 long doubles, which carry no value."""
    if a.dtype in (np.longdouble, np.clongdouble) and a.dtype.itemsize > 10:
        return a.dtype == b.dtype and np.array_equal(a, b)
    return a.dtype == b.dtype and a.tobytes() == b.tobytes()


def three_grids(shape):
    """Even over all ranks; last axis split with replicas; axes crossed on 2*(P//2) ranks (one idle if P is odd)."""
    nd = len(shape)
    cols = max(d for d in range(1, math.isqrt(P) + 1) if P % d == 0)
    pairs = (P // 2, 2) if P > 1 else (1, 1)
    return [even_layout(shape, P),
            Layout(shape, (P // cols, cols), tuple([None] * (nd - 1) + [1]) if nd else ()),
            Layout(shape, pairs, ((1, 0) + (None,) * (nd - 2)) if nd >= 2 else ((1,) if nd else ()))]


def sample(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    wide = (2,) + tuple(shape)                    # root passes a non-contiguous view
    if np.issubdtype(dtype, np.integer):
        data = rng.integers(0, 100, size=wide)
    else:
        data = rng.standard_normal(wide) * 1e3
        if np.issubdtype(dtype, np.complexfloating):
            data = data + 1j * rng.standard_normal(wide)
    return np.moveaxis(data.astype(dtype), 0, -1)[..., 1] if shape else data.astype(dtype)[1]


# 1. scatter -> three grids -> gather / allgather, bit-exact, every dtype and shape
for s, shape in enumerate(SHAPES):
    grids = three_grids(shape)
    for dtype in DTYPES:
        x = sample(shape, dtype, seed=s)
        block = run(plan_redistribution(Layout.on_root(shape, P), grids[0], P), x if rank == 0 else None, dtype,
                    "scatter")
        for src, dst in zip(grids, grids[1:]):
            local = np.asfortranarray(block) if block is not None and block.ndim > 1 else block
            block = run(plan_redistribution(src, dst, P), local, dtype, "move")
        gathered = run(plan_redistribution(grids[-1], Layout.on_root(shape, P), P), block, dtype, "gather")
        everywhere = run(plan_redistribution(grids[-1], Layout.replicated(shape, P), P), block, dtype, "allgather")
        assert same(everywhere, x), (shape, dtype)
        if rank == 0:
            assert same(gathered, x), (shape, dtype)
        else:
            assert gathered is None
        picked = run(plan_redistribution(Layout.replicated(shape, P), grids[1], P), x, dtype, "slice")
        assert grids[1].block(rank) is None or same(picked, x[grids[1].block(rank)])

# 1b. row blocks all-gather (MPI_Allgather; MPI_Allgatherv where the last rank holds none), column blocks
# (strided) run the Alltoallw
for axis, holders in ((0, P), (1, P), (0, P - 1)) if P > 2 else ((0, P), (1, P)) if P > 1 else ():
    shape = (3, 2 * holders) if axis else (2 * holders, 3)
    move = plan_redistribution(Layout(shape, (holders,), (None, 0) if axis else (0, None)),
                               Layout.replicated(shape, P), P)
    assert move.collectives == ((None,) if axis else ("allgather",) if holders == P else ("allgatherv",)), move
    x = sample(shape, np.float64, seed=axis)
    assert same(run(move, None if move.src.block(rank) is None else x[move.src.block(rank)], np.float64,
                    "allgather"), x)
if P == 4:   # a block on every rank, out of rank order (tensor axis 0 on grid axis 1): MPI_Allgatherv
    move = plan_redistribution(Layout((2, 2, 3), (2, 2), (1, 0, None)), Layout.replicated((2, 2, 3), P), P)
    assert move.collectives == ("allgatherv",), move
    x = sample((2, 2, 3), np.float64, seed=2)
    assert same(run(move, x[move.src.block(rank)], np.float64, "allgather"), x)
if P > 1:   # an allgather's table on a communicator numbered otherwise than the world: refused on every rank
    reversed_ranks = comm.Split(0, P - 1 - rank)
    move = plan_redistribution(Layout((2 * P, 3), (P,), (0, None)), Layout.replicated((2 * P, 3), P), P)
    element = element_type(np.float64)
    try:
        Collective(reversed_ranks, move.table(rank)[0], np.float64, element, comm)
    except ValueError as e:
        assert "allgather on ranks that are not its communicator's, in order" in str(e), e
    else:
        raise AssertionError("a reversed communicator's allgather ran")
    element.Free()
    reversed_ranks.Free()

# 1c. a transpose: every peer's piece has one shape, so the Transfer commits one datatype each way, however many
# peers (placed by displacement; at P = 65,536 one move of TTMc-O5 had 104,446 peers' types)
if P > 1:
    shape = (4 * P, 4 * P)
    rows, columns = Layout(shape, (P,), (0, None)), Layout(shape, (P,), (None, 0))
    element = element_type(np.float64)
    transfer = Transfer(comm, rank_tables(rows, columns, P, rank)[0], np.float64, element)
    try:
        x = sample(shape, np.float64, seed=7)
        if not transfer.big_sends:   # (a forced message limit, test_safety_mpi's, sends pieces point-to-point)
            assert transfer.created == 2, transfer.created
        assert transfer.bytes_sent == transfer.bytes_received == 16 * 8 * (P - 1), transfer.bytes_sent
        assert same(transfer(x[rows.block(rank)]), x[columns.block(rank)])                 # Alltoallw
        assert same(transfer.post(x[rows.block(rank)])[1](), x[columns.block(rank)])       # Ialltoallw
    finally:
        transfer.free()
        element.Free()

# 2. partial sums: summand k holds (k+1) * block; reduce into an even layout and onto the root
for shape in [(7, 3), (5,), (2, 1, 4)]:
    x = np.arange(1, math.prod(shape) + 1).reshape(shape)
    for grid in {(1, P), (P // 2 or 1, 2 if P > 1 else 1), (2 if P > 1 else 1, P // 2 or 1)}:
        partial = Layout(shape, grid, (0,) + (None,) * (len(shape) - 1), (1,))
        k = partial.summand_index(np.arange(P))[rank]
        expect = x * (grid[1] * (grid[1] + 1) // 2)
        for dtype in (np.int64, np.float64, np.complex64):
            local = None if partial.block(rank) is None else (x[partial.block(rank)] * (k + 1)).astype(dtype)
            for dst in (even_layout(shape, P), Layout(shape, grid, partial.axes), Layout.on_root(shape, P),
                        Layout.replicated(shape, P)):
                block = run(plan_redistribution(partial, dst, P), local, dtype, "reduce")
                assert dst.block(rank) is None or np.array_equal(block, expect[dst.block(rank)].astype(dtype))

# 3. one local kernel on blocks + partial-sum reduction equals numpy; group bytes == planned volume
KERNELS = [("ijk", ("ij", "jk"), "ik", dict(i=7, j=5, k=6)), ("ijka", ("ijk", "ja", "ka"), "ia", dict(i=5, j=4, k=3, a=2))]
for indices, inputs, output, sizes in KERNELS:
    spec = ",".join(inputs) + "->" + output
    plan = build_plan(decompose(spec, *[[sizes[c] for c in t] for t in inputs]), P)
    grid = max(plan.groups, key=lambda g: len(g.indices)).grid
    choice = GridChoice(indices, tuple(dict(zip(grid.indices, grid.dims))[c] for c in indices), output, P, 0, "")
    rng = np.random.default_rng(1)
    for dtype in (np.float64, np.int64):
        operands = [rng.integers(-9, 9, size=[sizes[c] for c in t]).astype(dtype) for t in inputs]
        blocks = []
        for t, array in zip(inputs, operands):
            even = even_layout(array.shape, P)
            block = run(plan_redistribution(Layout.on_root(array.shape, P), even, P), array if rank == 0 else None,
                        dtype, "scatter " + t)
            block = run(plan_redistribution(even, choice.layout(t, sizes), P), block, dtype, "in " + t)
            blocks.append(block)
        part = np.einsum(spec, *blocks) if rank < choice.used else None
        out_layout = choice.layout(output, sizes)
        target = even_layout(out_layout.shape, P)
        block = run(plan_redistribution(out_layout, target, P), part, dtype, "out " + output)
        result = run(plan_redistribution(target, Layout.on_root(target.shape, P), P), block, dtype, "gather " + output)
        if rank == 0:
            assert np.array_equal(result, np.einsum(spec, *operands)), spec

        # 4. the same reduction through MPI's Allreduce on the grid's reduction Cart_sub agrees
        cart = comm.Create_cart(list(choice.dims), reorder=False)
        allreduced = run(plan_redistribution(out_layout, choice.layout(output, sizes, partial=False), P),
                         part, dtype, "allreduce")
        if rank < choice.used:
            reduction = cart.Sub([c not in output for c in indices])
            assert reduction.size == math.prod(choice.dims[g] for g in choice.reduction_dims)
            summed = np.empty_like(part)
            reduction.Allreduce(part, summed, op=MPI.SUM)
            assert np.array_equal(summed, allreduced)
            reduction.Free()
            cart.Free()
        else:
            assert cart == MPI.COMM_NULL and allreduced is None

assert len(log.records) == checks
total = comm.reduce(checks, op=MPI.SUM)
if rank == 0:
    print("OK", P, total)
'''


@pytest.mark.parametrize("nprocs", some_p(*DEFAULT_P))
def test_redistribution_layer_under_mpiexec(nprocs, tmp_path):
    out = check_mpi(nprocs, JOB, tmp_path=tmp_path, timeout=170)
    assert out.split()[:2] == ["OK", str(nprocs)], out
