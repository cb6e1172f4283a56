"""Local compute on a GPU with CuPy: blocks live on the device, the same kernels run on them.

STANDALONE: imports only mpi4py and the sibling runtime modules (emitted
scripts carry this file); CuPy is imported when a device is opened, so a
machine without it never needs it. :func:`open_device` gives each rank a
:class:`Device` (the node's GPUs shared round-robin by its ranks). A
:class:`~deinsum.runtime.runner.Runtime` built with one

* uploads the blocks a group reads (timed as ``host_to_device``) and runs the
  group's kernel from ``kernels.py`` on the CuPy arrays (GEMMs through ``@``,
  i.e. cuBLAS) or ``cupy.einsum(..., optimize='greedy')``, whichever ran faster
  when first timed on these subscripts, block shapes and dtypes
  (:meth:`Device.contract`, kept in :data:`CHOICES`), synchronizing before the
  ``compute`` clock stops;
* copies a block to host memory before a move (timed as ``device_to_host``,
  into CuPy's pinned pool): the exchange's subarray datatypes and staging
  buffer are in host memory.
  ``Device.cuda_aware`` says whether the MPI library would take device buffers
  (asked, never assumed); the exchange stages through host memory either way.

Where the result ends is :meth:`Device.place`'s choice: on the GPU for callers
whose inputs were already there (CuPy arrays), else on the host.
"""
import ctypes

from mpi4py import MPI

from .checks import collectively, kept_on, libmpi_files, node_place
from .kernels import contract_group


#: ``{(device id, subscripts, output, shapes, dtypes): (winner, seconds by candidate)}``: the local
#: contraction each block shape runs, measured once per process (:meth:`Device.contract`).
CHOICES = {}
#: What :func:`cuda_aware`'s answers say.
CUDA_AWARE = {True: "CUDA-aware", False: "not CUDA-aware", None: "CUDA-awareness unknown"}
#: Timed runs per candidate when a shape is first seen (the fastest counts): a library's first calls at a
#: new shape (plans, handles) are slower than its steady state.
CHOICE_TRIALS = 3


def is_device_array(x):
    """Whether ``x`` is a GPU array (it has ``__cuda_array_interface__``, as CuPy arrays do).

    >>> is_device_array([1.0]), is_device_array(None)
    (False, False)
    """
    return hasattr(x, "__cuda_array_interface__")


def device_bytes(arrays):
    """Bytes of the distinct GPU allocations among ``arrays`` (a rank's operands: memory it already uses).

    >>> device_bytes([None, [1.0]])
    0
    """
    held = {}
    for x in arrays:
        if is_device_array(x):
            held[x.__cuda_array_interface__["data"][0]] = x.nbytes
    return sum(held.values())


def load_cupy(error=RuntimeError):
    """The ``cupy`` module once it sees a CUDA device; else ``error`` with one line saying why."""
    try:
        import cupy
    except ImportError as exc:
        raise error(f"device='gpu' needs CuPy, which cannot be imported here ({exc}); install the CuPy wheel "
                    f"of this machine's CUDA (e.g. pip install cupy-cuda12x)") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - CUDARuntimeError and friends: no driver, no device
        raise error(f"device='gpu': CuPy finds no usable CUDA device ({' '.join(str(exc).split())})") from None
    if count < 1:
        raise error("device='gpu': CuPy finds no CUDA device")
    return cupy


def cuda_aware():
    """Whether the MPI library says it takes CUDA device buffers: mpi4py's ``MPI.Query_cuda_support``
    where it has one, else ``MPIX_Query_cuda_support`` of the loaded libmpi (MPICH, Open MPI); None
    where neither answers."""
    query = getattr(MPI, "Query_cuda_support", None)
    if query is not None:
        return bool(query())
    for path in libmpi_files():
        function = getattr(ctypes.CDLL(path), "MPIX_Query_cuda_support", None)
        if function is not None:
            function.restype = ctypes.c_int
            return bool(function())
    return None


def memory_share(cupy, device, sharing):
    """Bytes of CUDA ``device`` that one of ``sharing`` ranks may use: its free memory plus CuPy's pooled free
    blocks, split evenly, and at most what the pool's limit (``set_limit``) leaves this process."""
    with cupy.cuda.Device(device):
        pool = cupy.get_default_memory_pool()
        share = (cupy.cuda.runtime.memGetInfo()[0] + pool.free_bytes()) // sharing
        limit = pool.get_limit()
        return min(share, max(0, limit - pool.used_bytes())) if limit else share


def device_name(cupy, device):
    """The name of CUDA ``device`` (its properties' ``name``)."""
    name = cupy.cuda.runtime.getDeviceProperties(device)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


class Device:
    """This rank's GPU: the ``cupy`` module, the device id (``local_rank`` of ``local_size`` ranks on the
    node, modulo the node's GPUs), how many ranks share it, its name, and whether MPI is CUDA-aware.
    Raises ``error`` (one line) where no GPU can be used."""

    def __init__(self, local_rank, local_size=1, error=RuntimeError):
        self.cp = load_cupy(error)
        import cupyx
        self.cupyx = cupyx
        count = self.cp.cuda.runtime.getDeviceCount()
        self.id = local_rank % count
        self.sharing = len(range(self.id, max(local_size, local_rank + 1), count))
        self.cp.cuda.Device(self.id).use()
        self.name = device_name(self.cp, self.id)
        self.cuda_aware = cuda_aware()

    def __str__(self):
        return f"GPU {self.id} ({self.name}), MPI {CUDA_AWARE[self.cuda_aware]}"

    @property
    def memory(self):
        """The bytes of this GPU this rank may use (:func:`memory_share` among the ranks sharing it)."""
        return memory_share(self.cp, self.id, self.sharing)

    def check_memory(self, need, error=RuntimeError, held=0):
        """Raise ``error`` unless ``need`` bytes fit this rank's share of the GPU (:attr:`memory`) and the ``held``
        bytes its operands already use there (part of ``need``)."""
        share = self.memory
        if need > share + held:
            raise error(f"device='gpu': the plan needs up to {need:,} bytes per rank, GPU {self.id} has "
                        f"{share:,} free for this rank ({self.sharing} rank(s) share it)"
                        + (f" beside the {held:,} its operands hold there" if held else ""))

    def synchronize(self):
        """Wait for the work queued on this device (before a clock stops)."""
        self.cp.cuda.get_current_stream().synchronize()

    def contract(self, inputs, output, *blocks):
        """``contract_group(inputs, output, *blocks)`` or ``cupy.einsum`` (``optimize='greedy'``) of the same
        statement, whichever was faster on the first call with these subscripts, shapes and dtypes (the fastest of
        :data:`CHOICE_TRIALS` timed runs each after a warm-up, back to back; the winner kept in :data:`CHOICES`),
        synchronized. Only local compute is
        chosen, never communication, so ranks may choose differently. Measured where the GPU is this
        rank's alone (a trial's memory could fail a sharing rank) and for two or more non-empty blocks;
        the kernel runs otherwise, and where ``cupy.einsum`` fails (e.g. out of memory)."""
        key = (self.id, tuple(inputs), output, tuple(b.shape for b in blocks), tuple(b.dtype.str for b in blocks))
        runs = {"kernel": lambda: contract_group(inputs, output, *blocks),
                "cupy.einsum": lambda: self.cp.einsum(",".join(inputs) + "->" + output, *blocks, optimize="greedy")}
        if key not in CHOICES and (self.sharing > 1 or len(blocks) < 2 or 0 in [b.size for b in blocks]):
            CHOICES[key] = ("kernel", {})
        if key not in CHOICES:
            seconds = {}
            for name, run in runs.items():   # each candidate: a warm-up, then timed runs back to back
                try:
                    for trial in range(1 + CHOICE_TRIALS):
                        self.synchronize()
                        start = MPI.Wtime()
                        out = run()
                        self.synchronize()
                        if trial:
                            seconds[name] = min(seconds.get(name, float("inf")), MPI.Wtime() - start)
                except Exception:  # noqa: BLE001 - cupy.einsum out of memory and the like: keep the kernel
                    if name == "kernel":
                        raise
                    seconds.pop(name, None)
            CHOICES[key] = (min(seconds, key=seconds.get), seconds)
            return out
        out = runs[CHOICES[key][0]]()
        self.synchronize()
        return out

    def upload(self, blocks, clock):
        """``blocks`` as device arrays (None stays None); copies timed as ``host_to_device``."""
        if all(b is None or is_device_array(b) for b in blocks):
            return list(blocks)
        with clock("host_to_device"):
            blocks = [b if b is None or is_device_array(b) else self.cp.asarray(b) for b in blocks]
            self.synchronize()
        return blocks

    def download(self, x, clock):
        """``x`` as a host array (None stays None) in page-locked memory from CuPy's pinned pool (a DMA
        copy, several times faster than into fresh pageable memory); timed as ``device_to_host``."""
        if not is_device_array(x):
            return x
        with clock("device_to_host"):
            x = x if x.flags.c_contiguous else x.copy(order="C")   # (ascontiguousarray makes 0-d 1-d)
            host = self.cupyx.empty_pinned(x.shape, x.dtype)
            x.get(out=host)
            return host

    def place(self, x, on_device, clock):
        """``x`` on the device (``on_device``) or on the host, copied (and timed) only where needed."""
        return self.upload([x], clock)[0] if on_device else self.download(x, clock)


def open_device(comm, error=RuntimeError):
    """This rank's :class:`Device` (collective on ``comm``'s first use, then kept on it: see
    :func:`~deinsum.runtime.checks.kept_on`): ranks of a node share its GPUs round-robin. Where any rank
    cannot use a GPU, every rank raises the same one-line ``error`` (and nothing is kept)."""
    return kept_on(comm, "device", lambda: collectively(comm, Device, *node_place(comm), error, error=error))
