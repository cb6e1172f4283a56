"""The ``deinsum`` command line: bounds, plans, emitted scripts and runs.

    deinsum bound "ijk,ja,ka->ia" --latex
    deinsum plan "ijk,ja,ka->ia" --size i=1024,j=1024,k=1024,a=24 -P 64
    deinsum emit "ijk,ja,ka->ia" --size i=64,j=64,k=64,a=8 -P 8 -o prog.py
    deinsum run "ijk,ja,ka->ia" --size i=64,j=64,k=64,a=8 -n 4 --validate
    deinsum run "ijk,ja,ka->ia" --size i=512,j=512,k=512,a=24 -n 2 --device gpu
    deinsum info --json
    deinsum run "ijk,ja,ka->ia" --size i=512,j=512,k=512,a=24 -n 4 --inputs local --result distributed \
        --load x.npy b.npy c.npy --save out.npy
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .errors import DeinsumError
from .options import as_ranks
from .version import __version__


#: Modes of every command (one set, one default: those of deinsum.compile).
INPUTS, RESULTS = ("global", "root", "local"), ("all", "root", "distributed")


def parse_sizes(options: list[str]) -> dict[str, int]:
    """``["i=4,j=5", "k=6"]`` -> ``{"i": 4, "j": 5, "k": 6}``.

    >>> parse_sizes(["i=4,j=5", "k=6"])
    {'i': 4, 'j': 5, 'k': 6}
    """
    sizes = {}
    for option in options:
        for item in option.split(","):
            name, sep, value = item.strip().partition("=")
            if not sep or len(name) != 1 or not name.isalpha() or not value.isdigit():
                raise DeinsumError(f"--size {item!r}: expected INDEX=INT, e.g. i=1024")
            sizes[name] = int(value)
    return sizes


def shapes_from_sizes(equation: str, sizes: dict[str, int]) -> list[tuple[int, ...]]:
    """Operand shapes of ``equation`` from per-index sizes."""
    lhs = "".join(equation.split()).partition("->")[0]
    if "..." in lhs:
        raise DeinsumError("the command line takes no '...': name every index and give its --size")
    terms = lhs.split(",")
    unknown = sorted(set(sizes) - set("".join(terms)))
    if unknown:
        raise DeinsumError(f"--size names {', '.join(unknown)}, which {equation!r} does not use")
    missing = sorted({c for t in terms for c in t if c.isalpha() and c not in sizes})
    if missing:
        raise DeinsumError(f"--size: no size given for index {', '.join(repr(c) for c in missing)}")
    return [tuple(sizes[c] for c in t) for t in terms]


def launch_command(nprocs: int, script, *args: str) -> list[str]:
    """The command that runs ``script`` on ``nprocs`` ranks with this installation's ``python`` and the
    ``mpiexec`` beside it (the ``mpich`` extra's; they work without activating the environment), else the
    ``mpiexec`` on ``PATH`` (the site's MPI, which mpi4py should be built against).

    >>> cmd = launch_command(4, "prog.py", "--validate")
    >>> cmd[1:3], cmd[4:]
    (['-n', '4'], ['-m', 'mpi4py', 'prog.py', '--validate'])
    """
    beside = Path(sys.executable).with_name("mpiexec")
    mpiexec = str(beside) if beside.exists() else shutil.which("mpiexec") or "mpiexec"
    return [mpiexec, "-n", str(nprocs), sys.executable, "-m", "mpi4py", str(script), *args]


def _has_shapes(args) -> bool:
    """Whether a command's operand shapes are known: from ``--size``, or an equation without indices
    (like ``->``) has them already."""
    return bool(args.size) or not any(c.isalpha() for c in args.equation)


def _program(args, nprocs=None, needs_sizes=False):
    """The compiled program of a command: with shapes (see ``_has_shapes``), or without: symbolic, unless
    ``needs_sizes``."""
    from . import compile as compile_einsum
    if needs_sizes and not _has_shapes(args):
        raise DeinsumError(f"{args.command} needs sizes: --size i=...,j=...")
    shapes = shapes_from_sizes(args.equation, parse_sizes(args.size)) if _has_shapes(args) else []
    return compile_einsum(args.equation, *shapes, nprocs=nprocs, dtype=args.dtype, memory=args.memory,
                          inputs=args.inputs, result=args.result, layouts=parse_layouts(args.layout),
                          device=getattr(args, "device", "cpu"))


def parse_layouts(options: list[str]) -> dict[str, str]:
    """``["in0=even", "out=even"]`` -> pinned layouts by tensor name (operand numbers allowed: ``0=even``).

    >>> parse_layouts(["0=even", "out=root"])
    {'in0': 'even', 'out': 'root'}
    """
    pins = {}
    for item in options:
        name, sep, spec = item.partition("=")
        if not sep or not name or not spec:
            raise DeinsumError(f"--layout {item!r}: expected TENSOR=LAYOUT, e.g. in0=even or out=even")
        pins[f"in{name}" if name.isdigit() else name] = spec
    return pins


def cmd_bound(args) -> int:
    if args.layout and not (_has_shapes(args) and args.nprocs):
        raise DeinsumError("--layout needs --size and -P: a pinned layout matters only to the plan, which bound "
                           "prints with --size and -P")
    per_p = [int(q) for q in args.per_p.split(",") if q.strip()] if args.per_p else []
    if per_p and not (args.latex and _has_shapes(args)):
        raise DeinsumError("--per-p needs --latex and --size: it adds rows to the LaTeX table of plans")
    prog = _program(args)
    print(prog.report("latex" if args.latex else "json" if args.json else "text", nprocs=args.nprocs, per_p=per_p))
    return 0


def cmd_plan(args) -> int:
    """Print the plan; exit 2 where no plan fits the memory per rank (the report says what would)."""
    prog = _program(args, args.nprocs, needs_sizes=True)
    print(prog.report("json" if args.json else "text", nprocs=args.nprocs))
    plan = prog.plan(nprocs=args.nprocs)
    if not plan.feasible:
        print(f"deinsum: error: INFEASIBLE: no plan fits {plan.memory:,} bytes per rank; the least peak of any "
              f"plan found is {plan.peak_bytes:,} bytes per rank (--memory {plan.peak_bytes})", file=sys.stderr)
        return 2
    return 0


def cmd_emit(args) -> int:
    path = _program(args, args.nprocs, needs_sizes=True).to_script(args.script)
    print(f"wrote {path} (run: {shlex.join(launch_command(args.nprocs, path, '--validate'))})")
    return 0


def cmd_run(args) -> int:
    prog = _program(args, args.nprocs, needs_sizes=True)
    with tempfile.TemporaryDirectory() as tmp:
        script = prog.to_script(Path(tmp) / "program.py")
        cmd = launch_command(args.nprocs, script, "--repeat", str(args.repeat), "--device", args.device,
                             *(["--validate"] if args.validate else []), *(["--load", *args.load] if args.load else []),
                             *(["--save", args.save] if args.save else []))
        try:
            return subprocess.run(cmd, timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            raise DeinsumError(f"mpiexec did not finish within --timeout {args.timeout} s") from None


def info_facts(comm):
    """Collective on ``comm``: what a bug report needs (versions; the MPI library, its launcher variables and
    whether they match; ranks, nodes, memory per rank; BLAS, GEMM routes; GPUs), on rank 0 (None elsewhere)."""
    import mpi4py
    import numpy as np
    from mpi4py import MPI
    from threadpoolctl import threadpool_info
    from .memory import default_memory
    from .runtime.checks import launch_mismatch, launcher_variables, libmpi_files, mpi_library, node_place
    from .runtime.gemm import machine_key
    from .runtime.gpu import cuda_aware, device_name, load_cupy
    from .runtime.blas import gemm_libraries, gemm_routes
    local, on_node = node_place(comm)
    nodes = comm.gather((on_node, default_memory(on_node)) if local == 0 else None, root=0)
    if comm.Get_rank() != 0:
        return None
    nodes = [n for n in nodes if n is not None]
    try:
        cupy = load_cupy()
        gpus = [device_name(cupy, d) for d in range(cupy.cuda.runtime.getDeviceCount())]
    except RuntimeError as exc:
        gpus = str(exc)
    return {"deinsum": __version__, "python": sys.version.split()[0], "numpy": np.__version__,
            "mpi4py": mpi4py.__version__,
            "mpi": {"library": mpi_library(), "library_version": MPI.Get_library_version().strip(),
                    "standard": "MPI {}.{}".format(*MPI.Get_version()), "libmpi": libmpi_files(),
                    "mpi4py_module": MPI.__file__, "mpi4py_config": mpi4py.get_config(), "cuda_aware": cuda_aware()},
            "launcher": {"variables": launcher_variables(), "mismatch": launch_mismatch()},
            "ranks": comm.Get_size(), "nodes": len(nodes), "ranks_per_node": sorted(n for n, _ in nodes),
            "memory_per_rank": min(m for _, m in nodes),
            "cpu": machine_key(None)["cpu"].get("model name"),
            "blas": [{k: p.get(k) for k in ("internal_api", "version", "num_threads", "filepath")}
                     for p in threadpool_info() if p["user_api"] == "blas"],
            "gemm": {"libraries": gemm_libraries(), **gemm_routes()},
            "gpus": gpus}


def info_text(facts) -> str:
    """:func:`info_facts` as the lines ``deinsum info`` prints."""
    from .runtime.gpu import CUDA_AWARE
    from .runtime.blas import gemm_library
    mpi, gemm, launcher = facts["mpi"], facts["gemm"], facts["launcher"]
    blas = ", ".join(f"{b['internal_api']} {b['version']} ({b['num_threads']} threads)" for b in facts["blas"])
    gpus = f"none ({facts['gpus']})" if isinstance(facts["gpus"], str) else ", ".join(facts["gpus"]) or "none"
    variables = ", ".join(f"{k}={v}" for k, v in launcher["variables"].items()) or "none"
    memory = facts["memory_per_rank"]
    return "\n".join([
        f"deinsum {facts['deinsum']} (Python {facts['python']}, numpy {facts['numpy']}, mpi4py {facts['mpi4py']})",
        f"MPI: {mpi['library']}, {mpi['standard']}, {CUDA_AWARE[mpi['cuda_aware']]}; mpi4py's module "
        f"{Path(mpi['mpi4py_module']).name}, built with {mpi['mpi4py_config'] or 'no mpi.cfg (a wheel)'}",
        f"launcher variables: {variables}; {launcher['mismatch'] or 'no mismatch with MPI.COMM_WORLD'}",
        f"ranks: {facts['ranks']} on {facts['nodes']} node(s), {'/'.join(map(str, facts['ranks_per_node']))} per "
        f"node; memory per rank: {memory:,} bytes ({memory / 2**30:.1f} GiB: the default, free memory / ranks "
        f"on the node)",
        f"CPU: {facts['cpu'] or 'unknown'}; BLAS libraries loaded: {blas or 'none found'}",
        f"GEMM libraries: MKL {gemm['libraries']['mkl'] or 'not installed'}; deinsum's streaming kernels: "
        f"{gemm['libraries']['stream'] or 'not built (or no AVX-512)'}",
        f"GEMM routes ({gemm['why']}): {gemm_library()}",
        f"GPUs: {gpus}"])


def cmd_info(args) -> int:
    """Print :func:`info_facts` on rank 0 (text, or JSON with ``--json``); collective on COMM_WORLD."""
    from mpi4py import MPI
    facts = info_facts(MPI.COMM_WORLD)
    if facts is not None:
        print(json.dumps(facts, indent=2) if args.json else info_text(facts))
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit code 2)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="deinsum", description="Communication-optimal distributed einsums.")
    parser.add_argument("--version", action="version", version=f"deinsum {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name, func, help_text, ranks_flag=None, ranks_required=False):
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("equation", help='the einsum, e.g. "ijk,ja,ka->ia"')
        p.add_argument("--size", action="append", default=[], help="index sizes, e.g. i=1024,j=512 (repeatable)")
        p.add_argument("--dtype", default="float64", help="element type (default float64)")
        p.add_argument("--memory", default=None,
                       help="peak memory per rank, in bytes, e.g. 4GiB or 500MB (default: this machine's free "
                            "memory shared by min(P, cores) ranks)")
        p.add_argument("--inputs", choices=INPUTS, default="global",
                       help="where the inputs start: on every rank (global, default), on rank 0, or local blocks")
        p.add_argument("--result", choices=RESULTS, default="all",
                       help="where the result ends: on every rank (all, default), on rank 0, or distributed")
        p.add_argument("--layout", action="append", default=[], metavar="TENSOR=LAYOUT",
                       help="pin the layout an input (in0, in1, ... or 0, 1, ...) starts in (local) or is first "
                            "distributed into (global, root), or a distributed result (out) ends in: even, "
                            "replicated, root or a grid spec like '2x2: 0, 1'; the plan is built around it "
                            "(repeatable)")
        if ranks_flag:
            p.add_argument(*ranks_flag, dest="nprocs", type=int, required=ranks_required, default=None,
                           help="number of MPI ranks")
        p.set_defaults(run=func)
        return p

    b = command("bound", cmd_bound, "SOAP I/O lower bound, optimal tiles and fusion", ("-P", "--nprocs"))
    fmt = b.add_mutually_exclusive_group()
    fmt.add_argument("--latex", action="store_true", help="booktabs table and formulas")
    b.add_argument("--per-p", default="", metavar="P,P,...",
                   help="with --latex and --size: a per-P table of the bounds and deinsum's plans at these rank counts "
                        "too (the sizes as given), e.g. 8,64,512")
    fmt.add_argument("--json", action="store_true", help="JSON data")
    p = command("plan", cmd_plan, "groups, grids, layouts and bytes per rank for P ranks (no MPI needed)",
                ("-P", "--nprocs"), True)
    p.add_argument("--json", action="store_true", help="JSON data")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="gpu: plan in a GPU's memory (without --memory: its free memory here, per rank sharing it)")
    e = command("emit", cmd_emit, "write a standalone mpi4py program", ("-P", "--nprocs"), True)
    e.add_argument("-o", "--script", required=True, help="the program file to write")
    e.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="gpu: the program also carries the GPU path and takes --device gpu (CuPy on the cluster)")
    r = command("run", cmd_run, "emit the program and run it under mpiexec", ("-n", "--nprocs"), True)
    r.add_argument("--validate", action="store_true",
                   help="compare with numpy.einsum on rank 0 (with --inputs local or --result distributed, rank 0 then "
                        "holds the whole operands and result: small problems only)")
    r.add_argument("--load", nargs="+", default=None, metavar="NPY",
                   help=".npy files, one per operand (default random); with --inputs local each rank reads only its "
                        "block")
    r.add_argument("--save", default=None, metavar="NPY",
                   help="write the result to this .npy file; with --result distributed each rank writes only its block")
    r.add_argument("--repeat", type=int, default=3, help="runs to time (median [min, max])")
    r.add_argument("--timeout", type=float, default=None, help="give up after this many seconds")
    r.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="where local contractions run (gpu: CuPy; inputs and result on the host, copies timed)")
    i = sub.add_parser("info", help="versions, MPI, ranks, memory, GEMM libraries and GPUs: what a bug report needs",
                       description="Versions, the MPI library and its launcher, ranks, memory per rank, GEMM "
                                   "libraries and routes, GPUs; under mpiexec rank 0 prints.")
    i.add_argument("--json", action="store_true", help="JSON data")
    i.set_defaults(run=cmd_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # an equation may start with '->' (a 0-d einsum, as numpy's "->"): a leading space keeps argparse from
    # taking it for an option
    argv = [f" {a}" if a.startswith("->") else a for a in (sys.argv[1:] if argv is None else argv)]
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        if getattr(args, "nprocs", None) is not None:
            as_ranks(args.nprocs, "-P" if args.command in ("bound", "plan", "emit") else "-n")
        return args.run(args)
    except (DeinsumError, OSError, MemoryError) as exc:   # one line a user can act on, exit 2
        if isinstance(exc, BrokenPipeError):   # e.g. `deinsum bound ... | head`: not an error
            sys.stdout = open(os.devnull, "w")
            return 0
        print(f"deinsum: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
