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

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np

from .runtime.checks import agree, check_cast, check_launch, check_memory, check_output_path, collectively
from .runtime.checks import node_place
from .runtime.checks import kept_on, unanimous, write_atomically
from .emit import generate
from .runtime.gpu import device_bytes, is_device_array, load_cupy, memory_share, open_device
from .runtime.blas import gemm_library
from .runtime.kernels import contract_pair, group_strategy, unary
from .runtime.runner import Runtime, pin_blas_threads
from .darray import DistributedArray
from .decompose import Decomposition, as_shape, decompose
from .errors import DeinsumError
from .options import CASTINGS, as_dtype, as_ranks, check_choice
from .footprint import footprint
from .memory import as_bytes, default_memory
from .plan import INPUT_MODES, RESULT_MODES, Plan, bound_notes, build_plan, check_pins, pin_names, planning_ranks
from .schedule import Move, Prepass
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


def call_comm(comm, arrays) -> tuple:
    """The communicator of a call (``comm``, else that of its DistributedArray operands, else COMM_WORLD) and
    a failure for every rank to agree on: a ``comm`` that is no mpi4py communicator fails on COMM_WORLD.
    A launcher mismatch (:func:`~deinsum.runtime.checks.check_launch`) raises first.

    >>> call_comm("world", [])[1]
    "comm='world': expected an mpi4py communicator such as MPI.COMM_WORLD"
    """
    from mpi4py import MPI
    check_launch(DeinsumError)
    if comm is None:
        held = [a for a in arrays if isinstance(a, DistributedArray)]
        return (held[0].comm if held else MPI.COMM_WORLD), None
    if isinstance(comm, MPI.Intracomm):
        return comm, None
    return MPI.COMM_WORLD, f"comm={comm!r}: expected an mpi4py communicator such as MPI.COMM_WORLD"


#: Runtimes (communicators, datatypes, tables: ~25 kB and up) a program keeps per communicator, the most recent.
RUNTIMES_KEPT = 8
_COMMUNICATORS = itertools.count()   # a token per communicator a program ran on (see kept_on)
#: The memory of a plan made with memory to spare (reports compare a plan with it): 2**62 bytes per rank.
UNLIMITED = 2**62

_PINNED = [0]  # the most ranks per node this process pinned its BLAS threads for (a local action)


def execute(decomposition: Decomposition, *operands) -> np.ndarray:
    """Run a decomposition sequentially with numpy (BLAS via tensordot/matmul): the distributed runtime
    calls the same kernels on local blocks.

    >>> x, a, b = (np.ones(s) for s in [(8, 9, 10), (9, 4), (10, 4)])
    >>> float(execute(decompose("ijk,ja,ka->ia", x.shape, a.shape, b.shape), x, a, b)[0, 0])
    90.0
    """
    arrays = [np.asarray(x) for x in operands]
    if len(arrays) != len(decomposition.raw_subscripts):
        raise DeinsumError(f"{decomposition.equation!r} takes {len(decomposition.raw_subscripts)} operands, "
                           f"got {len(arrays)}")
    tensors = {f"in{n}": a for n, a in enumerate(arrays)}
    dtype = np.result_type(*arrays) if arrays else np.float64
    for step in decomposition.prepass + decomposition.steps:
        args = [tensors[o] for o in step.operands]
        if len(args) == 1:
            tensors[step.name] = unary(args[0], step.subscripts[0], step.output)
        else:
            tensors[step.name] = contract_pair(*args, *step.subscripts, step.output)
    return np.asarray(tensors["out"], dtype=dtype)


def runtime_for(plan: Plan, comm, device=None) -> Runtime:
    """This rank's :class:`~deinsum.runtime.runner.Runtime` of ``plan`` on ``comm`` (its tables only),
    computing on ``device`` (a :class:`~deinsum.runtime.gpu.Device`) if given."""
    rank = comm.Get_rank()
    return Runtime(comm, plan.dtype, [(m.phase, m.label, m.table(rank)) for m in plan.moves], device)


def run_schedule(rt: Runtime, plan: Plan, operands: Sequence) -> np.ndarray | None:
    """Execute ``plan``'s schedule on this rank: the same operations, in the same order, as the
    ``run`` of the plan's emitted script (see :mod:`deinsum.emit`)."""
    d = plan.decomposition
    tensors = dict(zip(d.input_names, operands))
    moves, in_rounds = iter(range(len(plan.moves))), {}
    comm_of = lambda e: rt.world if e.comm.world else rt.cart_sub(e.comm.grid, e.comm.remain)  # noqa: E731
    for item in plan.schedule:
        if isinstance(item, Prepass):
            s = item.step
            tensors[s.name] = rt.unary(tensors[s.operands[0]], s.subscripts[0], s.output, item.src)
            continue
        if isinstance(item, Move):
            k = next(moves)
            if item.rounds:                  # run round by round inside the group that reads it
                in_rounds[item.tensor] = k, item
                continue
            if item.parts:
                e = item.exchanges[0]
                tensors[item.tensor] = rt.in_parts(e.kind, tensors[item.tensor], k, *item.parts, comm_of(e))
                continue
            for step, e in enumerate(item.exchanges):
                tensors[item.tensor] = rt.move(e.kind, tensors[item.tensor], k, step, comm_of(e))
            continue
        g = item.group
        subs = tuple(sub for _, sub in g.reads)
        if g.rounds:
            index, count = g.rounds
            total = None
            for t in range(count):
                blocks = []
                for name, sub in g.reads:
                    if name in in_rounds:
                        k, m = in_rounds[name]
                        e = m.exchanges[0]
                        blocks.append(rt.prefetch(e.kind, tensors[name], k, t, count, comm_of(e)) if m.prefetch
                                      else rt.move(e.kind, tensors[name], k, t, comm_of(e)))
                    else:
                        blocks.append(rt.slab(tensors[name], sub.index(index), count, t) if index in sub
                                      else tensors[name])
                if g.free_rounds:
                    total = rt.contract_slab(g.result_block(d.sizes), total, g.output_subscripts.index(index), count,
                                             t, subs, g.output_subscripts, *blocks)
                else:
                    total = rt.contract_round(g.grid.dims, total, subs, g.output_subscripts, *blocks)
                del blocks
            tensors[g.output], in_rounds = total, {}
        elif rt.member(g.grid.dims):
            tensors[g.output] = rt.contract_group(subs, g.output_subscripts, *(tensors[name] for name, _ in g.reads))
        else:
            tensors[g.output] = None
    return tensors["out"]


@dataclass
class Program:
    """An einsum compiled for distributed execution (see :func:`deinsum.compile`)."""

    equation: str
    shapes: tuple[tuple[int, ...], ...] | None = None
    nprocs: int | None = None
    dtype: np.dtype | None = None
    memory: int | None = None
    inputs: str = "global"
    result: str = "all"
    threads: str | None = "auto"
    layouts: dict | None = None
    casting: str = "safe"
    device: str = "cpu"
    prefetch: bool = False
    last_run: RunReport | None = field(default=None, init=False, repr=False)
    last_plan: Plan | None = field(default=None, init=False, repr=False)
    _runtimes: dict = field(default_factory=dict, init=False, repr=False)
    _checked_call: tuple | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        if self.shapes is not None:
            self.shapes = tuple(as_shape(s, f"operand {n}") for n, s in enumerate(self.shapes))
        self.dtype = None if self.dtype is None else as_dtype(self.dtype)
        for option, choices in [("casting", CASTINGS), ("device", ("cpu", "gpu")), ("inputs", INPUT_MODES),
                                ("result", RESULT_MODES), ("threads", ("auto", None)), ("prefetch", (False, True))]:
            check_choice(option, getattr(self, option), choices)
        if self.memory is not None:
            self.memory = as_bytes(self.memory, error=DeinsumError)
        if self.nprocs is not None:
            self.nprocs = as_ranks(self.nprocs)
        pin_names(self.layouts)   # a dict of tensor names (or operand numbers) to layouts
        if not isinstance(self.equation, str):
            raise DeinsumError(f"the einsum equation must be a string, not {type(self.equation).__name__}")
        # parametric with '...': the decomposition waits for the shapes of a call
        self.decomposition: Decomposition | None = (
            decompose(self.equation, *self.shapes) if self.shapes is not None
            else None if "..." in self.equation else decompose(self.equation))
        if self.decomposition is not None:   # (with '...': at the call, as the rest of the plan)
            check_pins(self.decomposition, dict(pin_names(self.layouts)))

    # ---- planning and reports (pure, no MPI) ---------------------------------------------------
    def plan(self, shapes: Sequence[Sequence[int]] | None = None, nprocs: int | None = None, dtype=None,
             inputs: str | None = None, result: str | None = None, layouts: dict | None = None,
             memory: int | str | None = None) -> Plan:
        """The plan for these shapes, ranks, dtype, entry/exit layouts and memory per rank (bytes; default: the
        compiled one) (cached); ``layouts`` pins more layouts on top of the compiled ones (see
        :func:`deinsum.compile`)."""
        shapes = self.shapes if shapes is None else tuple(as_shape(s, f"operand {n}") for n, s in enumerate(shapes))
        if shapes is None:
            raise DeinsumError(f"{self.equation!r} was compiled without shapes: pass shapes to plan()")
        nprocs = self._ranks(nprocs)
        if nprocs is None:
            raise DeinsumError("the number of ranks is unknown: pass nprocs")
        dtype = as_dtype(dtype if dtype is not None else self.dtype if self.dtype is not None else np.float64)
        pins = pin_names({**dict(pin_names(self.layouts)), **dict(pin_names(layouts))})
        memory, default = self.memory if memory is None else memory, ""
        if memory is None and self.device == "gpu":
            memory, default = _gpu_default_memory(nprocs)
        return _plan(self.equation, shapes, nprocs, dtype, memory, inputs or self.inputs, result or self.result,
                     pins, self.prefetch, default)

    def _ranks(self, nprocs) -> int | None:
        """``nprocs`` (else the compiled one, else None) checked as a number of ranks."""
        nprocs = nprocs if nprocs is not None else self.nprocs
        return None if nprocs is None else as_ranks(nprocs)

    def analysis(self, nprocs: int | None = None):
        """SOAP bounds and fusion: symbolic without shapes, numeric and parallel with them."""
        if self.decomposition is None:
            raise DeinsumError(f"{self.equation!r}: bounds of an einsum with '...' need shapes: compile with shapes")
        p = self._ranks(nprocs)
        words = None if self.memory is None else max(1, as_bytes(self.memory, error=DeinsumError) // as_dtype(
            self.dtype if self.dtype is not None else np.float64).itemsize)
        return analyze(self.decomposition, S=words, P=p)

    def report(self, format: str = "text", nprocs: int | None = None, inputs: str | None = None,
               result: str | None = None, per_p: Sequence[int] = ()) -> str:
        """The bounds report (``text``, ``latex`` or ``json``) followed, with shapes and P, by the plan. ``latex``
        with shapes: a per-P table of the bounds beside the plans at P and at every rank count in ``per_p``, and
        the sentences that state their class and assumptions."""
        nprocs = self._ranks(nprocs)
        planned = self.shapes is not None and nprocs is not None
        if format == "latex":
            procs = sorted(set(([nprocs] if nprocs is not None else []) + [as_ranks(q) for q in per_p]))
            plans = [self.plan(nprocs=q, inputs=inputs, result=result) for q in procs] if self.shapes else []
            plans = [p for p in plans if p.bound is not None]
            a = plans[0].bound_analysis if plans else self.analysis(nprocs)
            return a.latex([p.bound_row() for p in plans], bound_notes(plans) if plans else ())
        plan = self.plan(nprocs=nprocs, inputs=inputs, result=result) if planned else None
        spare = self.plan(nprocs=nprocs, inputs=inputs, result=result, memory=UNLIMITED) if planned else None
        a = plan.bound_analysis if plan is not None and plan.bound_analysis is not None else self.analysis(nprocs)
        if format == "json":
            import json
            data = {"equation": a.equation, "analysis": a.to_dict()} | ({} if plan is None else plan.to_dict())
            if plan is not None:
                data["peak_bytes_per_rank"] = footprint(plan).tolist()
                data["received_bytes_max_with_memory_to_spare"] = int(spare.received_bytes().max(initial=0))
                data["local_kernels"] = {"gemm": self._gemms(), "rank 0": local_kernels(plan, 0, self.device)}
            return json.dumps(data, indent=2, default=str)
        if format != "text":
            raise DeinsumError(f"report format {format!r}: expected text, latex or json")
        if plan is None:
            return str(a)
        need = footprint(plan)
        kernels = "".join(f"\n    group {k}: {name}" for k, name in enumerate(local_kernels(plan, 0, self.device)))
        ours, free = int(plan.received_bytes().max(initial=0)), int(spare.received_bytes().max(initial=0))
        cost = (f"  what the memory costs: {ours:,} bytes received by the busiest rank, {free:,} with memory to "
                f"spare ({f'{ours / free:.3f}x; ' if free else ''}peak {spare.peak_bytes:,} bytes per rank)\n"
                if ours != free else "")
        return (f"{a}\n\n{plan}\n  peak memory per rank (upper bound): max {int(need.max()):,} bytes "
                f"(rank {int(need.argmax())}), mean {float(need.mean()):,.0f}\n{cost}"
                f"  local kernels on rank 0's blocks (a cost model's pick; GEMMs: {self._gemms()}):{kernels}")

    def _gemms(self) -> str:
        return gemm_library() if self.device == "cpu" else "CuPy's (cuBLAS)"

    def to_script(self, path: str | Path, nprocs: int | None = None, dtype=None, inputs: str | None = None,
                  result: str | None = None) -> Path:
        """Write a standalone mpi4py program; atomic write. Its inputs start (and its result ends) as
        ``inputs`` and ``result`` say, by default as compiled: with 'local' inputs each rank reads only its
        block of each ``--load`` file (in the plan's entry layout), with a 'distributed' result it writes only
        its block of ``--save``. A program compiled with ``device='gpu'`` also carries the GPU path (run it
        with ``--device gpu``)."""
        inputs, result = inputs or self.inputs, result or self.result
        check_output_path(path, DeinsumError)
        text = generate(self.plan(nprocs=nprocs, dtype=dtype, inputs=inputs, result=result), self.device).encode()
        write_atomically(path, lambda f: f.write(text), DeinsumError)   # every rank may call it
        return Path(path)

    def input_blocks(self, rank: int, nprocs: int, dtype=None, result: str | None = None
                     ) -> list[tuple[slice, ...]]:
        """The slice of each operand that ``rank`` must pass with ``inputs='local'`` (the planner chooses the
        layouts together with the grids, so they depend on ``result`` and any pinned ``layouts``). A rank
        that holds nothing of an operand gets empty slices (it may pass the empty block, a scalar's value, or None)."""
        plan = self.plan(nprocs=nprocs, dtype=dtype, inputs="local", result=result)
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < nprocs:
            raise DeinsumError(f"input_blocks: rank {rank!r} is not a rank of {nprocs} (0 to {nprocs - 1})")
        return [layout.block(rank) or (slice(0, 0),) * len(layout.shape) for layout in plan.entry]

    # ---- running -----------------------------------------------------------------------------------
    def __call__(self, *arrays, comm=None, inputs: str | None = None, result=None):
        """Run on ``comm`` (default COMM_WORLD, or that of the distributed operands); returns the result as
        ``result`` asks.

        :class:`~deinsum.darray.DistributedArray` operands stay where they are: their layouts are pinned
        entry layouts (no move where they already fit the plan); plain arrays beside them are taken as
        replicated (every rank passes the whole array); the result is then a DistributedArray in the
        layout the plan chose, unless ``result`` (of the call, or ``'root'``/``'distributed'`` compiled) says
        otherwise. ``result`` may also be a layout (a Layout, ``'even'`` or text like ``'2x2: 0, 1'``): a
        DistributedArray in that layout.

        Collective and checked before any work: all ranks agree on the equation, operand count,
        shapes, dtype, casting, modes, threads, device, pinned layouts, compiled ``nprocs`` and
        communicator size, the plan (with the memory agreed across ranks) fits that memory, and local
        blocks match the plan; otherwise every rank raises the same one-line DeinsumError.
        """
        comm, inputs, result, pins, held, failure = self._call_modes(arrays, comm, inputs, result)
        shapes, dtype = self._agreed_facts(arrays, comm, inputs, result, pins, held, failure)
        blocks = [a.local if isinstance(a, DistributedArray) else a for a in arrays]
        device = open_device(comm, DeinsumError) if self.device == "gpu" else None   # its memory bounds the plan
        plan, operands = self._agreed_plan(comm, shapes, dtype, inputs, result, pins, blocks, device)
        self._pin_threads(comm)
        if device is not None:   # (every rank at once: one out of memory must not leave others waiting)
            collectively(comm, device.check_memory, int(footprint(plan)[comm.rank]), DeinsumError,
                         device_bytes(blocks), error=DeinsumError)
        out = self._run(plan, comm, device, operands, blocks)
        if result == "distributed":
            return DistributedArray(out, plan.dtype, layout=plan.exit, comm=comm)
        return out[()] if out is not None and out.ndim == 0 else out   # numpy.einsum: a scalar

    def _call_modes(self, arrays, comm, inputs, result) -> tuple:
        """The call's communicator, modes and pinned layouts (DistributedArray operands pin theirs; a result
        layout pins ``out``), whether it has DistributedArray operands, and a failure to agree on (or None)."""
        held = any(isinstance(a, DistributedArray) for a in arrays)
        comm, bad_comm = call_comm(comm, arrays)
        inputs = inputs or ("local" if held else self.inputs)
        result = result if result is not None else self.result if not held or self.result != "all" else "distributed"
        pins = dict(pin_names(self.layouts))
        if held:
            pins |= {f"in{n}": a.layout if isinstance(a, DistributedArray) else "replicated"
                     for n, a in enumerate(arrays)}
        if not (isinstance(result, str) and result in ("all", "root", "distributed")):
            pins["out"], result = result, "distributed"
        return comm, inputs, result, pin_names(pins), held, bad_comm

    def _agreed_facts(self, arrays, comm, inputs, result, pins, held, failure) -> tuple:
        """The operands' shapes and dtype, once every rank agrees on the call (else the same error on all)."""
        facts, mine, shapes, dtype = self._facts(arrays, comm, inputs, result, pins, held)
        agree(comm, facts, failure or mine, DeinsumError)
        if self.nprocs is not None and self.nprocs != comm.size:      # (the same on every rank)
            raise DeinsumError(f"compiled for nprocs={self.nprocs}, called on {comm.size} rank(s)")
        if inputs == "root":   # the other ranks learn rank 0's shapes and dtype
            shapes, dtype = comm.bcast((shapes, dtype), root=0)
        return shapes, dtype

    def _agreed_plan(self, comm, shapes, dtype, inputs, result, pins, blocks, device=None) -> tuple:
        """The plan at the memory every rank has (by default its share of the node's free memory, and of its
        GPU's on ``device``), checked to fit it, and this rank's operands as it takes them.

        A repeat of this rank's last checked call reuses its plan, if every rank repeats a call with the same
        memory: each rank's cache holds its own last call (on any communicator), so the ranks vote, in one
        small allreduce instead of planning again and agreeing on the plan."""
        from mpi4py import MPI
        node_ranks = node_place(comm)[1]   # kept per communicator: collective once, on every rank
        call = (self.equation, shapes, dtype, inputs, result, pins, self.memory, self.device, self.prefetch, comm.size)
        cached = self._checked_call[1] if self._checked_call and self._checked_call[0] == call else None
        given = cached.memory if cached is not None else 0
        if unanimous(comm, cached is not None, given):
            plan, memory = cached, given
        else:   # the memory every rank has (the node's free memory shared by its ranks, or as given), then the plan
            mine = collectively(comm, _memory_here, self.memory, node_ranks, device, blocks, error=DeinsumError)
            memory = comm.allreduce(mine, op=MPI.MIN)
            plan = collectively(comm, self.plan, shapes, comm.size, dtype, inputs, result, dict(pins), memory,
                                error=DeinsumError)
        plan, operands = collectively(comm, self._checked, plan, shapes, blocks, comm.rank, error=DeinsumError)
        self._checked_call = (call, plan)
        return plan, operands

    def _pin_threads(self, comm) -> None:
        """With ``threads='auto'`` (agreed), BLAS threads x the ranks on this node <= its cores; pinned again only
        for more ranks per node (never raises threads; the node layout is kept per communicator)."""
        node_ranks = node_place(comm)[1]
        if self.threads == "auto" and node_ranks > _PINNED[0]:
            pin_blas_threads(node_ranks)
            _PINNED[0] = node_ranks

    def _run(self, plan, comm, device, operands, blocks):
        """Run the plan's schedule on this rank's operands and record the run (``last_run``, ``last_plan``)."""
        from mpi4py import MPI
        rt = self._runtime(plan, comm, device)
        rt.reset()
        out = run_schedule(rt, plan, operands)
        if device is not None:   # the result ends where this rank's inputs were: GPU or host
            resident = comm.allreduce(int(any(is_device_array(b) for b in blocks)), op=MPI.MAX)   # one answer
            out = device.place(out, bool(resident), rt.clock)
        model = plan.model_bytes()[comm.rank]
        self.last_run = RunReport(comm.rank, dict(rt.clock.seconds), rt.log.bytes_sent, rt.log.bytes_received,
                                  *model)
        self.last_plan = plan
        return out

    def _runtime(self, plan: Plan, comm, device) -> Runtime:
        """This rank's runtime of ``plan`` on ``comm``, kept for the next calls: the last RUNTIMES_KEPT plans
        per communicator (a parametric program sees many shapes). Every rank of ``comm`` makes the same calls
        on it, so every rank frees the same runtime (collectively) at the same call."""
        kept = self._runtimes.setdefault(kept_on(comm, "deinsum communicator", next, _COMMUNICATORS), OrderedDict())
        if plan in kept:
            kept.move_to_end(plan)
        else:
            kept[plan] = runtime_for(plan, comm, device)
            while len(kept) > RUNTIMES_KEPT:
                kept.popitem(last=False)[1].close()
        return kept[plan]

    def close(self) -> None:
        """Free the communicators and datatypes kept across calls (collective: every rank calls it)."""
        for kept in self._runtimes.values():
            for rt in kept.values():
                rt.close()
        self._runtimes.clear()

    def __enter__(self) -> Program:
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    def _facts(self, arrays, comm, inputs, result, pins, held):
        """This rank's facts to agree on, its local failure (or None), and its shapes and dtype."""
        rank = comm.rank
        facts = {"equation": self.equation, "compiled shapes": self.shapes, "compiled dtype": self.dtype,
                 "compiled nprocs": self.nprocs, "casting": self.casting, "threads": self.threads,
                 "device": self.device, "inputs": inputs, "result": result, "communicator size": comm.size,
                 "operand count": len(arrays)}
        shapes = dtype = None
        try:
            facts["pinned layouts"] = pins
            nops = self.equation.partition("->")[0].count(",") + 1
            if len(arrays) != nops:
                raise DeinsumError(f"{self.equation!r} takes {nops} operands, got {len(arrays)}")
            if held:
                self._check_distributed(arrays, comm, inputs)
            elif inputs == "local" and self.shapes is None:
                raise DeinsumError("inputs='local' needs the global shapes: compile with shapes")
            if inputs != "root" or rank == 0:
                # with local inputs a rank that holds nothing of an operand may pass None
                for n, a in enumerate(arrays):
                    if a is None and inputs != "local":
                        raise DeinsumError(f"operand {n} is None: with inputs={inputs!r} "
                                           f"{'rank 0 passes' if inputs == 'root' else 'every rank passes'} "
                                           f"the whole arrays")
                    if is_device_array(a) and self.device != "gpu":
                        raise DeinsumError(f"operand {n} is a GPU array: compile with device='gpu'")
                types = [a.dtype if hasattr(a, "dtype") else np.asarray(a).dtype   # numpy, CuPy, DistributedArray
                         for a in arrays if not (inputs == "local" and a is None)]
                if self.dtype is None and not types:
                    raise DeinsumError(f"rank {rank} passes no block to take the dtype from: pass the empty "
                                       f"blocks (see Program.input_blocks) or compile with dtype")
                dtype = as_dtype(self.dtype if self.dtype is not None else np.result_type(*types))
                for n, t in enumerate(types):
                    check_cast(t, dtype, self.casting, f"operand {n}", DeinsumError)
                shapes = (self.shapes if inputs == "local" and not held   # np.shape reads .shape where there is one
                          else tuple(tuple(np.shape(a)) for a in arrays))
                if inputs != "root":
                    facts.update({"shapes": shapes, "dtype": dtype})
            failure = None
        except Exception as exc:  # noqa: BLE001 - reported on every rank by agree()
            failure = str(exc) if isinstance(exc, DeinsumError) else f"{type(exc).__name__}: {exc}"
        return facts, failure, shapes, dtype

    def _check_distributed(self, arrays, comm, inputs) -> None:
        """Distributed operands live on ``comm``; plain ones beside them are whole (replicated) arrays."""
        from mpi4py import MPI
        if inputs != "local":
            raise DeinsumError(f"inputs={inputs!r} with DistributedArray operands: they are 'local' by nature")
        if self.inputs == "root":
            raise DeinsumError("compiled with inputs='root', called with DistributedArray operands: they are local")
        for n, a in enumerate(arrays):
            if isinstance(a, DistributedArray):
                if MPI.Comm.Compare(a.comm, comm) not in (MPI.IDENT, MPI.CONGRUENT):
                    raise DeinsumError(f"operand {n}: a DistributedArray on another communicator than the call's")
            elif a is None:
                raise DeinsumError(f"operand {n} is None: beside DistributedArrays pass whole arrays "
                                   f"(replicated) or DistributedArrays")

    def _checked(self, plan, shapes, arrays, rank):
        """``plan``, once it fits its memory (bytes per rank), and this rank's operands as the plan takes them
        (local blocks checked against its entry layouts)."""
        check_footprint(plan)
        holds = plan.inputs in ("global", "local") or rank == 0
        operands = [None if not holds or a is None else a.astype(plan.dtype, copy=False) if is_device_array(a)
                    else np.asarray(a, dtype=plan.dtype) for a in arrays]
        if plan.inputs == "local":
            for n, (a, want) in enumerate(zip(operands, _entry_shapes(plan, rank))):
                if want is None and (a is None or a.size == 0 or a.ndim == 0):   # (a scalar: nothing to slice)
                    operands[n] = None                # this rank holds nothing of the operand
                elif a is None or a.shape != want:
                    raise DeinsumError(f"operand {n}: rank {rank} must pass its block of shape "
                                       f"{want if want is not None else '(none)'} (see Program.input_blocks), "
                                       f"not {None if a is None else a.shape}")
        return plan, operands


def check_footprint(plan, limit: int | None = None) -> None:
    """Raise a one-line DeinsumError if some rank's peak footprint exceeds ``limit`` bytes per rank
    (default: the plan's ``memory``, itself by default :func:`deinsum.memory.default_memory`),
    before anything is allocated.

    >>> import deinsum
    >>> check_footprint(deinsum.compile("i,j->ij", (1000,), (1000,)).plan(nprocs=2), limit=10**6)
    Traceback (most recent call last):
    ...
    deinsum.errors.DeinsumError: the plan of 'i,j->ij' on 2 rank(s) needs 13,080,576 bytes per rank at its peak (rank 0) but 1,000,000 bytes are available per rank; use more ranks, or less replication (inputs/result 'local'/'distributed'), or raise the memory limit
    """
    limit = plan.memory if limit is None else int(limit)
    need = footprint(plan)
    rank = int(np.argmax(need))
    check_memory(int(need[rank]), limit, f"the plan of {plan.equation!r} on {plan.nprocs} rank(s)", rank,
                 DeinsumError)


def local_kernels(plan: Plan, rank: int = 0, device: str = "cpu") -> list[str]:
    """How each group computes on ``rank``'s blocks (on ``device``): the strategy the kernels' cost model
    picks.

    >>> import deinsum
    >>> prog = deinsum.compile("ijk,ja,ka->ia", (8, 8, 8), (8, 4), (8, 4))
    >>> local_kernels(prog.plan(nprocs=2))[0].split(":")[0]
    'MTTKRP to (i)'
    """
    sizes = plan.decomposition.sizes
    shapes = [[g.grid.layout(sub, sizes, partial=False).local_shape(rank) or (0,) * len(sub) for _, sub in g.reads]
              for g in plan.groups]
    return [group_strategy([sub for _, sub in g.reads], g.output_subscripts, shape, plan.dtype, device == "gpu")
            for g, shape in zip(plan.groups, shapes)]


@lru_cache(maxsize=256)
def _entry_shapes(plan: Plan, rank: int) -> tuple:
    """The block shape of each input ``rank`` passes with local inputs (None where it holds none)."""
    return tuple(layout.local_shape(rank) for layout in plan.entry)


@lru_cache(maxsize=128)
def _plan(equation, shapes, nprocs, dtype, memory, inputs, result, pins=(), prefetch=False, default="") -> Plan:
    return build_plan(decompose(equation, *shapes), nprocs, dtype, memory, inputs, result, dict(pins), prefetch,
                      default)


def _memory_here(given: int | None, node_ranks: int, device, blocks) -> int:
    """This rank's memory: as ``given``, else its share of the node's free memory and, on ``device``, no more than
    its share of the GPU with the bytes its operands (``blocks``) already hold there. (Every rank calls it, given
    or not: the ranks may disagree, and their allreduce follows.)"""
    if given is not None:
        return given
    memory = default_memory(node_ranks)
    return memory if device is None else min(memory, device.memory + device_bytes(blocks))


def _gpu_default_memory(nprocs: int) -> tuple[int, str]:
    """The default memory per rank of a GPU plan made without MPI, and where it came from: for
    :func:`planning_ranks` ranks on this node, the least :func:`~deinsum.runtime.gpu.memory_share` of the GPUs
    they use or the host's share, whichever is less; the host's where no GPU is here (and the plan says so)."""
    ranks = planning_ranks(nprocs)
    host = default_memory(ranks)
    try:
        cupy = load_cupy()
    except RuntimeError:
        return host, f"this machine's free memory / {ranks} rank(s), no GPU here"
    count = cupy.cuda.runtime.getDeviceCount()   # the GPUs its ranks use, round-robin
    sharing = -(-ranks // count)
    share = min(memory_share(cupy, gpu, sharing) for gpu in range(min(count, ranks)))
    where = f"this machine's free GPU memory (within CuPy's pool limit) / {sharing} rank(s) per GPU"
    return (share, where) if share <= host else (host, f"this machine's free memory / {ranks} rank(s), less than "
                                                       f"its GPUs' share")
