"""Modeled communication volume of the benchmark suite at the paper's sizes; no ranks needed.

For P in {8, 64, 512} and each kernel group: the grid :func:`deinsum.grids.plan_grid`
chooses and its volume (words the busiest rank receives: inputs from an even
block distribution over all P ranks, output partial sums reduced into an even
distribution), the original artifact's grid and its volume under the same
model, their ratio, and, when :mod:`deinsum.soap` is importable, the SOAP
memory-independent per-rank lower bound for the same starting layout.

Sizes and artifact grids: ``shared/notes/benchmarks.md``. MTTKRP-O5 sizes at
P = 8 and 64 are not listed there; they follow the weak scaling rule
``(60, 24) * P^(1/6)``, rounded. The TTMc artifact grids belong to its four
binary steps; the index order of each grid is our reading (reduction index
unsplit) and is marked "assumed".

    python scripts/model_volume.py            # text table
    python scripts/model_volume.py --json     # one JSON object per row
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from deinsum.decompose import decompose
from deinsum.grids import GridChoice
from deinsum.placement import even_layout
from deinsum.plan import build_plan
from deinsum.redistribute import received_words

PROCS = (8, 64, 512)


@dataclass(frozen=True)
class Group:
    """One kernel group: a SOAP statement run on one grid."""

    kernel: str
    indices: str
    inputs: tuple[str, ...]
    output: str
    note: str = ""

    @property
    def equation(self) -> str:
        return ",".join(self.inputs) + "->" + self.output


def grid_volume(indices: str, sizes: dict, inputs, output: str, nprocs: int, dims) -> int:
    """Words the busiest rank receives for one group on grid ``dims`` when every input starts and the
    output ends evenly distributed (``even_layout``, the artifact's comparison start), by the planner's model."""
    choice = GridChoice(indices, tuple(dims), output, nprocs)
    words = np.zeros(nprocs, dtype=np.int64)
    for sub in inputs:
        layout = choice.layout(sub, sizes, partial=False)
        words += received_words(even_layout(layout.shape, nprocs), layout, nprocs)
    out = choice.layout(output, sizes)
    return int((words + received_words(out, even_layout(out.shape, nprocs), nprocs)).max())


def planned_grid(group: "Group", sizes: dict, nprocs: int) -> tuple[int, ...]:
    """deinsum's grid for one group planned alone from and to even layouts (pinned), over ``group.indices``."""
    pins = {f"in{n}": "even" for n in range(len(group.inputs))} | {"out": "even"}
    plan = build_plan(decompose(group.equation, *[[sizes[c] for c in t] for t in group.inputs]), nprocs,
                      layouts=pins)
    grid = max(plan.groups, key=lambda g: len(g.indices)).grid
    return tuple(dict(zip(grid.indices, grid.dims)).get(c, 1) for c in group.indices)


def mm_sizes(nprocs: int) -> dict[str, int]:
    n = round(4096 * nprocs ** (1 / 3))
    return dict(i=n, j=n, k=n)


MTTKRP3_SIZES = {8: (1724, 42), 64: (2900, 68), 512: (4872, 120)}


def mttkrp3_sizes(nprocs: int) -> dict[str, int]:
    i, r = MTTKRP3_SIZES[nprocs]
    return dict(i=i, j=i, k=i, a=r)


def order5_sizes(nprocs: int) -> dict[str, int]:
    i, r = (192, 68) if nprocs == 512 else (round(60 * nprocs ** (1 / 6)), round(24 * nprocs ** (1 / 6)))
    return dict(i=i, j=i, k=i, l=i, m=i, a=r, b=r, c=r, d=r, e=r)


MTTKRP3_GRIDS = {8: (2, 2, 2, 1), 64: (4, 4, 4, 1), 512: (8, 8, 8, 1)}
MTTKRP5_GRIDS = {8: (1, 2, 4, 1, 1, 1), 64: (1, 8, 8, 1, 1, 1), 512: (1, 16, 32, 1, 1, 1)}

#: (group, sizes for P, artifact grid for P or None)
SUITE: list[tuple[Group, Callable[[int], dict], dict[int, tuple[int, ...]]]] = [
    (Group("1MM", "ijk", ("ij", "jk"), "ik"), mm_sizes, {8: (2, 2, 2), 64: (4, 4, 4), 512: (8, 8, 8)}),
    (Group("MTTKRP-O3-M0", "ijka", ("ijk", "ja", "ka"), "ia"), mttkrp3_sizes, MTTKRP3_GRIDS),
    (Group("MTTKRP-O3-M1", "ijka", ("ijk", "ia", "ka"), "ja"), mttkrp3_sizes, MTTKRP3_GRIDS),
    (Group("MTTKRP-O3-M2", "ijka", ("ijk", "ia", "ja"), "ka"), mttkrp3_sizes, MTTKRP3_GRIDS),
    (Group("MTTKRP-O5-M0", "ijklma", ("ijklm", "ja", "ka", "la", "ma"), "ia"), order5_sizes, MTTKRP5_GRIDS),
    (Group("MTTKRP-O5-M2", "ijklma", ("ijklm", "ia", "ja", "la", "ma"), "ka"), order5_sizes, MTTKRP5_GRIDS),
    (Group("MTTKRP-O5-M4", "ijklma", ("ijklm", "ia", "ja", "ka", "la"), "ma"), order5_sizes, MTTKRP5_GRIDS),
    (Group("TTMc-O5 step 1", "ijklme", ("ijklm", "me"), "ijkle", "assumed"), order5_sizes, {512: (1, 8, 8, 8, 1, 1)}),
    (Group("TTMc-O5 step 2", "ijkled", ("ijkle", "ld"), "ijkde", "assumed"), order5_sizes, {512: (8, 8, 8, 1, 1, 1)}),
    (Group("TTMc-O5 step 3", "ijkdec", ("ijkde", "kc"), "ijcde", "assumed"), order5_sizes, {512: (8, 8, 1, 1, 1, 8)}),
    (Group("TTMc-O5 step 4", "ijcdeb", ("ijcde", "jb"), "ibcde", "assumed"), order5_sizes, {512: (8, 1, 1, 1, 8, 8)}),
]


@dataclass(frozen=True)
class Row:
    kernel: str
    equation: str
    nprocs: int
    sizes: dict[str, int]
    grid: tuple[int, ...]
    volume: int
    artifact_grid: tuple[int, ...] | None
    artifact_volume: int | None
    soap_bound: float | None
    note: str

    @property
    def ratio(self) -> float | None:
        """Artifact volume over ours (>= 1: ours moves less)."""
        if self.artifact_volume is None:
            return None
        return self.artifact_volume / self.volume if self.volume else (1.0 if not self.artifact_volume else float("inf"))


def soap_bound_function() -> Callable[[Group, dict, int], float] | None:
    """SOAP memory-independent per-rank bound (same even starting layout), or None if deinsum.soap is absent."""
    try:
        from deinsum.soap import DEFAULT_S, Statement, parallel_bound
    except ImportError:
        return None

    def bound(group: Group, sizes: dict, nprocs: int) -> float:
        statement = Statement.from_terms(list(group.inputs), group.output)
        return parallel_bound(statement, {c: sizes[c] for c in group.indices}, nprocs, DEFAULT_S).Q_indep

    return bound


def rows(procs=PROCS) -> list[Row]:
    """Every (group, P) of the suite, modeled."""
    soap = soap_bound_function()
    out = []
    for group, sizes_for, artifact in SUITE:
        for nprocs in procs:
            if group.kernel.startswith("TTMc") and nprocs not in artifact:
                continue
            sizes = {c: n for c, n in sizes_for(nprocs).items() if c in group.indices}
            dims = planned_grid(group, sizes, nprocs)
            volume = grid_volume(group.indices, sizes, group.inputs, group.output, nprocs, dims)
            theirs = artifact.get(nprocs)
            theirs_volume = None if theirs is None else grid_volume(group.indices, sizes, group.inputs,
                                                                     group.output, nprocs, theirs)
            out.append(Row(group.kernel, group.equation, nprocs, sizes, dims, volume, theirs,
                           theirs_volume, None if soap is None else soap(group, sizes, nprocs), group.note))
    return out


COLUMNS: list[tuple[str, Callable[[Row], str]]] = [
    ("kernel", lambda r: r.kernel),
    ("P", lambda r: str(r.nprocs)),
    ("sizes", lambda r: ",".join(f"{c}={n}" for n, c in _first_index_of_each_size(r.sizes).items())),
    ("grid", lambda r: "x".join(map(str, r.grid))),
    ("words/rank", lambda r: f"{r.volume:.4g}"),
    ("artifact grid", lambda r: "-" if r.artifact_grid is None else "x".join(map(str, r.artifact_grid))
     + (f" ({r.note})" if r.note else "")),
    ("artifact words/rank", lambda r: "-" if r.artifact_volume is None else f"{r.artifact_volume:.4g}"),
    ("artifact/ours", lambda r: "-" if r.ratio is None else f"{r.ratio:.2f}"),
    ("SOAP bound (mem-indep)", lambda r: "n/a" if r.soap_bound is None else f"{r.soap_bound:.4g}"),
    ("ours/bound", lambda r: "-" if not r.soap_bound else f"{r.volume / r.soap_bound:.2f}"),
]


def _first_index_of_each_size(sizes: dict[str, int]) -> dict[int, str]:
    first: dict[int, str] = {}
    for c, n in sizes.items():
        first.setdefault(n, c)
    return first


def table(modeled: list[Row]) -> str:
    """Fixed-width text table of ``modeled``."""
    cells = [[header for header, _ in COLUMNS]] + [[cell(r) for _, cell in COLUMNS] for r in modeled]
    widths = [max(len(row[c]) for row in cells) for c in range(len(COLUMNS))]
    lines = ["  ".join(text.ljust(w) for text, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def main(argv: list[str]) -> None:
    modeled = rows()
    if "--json" in argv:
        for r in modeled:
            print(json.dumps(asdict(r) | {"ratio": r.ratio}))
        return
    print("Inputs start evenly block-distributed over all P ranks (no replication); outputs end the same way.")
    print(table(modeled))


if __name__ == "__main__":
    main(sys.argv[1:])
