"""Where the planner places tensors (emitted scripts do not carry it): layouts the caller pins (a
:class:`~deinsum.layout.Layout`, a mode name or a short text, checked against a tensor's shape and the number of
ranks), and the home a tensor spreads to on a compute grid.
"""
from __future__ import annotations

import math
import re

import numpy as np

from .errors import DeinsumError
from .grids import balanced_split
from .layout import Layout, check_count

__all__ = ["even_layout", "pin_layout", "spread"]


def even_layout(shape: tuple[int, ...], nprocs: int) -> Layout:
    """Evenly block-distributed over all ``nprocs`` ranks, no replication (the pinned mode ``"even"``).

    The grid is :func:`deinsum.grids.balanced_split` of ``nprocs`` over the tensor axes. An axis may get more
    parts than it has elements (a prime P larger than every axis): those ranks hold empty blocks. A 0-d tensor
    lives on rank 0.

    >>> even_layout((6, 4), 4).grid
    (2, 2)
    >>> even_layout((3, 4), 7).grid, even_layout((3, 4), 7).local_shape(6)
    ((1, 7), (3, 0))
    """
    shape = tuple(shape)
    check_count(nprocs, "nprocs", minimum=1)
    if not shape:
        return Layout.on_root(shape, nprocs)
    return Layout(shape, balanced_split(shape, nprocs), tuple(range(len(shape))))


def pin_layout(spec, shape: tuple[int, ...], nprocs: int, what: str) -> Layout:
    """A pinned layout: a :class:`Layout`, a mode name (``"even"``, ``"replicated"``, ``"root"``) or the
    short text ``"GRID: AXIS, ..."`` (grid extents joined by ``x``; per tensor axis the grid dimension
    that splits it, ``-`` for none, ``1.0`` for dims 1 then 0 nested), as :meth:`Layout.spec` prints it.

    >>> pin_layout("even", (4, 6), 4, "in0").grid
    (2, 2)
    >>> pin_layout("2x3: 1.0, -", (12, 5), 6, "in0").axes
    ((1, 0), None)
    """
    named = {"even": even_layout, "replicated": Layout.replicated, "root": Layout.on_root}
    if isinstance(spec, str) and spec.strip() in named:
        return named[spec.strip()](shape, nprocs)
    if isinstance(spec, str):
        spec = _parse_layout(spec, shape, what)
    if not isinstance(spec, Layout):
        raise DeinsumError(f"layout of {what}: expected a Layout, {', '.join(named)} or text like '2x2: 0, 1', "
                           f"not {type(spec).__name__}")
    if spec.shape != tuple(shape):
        raise DeinsumError(f"layout of {what}: {spec} is for shape {spec.shape}, the tensor has {tuple(shape)}")
    if spec.nranks > nprocs:
        raise DeinsumError(f"layout of {what}: grid {spec.grid} needs {spec.nranks} ranks, only {nprocs} given")
    if spec.partial:
        raise DeinsumError(f"layout of {what}: {spec} holds partial sums (a pinned layout holds values)")
    return spec


def _parse_layout(text: str, shape: tuple[int, ...], what: str) -> Layout:
    """``"2x3: 1.0, -"`` -> Layout (see :func:`pin_layout`); a one-line DeinsumError if malformed."""
    match = re.fullmatch(r"\s*(\d+(?:\s*x\s*\d+)*)\s*:\s*(.*?)\s*", text)
    items = [] if match is None or not match.group(2) else [t.strip() for t in match.group(2).split(",")]
    if match is None or not all(re.fullmatch(r"-|\d+(\.\d+)*", t) for t in items):
        raise DeinsumError(f"layout of {what}: {text!r} is not a mode (even, replicated, root) or "
                           f"'GRID: AXIS, ...' like '2x3: 0, -'")
    grid = tuple(int(g) for g in match.group(1).split("x"))
    if len(items) != len(shape):
        raise DeinsumError(f"layout of {what}: {text!r} names {len(items)} axes, the tensor has {len(shape)}")
    axes = tuple(None if t == "-" else tuple(int(g) for g in t.split(".")) for t in items)
    return Layout(tuple(shape), grid, axes)


def spread(layout: Layout) -> Layout:
    """``layout`` with its replicated grid dimensions also splitting axes: no replication left.

    Each replicated dimension (largest first) nests under the axis whose
    blocks are then longest, so every rank holds a distinct, even piece of
    its replication group's block: the "home" of a tensor on a compute grid,
    from which an all-gather inside the replication group makes the block.

    >>> spread(Layout((8, 6), grid=(2, 3), axes=(0, None))).axes
    (0, 1)
    >>> spread(Layout((8, 3), grid=(2, 4), axes=(0, None))).axes   # rows 4 long, columns 3: split rows
    ((0, 1), None)
    """
    if layout.partial:
        raise DeinsumError(f"layout {layout}: a partial layout cannot be spread")
    if not layout.shape:
        return layout
    nest = [list(layout.axis_dims(x)) for x in range(len(layout.shape))]
    for g in sorted(layout.replicated_dims, key=lambda g: (-layout.grid[g], g)):
        if layout.grid[g] == 1:
            continue
        extent = [-(-n // math.prod(layout.grid[d] for d in dims)) for n, dims in zip(layout.shape, nest)]
        nest[int(np.argmax(extent))].append(g)
    return Layout(layout.shape, layout.grid, tuple(tuple(d) if d else None for d in nest))
