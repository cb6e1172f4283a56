"""Run-time checks that keep every rank on the same path: agreement, inputs, files, memory.

STANDALONE: imports only numpy and mpi4py (and the standard library); its source
is pasted verbatim into emitted scripts, and ``deinsum.program`` imports it.
Functions that raise take the exception class to raise (``error``), so the
library raises ``DeinsumError`` and a script its ``ProgramError``.

Collective by construction: :func:`agree` is one small ``Allreduce`` after
which every rank either goes on or raises the same one-line error.

>>> from mpi4py import MPI
>>> agree(MPI.COMM_SELF, {"equation": "ij,jk->ik", "shapes": ((4, 5), (5, 6))})
>>> agree(MPI.COMM_SELF, {}, failure="operand 1: bad shape")
Traceback (most recent call last):
...
ValueError: operand 1: bad shape
"""
import contextlib
import functools
import hashlib
import os
import re
import signal
import socket
import stat
import threading

import numpy as np
from mpi4py import MPI


def _ranks(ranks):
    """``[0, 2, 3, 4]`` -> ``'ranks 0, 2-4'``."""
    runs, start = [], None
    for n, r in enumerate(ranks):
        if start is None:
            start = r
        if n + 1 == len(ranks) or ranks[n + 1] != r + 1:
            runs.append(f"{start}" if start == r else f"{start}-{r}")
            start = None
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(runs)


def _one_line(text):
    return " ".join(str(text).split())


def unanimous(comm, ok, value):
    """Collective: whether every rank is ``ok`` and passes the same integer ``value`` (|value| < 2**62):
    one ``Allreduce`` (MIN) of three int64s, none on one rank.

    >>> unanimous(MPI.COMM_SELF, True, 7), unanimous(MPI.COMM_SELF, False, 7)
    (True, False)
    """
    votes = np.array([ok, value, -value], dtype=np.int64)
    if comm.Get_size() > 1:
        comm.Allreduce(MPI.IN_PLACE, votes, op=MPI.MIN)     # all ok, min value, -(max value)
    return bool(votes[0] and votes[1] == -votes[2])


def agree(comm, facts, failure=None, error=ValueError):
    """Collective: every rank passes its ``facts`` (a dict of small values) and its local
    ``failure`` (a message, or None). One ``Allreduce`` of three integers (whether any rank
    failed, the smallest and the largest digest of the facts: O(log P), no data that grows
    with P); then every rank raises the same one-line ``error`` if any rank failed (the
    lowest such rank's message, naming it) or if the facts differ (each differing fact with
    the ranks that hold each value), else returns None on every rank. Only then are the
    messages or facts gathered, to say what went wrong. On one rank there is nobody to
    disagree with: no reduction, its failure raised as is.

    >>> agree(MPI.COMM_SELF, {"dtype": "float64"}, error=KeyError) is None
    True
    >>> agree(MPI.COMM_SELF, {}, "operand 0:   bad", error=KeyError)
    Traceback (most recent call last):
    ...
    KeyError: 'operand 0: bad'
    """
    if comm.Get_size() == 1:   # nobody to disagree with: no digest, no reduction
        if failure is not None:
            raise error(_one_line(failure))
        return None
    facts = {str(k): repr(v) for k, v in facts.items()}
    digest = int(hashlib.sha256(repr(sorted(facts.items())).encode()).hexdigest()[:15], 16)   # < 2**60
    if unanimous(comm, failure is None, digest):
        return None
    gathered = comm.allgather(None if failure is None else _one_line(failure))
    failed = [(r, f) for r, f in enumerate(gathered) if f is not None]
    if failed:
        rank, message = failed[0]
        if len(failed) == comm.Get_size() and all(f == message for _, f in failed):
            raise error(message)   # the same failure everywhere: no rank to name
        others = [r for r, _ in failed[1:]]
        also = f" (also failing: {_ranks(others)})" if others else ""
        raise error(f"rank {rank}: {message}{also}")
    every = comm.allgather(facts)   # the digests differ: the details (every rank, so still collective)
    keys = sorted(set().union(*every))
    parts = []
    for key in keys:
        values = [f.get(key, "(none)") for f in every]
        if len(set(values)) > 1:
            groups = {}
            for r, v in enumerate(values):
                groups.setdefault(v, []).append(r)
            parts.append(f"{key}: " + "; ".join(f"{v} on {_ranks(rs)}" for v, rs in groups.items()))
    raise error("the ranks disagree on " + " | ".join(parts))


def collectively(comm, check, *args, error=ValueError):
    """Run ``check(*args)`` on every rank of ``comm``; if it raises on any rank, every rank
    raises the same one-line ``error`` (see :func:`agree`), else return this rank's value.

    >>> collectively(MPI.COMM_SELF, int, "12")
    12
    >>> collectively(MPI.COMM_SELF, int, "x")
    Traceback (most recent call last):
    ...
    ValueError: invalid literal for int() with base 10: 'x'
    """
    value, failure = None, None
    try:
        value = check(*args)
    except error as exc:
        failure = str(exc)
    except Exception as exc:  # noqa: BLE001 - any failure must reach every rank
        failure = f"{type(exc).__name__}: {exc}"
    agree(comm, {}, failure, error)
    return value


def check_output_path(path, error=ValueError):
    """The file a save to ``path`` writes (``path`` itself, or a symlink's target, resolved fully), or a
    one-line ``error``: an empty path, a path that exists and is not a regular file (a directory,
    device, FIFO or socket), a missing or unwritable directory, an unwritable file.

    >>> check_output_path("/", KeyError)
    Traceback (most recent call last):
    ...
    KeyError: "output '/' is a directory, expected a file name"
    >>> check_output_path("/dev/null", KeyError)
    Traceback (most recent call last):
    ...
    KeyError: "output '/dev/null' is a character device, not a regular file: saves write only regular files"
    """
    text = os.fspath(path)
    if not text:
        raise error("output '' is an empty path, expected a file name")
    target = os.path.realpath(text)
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise error(f"output {text!r}: {exc.strerror}") from None
    if text.endswith(os.sep) or mode is not None and stat.S_ISDIR(mode):
        raise error(f"output {text!r} is a directory, expected a file name")
    if mode is not None and not stat.S_ISREG(mode):
        kind = next(k for test, k in _NODES if test(mode))
        raise error(f"output {text!r} is a {kind}, not a regular file: saves write only regular files")
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        raise error(f"output {text!r}: the directory {folder!r} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise error(f"output {text!r}: the directory {folder!r} is not writable")
    if mode is not None and not os.access(target, os.W_OK):
        raise error(f"output {text!r} exists and is not writable")
    return target


_NODES = ((stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"), (stat.S_ISFIFO, "FIFO"),
          (stat.S_ISSOCK, "socket"), (lambda mode: True, "special file"))


def write_atomically(path, write, error=ValueError):
    """Call ``write(file)`` on a temporary file beside the file :func:`check_output_path` names (a
    symlink's target: the link stays), then rename it onto that file: never a half-written file. The
    temporary, ``.<name>.deinsum-tmp.<host>.<pid>``, is removed on any exception and on SIGTERM; one
    left by a killed process (``kill -9``) is removed by the next save of the same file on its host.
    One save of a file at a time per process."""
    target, temporary = temporary_beside(path, error)
    with sigterm_raises():
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)   # the umask applies
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
            os.replace(temporary, target)
        except BaseException:
            remove_quietly(temporary)
            raise


def temporary_beside(path, error=ValueError):
    """``(target, temporary)``: the file a save to ``path`` writes (:func:`check_output_path`) and this
    process's temporary beside it, ``.<name>.deinsum-tmp.<host>.<pid>``, once the stale ones of this host
    (their process gone) are removed."""
    target = check_output_path(path, error)
    folder, name = os.path.split(target)
    prefix = f".{name}.deinsum-tmp.{socket.gethostname()}."
    _remove_stale(folder, prefix)
    return target, os.path.join(folder, f"{prefix}{os.getpid()}")


def remove_quietly(path):
    """Remove the file ``path`` if it is there."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _remove_stale(folder, prefix):
    """Remove the files ``prefix<pid>`` in ``folder`` (``prefix`` names this host) whose process no longer
    runs, or is this one (then an earlier process with this pid left it): never a live process's."""
    for entry in os.listdir(folder):
        pid = entry[len(prefix):]
        if entry.startswith(prefix) and re.fullmatch("[1-9][0-9]*", pid) and not _runs_elsewhere(int(pid)):
            remove_quietly(os.path.join(folder, entry))


def _runs_elsewhere(pid):
    """Whether ``pid`` is a running process of this host other than this one."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # another user's process: it runs
        pass
    return True


class _Terminated(BaseException):
    """SIGTERM during a save (raised by the handler :func:`sigterm_raises` installs)."""


@contextlib.contextmanager
def sigterm_raises():
    """While a save writes, SIGTERM (a scheduler's time limit) raises :class:`_Terminated`, so that the
    temporary file is removed; then the process dies of the SIGTERM as it would have. Only in the main
    thread, and only where SIGTERM has its default action (else it is left as it is)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL):
        yield
        return

    def terminated(signum, frame):
        raise _Terminated

    signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    except _Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)
        raise   # only if this thread blocks SIGTERM
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def save_atomically(path, array, error=ValueError):
    """``numpy.save`` to exactly ``path`` (no ``.npy`` appended), atomically (see :func:`write_atomically`)."""
    write_atomically(path, lambda f: np.save(f, array, allow_pickle=False), error)


def check_npy_file(path, what="input", error=ValueError):
    """The size of ``path``, a ``.npy`` file to read, or a one-line ``error``: a directory, a missing, special
    or empty file."""
    if os.path.isdir(path):
        raise error(f"{what} {path}: a directory, not a .npy file")
    if not os.path.isfile(path):
        raise error(f"{what} {path}: no such file" if not os.path.exists(path) else f"{what} {path}: not a regular file")
    size = os.path.getsize(path)
    if size == 0:
        raise error(f"{what} {path}: the file is empty")
    return size


def check_npy_data(shape, dtype, want_shape, want_dtype, casting, where, error=ValueError):
    """Raise a one-line ``error`` unless a ``.npy`` file's array of ``shape`` and ``dtype`` holds numbers, of
    ``want_shape`` and in a dtype numpy's ``casting`` rule turns into ``want_dtype`` (each if not None)."""
    if dtype.hasobject:
        raise error(f"{where}: holds Python objects (a pickled array), which is never loaded")
    if dtype.kind not in "biufc":
        raise error(f"{where}: non-numeric data of dtype {dtype}")
    if want_shape is not None and shape != tuple(want_shape):
        raise error(f"{where}: expected shape {tuple(want_shape)}, not {shape}")
    if want_dtype is not None:
        check_cast(dtype, want_dtype, casting, where, error)


def load_npy(path, shape, dtype, casting="safe", what="input", error=ValueError):
    """The array in the ``.npy`` file ``path`` as ``dtype``, or a one-line ``error``: those of
    :func:`check_npy_file` and :func:`check_npy_data`, not a ``.npy`` (e.g. ``.npz``)."""
    check_npy_file(path, what, error)
    try:
        x = np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - numpy raises many types for bad files
        raise error(f"{what} {path}: not a readable .npy file ({_one_line(exc)})") from None
    if not isinstance(x, np.ndarray):
        x.close()
        raise error(f"{what} {path}: expected one array in a .npy file, not an .npz archive")
    check_npy_data(x.shape, x.dtype, shape, dtype, casting, f"{what} {path}", error)
    return x.astype(dtype, copy=False)


def check_cast(source, target, casting, what, error=ValueError):
    """Raise ``error`` if numpy's ``casting`` rule forbids ``source`` -> ``target`` (as ``numpy.einsum``).

    >>> check_cast(np.float64, np.int32, "safe", "operand 0", KeyError)
    Traceback (most recent call last):
    ...
    KeyError: "operand 0: cannot cast float64 to int32 under casting='safe' (pass casting='unsafe' to allow it)"
    """
    source, target = np.dtype(source), np.dtype(target)
    if not np.can_cast(source, target, casting=casting):
        raise error(f"{what}: cannot cast {source} to {target} under casting={casting!r} "
                    f"(pass casting='unsafe' to allow it)")


def validation_operands(shapes, dtype, seed):
    """Deterministic random operands: uniform in [-1, 1) for floats (complex: both parts),
    non-zero integers in [-3, 3] (unsigned: [1, 3]) for integer types, so that a check
    against numpy is never vacuous."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    out = []
    for shape in shapes:
        if dtype.kind in "iu":
            x = rng.integers(1, 4, shape)
            if dtype.kind == "i":
                x = x * rng.choice([-1, 1], shape)
        else:
            x = rng.uniform(-1, 1, shape)
            if dtype.kind == "c":
                x = x + 1j * rng.uniform(-1, 1, shape)
        out.append(np.asarray(x, dtype=dtype))
    return out


def tolerance(dtype):
    """Relative tolerance of a result of ``dtype`` against numpy (0 for integers: exact).

    >>> [tolerance(t) for t in ("int32", "float16", "float32", "complex64", "float64")]
    [0.0, 0.03, 0.0001, 0.0001, 1e-10]
    """
    dtype = np.dtype(dtype)
    if dtype.kind in "iub":
        return 0.0
    bits = np.finfo(dtype).bits
    return 0.03 if bits <= 16 else 1e-4 if bits <= 32 else 1e-10


def matches(result, want, dtype):
    """Whether ``result`` equals the numpy reference ``want`` within :func:`tolerance` (scaled by the
    largest finite reference magnitude, so cancellation is not a false mismatch); NaN and infinities
    must sit where numpy has them (the same NaN or the same infinity there).

    >>> matches([1.0, np.nan, -np.inf], [1.0, np.nan, -np.inf], "float64")
    True
    """
    rtol = tolerance(dtype)
    result, want = np.asarray(result), np.asarray(want)
    if result.shape != want.shape:
        return False
    scale = float(np.max(np.abs(want[np.isfinite(want)].astype(np.complex128)), initial=0))
    return bool(np.allclose(result, want, rtol=rtol, atol=rtol * scale, equal_nan=True))


def max_error(result, want):
    """The largest ``|result - want|``, where both hold the same NaN or infinity counting as 0 (NaN
    where only one holds a NaN, inf where only one an infinity).

    >>> max_error([1.0, np.nan, np.inf], [1.5, np.nan, np.inf])
    0.5
    """
    result, want = np.asarray(result), np.asarray(want)
    same = (result == want) | np.isnan(result) & np.isnan(want)
    with np.errstate(invalid="ignore"):
        return float(np.max(np.where(same, 0, np.abs(result - want)), initial=0))


_KEPT = []   # the MPI attribute key of :func:`kept_on`, made at its first use (MPI may start after imports)


def kept_on(comm, key, make, *args):
    """``make(*args)`` once per communicator, kept on ``comm`` under ``key`` (an MPI attribute: freed with
    ``comm``, never seen by another communicator, even one that reuses its handle). A collective ``make``
    stays collective: every rank of ``comm`` has kept the same keys, since each ran it on ``comm`` too.

    >>> kept_on(MPI.COMM_SELF, "doctest", list, "ab"), kept_on(MPI.COMM_SELF, "doctest", list, "cd")
    (['a', 'b'], ['a', 'b'])
    """
    if not _KEPT:
        _KEPT.append(MPI.Comm.Create_keyval())
    kept = comm.Get_attr(_KEPT[0])
    if kept is None:
        kept = {}
        comm.Set_attr(_KEPT[0], kept)
    if key not in kept:
        kept[key] = make(*args)
    return kept[key]


def node_place(comm):
    """Collective on ``comm``'s first use (then kept on it, see :func:`kept_on`): this rank's index among the
    ranks of ``comm`` on its node, and how many they are.

    >>> node_place(MPI.COMM_SELF)
    (0, 1)
    """
    return kept_on(comm, "node place", _split_place, comm)


def _split_place(comm):
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_rank(), node.Get_size()
    finally:
        node.Free()


#: Launcher variables that give a job's number of ranks: Open MPI's, PMI's (MPICH's and Intel MPI's Hydra,
#: Slurm's pmi2), MVAPICH's, Flux's, a Slurm step's (read only inside ``srun``: SLURM_STEP_ID set).
LAUNCH_SIZES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "FLUX_JOB_SIZE", "SLURM_STEP_NUM_TASKS")
#: Variables that imply more than one rank where above 1 (Hydra's ranks on this node) or 0 (a PMIx rank:
#: PMIx exports no size).
LAUNCH_HINTS = {"MPI_LOCALNRANKS": 1, "PMIX_RANK": 0}


def launcher_variables():
    """The launcher variables (:data:`LAUNCH_SIZES`, :data:`LAUNCH_HINTS`) of this process's environment."""
    step = "SLURM_STEP_ID" in os.environ
    return {k: os.environ[k] for k in (*LAUNCH_SIZES, *LAUNCH_HINTS)
            if k in os.environ and (step or not k.startswith("SLURM_"))}


def mpi_library():
    """The MPI library mpi4py runs on: the first line of ``MPI.Get_library_version()`` up to a comma, and
    the ``libmpi`` files this process maps (where it can tell)."""
    first = (MPI.Get_library_version().strip() or "unknown MPI").splitlines()[0]
    name, files = _one_line(first.split(",")[0]), libmpi_files()
    return f"{name} ({', '.join(files)})" if files else name


def libmpi_files():
    """The ``libmpi*`` files mapped into this process (from ``/proc/self/maps``; none where it cannot tell)."""
    try:
        with open("/proc/self/maps") as maps:
            return sorted({parts[5] for parts in map(str.split, maps)
                           if len(parts) > 5 and os.path.basename(parts[5]).startswith("libmpi")})
    except OSError:
        return []


@functools.lru_cache(maxsize=None)
def launch_mismatch():
    """Where the launcher's variables say the job has several ranks but ``MPI.COMM_WORLD`` has one (mpi4py
    runs on another MPI than the launcher's, so each rank starts alone), the one-line message naming them,
    else None; once per process. A job size of 1 among them is the launcher of this MPI starting the
    process alone (the others an outer job's, e.g. Slurm's around ``mpiexec -n 1``)."""
    if MPI.COMM_WORLD.Get_size() > 1:
        return None
    seen = launcher_variables()
    number = {k: int(v) if v.strip().isdigit() else 0 for k, v in seen.items()}
    more = [f"{k}={seen[k]}" for k in seen if number[k] > LAUNCH_HINTS.get(k, 1)]
    if not more or any(number[k] == 1 for k in LAUNCH_SIZES if k in seen):
        return None
    return (f"launcher mismatch: the environment says this job has several ranks ({', '.join(more)}) but "
            f"MPI.COMM_WORLD has 1: mpi4py runs on {mpi_library()}, not on the launcher's MPI; reinstall mpi4py "
            f"against the launcher's MPI (env MPICC=mpicc pip install --force-reinstall --no-cache-dir "
            f"--no-binary=mpi4py mpi4py) or launch with the mpiexec of mpi4py's MPI (deinsum info shows which)")


def check_launch(error=ValueError):
    """Raise ``error`` with :func:`launch_mismatch`'s message where there is one: every entry point that runs
    on MPI calls it first (nothing to agree on: a mismatch leaves each process alone in its COMM_WORLD)."""
    message = launch_mismatch()
    if message:
        raise error(message)


def check_memory(needed, limit, where, rank, error=ValueError):
    """Raise ``error`` if ``needed`` bytes (the peak, on ``rank``) exceed ``limit`` bytes per rank."""
    if needed > limit:
        raise error(f"{where} needs {needed:,} bytes per rank at its peak (rank {rank}) but {limit:,} bytes "
                    f"are available per rank; use more ranks, or less replication (inputs/result "
                    f"'local'/'distributed'), or raise the memory limit")
