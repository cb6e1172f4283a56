"""The command-line driver of an emitted program: arguments, inputs, repeated timed runs, report.

STANDALONE: imports only numpy, mpi4py and the sibling runtime modules
(emitted scripts carry these files in their runtime payload; it uses checks.py for
agreement, files, memory and validation). An emitted script defines
its plan's data (``EQUATION``, ``MOVES``, ...) and ``run(rt, *operands)``;
``script_main(globals())`` turns it into a command-line tool. Each rank builds
its own exchange tables and footprint from the layouts in that data at start-up.
"""
import argparse
import sys

import numpy as np
from mpi4py import MPI

from ..peak import peak_bytes
from ..layout import Layout
from ..tables import rank_tables
from ..memory import as_bytes, default_memory
from .checks import agree, check_launch, check_memory, check_output_path, collectively, load_npy, matches, max_error
from .checks import node_place
from .checks import save_atomically, validation_operands
from .kernels import reference_einsum
from .runner import PHASES, Runtime, pin_blas_threads


class ProgramError(Exception):
    """A wrong run-time argument (sizes, number of ranks, input files)."""


#: The most timed runs one launch takes (``--repeat``).
MAX_REPEAT = 100_000


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


STARTS = {"global": "on every rank", "root": "on rank 0", "local": "as each rank's block"}
ENDS = {"all": "on every rank", "root": "on rank 0", "distributed": "as each rank's block"}


def load_operands(paths, shapes, dtype):
    """Load the ``.npy`` inputs (numpy's ``safe`` casting to the program's dtype)."""
    return [load_npy(path, shape, dtype, "safe", f"--load operand {n}", ProgramError)
            for n, (path, shape) in enumerate(zip(paths, shapes))]


def summarize(samples):
    """Median and [min, max] of a list of seconds, as text."""
    return f"{float(np.median(samples)):.6f} [{min(samples):.6f}, {max(samples):.6f}]"


def footprint_of(ns):
    """The script's ``FOOTPRINT`` as :func:`deinsum.peak.peak_bytes` takes it (its layouts are tuples)."""
    terms = lambda group: tuple((Layout(*layout), *rest) for layout, *rest in group)  # noqa: E731
    return tuple((terms(held), tuple(terms(group) for group in transients)) for held, transients in ns["FOOTPRINT"])


def script_runtime(ns, comm, device=None):
    """This rank's :class:`Runtime` for an emitted program (``ns`` = its globals), its tables built from
    ``MOVES[k] = (timer, label, src, dst, split, rounds)``, computing on ``device`` (a GPU) if given."""
    rank = comm.Get_rank()
    moves = [(timer, label, rank_tables(Layout(*src), Layout(*dst), ns["NPROCS"], rank, split, rounds))
             for timer, label, src, dst, split, rounds in ns["MOVES"]]
    return Runtime(comm, ns["DTYPE"], moves, device)


def script_main(ns, argv=None):
    """Command-line driver of an emitted program (``ns`` = the program's globals)."""
    comm = MPI.COMM_WORLD
    parser = argparse.ArgumentParser(description=f"deinsum program for {ns['EQUATION']!r} on {ns['NPROCS']} ranks")
    parser.add_argument("--size", action="append", default=[], help="check planned sizes, e.g. i=64,j=32")
    parser.add_argument("--load", nargs="+", default=None, metavar="NPY",
                        help=f".npy files, one per operand (read {STARTS[ns['INPUTS']]}; default random)")
    parser.add_argument("--save", default=None, metavar="NPY",
                        help="write the result to this .npy file (rank 0; a distributed result: each rank its block)")
    parser.add_argument("--validate", action="store_true", help="compare with numpy.einsum on rank 0 (local inputs "
                        "or a distributed result are gathered whole there: small problems only)")
    parser.add_argument("--repeat", type=int, default=1, help="run K times; report median [min, max]")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument("--memory", default=None,
                        help="bytes per rank the run may use, e.g. 4GiB or 500MB (default: MemAvailable shared by "
                             "the node's ranks)")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="where local contractions run; gpu: CuPy, inputs and result on the host (copies timed)")
    args = parser.parse_args(argv)
    # every check before any work, agreed by all ranks: one error everywhere, never a hang
    operands, failure = None, None
    node_ranks = node_place(comm)[1]   # collective, so before anything that may raise
    try:
        check_launch(ProgramError)
        if comm.size != ns["NPROCS"]:
            raise ProgramError(f"this program was planned for {ns['NPROCS']} ranks, not {comm.size}: "
                               f"run mpiexec -n {ns['NPROCS']} or emit it again")
        check_sizes(args.size, ns["SIZES"])
        if not 1 <= args.repeat <= MAX_REPEAT:
            raise ProgramError(f"--repeat {args.repeat}: expected 1 to {MAX_REPEAT:,} runs")
        limit = default_memory(node_ranks) if args.memory is None else as_bytes(args.memory, "--memory", ProgramError)
        need = int(peak_bytes(footprint_of(ns), [comm.rank], np.dtype(ns["DTYPE"]).itemsize)[0])
        check_memory(need, limit, "this program", comm.rank, ProgramError)
        if comm.rank == 0 and args.save is not None:
            check_output_path(args.save, ProgramError)
        if args.load and len(args.load) != len(ns["INPUT_SHAPES"]):
            raise ProgramError(f"--load takes {len(ns['INPUT_SHAPES'])} files, got {len(args.load)}")
        # whole operands: the inputs where they start whole, rank 0's reference where --validate compares
        if ns["INPUTS"] == "global" or comm.rank == 0 and (ns["INPUTS"] == "root" or args.validate):
            if args.load:
                operands = load_operands(args.load, ns["INPUT_SHAPES"], ns["DTYPE"])
            else:
                operands = validation_operands(ns["INPUT_SHAPES"], ns["DTYPE"], args.seed)
    except Exception as exc:  # noqa: BLE001 - any rank's failure stops every rank
        failure = str(exc) if isinstance(exc, ProgramError) else f"{type(exc).__name__}: {exc}"
    # the same arguments everywhere (else --repeat could differ and hang), and no failure anywhere
    if not _agreed(comm, {"equation": ns["EQUATION"], "argv": sys.argv[1:] if argv is None else argv}, failure):
        return 2
    whole = operands
    if ns["INPUTS"] == "local":
        operands = _on_every_rank(comm, ns["BLOCK_IO"].local_blocks, comm, args.load, [Layout(*e) for e in ns["ENTRY"]],
                                  ns["DTYPE"], args.seed, "--load operand", ProgramError)
    elif operands is None:
        operands = [None] * len(ns["INPUT_SHAPES"])
    if operands is False:
        return 2
    device = None
    if args.device == "gpu":
        try:
            if ns["OPEN_DEVICE"] is None:
                raise ProgramError("this program was emitted for the CPU: emit it with device='gpu' "
                                   "(deinsum emit --device gpu) to run it with --device gpu")
            device = ns["OPEN_DEVICE"](comm, ProgramError)
            collectively(comm, device.check_memory, need, ProgramError, error=ProgramError)
        except ProgramError as exc:   # raised on every rank alike (both agree first)
            if comm.rank == 0:
                print(f"error: {exc}", file=sys.stderr)
            return 2
    threads = pin_blas_threads(node_ranks)
    runs = []
    with script_runtime(ns, comm, device) as rt:
        for _ in range(args.repeat):
            rt.reset()
            comm.Barrier()
            start = MPI.Wtime()
            result = ns["run"](rt, *operands)
            if device is not None:
                result = device.place(result, False, rt.clock)
            comm.Barrier()
            runs.append((MPI.Wtime() - start, rt.clock.seconds, rt.log))
        model = rt.model_bytes
    report(comm, ns, runs, threads, model, device)
    blocks, exit_layout = result, Layout(*ns["EXIT"])
    if args.validate and ns["RESULT"] == "distributed":   # the whole result on rank 0
        result = ns["BLOCK_IO"].gather_on_root(comm, blocks, exit_layout, ns["DTYPE"])
    status, failure = 0, None
    if comm.rank == 0:
        try:
            if args.validate:
                want = reference_einsum(ns["EQUATION"], *whole)
                ok = matches(result, want, ns["DTYPE"])
                print(f"validate: {'OK' if ok else 'MISMATCH'} (max abs error {max_error(result, want):.3g})")
                status = 0 if ok else 1
            if args.save is not None and ns["RESULT"] != "distributed":
                save_atomically(args.save, result, ProgramError)
                print(f"wrote {args.save}")
        except Exception as exc:  # noqa: BLE001 - e.g. a full disk: one line, and no rank left waiting
            failure = f"{type(exc).__name__}: {exc}"
    if not _agreed(comm, {}, failure):
        return 2
    if args.save is not None and ns["RESULT"] == "distributed":
        saved = _on_every_rank(comm, ns["BLOCK_IO"].save_blocks, comm, args.save, blocks, exit_layout, ns["DTYPE"],
                               ProgramError)
        if saved is False:
            return 2
        if comm.rank == 0:
            print(f"wrote {args.save} (each rank its block)")
    return comm.bcast(status, root=0)


def _on_every_rank(comm, step, *args):
    """``step(*args)``, a collective step whose ProgramError every rank raises alike: its value, or False
    once rank 0 has printed the error."""
    try:
        return step(*args)
    except ProgramError as exc:
        if comm.rank == 0:
            print(f"error: {exc}", file=sys.stderr)
        return False


def _agreed(comm, facts, failure):
    """Collective :func:`agree`; on disagreement or any failure rank 0 prints the one-line error."""
    try:
        agree(comm, facts, failure, ProgramError)
    except ProgramError as exc:
        if comm.rank == 0:
            print(f"error: {exc}", file=sys.stderr)
        return False
    return True


def exit_with(status):
    """Exit an emitted script with ``status``, reached by every rank together. A failure exits after
    ``MPI.Finalize`` so that ``python -m mpi4py`` does not turn it into an ``MPI_Abort`` message, and
    through ``sys.exit``: ``os._exit`` would skip the exit handlers that end MPICH's PMI session, and
    Hydra would then kill the ranks still exiting (``BAD TERMINATION``, exit code 9)."""
    if status:
        MPI.Finalize()
    sys.exit(status)


def report(comm, ns, runs, threads, model, device=None):
    """Print median [min, max] seconds per phase and measured bytes per rank against this rank's ``model``
    (bytes sent, received) (rank 0)."""
    totals = [r[0] for r in runs]
    sent = comm.gather(runs[-1][2].bytes_sent, root=0)
    received = comm.gather(runs[-1][2].bytes_received, root=0)
    model = comm.gather(model, root=0)
    if comm.rank != 0:
        return
    blas = "unpinned (no threadpoolctl)" if threads is None else f"{threads} BLAS thread(s) per rank"
    if device is not None:
        blas = f"local compute on {device}"
    print(f"deinsum program {ns['EQUATION']!r}: {ns['NPROCS']} ranks, {blas}, dtype {ns['DTYPE']}, "
          f"{len(runs)} run(s); inputs start {STARTS[ns['INPUTS']]}, result ends {ENDS[ns['RESULT']]} (both timed)")
    print(f"  total        {summarize(totals)} s")
    for phase in PHASES:
        samples = [r[1].get(phase, 0.0) for r in runs]
        if any(samples):
            print(f"  {phase:<12} {summarize(samples)} s")
    print("  rank  bytes sent  bytes received  (model sent/received)")
    for rank, (s, r) in enumerate(zip(sent, received)):
        print(f"  {rank:>4}  {s:>10}  {r:>14}  ({model[rank][0]}/{model[rank][1]})")
    match = all((s, r) == tuple(model[k]) for k, (s, r) in enumerate(zip(sent, received)))
    print(f"  measured bytes {'==' if match else '!='} model")
