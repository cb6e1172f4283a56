"""The command-line driver of an emitted program: arguments, inputs, repeated timed runs, report.

STANDALONE: imports only numpy, mpi4py and the sibling runtime modules
(emitted scripts carry these files as one block). An emitted script defines
its plan's data (``EQUATION``, ``MOVES``, ...) and ``run(rt, *operands)``;
``script_main(globals())`` turns it into a command-line tool.
"""
import argparse
import os
import sys

import numpy as np
from mpi4py import MPI

from .kernels import reference_einsum
from .runtime import PHASES, Runtime, pin_blas_threads

class ProgramError(Exception):
    """A wrong run-time argument (sizes, number of ranks, input files)."""


def random_operands(shapes, dtype, seed):
    """Deterministic random operands in [-1, 1) (complex: both parts)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    out = []
    for shape in shapes:
        x = rng.uniform(-1, 1, shape)
        if dtype.kind == "c":
            x = x + 1j * rng.uniform(-1, 1, shape)
        out.append(np.asarray(x, dtype=dtype))
    return out


def check_sizes(options, planned):
    """Validate ``--size i=4,j=5`` options against the planned sizes."""
    for option in options:
        for item in option.split(","):
            name, sep, value = item.partition("=")
            if not sep or name not in planned or not value.strip().isdigit():
                raise ProgramError(f"--size {item!r}: expected INDEX=INT with INDEX one of {''.join(planned)}")
            if int(value) != planned[name]:
                raise ProgramError(f"--size {item}: this program was planned for {name}={planned[name]}; "
                                   f"emit it again for other sizes")


STARTS = {"global": "on every rank", "root": "on rank 0"}
ENDS = {"all": "on every rank", "root": "on rank 0"}


def load_operands(paths, shapes, dtype):
    """Load ``.npy`` inputs and check their shapes."""
    if len(paths) != len(shapes):
        raise ProgramError(f"--load takes {len(shapes)} files, got {len(paths)}")
    out = []
    for n, (path, shape) in enumerate(zip(paths, shapes)):
        try:
            x = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ProgramError(f"--load {path}: cannot read ({exc})") from None
        if x.shape != tuple(shape):
            raise ProgramError(f"--load {path}: operand {n} must have shape {tuple(shape)}, not {x.shape}")
        out.append(x.astype(dtype, copy=False))
    return out


def save_atomically(path, array):
    """Write ``array`` to ``path`` via a temporary file and rename: never a half-written file."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        np.save(f, array, allow_pickle=False)
    os.replace(tmp, path)


def summarize(samples):
    """Median and [min, max] of a list of seconds, as text."""
    return f"{float(np.median(samples)):.6f} [{min(samples):.6f}, {max(samples):.6f}]"


def script_runtime(ns, comm):
    """This rank's :class:`Runtime` for an emitted program (``ns`` = its globals): its own rows of ``MOVES``."""
    rank = comm.Get_rank()
    moves = [(timer, label, [per_rank[rank] for per_rank in steps]) for timer, label, steps in ns["MOVES"]]
    return Runtime(comm, ns["DTYPE"], moves)


def script_main(ns, argv=None):
    """Command-line driver of an emitted program (``ns`` = the program's globals)."""
    comm = MPI.COMM_WORLD
    parser = argparse.ArgumentParser(description=f"deinsum program for {ns['EQUATION']!r} on {ns['NPROCS']} ranks")
    parser.add_argument("--size", action="append", default=[], help="check planned sizes, e.g. i=64,j=32")
    parser.add_argument("--load", nargs="+", default=None, metavar="NPY",
                        help=f".npy files, one per operand (read {STARTS[ns['INPUTS']]}; default random)")
    parser.add_argument("--save", default=None, metavar="NPY", help="write the result to this .npy file (rank 0)")
    parser.add_argument("--validate", action="store_true", help="compare with numpy.einsum on rank 0")
    parser.add_argument("--repeat", type=int, default=1, help="run K times; report median [min, max]")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    args = parser.parse_args(argv)
    try:
        if comm.size != ns["NPROCS"]:
            raise ProgramError(f"this program was planned for {ns['NPROCS']} ranks, not {comm.size}: "
                               f"run mpiexec -n {ns['NPROCS']} or emit it again")
        check_sizes(args.size, ns["SIZES"])
        if args.repeat < 1:
            raise ProgramError("--repeat must be >= 1")
        operands = None
        if comm.rank == 0 or ns["INPUTS"] == "global":
            if args.load:
                operands = load_operands(args.load, ns["INPUT_SHAPES"], ns["DTYPE"])
            else:
                operands = random_operands(ns["INPUT_SHAPES"], ns["DTYPE"], args.seed)
        error = None
    except ProgramError as exc:
        error = str(exc)
    error = next((e for e in comm.allgather(error) if e), None)  # every rank stops on any rank's error
    if error:
        if comm.rank == 0:
            print(f"error: {error}", file=sys.stderr)
        return 2
    if operands is None:
        operands = [None] * len(ns["INPUT_SHAPES"])
    threads = pin_blas_threads(comm)
    runs = []
    with script_runtime(ns, comm) as rt:
        for _ in range(args.repeat):
            rt.reset()
            comm.Barrier()
            start = MPI.Wtime()
            result = ns["run"](rt, *operands)
            comm.Barrier()
            runs.append((MPI.Wtime() - start, rt.clock.seconds, rt.log))
    report(comm, ns, runs, threads)
    status = 0
    if comm.rank == 0:
        if args.validate:
            want = reference_einsum(ns["EQUATION"], *operands)
            ok = np.allclose(result, want, rtol=ns["RTOL"], atol=ns["RTOL"] * np.max(np.abs(want), initial=0))
            print(f"validate: {'OK' if ok else 'MISMATCH'} (max abs error "
                  f"{float(np.max(np.abs(result - want), initial=0)):.3g})")
            status = 0 if ok else 1
        if args.save:
            save_atomically(args.save, result)
            print(f"wrote {args.save}")
    return comm.bcast(status, root=0)


def report(comm, ns, runs, threads):
    """Print median [min, max] seconds per phase and measured bytes per rank (rank 0)."""
    totals = [r[0] for r in runs]
    sent = comm.gather(runs[-1][2].bytes_sent, root=0)
    received = comm.gather(runs[-1][2].bytes_received, root=0)
    if comm.rank != 0:
        return
    blas = "unpinned (no threadpoolctl)" if threads is None else f"{threads} BLAS thread(s) per rank"
    print(f"deinsum program {ns['EQUATION']!r}: {ns['NPROCS']} ranks, {blas}, dtype {ns['DTYPE']}, "
          f"{len(runs)} run(s); inputs start {STARTS[ns['INPUTS']]}, result ends {ENDS[ns['RESULT']]} (both timed)")
    print(f"  total        {summarize(totals)} s")
    for phase in PHASES:
        samples = [r[1].get(phase, 0.0) for r in runs]
        if any(samples):
            print(f"  {phase:<12} {summarize(samples)} s")
    model = ns["MODEL_BYTES"]
    print("  rank  bytes sent  bytes received  (model sent/received)")
    for rank, (s, r) in enumerate(zip(sent, received)):
        print(f"  {rank:>4}  {s:>10}  {r:>14}  ({model[rank][0]}/{model[rank][1]})")
    match = all((s, r) == tuple(model[k]) for k, (s, r) in enumerate(zip(sent, received)))
    print(f"  measured bytes {'==' if match else '!='} model")
