"""The ``deinsum`` command line: bounds, plans, emitted scripts and runs.

    deinsum bound "ijk,ja,ka->ia" --latex
    deinsum plan "ijk,ja,ka->ia" --size i=1024,j=1024,k=1024,a=24 -P 64
    deinsum emit "ijk,ja,ka->ia" --size i=64,j=64,k=64,a=8 -P 8 -o prog.py
    deinsum run "ijk,ja,ka->ia" --size i=64,j=64,k=64,a=8 -n 4 --validate
    deinsum run "ijk,ja,ka->ia" --size i=512,j=512,k=512,a=24 -n 2 --device gpu
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from .errors import DeinsumError, as_ranks
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
    """The command that runs ``script`` on ``nprocs`` ranks with this installation's ``mpiexec``
    and ``python`` (they work without activating its environment).

    >>> cmd = launch_command(4, "prog.py", "--validate")
    >>> cmd[1:3], cmd[4:], Path(cmd[0]).parent == Path(cmd[3]).parent
    (['-n', '4'], ['-m', 'mpi4py', 'prog.py', '--validate'], True)
    """
    return [str(Path(sys.executable).with_name("mpiexec")), "-n", str(nprocs), sys.executable, "-m", "mpi4py",
            str(script), *args]


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
    prog = _program(args)
    print(prog.report("latex" if args.latex else "json" if args.json else "text", nprocs=args.nprocs))
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
                             *(["--validate"] if args.validate else []))
        try:
            return subprocess.run(cmd, timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            raise DeinsumError(f"mpiexec did not finish within --timeout {args.timeout} s") from None


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
    fmt.add_argument("--json", action="store_true", help="JSON data")
    p = command("plan", cmd_plan, "groups, grids, layouts and bytes per rank for P ranks (no MPI needed)",
                ("-P", "--nprocs"), True)
    p.add_argument("--json", action="store_true", help="JSON data")
    e = command("emit", cmd_emit, "write a standalone mpi4py program", ("-P", "--nprocs"), True)
    e.add_argument("-o", "--script", required=True, help="the program file to write")
    e.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="gpu: the program also carries the GPU path and takes --device gpu (CuPy on the cluster)")
    r = command("run", cmd_run, "emit the program and run it under mpiexec", ("-n", "--nprocs"), True)
    r.add_argument("--validate", action="store_true", help="compare with numpy.einsum on rank 0")
    r.add_argument("--repeat", type=int, default=3, help="runs to time (median [min, max])")
    r.add_argument("--timeout", type=float, default=None, help="give up after this many seconds")
    r.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="where local contractions run (gpu: CuPy; inputs and result on the host, copies timed)")
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
