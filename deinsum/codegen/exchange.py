"""Run one rank's redistribution table: one ``Alltoallw`` of subarray datatypes per phase.

STANDALONE: imports only numpy and mpi4py, because this file's source is
pasted into generated scripts. The tables come from
``deinsum.redistribute.Redistribution.table(rank)``; every rank of ``comm``
must call :func:`exchange` with its own table of the same plan (collective).

A phase is ``(in_held, in_shape, out_held, out_shape, sends, recvs, ops)``:

* ``sends``: ``(peer, starts, subsizes)`` subarrays of the input block;
* ``recvs``: ``(peer, starts, subsizes, add)``; ``add=0`` lands in place in
  the output block, ``add=1`` in a staging buffer;
* ``ops``: ``(peer, add, from_starts, subsizes, to_starts)``, run in order
  after the exchange: copy or add a piece of the input block (``peer`` = this
  rank) or of ``peer``'s staged piece into the output block.

Usage in a script (two ranks; rank 0 scatters ``[0, 1, 2, 3, 4]``)::

    log = ByteLog()
    block = exchange(comm, TABLE[comm.rank], whole if comm.rank == 0 else None, np.float64, log, "scatter x")
"""
import math

import numpy as np
from mpi4py import MPI
from mpi4py.util import dtlib


class ByteLog:
    """Bytes this rank handed to MPI per :func:`exchange` call (self excluded).

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


def exchange(comm, table, local, dtype, log=None, label=""):
    """Execute ``table`` (this rank's phases) on ``comm``; return the new local block, or None if it holds none.

    ``local`` is this rank's block of the source layout (None where it holds
    none); any numpy dtype works, non-contiguous input is copied first. Bytes
    handed to MPI are appended to ``log`` under ``label``.
    """
    dtype = np.dtype(dtype)
    block = None if local is None else np.asarray(local, dtype=dtype, order="C")
    element = _element_type(dtype)
    sent = received = 0
    try:
        for phase in table:
            block, phase_sent, phase_received = _run_phase(comm, phase, block, dtype, element)
            sent += phase_sent
            received += phase_received
    finally:
        element.Free()
    if log is not None:
        log.add(label, sent, received)
    return block


def _element_type(dtype):
    """A committed MPI datatype for one element (to be freed): the matching named type, else raw bytes."""
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
    return [([starts[0] + r] + s, [1] + z) for r in range(subsizes[0]) for s, z in _slabs(starts[1:], subsizes[1:], limit)]


def _run_phase(comm, phase, block, dtype, element):
    in_held, in_shape, out_held, out_shape, sends, recvs, ops = phase
    rank, nprocs = comm.Get_rank(), comm.Get_size()
    if in_held and (block is None or block.shape != tuple(in_shape)):
        raise ValueError(f"rank {rank}: local block of shape {None if block is None else block.shape}, "
                         f"the table expects {tuple(in_shape)}")
    out_bytes = math.prod(out_shape) * dtype.itemsize if out_held else 0
    staged_at = {}
    end = out_bytes
    for peer, _, subsizes, add in recvs:
        if add:
            staged_at[peer] = end
            end += math.prod(subsizes) * dtype.itemsize
    buffer = np.empty(max(end, 1), dtype=np.uint8)
    out = buffer[:out_bytes].view(dtype).reshape(out_shape) if out_held else None

    send_counts, send_types = [0] * nprocs, [element] * nprocs
    recv_counts, recv_displs, recv_types = [0] * nprocs, [0] * nprocs, [element] * nprocs
    created, requests, big_sent, big_received = [], [], 0, 0
    limit = max(1, MAX_MESSAGE_BYTES // dtype.itemsize)
    try:
        big_sends, big_recvs = [], []   # over the limit: sender and receiver both see it from subsizes
        for peer, starts, subsizes in sends:
            if math.prod(subsizes) > limit:
                big_sends.append((peer, starts, subsizes))
            else:
                send_counts[peer], send_types[peer] = 1, _subarray(element, in_shape, subsizes, starts, created)
        for peer, starts, subsizes, add in recvs:
            if math.prod(subsizes) > limit:
                big_recvs.append((peer, starts, subsizes, add))
            elif add:
                recv_counts[peer], recv_displs[peer] = math.prod(subsizes), staged_at[peer]
            else:
                recv_counts[peer], recv_types[peer] = 1, _subarray(element, out_shape, subsizes, starts, created)
        send_buffer = block if in_held and block.size else np.empty(1, dtype=np.uint8)
        comm.Alltoallw([send_buffer, (send_counts, [0] * nprocs), send_types],
                       [buffer, (recv_counts, recv_displs), recv_types])
        for peer, starts, subsizes, add in big_recvs:
            for at, size in _slabs(starts, subsizes, limit):
                if add:   # contiguous in the staged piece: at its C-order offset
                    offset = staged_at[peer] + sum((a - s) * math.prod(subsizes[k + 1:]) for k, (a, s)
                                                   in enumerate(zip(at, starts))) * dtype.itemsize
                    requests.append(comm.Irecv([buffer[offset:], math.prod(size), element], peer, _BIG_TAG))
                else:
                    requests.append(comm.Irecv([out, 1, _subarray(element, out_shape, size, at, created)], peer,
                                               _BIG_TAG))
            big_received += math.prod(subsizes) * dtype.itemsize * (peer != rank)
        for peer, starts, subsizes in big_sends:
            for at, size in _slabs(starts, subsizes, limit):
                requests.append(comm.Isend([block, 1, _subarray(element, in_shape, size, at, created)], peer,
                                           _BIG_TAG))
            big_sent += math.prod(subsizes) * dtype.itemsize * (peer != rank)
        MPI.Request.Waitall(requests)
        sent = big_sent + sum(n * t.Get_size() for peer, (n, t) in enumerate(zip(send_counts, send_types))
                              if peer != rank)
        received = big_received + sum(n * t.Get_size() for peer, (n, t) in enumerate(zip(recv_counts, recv_types))
                                      if peer != rank)
    finally:
        for datatype in created:
            datatype.Free()

    for peer, add, from_starts, subsizes, to_starts in ops:
        if peer == rank:
            piece = block[_slices(from_starts, subsizes)]
        else:
            start = staged_at[peer]
            piece = buffer[start:start + math.prod(subsizes) * dtype.itemsize].view(dtype).reshape(subsizes)
        if add:
            out[_slices(to_starts, subsizes)] += piece
        else:
            out[_slices(to_starts, subsizes)] = piece
    if staged_at and out is not None:
        out = out.copy()          # let the staging buffer go
    return out, sent, received


def _subarray(element, sizes, subsizes, starts, created):
    """Committed C-order subarray type (0-d arrays count as one element), remembered in ``created``."""
    sizes, subsizes, starts = (list(sizes) or [1]), (list(subsizes) or [1]), (list(starts) or [0])
    datatype = element.Create_subarray(sizes, subsizes, starts, order=MPI.ORDER_C).Commit()
    created.append(datatype)
    return datatype


def _slices(starts, subsizes):
    return tuple(slice(s, s + n) for s, n in zip(starts, subsizes))
