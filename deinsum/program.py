"""The compiled program: plans per shapes/P, runs under MPI, emits scripts, reports bounds.

>>> import deinsum
>>> prog = deinsum.compile("ijk,ja,ka->ia", (40, 30, 20), (30, 8), (20, 8))
>>> plan = prog.plan(nprocs=8)
>>> [s.kind for s in plan.decomposition.steps]
['KRP', 'TDOT']
>>> plan.groups[0].grid.used
8
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np

from .codegen.checks import agree, check_cast, check_output_path, collectively, write_atomically
from .codegen.emit import generate
from .decompose import Decomposition, as_shape, decompose
from .errors import DeinsumError
from .footprint import check_footprint, footprint
from .grids import Layout
from .plan import Plan, build_plan
from .soap import analyze


@dataclass(frozen=True)
class RunReport:
    """What one call measured on this rank: seconds per phase and bytes moved, next to the model."""

    rank: int
    seconds: dict
    bytes_sent: int
    bytes_received: int
    model_sent: int
    model_received: int

    @property
    def matches_model(self) -> bool:
        return (self.bytes_sent, self.bytes_received) == (self.model_sent, self.model_received)

    def __str__(self) -> str:
        phases = ", ".join(f"{k} {v:.6f} s" for k, v in self.seconds.items())
        return (f"rank {self.rank}: {phases}; sent {self.bytes_sent} B, received {self.bytes_received} B "
                f"(model {self.model_sent}/{self.model_received})")


@dataclass(frozen=True)
class DistributedResult:
    """The result left distributed: this rank's block and the layout saying who holds what."""

    local: np.ndarray | None
    layout: Layout
    rank: int

    @property
    def block(self):
        """This rank's slice of the global result (None where it holds nothing)."""
        return self.layout.block(self.rank)


def as_dtype(value) -> np.dtype:
    """``np.dtype(value)`` for int/float/complex types, else a DeinsumError."""
    try:
        dtype = np.dtype(value)
    except TypeError:
        raise DeinsumError(f"dtype {value!r} is not a numpy data type") from None
    if dtype.kind not in "iufc":
        raise DeinsumError(f"dtype {dtype.name}: expected an integer, float or complex type")
    return dtype


_PINNED: list = []  # non-empty once this process pinned its BLAS threads


@lru_cache(maxsize=64)
def _program(plan: Plan) -> dict:
    """The namespace of the plan's program text (the same text ``to_script`` writes), executed once."""
    namespace: dict = {"__name__": "deinsum_program"}
    exec(compile(generate(plan), f"<deinsum program {plan.equation}>", "exec"), namespace)
    return namespace


@dataclass
class Program:
    """An einsum compiled for distributed execution (see :func:`deinsum.compile`)."""

    equation: str
    shapes: tuple[tuple[int, ...], ...] | None = None
    nprocs: int | None = None
    dtype: np.dtype | None = None
    memory: int | None = None
    inputs: str = "global"
    output: str = "all"
    threads: str | None = "auto"
    casting: str = "safe"
    last_run: RunReport | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        if self.shapes is not None:
            self.shapes = tuple(as_shape(s, f"operand {n}") for n, s in enumerate(self.shapes))
        self.dtype = None if self.dtype is None else as_dtype(self.dtype)
        if self.casting not in ("no", "equiv", "safe", "same_kind", "unsafe"):
            raise DeinsumError(f"casting={self.casting!r}: expected one of no, equiv, safe, same_kind, unsafe")
        if not isinstance(self.equation, str):
            raise DeinsumError(f"the einsum equation must be a string, not {type(self.equation).__name__}")
        # parametric with '...': the decomposition waits for the shapes of a call
        self.decomposition: Decomposition | None = (
            decompose(self.equation, *self.shapes) if self.shapes is not None
            else None if "..." in self.equation else decompose(self.equation))

    # ---- planning and reports (pure, no MPI) ---------------------------------------------------
    def plan(self, shapes: Sequence[Sequence[int]] | None = None, nprocs: int | None = None, dtype=None,
             inputs: str | None = None, output: str | None = None) -> Plan:
        """The plan for these shapes, ranks, dtype and entry/exit layouts (cached)."""
        shapes = self.shapes if shapes is None else tuple(as_shape(s, f"operand {n}") for n, s in enumerate(shapes))
        if shapes is None:
            raise DeinsumError(f"{self.equation!r} was compiled without shapes: pass shapes to plan()")
        nprocs = nprocs if nprocs is not None else self.nprocs
        if nprocs is None:
            raise DeinsumError("the number of ranks is unknown: pass nprocs")
        dtype = as_dtype(dtype if dtype is not None else self.dtype if self.dtype is not None else np.float64)
        return _plan(self.equation, shapes, int(nprocs), dtype, self.memory, inputs or self.inputs,
                     output or self.output)

    def analysis(self, nprocs: int | None = None):
        """SOAP bounds and fusion: symbolic without shapes, numeric and parallel with them."""
        if self.decomposition is None:
            raise DeinsumError(f"{self.equation!r}: bounds of an einsum with '...' need shapes: compile with shapes")
        p = nprocs if nprocs is not None else self.nprocs
        return analyze(self.decomposition, S=self.memory, P=p)

    def report(self, format: str = "text", nprocs: int | None = None, inputs: str | None = None,
               output: str | None = None) -> str:
        """The bounds report (``text``, ``latex`` or ``json``) followed, with shapes and P, by the plan."""
        a = self.analysis(nprocs)
        if format == "latex":
            return a.latex()
        if format == "json":
            import json
            data = a.to_dict()
            if self.shapes is not None and (nprocs or self.nprocs):
                plan = self.plan(nprocs=nprocs, inputs=inputs, output=output)
                data["received_bytes_per_rank"] = plan.received_bytes().tolist()
                data["peak_bytes_per_rank"] = footprint(plan).tolist()
            return json.dumps(data, indent=2, default=str)
        if format != "text":
            raise DeinsumError(f"report format {format!r}: expected text, latex or json")
        text = str(a)
        if self.shapes is not None and (nprocs or self.nprocs):
            plan = self.plan(nprocs=nprocs, inputs=inputs, output=output)
            need = footprint(plan)
            text += (f"\n\n{plan}\n  peak memory per rank (upper bound): max {int(need.max()):,} bytes "
                     f"(rank {int(need.argmax())}), mean {float(need.mean()):,.0f}")
        return text

    def to_script(self, path: str | Path, nprocs: int | None = None, dtype=None) -> Path:
        """Write a standalone mpi4py program (inputs and result on rank 0); atomic write."""
        check_output_path(path, DeinsumError)
        text = generate(self.plan(nprocs=nprocs, dtype=dtype, inputs="root", output="root")).encode()
        write_atomically(path, lambda f: f.write(text))   # a unique temporary name: every rank may call it
        return Path(path)

    def input_blocks(self, rank: int, nprocs: int, dtype=None) -> list[tuple[slice, ...] | None]:
        """The slice of each operand that ``rank`` must pass with ``inputs='local'``."""
        plan = self.plan(nprocs=nprocs, dtype=dtype, inputs="local")
        return [layout.block(rank) for layout in plan.entry]

    # ---- running -----------------------------------------------------------------------------------
    def __call__(self, *arrays, comm=None, inputs: str | None = None, output: str | None = None):
        """Run on ``comm`` (default COMM_WORLD); returns the result as ``output`` asks.

        Collective and checked before any work: all ranks agree on the equation, operand count,
        shapes, dtype, modes and communicator size, the plan fits the memory limit, and local
        blocks match the plan; otherwise every rank raises the same one-line DeinsumError.
        """
        from mpi4py import MPI
        comm = MPI.COMM_WORLD if comm is None else comm
        inputs, output = inputs or self.inputs, output or self.output
        facts, failure, shapes, dtype = self._facts(arrays, comm.rank, comm.size, inputs, output)
        agree(comm, facts, failure, DeinsumError)
        if inputs == "root":   # the other ranks learn rank 0's shapes and dtype
            shapes, dtype = comm.bcast((shapes, dtype), root=0)
        plan = collectively(comm, self._checked_plan, arrays, shapes, dtype, comm.rank, comm.size, inputs, output,
                            error=DeinsumError)
        holds = inputs == "global" or inputs == "local" or comm.rank == 0
        operands = [np.asarray(a, dtype=dtype) if holds else None for a in arrays]
        ns = _program(plan)
        if self.threads == "auto" and not _PINNED:
            ns["pin_blas_threads"](comm)
            _PINNED.append(comm.size)
        log, clock = ns["ByteLog"](), ns["Clock"]()
        result = ns["run_program"](comm, operands, log, clock)
        model = plan.model_bytes()[comm.rank]
        self.last_run = RunReport(comm.rank, dict(clock.seconds), log.bytes_sent, log.bytes_received, *model)
        if output == "distributed":
            return DistributedResult(result, plan.exit, comm.rank)
        return result[()] if result is not None and result.ndim == 0 else result  # numpy.einsum: a scalar

    def _facts(self, arrays, rank, size, inputs, output):
        """This rank's facts to agree on, its local failure (or None), and its shapes and dtype."""
        facts = {"equation": self.equation, "compiled shapes": self.shapes, "compiled dtype": self.dtype,
                 "casting": self.casting, "inputs": inputs, "output": output, "communicator size": size,
                 "operand count": len(arrays)}
        shapes = dtype = None
        try:
            nops = self.equation.partition("->")[0].count(",") + 1
            if len(arrays) != nops:
                raise DeinsumError(f"{self.equation!r} takes {nops} operands, got {len(arrays)}")
            if inputs == "local" and self.shapes is None:
                raise DeinsumError("inputs='local' needs the global shapes: compile with shapes")
            if inputs != "root" or rank == 0:
                types = [np.asarray(a).dtype for a in arrays]
                dtype = as_dtype(self.dtype if self.dtype is not None else np.result_type(*types))
                for n, t in enumerate(types):
                    check_cast(t, dtype, self.casting, f"operand {n}", DeinsumError)
                shapes = self.shapes if inputs == "local" else tuple(tuple(np.shape(a)) for a in arrays)
                if inputs != "root":
                    facts.update({"shapes": shapes, "dtype": dtype})
            failure = None
        except Exception as exc:  # noqa: BLE001 - reported on every rank by agree()
            failure = str(exc) if isinstance(exc, DeinsumError) else f"{type(exc).__name__}: {exc}"
        return facts, failure, shapes, dtype

    def _checked_plan(self, arrays, shapes, dtype, rank, size, inputs, output) -> Plan:
        """The plan, once it fits the memory limit and this rank's local blocks match it."""
        plan = self.plan(shapes, size, dtype, inputs, output)
        check_footprint(plan, None if self.memory is None else self.memory * plan.dtype.itemsize)
        if inputs == "local":
            for n, (a, layout) in enumerate(zip(arrays, plan.entry)):
                want = layout.local_shape(rank)
                if np.shape(a) != tuple(want):
                    raise DeinsumError(f"operand {n}: rank {rank} must pass its block of shape {tuple(want)}"
                                       f" (see Program.input_blocks), not {np.shape(a)}")
        return plan


@lru_cache(maxsize=128)
def _plan(equation, shapes, nprocs, dtype, memory, inputs, output) -> Plan:
    return build_plan(decompose(equation, *shapes), nprocs, dtype, memory, inputs, output)
