"""Run one rank's redistribution table: per step, one ``Alltoallw`` of subarray datatypes, or MPI's collective.

STANDALONE: imports only numpy, mpi4py and ``deinsum.tables`` (emitted scripts carry these files).
The tables come from ``deinsum.tables.rank_tables`` (peers numbered in
``comm``: ``Runtime`` renumbers world ranks for a sub-communicator); every rank
of ``comm`` must run its own table of the same move (collective); ``rank_tables`` says what a table holds.

A step whose table names a collective (``deinsum.tables.collectives``: an
allreduce, all-gather or reduce-scatter of regular blocks) runs MPI's own as a
:class:`Collective`. A :class:`Transfer` or :class:`Collective` commits the step's
datatypes once and runs it any number of times; :func:`exchange` runs a table once. Two ranks, rank 0 scatters
``[0, 1, 2, 3, 4]``::

    log = ByteLog()
    block = exchange(comm, TABLE[comm.rank], whole if comm.rank == 0 else None, np.float64, log, "scatter x")
"""
import math

import numpy as np
from mpi4py import MPI
from mpi4py.util import dtlib

from ..tables import contiguous, native


class ByteLog:
    """Bytes this rank handed to MPI per exchange (self excluded); for MPI's own collective, whose inner traffic
    cannot be measured, the bytes its algorithm moves as the model states them (:class:`Collective`).

    >>> log = ByteLog(); log.add("x", 16, 8); log.add("y", 0, 24)
    >>> log.bytes_sent, log.bytes_received
    (16, 32)
    """

    def __init__(self):
        self.records = []

    def add(self, label, sent, received):
        """Record one call: ``(label, bytes_sent, bytes_received)``."""
        self.records.append((label, sent, received))

    @property
    def bytes_sent(self):
        """Bytes sent over all recorded calls."""
        return sum(sent for _, sent, _ in self.records)

    @property
    def bytes_received(self):
        """Bytes received over all recorded calls."""
        return sum(received for _, _, received in self.records)

    def __str__(self):
        return "\n".join(f"{label}: sent {sent} B, received {received} B" for label, sent, received in self.records)


def element_type(dtype):
    """A committed MPI datatype for one element of ``dtype`` (the caller frees it): the matching named
    type, else raw bytes."""
    dtype = np.dtype(dtype)
    try:
        return dtlib.from_numpy_dtype(dtype.newbyteorder("="))
    except (ValueError, KeyError, TypeError):
        return MPI.BYTE.Create_contiguous(dtype.itemsize).Commit()


#: Largest message in bytes: a piece above it (e.g. over 2**31 elements) goes point-to-point in
#: C-order slabs of at most this size, so no MPI count, size or displacement can overflow an int.
MAX_MESSAGE_BYTES = 2**31 - 1
_BIG_TAG = 31


def _slabs(starts, subsizes, limit):
    """The box ``(starts, subsizes)`` as C-order slabs of at most ``limit`` elements, in order; each
    slab is contiguous within the box's C-order layout.

    >>> _slabs([0, 0], [3, 4], 8)
    [([0, 0], [2, 4]), ([2, 0], [1, 4])]
    >>> _slabs([1, 0], [1, 5], 2)
    [([1, 0], [1, 2]), ([1, 2], [1, 2]), ([1, 4], [1, 1])]
    """
    starts, subsizes = list(starts), list(subsizes)
    if math.prod(subsizes) <= limit:
        return [(starts, subsizes)]
    inner = math.prod(subsizes[1:])
    if inner <= limit:
        rows = limit // inner
        return [([starts[0] + r] + starts[1:], [min(rows, subsizes[0] - r)] + subsizes[1:])
                for r in range(0, subsizes[0], rows)]
    return [([starts[0] + r] + s, [1] + z) for r in range(subsizes[0])
            for s, z in _slabs(starts[1:], subsizes[1:], limit)]


class _Step:
    """What a step commits (``datatypes``, counted by ``created``) and releases (:meth:`free`)."""

    datatypes = ()

    @property
    def created(self):
        return len(self.datatypes)

    def post(self, block, wait=True):
        """``([], finish)``: the step run at once, ``finish()`` its output block (:meth:`Transfer.post` waits less)."""
        out = self(block)
        return [], lambda: out

    def free(self):
        """Release the committed datatypes (idempotent)."""
        for datatype in self.datatypes:
            datatype.Free()
        self.datatypes = []


class Transfer(_Step):
    """One step of one rank's table on ``comm``, with its subarray datatypes committed once.

    Call it with this rank's input block (None where it holds none) for the
    output block (None where it holds none); :meth:`free` releases the
    datatypes. ``created`` counts the datatypes this transfer committed: one per
    piece shape, not per peer (a piece placed past an int's reach, or a slab of
    one, has its own). A piece over :data:`MAX_MESSAGE_BYTES` goes outside the
    ``Alltoallw``, point-to-point in C-order slabs (sender and receiver both see
    it from its subsizes).
    """

    def __init__(self, comm, table, dtype, element):
        self.comm, self.dtype = comm, np.dtype(dtype)
        self.in_held, self.in_shape, self.out_held, self.out_shape, sends, recvs, self.ops = table
        rank = comm.Get_rank()
        size = self.dtype.itemsize
        self.out_bytes = math.prod(self.out_shape) * size if self.out_held else 0
        self.staged_at, end = {}, self.out_bytes
        for peer, _, subsizes, add in recvs:
            if add:
                self.staged_at[peer] = end
                end += math.prod(subsizes) * size
        self.buffer_bytes = max(end, 1)
        # (peer, count, byte displacement, type) of each peer's piece in the Alltoallw: O(peers), not O(ranks)
        self.element, self.send_pieces, self.recv_pieces = element, [], []
        self.datatypes, self._shapes = [], {}
        # pieces over the limit: (peer, datatype) slabs sent, (peer, byte offset, count, datatype) slabs received
        self.big_sends, self.big_recvs, big_sent, big_received = [], [], 0, 0
        limit = max(1, MAX_MESSAGE_BYTES // size)
        try:
            for peer, starts, subsizes in sends:
                if math.prod(subsizes) > limit:
                    self.big_sends += [(peer, self._subarray(element, self.in_shape, z, at))
                                       for at, z in _slabs(starts, subsizes, limit)]
                    big_sent += math.prod(subsizes) * size * (peer != rank)
                    continue
                self.send_pieces.append((peer, 1, *self._placed(element, self.in_shape, subsizes, starts)))
            for peer, starts, subsizes, add in recvs:
                if math.prod(subsizes) > limit:
                    for at, z in _slabs(starts, subsizes, limit):
                        if add:   # contiguous in the staged piece: at its C-order offset
                            offset = self.staged_at[peer] + size * _offset([a - s for a, s in zip(at, starts)],
                                                                           subsizes)
                            self.big_recvs.append((peer, offset, math.prod(z), element))
                        else:
                            self.big_recvs.append((peer, 0, 1, self._subarray(element, self.out_shape, z, at)))
                    big_received += math.prod(subsizes) * size * (peer != rank)
                elif add:
                    self.recv_pieces.append((peer, math.prod(subsizes), self.staged_at[peer], element))
                else:
                    self.recv_pieces.append((peer, 1, *self._placed(element, self.out_shape, subsizes, starts)))
        except BaseException:
            self.free()
            raise
        self.bytes_sent = big_sent + sum(n * t.Get_size() for peer, n, _, t in self.send_pieces if peer != rank)
        self.bytes_received = big_received + sum(n * t.Get_size() for peer, n, _, t in self.recv_pieces if peer != rank)

    def _subarray(self, element, sizes, subsizes, starts):
        """Committed C-order subarray type (0-d arrays count as one element)."""
        sizes, subsizes, starts = (list(sizes) or [1]), (list(subsizes) or [1]), (list(starts) or [0])
        datatype = element.Create_subarray(sizes, subsizes, starts, order=MPI.ORDER_C).Commit()
        self.datatypes.append(datatype)
        return datatype

    def _placed(self, element, sizes, subsizes, starts):
        """``(byte displacement, type)`` of the piece at ``starts``: one subarray type per piece shape, at the
        origin, shared by the peers whose pieces have that shape (thousands of peers, a few shapes), displaced
        to ``starts``; its own type where the displacement would overflow an int."""
        offset = _offset(starts, sizes) * self.dtype.itemsize
        if offset > MAX_MESSAGE_BYTES:
            return 0, self._subarray(element, sizes, subsizes, starts)
        key = (tuple(sizes), tuple(subsizes))
        if key not in self._shapes:
            self._shapes[key] = self._subarray(element, sizes, subsizes, [0] * len(subsizes))
        return offset, self._shapes[key]

    def _per_rank(self, pieces):
        """``((counts, displacements), types)`` over the communicator's ranks, as ``Alltoallw`` takes them, made for
        the call (held, they would take some 40 bytes per rank: megabytes per step at 65,536 ranks)."""
        nprocs = self.comm.Get_size()
        counts, displacements, types = [0] * nprocs, [0] * nprocs, [self.element] * nprocs
        for peer, count, displacement, datatype in pieces:
            counts[peer], displacements[peer], types[peer] = count, displacement, datatype
        return (counts, displacements), types

    def __call__(self, block):
        return self.post(block, wait=True)[1]()

    def post(self, block, wait=False):
        """Start the step: ``(requests, finish)``, ``finish()`` waiting for them and returning the output block; an
        ``Ialltoallw`` unless ``wait`` (a prefetched round). ``block`` must stay unchanged until then."""
        rank = self.comm.Get_rank()
        if self.in_held and (block is None or block.shape != tuple(self.in_shape)):
            raise ValueError(f"rank {rank}: local block of shape {None if block is None else block.shape}, "
                             f"the table expects {tuple(self.in_shape)}")
        if block is not None:
            block = np.asarray(block, dtype=self.dtype, order="C")
        buffer = np.empty(self.buffer_bytes, dtype=np.uint8)
        out = buffer[:self.out_bytes].view(self.dtype).reshape(self.out_shape) if self.out_held else None
        send_buffer = block if self.in_held and block.size else np.empty(1, dtype=np.uint8)
        args = ([send_buffer, *self._per_rank(self.send_pieces)], [buffer, *self._per_rank(self.recv_pieces)])
        requests = [] if wait else [self.comm.Ialltoallw(*args)]
        if wait:
            self.comm.Alltoallw(*args)
        requests += [self.comm.Irecv([buffer[offset:], n, t], peer, _BIG_TAG) for peer, offset, n, t in self.big_recvs]
        requests += [self.comm.Isend([block, 1, t], peer, _BIG_TAG) for peer, t in self.big_sends]

        def piece(peer, starts, subsizes):
            if peer == rank:
                return block[_slices(starts, subsizes)]
            start = self.staged_at[peer]
            return buffer[start:start + math.prod(subsizes) * self.dtype.itemsize].view(self.dtype).reshape(subsizes)

        def finish():
            MPI.Request.Waitall(requests)
            _apply(self.ops, out, piece)
            return out.copy() if self.staged_at and out is not None else out   # (a copy lets the staging go)

        return requests, finish


class Collective(_Step):
    """One step that runs MPI's collective of its name (a native table of ``rank_tables``) on ``comm``: every
    rank for ``Allreduce``, ``Reduce`` (ranks without a summand add zeros), ``Allgather`` (a contiguous block
    per rank, in rank order) or ``Allgatherv`` (contiguous blocks, each one subarray type resized to one
    element: with counts in elements MPICH's ring cuts blocks into 32 kB pieces, 1.7-2.5x slower), the
    ranks holding one block's summands for ``Reduce_scatter`` (the block itself where its pieces tile it in
    order, else packed); peers numbered in ``world`` (default ``comm``).
    ``bytes_sent``/``bytes_received`` are the model's: what MPI moves inside a collective cannot be measured.
    """

    def __init__(self, comm, table, dtype, element, world=None):
        self.comm, self.dtype, self.element = comm, np.dtype(dtype), element
        self.in_held, self.in_shape, self.out_held, self.out_shape, self.kind, pieces, words = table
        self.bytes_sent, self.bytes_received = (w * self.dtype.itemsize for w in words)
        self.datatypes = []
        peers = [peer for peer, _, _ in pieces]
        if world is not None and comm != world and peers:
            world_group, group = world.Get_group(), comm.Get_group()
            peers = world_group.Translate_ranks(peers, group)
            world_group.Free()
            group.Free()
        self.pieces = sorted((peer, starts, subsizes) for peer, (_, starts, subsizes) in zip(peers, pieces))
        if (MPI.UNDEFINED in peers or self.kind == "reduce_scatter" and len(self.pieces) != comm.Get_size()
                or self.kind == "allgather" and list(peers) != list(range(comm.Get_size()))):   # (in the table's order)
            raise ValueError(f"rank {comm.Get_rank()}: {self.kind} on ranks that are not its communicator's, in order")
        if self.kind == "allgatherv":
            self.counts, self.displs = [0] * comm.Get_size(), [0] * comm.Get_size()
            for peer, starts, _ in self.pieces:   # (element offsets in the C-ordered output)
                self.counts[peer], self.displs[peer] = 1, _offset(starts, self.out_shape)
            box = element.Create_subarray(list(self.out_shape), list(self.pieces[0][2]), [0] * len(self.out_shape),
                                          order=MPI.ORDER_C)
            self.datatypes.append(box.Create_resized(0, element.Get_extent()[1]).Commit())
            box.Free()
        self.in_order = False   # a reduce-scatter whose pieces tile the block in order sends it without a copy
        if self.kind == "reduce_scatter":
            offsets = [_offset(s, self.in_shape) for _, s, _ in self.pieces]
            self.in_order = offsets == sorted(offsets) and all(contiguous(z, self.in_shape) for _, _, z in self.pieces)

    def __call__(self, block):
        rank = self.comm.Get_rank()
        if self.in_held and (block is None or block.shape != tuple(self.in_shape)):
            raise ValueError(f"rank {rank}: local block of shape {None if block is None else block.shape}, "
                             f"the table expects {tuple(self.in_shape)}")
        if block is not None:
            block = np.asarray(block, dtype=self.dtype, order="C")
        out = np.empty(self.out_shape, dtype=self.dtype) if self.out_held or self.kind != "reduce" else None
        if self.kind in ("allreduce", "reduce"):
            mine = [block[_slices(s, z)] for peer, s, z in self.pieces if peer == rank]
            send = np.ascontiguousarray(mine[0]) if mine else np.zeros(self.out_shape, dtype=self.dtype)
            if self.kind == "allreduce":
                self.comm.Allreduce(send.reshape(-1), out.reshape(-1))
            else:
                self.comm.Reduce(send.reshape(-1), None if out is None else out.reshape(-1), root=0)
        elif self.kind == "allgather":
            self.comm.Allgather([block, block.size, self.element], [out, block.size, self.element])
        elif self.kind == "allgatherv":
            send = [block, block.size, self.element] if self.counts[rank] else [out, 0, self.element]
            self.comm.Allgatherv(send, [out, (self.counts, self.displs), self.datatypes[0]])
        else:
            send = block.reshape(-1) if self.in_order else np.concatenate(
                [block[_slices(s, z)].reshape(-1) for _, s, z in self.pieces])
            out = out.reshape(-1)
            self.comm.Reduce_scatter(send, out, [math.prod(z) for _, _, z in self.pieces], op=MPI.SUM)
            out = out.reshape(self.out_shape)
        return out if self.out_held else None


def local_part(table, block, dtype):
    """A step whose table sends and receives nothing (on every rank: a move the plan calls ``slice``): this
    rank's output block copied from its input block, with no MPI call; None where it holds no output block.

    >>> local_part((1, (4,), 1, (2,), (), (), ((0, 0, (1,), (2,), (0,)),)), np.arange(4.), np.float64).tolist()
    [1.0, 2.0]
    """
    in_held, in_shape, out_held, out_shape, sends, recvs, ops = table
    if sends or recvs:
        raise ValueError("a move with messages is not a slice of what this rank holds")
    if not out_held:
        return None
    out = np.empty(out_shape, dtype=dtype)
    _apply(ops, out, lambda peer, starts, subsizes: block[_slices(starts, subsizes)])
    return out


def _apply(ops, out, piece):
    """Run a step's ``ops`` into ``out``: copy or add each ``piece(peer, from_starts, subsizes)`` at its place."""
    for peer, add, from_starts, subsizes, to_starts in ops:
        if add:
            out[_slices(to_starts, subsizes)] += piece(peer, from_starts, subsizes)
        else:
            out[_slices(to_starts, subsizes)] = piece(peer, from_starts, subsizes)


def exchange(comm, table, local, dtype, log=None, label=""):
    """Run ``table`` (this rank's steps) once on ``comm``; return the new local block, or None if it holds none.

    ``local`` is this rank's block of the source layout (None where it holds
    none); bytes handed to MPI are appended to ``log`` under ``label``.
    """
    element = element_type(dtype)
    block, sent, received = local, 0, 0
    try:
        for step in table:
            members = comm
            if native(step) and step[4] == "reduce_scatter":   # on the ranks that hold one block's summands
                members = comm.Split(step[5][0][0] if step[5] else MPI.UNDEFINED, comm.Get_rank())
            if members == MPI.COMM_NULL:
                block = None
                continue
            try:
                transfer = (Collective(members, step, dtype, element, comm) if native(step)
                            else Transfer(comm, step, dtype, element))
                try:
                    block = transfer(block)
                finally:
                    transfer.free()
            finally:
                if members != comm:
                    members.Free()
            sent, received = sent + transfer.bytes_sent, received + transfer.bytes_received
    finally:
        element.Free()
    if log is not None:
        log.add(label, sent, received)
    return block


def _offset(starts, shape):
    """The C-order element offset of ``starts`` in an array of ``shape``."""
    return sum(a * math.prod(shape[k + 1:]) for k, a in enumerate(starts))


def _slices(starts, subsizes):
    return tuple(slice(s, s + n) for s, n in zip(starts, subsizes))
