"""Model sweep of the paper suite: deinsum's plan at the weak-scaling sizes for any P, no ranks needed.

Each (kernel, P) is planned as ``deinsum.compile(eq, *shapes).plan(nprocs=P,
inputs="local", result="distributed")`` in a forked child process under a time
and memory limit: the planner builds every rank's message tables, which at
P = 4096 takes minutes and many GiB for some kernels. A plan over a limit is
reported as such, never estimated.

    from suite_model import sweep
    rows = sweep(["1MM", "MTTKRP-O3-M0"], [8, 64], limit_s=60, limit_gib=4, workers=2)
"""
from __future__ import annotations

import multiprocessing
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import wait

import numpy as np

import deinsum
import deinsum.program  # noqa: F401  -- imported once here: forked planners inherit it
from suite_sizes import (artifact_groups, artifact_words, construction_words, equation_of, shapes_of,
                         weak_scaling_sizes)

#: Up to this many ranks the sweep also builds the exchange tables, for per-rank sent bytes.
TABLE_PROCS = 512
DTYPE = np.dtype(np.float64)


@dataclass
class ModelRow:
    """One kernel on P ranks: deinsum's grids, modeled bytes per rank, SOAP bounds, the artifact's volume.

    Bytes are per rank for float64. ``lower_bound`` holds for any fusion deinsum can plan (the printed
    bound); ``schedule_bound`` for the chosen fusion, each group as one statement.
    """

    kernel: str
    equation: str
    nprocs: int
    sizes: dict[str, int]
    grids: list[str] = field(default_factory=list)
    idle: int = 0
    received_max: int | None = None
    sent_max: int | None = None
    lower_bound: float | None = None          # bytes: any fusion of the decomposition (the printed bound)
    schedule_bound: float | None = None       # bytes: the chosen fusion, each group as one statement
    construction: int | None = None           # bytes: the best known construction (optimal-plans.md section 1)
    artifact_grids: list[str] = field(default_factory=list)
    artifact_bytes: int | None = None
    memory_words: int | None = None
    plan_seconds: float | None = None
    failure: str = ""

    @property
    def ratio_to_bound(self) -> float | None:
        """Busiest rank's received bytes over the lower bound for any fusion (None when the bound is 0)."""
        if self.received_max is None or not self.lower_bound:
            return None
        return self.received_max / self.lower_bound

    @property
    def ratio_to_construction(self) -> float | None:
        """Busiest rank's received bytes over the best known construction's (where the note has one)."""
        if self.received_max is None or not self.construction:
            return None
        return self.received_max / self.construction

    @property
    def artifact_over_ours(self) -> float | None:
        if self.artifact_bytes is None or not self.received_max:
            return None
        return self.artifact_bytes / self.received_max

    def to_dict(self) -> dict:
        return asdict(self) | {"ratio_to_bound": self.ratio_to_bound, "artifact_over_ours": self.artifact_over_ours,
                               "ratio_to_construction": self.ratio_to_construction}


def unplanned_row(kernel: str, nprocs: int) -> ModelRow:
    """The row before planning: sizes and the artifact's grids and volume."""
    sizes = weak_scaling_sizes(kernel, nprocs)
    row = ModelRow(kernel, equation_of(kernel), nprocs, sizes)
    row.artifact_grids = [f"{g.indices}={'x'.join(map(str, grid))}" for g, grid in artifact_groups(kernel, nprocs)]
    words = artifact_words(kernel, sizes, nprocs)
    row.artifact_bytes = None if words is None else words * DTYPE.itemsize
    words = construction_words(kernel, nprocs)
    row.construction = None if words is None else words * DTYPE.itemsize
    return row


def model_row(kernel: str, nprocs: int) -> ModelRow:
    """Plan ``kernel`` at the paper's sizes on ``nprocs`` ranks (pure; may take long at large P)."""
    row = unplanned_row(kernel, nprocs)
    start = time.perf_counter()
    plan = deinsum.compile(row.equation, *shapes_of(row.equation, row.sizes)).plan(
        nprocs=nprocs, dtype=DTYPE, inputs="local", result="distributed")
    row.received_max = int(plan.received_bytes().max())   # the vectorised volume model, any P
    row.plan_seconds = time.perf_counter() - start
    if nprocs <= TABLE_PROCS:  # per-rank sent bytes need every rank's exchange tables
        row.sent_max = max(sent for sent, _ in plan.model_bytes())
    row.grids = [f"{g.indices}={'x'.join(map(str, g.grid.dims))}" for g in plan.groups]
    row.idle = max(g.grid.idle for g in plan.groups)
    row.lower_bound = plan.lower_bound_bytes
    row.schedule_bound = plan.bound.chosen_words * DTYPE.itemsize
    row.memory_words = plan.memory // plan.dtype.itemsize
    return row


def _child(conn, kernel: str, nprocs: int, limit_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    try:
        conn.send(model_row(kernel, nprocs))
    except MemoryError:
        conn.send(f"planner exceeded the {limit_bytes / 2**30:g} GiB memory limit")
    conn.close()


def sweep(kernels, procs, limit_s: float, limit_gib: float, workers: int = 2) -> list[ModelRow]:
    """Model rows for every kernel and P, ``workers`` plans at a time, each in a child under the limits."""
    context = multiprocessing.get_context("fork")
    todo = [(k, p) for k in kernels for p in procs]
    total = len(todo)
    done: dict[tuple[str, int], ModelRow] = {}
    running = {}  # reader -> (task, process, start)
    limit_bytes = int(limit_gib * 2**30)

    def finish(task, answer, seconds: float) -> None:
        if isinstance(answer, str):
            done[task] = unplanned_row(*task)
            done[task].failure = answer
        else:
            done[task] = answer
            answer = f"planned in {seconds:.1f} s"
        print(f"  [{len(done):>2}/{total}] {task[0]} P={task[1]}: {answer}", file=sys.stderr, flush=True)

    while todo or running:
        while todo and len(running) < workers:
            task = todo.pop(0)
            reader, writer = context.Pipe(duplex=False)
            process = context.Process(target=_child, args=(writer, *task, limit_bytes), daemon=True)
            process.start()
            writer.close()
            running[reader] = (task, process, time.perf_counter())
        for reader in wait(list(running), timeout=1.0):
            task, process, started = running.pop(reader)
            try:
                answer = reader.recv()
            except EOFError:
                answer = None
            reader.close()
            process.join()
            if answer is None:
                answer = f"planner died (exit code {process.exitcode}; memory limit {limit_gib:g} GiB)"
            finish(task, answer, time.perf_counter() - started)
        for reader, (task, process, started) in list(running.items()):
            if time.perf_counter() - started > limit_s:
                process.kill()
                process.join()
                reader.close()
                del running[reader]
                finish(task, f"planner exceeded the {limit_s:g} s time limit", limit_s)
    return [done[(k, p)] for k in kernels for p in procs]
