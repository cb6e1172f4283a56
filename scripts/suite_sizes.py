"""The paper's suite at its weak-scaling sizes, with the original artifact's grids where known.

Equations (and the moderate one-core sizes used for measured runs) come from
``scripts/bench_executor.py``; paper sizes and grids from
``shared/notes/benchmarks.md``, through ``scripts/model_volume.py`` where it has them.
MTTKRP-O3 has listed sizes at P = 1, 2, 4, 8, 16, 64, 512 (grids at all but 16);
other P follow the weak-scaling rule ``(I, R) * P^(1/4)``, rounded.

>>> weak_scaling_sizes("MTTKRP-O3-M0", 2)
{'i': 1218, 'j': 1218, 'k': 1218, 'a': 30}
>>> [(g.kernel, grid) for g, grid in artifact_groups("1MM", 64)]
[('1MM', (4, 4, 4))]
"""
from __future__ import annotations

from bench_executor import KERNELS
from model_volume import MTTKRP3_SIZES, SUITE as MODEL_SUITE, Group, grid_volume, mm_sizes, order5_sizes

#: The P of the model sweep (paper: 1..512 nodes; 4096 extrapolates).
MODEL_PROCS = (1, 2, 4, 8, 16, 64, 512, 4096)
#: MTTKRP-O3 (I, R) and artifact grids over (i, j, k, a) at the P benchmarks.md lists beyond model_volume's.
MTTKRP3_PAPER_SIZES = {1: (1024, 24), 2: (1218, 30), 4: (1450, 34), 16: (2048, 48), **MTTKRP3_SIZES}
MTTKRP3_SMALL_P_GRIDS = {1: (1, 1, 1, 1), 2: (1, 1, 2, 1), 4: (1, 2, 2, 1)}
#: model_volume names TTMc's artifact groups "TTMc-O5 step 1..4".
ARTIFACT_FAMILY = {"TTMc-O5-M0": "TTMc-O5"}


#: Words the busiest rank receives in the best known construction (the developers' notes on optimal plans
#: section 1), at the paper's sizes, by P.
CONSTRUCTIONS = {
    "1MM": {8: 25_165_824, 64: 37_748_736, 512: 44_040_192, 4096: 47_185_920},
    "MTTKRP-O3": {8: 81_459, 64: 138_656, 512: 215_814, 4096: 293_760},
    "MTTKRP-O5": {8: 8_347, 64: 12_510, 512: 19_456, 4096: 23_012},
    "TTMc-O5-M0": {8: 10_115, 64: 22_680, 512: 21_026_586, 4096: 12_948_458},
}


def construction_words(kernel: str, nprocs: int) -> int | None:
    """The best known construction's words per rank for ``kernel`` on ``nprocs`` ranks, or None.

    >>> construction_words("MTTKRP-O5-M2", 512), construction_words("2MM", 8)
    (19456, None)
    """
    family = kernel[:9] if kernel.startswith("MTTKRP") else kernel
    return CONSTRUCTIONS.get(family, {}).get(nprocs)


def equation_of(kernel: str) -> str:
    return KERNELS[kernel][0]


def indices_of(equation: str) -> str:
    """Every index of ``equation`` once, in order of first appearance."""
    return "".join(dict.fromkeys(equation.split("->")[0].replace(",", "")))


def shapes_of(equation: str, sizes: dict[str, int]) -> list[tuple[int, ...]]:
    return [tuple(sizes[c] for c in term) for term in equation.split("->")[0].split(",")]


def weak_scaling_sizes(kernel: str, nprocs: int) -> dict[str, int]:
    """The paper's size of every index of ``kernel`` on ``nprocs`` ranks."""
    indices = indices_of(equation_of(kernel))
    if kernel.startswith("MTTKRP-O3"):
        scale = nprocs ** 0.25
        i, r = MTTKRP3_PAPER_SIZES.get(nprocs, (round(1024 * scale), round(24 * scale)))
        sizes = dict(i=i, j=i, k=i, a=r)
    elif kernel.endswith("MM"):
        sizes = dict.fromkeys(indices, mm_sizes(nprocs)["i"])
    else:
        sizes = order5_sizes(nprocs)
    return {c: sizes[c] for c in indices}


def measured_sizes(kernel: str, scale: float = 1.0) -> dict[str, int]:
    """Sizes that fit this machine: bench_executor's one-core sizes times ``scale``."""
    return {c: max(1, round(n * scale)) for c, n in KERNELS[kernel][1].items()}


def artifact_groups(kernel: str, nprocs: int) -> list[tuple[Group, tuple[int, ...]]]:
    """The original artifact's (group, grid) pairs for ``kernel`` on ``nprocs`` ranks; [] where none is known."""
    family = ARTIFACT_FAMILY.get(kernel, kernel)
    found = []
    for group, _, grids in MODEL_SUITE:
        if group.kernel == family or group.kernel.startswith(family + " step"):
            if kernel.startswith("MTTKRP-O3"):
                grids = {**MTTKRP3_SMALL_P_GRIDS, **grids}
            if nprocs in grids:
                found.append((group, grids[nprocs]))
    return found


def artifact_words(kernel: str, sizes: dict[str, int], nprocs: int) -> int | None:
    """Words the busiest rank receives on the artifact's grids, summed over its groups (model_volume's model)."""
    groups = artifact_groups(kernel, nprocs)
    if not groups:
        return None
    return sum(grid_volume(g.indices, {c: sizes[c] for c in g.indices}, g.inputs, g.output, nprocs, grid)
               for g, grid in groups)
