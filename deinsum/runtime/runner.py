"""One rank's run-time state, kept across calls, and the named operations a program is written in.

STANDALONE: imports only numpy, mpi4py and the sibling runtime modules
(emitted scripts carry these files in their runtime payload). A program, in-process or
emitted, is straight-line code over a :class:`Runtime`::

    grid0_sum = rt.cart_sub((2, 2, 2, 1), remain=(1, 2))
    in0 = rt.scatter(in0, move=0)
    if rt.member((2, 2, 2, 1)):
        out = rt.contract_group(("ja", "ka", "ijk"), "ia", in1, in2, in0)
    out = rt.reduce_scatter(out, move=3, comm=grid0_sum)
    out = rt.gather(out, move=3, step=1)

A move step whose blocks are regular runs MPI's collective of its name
(:class:`~deinsum.runtime.exchange.Collective`: ``rt.allreduce``, ``rt.allgather``,
``rt.reduce_scatter``), every other one the same subarray ``Alltoallw``
(:class:`~deinsum.runtime.exchange.Transfer`), its name saying what it amounts to,
and a ``slice`` no MPI call. Communicators and datatypes are created on first use
and kept until :meth:`Runtime.close` (``created`` counts them).
"""
import math
import os
from functools import partialmethod

import numpy as np
from mpi4py import MPI

from ..peak import ROUND_PIECES
from ..layout import Layout, block_range
from ..tables import native, table_words
from .exchange import ByteLog, Collective, Transfer, element_type, local_part
from .blas import agree_gemm_routes, set_stream_threads
from .kernels import contract_group, unary
from .libraries import array_module

PHASES = ("distribute", "compute", "reduce", "redistribute", "gather", "host_to_device", "device_to_host")


class Clock:
    """Wall-clock seconds per phase, accumulated over ``with clock("phase"):`` blocks.

    >>> clock = Clock()
    >>> with clock("compute"):
    ...     pass
    >>> sorted(clock.seconds)
    ['compute']
    """

    def __init__(self):
        self.seconds = {}
        self._phase = None

    def __call__(self, phase):
        self._phase = phase
        return self

    def __enter__(self):
        self._start = MPI.Wtime()
        return self

    def __exit__(self, *exc):
        self.seconds[self._phase] = self.seconds.get(self._phase, 0.0) + MPI.Wtime() - self._start
        return False


def pin_blas_threads(node_ranks):
    """Lower BLAS (and TBLIS) threads so that ``node_ranks`` (the ranks on this node) x threads <= cores
    (needs threadpoolctl); deinsum's streaming kernels then run on as many threads.

    Never raises a limit the caller set. Returns the threads per rank, or None without threadpoolctl.
    """
    try:
        from threadpoolctl import threadpool_info, threadpool_limits
    except ImportError:  # optional in emitted scripts
        return None
    now = max((pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"), default=1)
    threads = max(1, min(now, (os.cpu_count() or 1) // node_ranks))
    threadpool_limits(threads, user_api="blas")
    set_stream_threads(threads)
    try:  # TBLIS (the transposes of the `fast` extra) keeps its own thread count
        import pytblis
    except ImportError:
        return threads
    pytblis.set_num_threads(min(threads, pytblis.get_num_threads()))
    return threads


class Runtime:
    """This rank's state for one plan on ``comm``: communicators, datatypes and exchange tables.

    ``moves[k]`` is ``(timer, label, tables)`` of move ``k``: the phase it is
    timed under, its name in the byte log, and this rank's table of each of its
    steps, peers numbered in the world (:func:`deinsum.tables.rank_tables`).
    ``log`` and ``clock`` measure the current call (:meth:`reset` starts a new one).
    With a ``device`` (a :class:`~deinsum.runtime.gpu.Device`) groups compute on
    the GPU and moves stage device blocks through host memory.
    """

    def __init__(self, comm, dtype, moves, device=None):
        self.comm, self.rank, self.dtype = comm, comm.Get_rank(), np.dtype(dtype)
        self.moves, self.device = moves, device
        self.created = {"communicators": 0, "datatypes": 0}
        self._carts, self._subs, self._transfers = {}, {}, {}
        self._element, self._posted, self._ahead = None, [], {}
        self.world = comm
        agree_gemm_routes(comm)   # (collective: every rank routes its GEMMs as rank 0 does)
        self.reset()

    def reset(self):
        """Start measuring a new call."""
        self.log, self.clock = ByteLog(), Clock()

    @property
    def model_bytes(self):
        """(bytes sent, bytes received) per call that this rank's tables plan."""
        sent, received = zip(*[table_words(tables) for _, _, tables in self.moves]) if self.moves else ((), ())
        return sum(sent) * self.dtype.itemsize, sum(received) * self.dtype.itemsize

    # ---- communicators --------------------------------------------------------------------------
    def member(self, grid):
        """Whether this rank has a block of the iteration space of ``grid`` (ranks ``< prod(grid)``)."""
        return self.rank < math.prod(grid)

    def cart(self, grid):
        """``Create_cart(grid, reorder=False)`` of the world (COMM_NULL off the grid); collective, made once."""
        grid = tuple(grid)
        if grid not in self._carts:
            self._carts[grid] = self.comm.Create_cart(list(grid), reorder=False)
            self.created["communicators"] += 1
        return self._carts[grid]

    def cart_sub(self, grid, remain):
        """The ``Cart_sub`` of :meth:`cart` ``(grid)`` keeping grid dims ``remain`` (COMM_NULL off the grid);
        collective on the world, made once."""
        key = (tuple(grid), tuple(remain))
        if key not in self._subs:
            cart = self.cart(grid)
            sub = MPI.COMM_NULL
            if cart != MPI.COMM_NULL:
                sub = cart.Sub([d in remain for d in range(len(grid))])
                self.created["communicators"] += 1
            self._subs[key] = sub
        return self._subs[key]

    # ---- data movement --------------------------------------------------------------------------
    def move(self, kind, x, move, step=0, comm=None):
        """Step ``step`` of move ``move`` on ``comm`` (default: the world); ``kind`` names the collective, which
        is MPI's own where the step's table is a native one (of that kind), else an ``Alltoallw``.

        Ranks outside ``comm`` hold nothing before and after. Bytes go to the log under the move's label.
        """
        return self.wait(self.post(kind, x, move, step, comm, wait=True))

    def post(self, kind, x, move, step=0, comm=None, wait=False):
        """:meth:`move` started, for :meth:`wait` to end: an ``Alltoallw`` as ``Ialltoallw``, so that a group in
        rounds brings round t + 1's pieces while round t computes (prefetch); MPI's own collectives run at once."""
        comm = self.world if comm is None else comm
        timer, label, tables = self.moves[move]
        if self.device is not None:
            x = self.device.download(x, self.clock)
        with self.clock(timer):
            if kind == "slice":   # nothing to send or receive on any rank: no MPI call
                return timer, [], lambda: local_part(tables[step], x, self.dtype)
            if comm == MPI.COMM_NULL:
                if x is not None:
                    raise ValueError(f"rank {self.rank}: holds a block of {label} outside the {kind} communicator")
                return timer, [], lambda: None
            if native(tables[step]) and tables[step][4].removesuffix("v") != kind:   # (allgatherv: an allgather)
                raise ValueError(f"rank {self.rank}: {label} step {step} is an MPI {tables[step][4]}, not a {kind}")
            transfer = self._transfer(move, step, comm, tables[step])
            requests, finish = transfer.post(x, wait)
        self.log.add(f"{label} ({kind})", transfer.bytes_sent, transfer.bytes_received)
        self._posted += requests
        return timer, requests, finish

    def wait(self, posted):
        """The block a :meth:`post` brings, once it has come."""
        timer, requests, finish = posted
        with self.clock(timer):
            out = finish()
        self._posted = [r for r in self._posted if r]   # (waited ones are null)
        return out

    def prefetch(self, kind, x, move, step, steps, comm=None):
        """Step ``step`` of move ``move``, one round of a group in ``steps`` rounds, waited for, and step ``step + 1``
        posted (:meth:`post`) before it is returned: the next round's pieces move while this round computes."""
        posted = self._ahead.pop(move) if step else self.post(kind, x, move, step, comm)
        block = self.wait(posted)
        if step + 1 < steps:
            self._ahead[move] = self.post(kind, x, move, step + 1, comm)
        return block

    scatter = partialmethod(move, "scatter")
    broadcast = partialmethod(move, "broadcast")
    gather = partialmethod(move, "gather")
    allgather = partialmethod(move, "allgather")
    transpose = partialmethod(move, "transpose")
    reduce = partialmethod(move, "reduce")
    allreduce = partialmethod(move, "allreduce")
    reduce_scatter = partialmethod(move, "reduce_scatter")
    redistribute = partialmethod(move, "redistribute")
    slice = partialmethod(move, "slice")

    def _transfer(self, move, step, comm, table):
        key = (move, step)
        if key not in self._transfers:
            if self._element is None:
                self._element = element_type(self.dtype)
                self.created["datatypes"] += 1
            self._transfers[key] = (Collective(comm, table, self.dtype, self._element, self.world) if native(table)
                                    else Transfer(comm, renumbered(table, self.world, comm), self.dtype, self._element))
            self.created["datatypes"] += self._transfers[key].created
        return self._transfers[key]

    # ---- local compute --------------------------------------------------------------------------
    def contract_group(self, inputs, output, *blocks):
        """A fused group's statement on this rank's blocks (see ``contract_group``), timed as compute."""
        if self.device is not None:
            blocks = self.device.upload(blocks, self.clock)
        with self.clock("compute"):
            out = (contract_group if self.device is None else self.device.contract)(inputs, output, *blocks)
        return out

    def contract_round(self, grid, total, inputs, output, *blocks):
        """One round of a group run in rounds: its statement on this round's blocks, added into ``total`` (the
        rounds so far, a C-ordered block made at the first round; None before it); None off the group's
        ``grid``. The round's result is made in ``ROUND_PIECES`` balanced pieces along the result's first axis,
        each added where it belongs, so that a piece, not a second result, is held on top."""
        if not self.member(grid):
            return None
        if not output:   # a scalar result: one product per round
            part = self.contract_group(inputs, output, *blocks)
            return part if total is None else total + part
        first = output[0]
        n = next(b.shape[sub.index(first)] for b, sub in zip(blocks, inputs) if first in sub)
        pieces = max(1, min(ROUND_PIECES, n))
        for p in range(pieces):
            lo, hi = (int(v) for v in block_range(n, pieces, p))
            part = self.contract_group(inputs, output, *(
                b[tuple(slice(lo, hi) if c == first else slice(None) for c in sub)] for b, sub in zip(blocks, inputs)))
            if self._posted:   # MPICH moves a posted exchange only inside MPI calls
                MPI.Request.Testall(self._posted)
            with self.clock("compute"):
                if total is None:
                    total = array_module(part).zeros((n,) + part.shape[1:], dtype=part.dtype)
                total[lo:hi] += part
            del part
        return total

    def contract_slab(self, layout, total, axis, rounds, t, inputs, output, *blocks):
        """Round ``t`` of a group run in ``rounds`` over a free index: its statement on this round's blocks makes
        slab ``t`` along ``axis`` of this rank's result block (of ``layout``, a Layout or its literal), placed into
        ``total`` (the whole block, made at the first round; None before it); None off the group's grid."""
        layout = layout if isinstance(layout, Layout) else Layout(*layout)
        shape = layout.local_shape(self.rank)
        if shape is None:
            return None
        part = self.contract_group(inputs, output, *blocks)
        with self.clock("compute"):
            if total is None:
                total = array_module(part).empty(shape, dtype=part.dtype)
            start, stop = (int(v) for v in block_range(shape[axis], rounds, t))
            total[(slice(None),) * axis + (slice(start, stop),)] = part
        return total

    def in_parts(self, kind, x, move, axis, parts, comm=None):
        """Move ``move`` in its ``parts`` steps (a direct reduction after a group in rounds), each bringing one
        part of this rank's destination block along ``axis``, placed into it as it comes (None where this rank
        holds no destination block)."""
        tables, out, start = self.moves[move][2], None, 0
        for step in range(parts):
            part = self.move(kind, x, move, step, comm)
            if part is None:
                continue
            if out is None:
                shape = list(part.shape)
                shape[axis] = sum(table[3][axis] for table in tables)
                out = np.empty(shape, dtype=part.dtype)
            out[(slice(None),) * axis + (slice(start, start + part.shape[axis]),)] = part
            start += part.shape[axis]
        return out

    @staticmethod
    def slab(x, axis, rounds, t):
        """Round ``t``'s part of a block held in place: the balanced sub-range ``t`` of ``rounds`` along ``axis``
        (a view; None stays None), the part the round's moves bring of the other blocks."""
        if x is None:
            return None
        start, stop = (int(v) for v in block_range(x.shape[axis], rounds, t))
        return x[(slice(None),) * axis + (slice(start, stop),)]

    def unary(self, a, sub, out, layout):
        """A unary pre-pass step ``sub -> out`` on this rank's block of ``layout`` (a Layout or its literal
        ``(shape, grid, axes, partial)``; None stays None): each repeated index is split along one axis at most,
        so the block's diagonal is that range of the other axes too."""
        layout = layout if isinstance(layout, Layout) else Layout(*layout)
        block = layout.block(self.rank)
        if a is None or block is None:
            return None
        cut = []
        for k, c in enumerate(sub):
            ranges = [block[m] for m, x in enumerate(sub) if x == c]
            lo, hi = max(r.start for r in ranges), min(r.stop for r in ranges)
            cut.append(slice(lo - block[k].start, max(lo, hi) - block[k].start))
        if self.device is not None:
            a, = self.device.upload([a], self.clock)
        with self.clock("compute"):
            out = unary(a[tuple(cut)], sub, out)
            if self.device is not None:
                self.device.synchronize()
        return out

    # ---- lifetime -------------------------------------------------------------------------------
    def close(self):
        """Free every datatype and communicator this runtime created (collective on the world)."""
        for transfer in self._transfers.values():
            transfer.free()
        if self._element is not None:
            self._element.Free()
        for comm in list(self._subs.values()) + list(self._carts.values()):
            if comm != MPI.COMM_NULL:
                comm.Free()
        self._transfers, self._subs, self._carts, self._element = {}, {}, {}, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def renumbered(table, world, comm):
    """``table`` with its peers numbered in ``world`` renumbered in ``comm`` (made of ranks of the world)."""
    if comm == world:
        return table
    in_held, in_shape, out_held, out_shape, sends, recvs, ops = table
    peers = sorted({p for p, *_ in sends} | {p for p, *_ in recvs} | {p for p, *_ in ops})
    world_group, group = world.Get_group(), comm.Get_group()
    ranks = dict(zip(peers, world_group.Translate_ranks(peers, group))) if peers else {}
    world_group.Free()
    group.Free()
    if MPI.UNDEFINED in ranks.values():
        raise ValueError(f"rank {world.Get_rank()}: exchanges with a rank outside its communicator")

    def peer(items):
        return tuple((ranks[p],) + tuple(rest) for p, *rest in items)

    return in_held, in_shape, out_held, out_shape, peer(sends), peer(recvs), peer(ops)
