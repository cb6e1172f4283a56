"""Parallel SOAP bounds for P ranks with S words of local memory each (soap.md section 5).

* memory-independent (the class bound's per-group term, citable-bounds.md section 2): if every
  rank performs ``|V|/P`` iterations (rounded down), rank r touches at least ``X_P`` words,
  ``chi(X_P) = |V|/P``; summed over ranks, what the ranks must receive is at least
  ``P X_P - sum_T (words of T held at the start or end, over all ranks)``, so the busiest rank
  receives at least ``X_P - owned`` with ``owned = sum_T own(T)`` and ``own(T)`` the average share
  per rank: ``|T|/P`` for one copy (the default), ``|T|`` for a tensor on every rank.
* memory-dependent (segment argument): ``|V| / (P rho(S)) - (X0 - S)``, a figure of words a rank
  moves to or from its memory of S words (sent and received); deinsum prints no bound from it.

The tile at ``X_P`` is the per-rank block that process-grid selection aims for.

>>> from deinsum.soap import Statement
>>> pb = parallel_bound(Statement.from_terms(["ik", "kj"], "ij"), dict(i=4096, j=4096, k=4096), 64, 2**20)
>>> round(pb.Q_indep), round(pb.XP), round(pb.tiles["i"])    # 3 (n^3/P)^(2/3) - 3 n^2/P
(2359296, 3145728, 1024)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from ..errors import DeinsumError
from .numeric import clamped, numeric_bound, problem, split_tile, tile_for
from .statement import Statement, check_sizes, is_trivial

#: Relative error X_P may carry (geometric programs solved to ~1e-12): taken off before the shares are.
NOISE = 1e-9
#: The starting layout every parallel figure assumes.
LAYOUT = ("one copy of every input at the start and of the result at the end, an even share |T|/P per rank "
          "(the layouts are the algorithm's choice)")


@dataclass(frozen=True)
class ParallelBound:
    """Per-rank communication lower bounds (words) on P ranks with local memory S."""

    statement: Statement
    sizes: dict[str, int]
    P: int
    S: float
    Q_dep: float
    Q_indep: float
    XP: float
    owned: float
    tiles: dict[str, float]
    clamped: tuple[str, ...]
    layout: str = LAYOUT

    @property
    def binding(self) -> str:
        """Which bound is larger: ``"memory-dependent"`` or ``"memory-independent"``."""
        return "memory-dependent" if self.Q_dep >= self.Q_indep else "memory-independent"

    @property
    def Q(self) -> float:
        return max(self.Q_dep, self.Q_indep)

    def to_dict(self) -> dict:
        return {"statement": self.statement.equation, "sizes": dict(self.sizes), "P": self.P, "S": self.S,
                "Q_dep": self.Q_dep, "Q_indep": self.Q_indep, "Q": self.Q, "binding": self.binding,
                "XP": self.XP, "owned": self.owned, "tiles": dict(self.tiles), "clamped": list(self.clamped),
                "layout": self.layout}


def check_ranks(P) -> int:
    if isinstance(P, bool) or not isinstance(P, int) or P < 1:
        raise DeinsumError(f"P must be an int >= 1, got {P!r}")
    return P


def parallel_bound(statement: Statement, sizes: Mapping[str, int], P: int, S: float,
                   owned: Mapping[str, float] | None = None) -> ParallelBound:
    """Memory-dependent and memory-independent per-rank figures of one statement, and the per-rank tile.

    A rank performing ``floor(|V|/P)`` iterations touches at least ``X_P`` words of
    the terms; the busiest rank receives at least ``X_P - owned`` (module doc; ``X_P``
    less its relative ``NOISE``).
    Intermediates read from other groups count as terms, one copy of their complete
    values spread over the ranks. ``owned``: by tensor name, the words of each term
    all ranks hold at the start (inputs) or end (the result), divided by P; default
    ``|T|/P`` (one copy).

    >>> mm = Statement(("ik", "kj", "ij"), names=("A", "B", "C"))
    >>> sizes = dict(i=8, j=8, k=8)
    >>> [round(parallel_bound(mm, sizes, 8, 1e6, own).Q_indep, 6) for own in (None, {"A": 64})]
    [24.0, 0.0]
    """
    P = check_ranks(P)
    sizes = check_sizes(statement, sizes)
    seq = numeric_bound(statement, sizes, S)
    names = statement.names or tuple(f"term{k}" for k in range(len(statement.terms)))
    share = [min(float((owned or {}).get(n, statement.term_size(t, sizes) / P)), statement.term_size(t, sizes))
             for n, t in zip(names, statement.terms)]
    own = float(sum(share))
    points = seq.V // P
    if is_trivial(statement, sizes) or points == 0:   # no rank need compute anything: nothing to bound
        return ParallelBound(statement, sizes, P, seq.S, 0.0, 0.0, 0.0, own, dict(seq.tiles), ())
    pb = problem(statement, sizes)
    XP, y = tile_for(pb, math.log(points))
    Q_dep = max(0.0, seq.Q / P - (seq.X0 - seq.S)) if math.isfinite(seq.rho) else 0.0   # segment argument
    tiles = split_tile(statement.variables, pb, y, sizes)
    return ParallelBound(statement, sizes, P, seq.S, Q_dep, max(XP * (1 - NOISE) - own, 0.0), XP, own, tiles,
                         clamped(tiles, sizes))
