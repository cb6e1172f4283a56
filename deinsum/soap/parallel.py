"""Parallel SOAP bounds for P ranks with S words of local memory each (soap.md section 5).

* memory-dependent (segment argument): every rank moves at least
  ``|V| / (P rho(S)) - (X0 - S)`` words (``rho``, ``X0`` of the interior SOAP solution);
* memory-independent: a rank performing ``|V|/P`` iterations touches at least
  ``X_P`` words, ``chi(X_P) = |V|/P``, and moves (receives or sends) at least
  ``X_P - owned``, where ``owned`` is its share of the inputs at the start and
  of the result at the end (layout below). soap.md subtracts the inputs only;
  that overstates the bound by the output block a rank computes where it ends
  (e.g. at P = 1 it would claim N^2 words for MM, where nothing moves).

The larger of the two binds. The tile at ``X_P`` is the per-rank block that
process-grid selection aims for.

>>> from deinsum.soap import Statement
>>> pb = parallel_bound(Statement.from_terms(["ik", "kj"], "ij"), dict(i=4096, j=4096, k=4096), 64, 2**20)
>>> pb.binding, round(pb.XP), round(pb.tiles["i"])
('memory-independent', 3145728, 1024)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from ..errors import DeinsumError
from .numeric import clamped, numeric_bound, problem, split_tile, tile_for
from .statement import Statement, check_sizes, is_trivial

#: The starting layout every parallel figure assumes.
LAYOUT = "inputs evenly block-distributed over all P ranks at the start, the result at the end; no replication"


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
    """Memory-dependent and memory-independent per-rank bounds of one statement, and the per-rank tile.

    A rank performing ``|V|/P`` iterations touches at least ``X_P`` words of the
    terms and receives at least ``X_P - owned``. Intermediates read from other
    groups count as terms: deinsum computes every iteration once, so another
    group leaves them spread over the ranks, not replicated. ``owned``: the most
    words of each term (by tensor name) one rank holds at the start or keeps at
    the end; default ``ceil(|T| / P)``, an even layout without replication.
    """
    P = check_ranks(P)
    sizes = check_sizes(statement, sizes)
    seq = numeric_bound(statement, sizes, S)
    names = statement.names or tuple(f"term{k}" for k in range(len(statement.terms)))
    share = [min(float((owned or {}).get(n, math.ceil(statement.term_size(t, sizes) / P))),
                 statement.term_size(t, sizes)) for n, t in zip(names, statement.terms)]
    own = float(sum(share))
    if is_trivial(statement, sizes):
        return ParallelBound(statement, sizes, P, seq.S, 0.0, 0.0, 0.0, own, dict(seq.tiles), ())
    pb = problem(statement, sizes)
    XP, y = tile_for(pb, math.log(seq.V / P))
    Q_dep = max(0.0, seq.Q / P - (seq.X0 - seq.S)) if math.isfinite(seq.rho) else 0.0   # segment argument
    tiles = split_tile(statement.variables, pb, y, sizes)
    return ParallelBound(statement, sizes, P, seq.S, Q_dep, max(XP - own, 0.0), XP, own, tiles,
                         clamped(tiles, sizes))
