"""Parallel SOAP bounds for P ranks with S words of local memory each (soap.md section 5).

* memory-independent (the class bound's per-group term, citable-bounds.md section 2): if every
  rank performs ``|V|/P`` iterations (rounded down), rank r touches at least ``X_P`` words,
  ``chi(X_P) = |V|/P``; summed over ranks, what the ranks must receive is at least
  ``P X_P - sum_T (words of T held at the start or end, over all ranks)``, so the busiest rank
  receives at least ``X_P - owned`` with ``owned = sum_T own(T)`` and ``own(T)`` the average share
  per rank: ``|T|/P`` for one copy (the default), ``|T|`` for a tensor on every rank.
* joint (:func:`joint_bound`): a group ``p`` that sums nothing makes each element of its output ``T``
  complete where it computes it, once; the group ``c`` that reads ``T`` receives every element of ``T``
  it needs that it did not make. Per rank, with ``K`` the elements of ``T`` the rank made
  (``|K| <= ceil(|T|/P)``) and ``D`` its iterations of ``c``: ``p``'s reads ``U`` (``m`` of them) touch
  ``|pi_U K| >= |pi_U D| - |M|`` (``M``: the elements of ``T`` it receives), at least ``phi`` (the
  least footprint of ``floor(|T|/P)`` iterations of ``p``), and ``|M| >= |pi_T D| - |K|``; eliminating
  ``M`` gives, for every ``lam`` in [0, 1], the weighted footprint
  ``sum_{U in c, U != T} |pi_U D| + (lam/m) sum_{U in p} |pi_U D| + (1 - lam) |pi_T D|
  + (1 - lam/m) phi - (1 - lam) ceil(|T|/P)`` less the shares of every other term of ``p`` and ``c``.
  It binds where running ``p`` and ``c`` as two statements costs more than either alone (KRP then
  TDOT: the TDOT's grid that keeps ``T`` local needs the KRP's inputs on every rank).
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
from .numeric import clamped, numeric_bound, problem, split_tile, tile_for, weighted_footprint
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


#: Steps of the bisection over ``lam`` in :func:`joint_bound` (the bound is concave in ``lam``).
JOINT_STEPS = 10


def joint_bound(producer: Statement, consumer: Statement, sizes: Mapping[str, int], P: int,
                owned: Mapping[str, float] | None = None) -> float:
    """Words the busiest rank receives at least where ``producer`` (a statement that sums nothing)
    makes the intermediate ``consumer`` reads, each group balanced over the P ranks (module doc).
    ``owned`` as in :func:`parallel_bound` (the intermediate itself is never held).

    KRP then TDOT of MTTKRP (1724^3 x 42, P = 8): each group alone bounds 0 and 63,357 words, both
    together 79,841 (the fused statement 81,459).

    >>> krp, tdot = Statement(("ja", "ka", "jka"), ("in1", "in2", "t0")), Statement(("ijk", "jka", "ia"),
    ...                                                                      ("in0", "t0", "out"))
    >>> round(joint_bound(krp, tdot, dict(i=1724, j=1724, k=1724, a=42), 8))
    79841
    """
    P = check_ranks(P)
    made, name = producer.output, producer.names[-1]
    if set(producer.variables) != set(made) or name not in consumer.names[:-1]:
        raise DeinsumError(f"{producer.equation} -> {consumer.equation}: a joint bound needs a producer that "
                           f"sums nothing and a consumer that reads its result")
    sizes = {**check_sizes(producer, sizes), **check_sizes(consumer, sizes)}
    points = consumer.iteration_space(sizes) // P
    if points == 0 or is_trivial(consumer, sizes):
        return 0.0
    others = [(n, t) for n, t in zip(consumer.names, consumer.terms) if n != name]
    reads = list(zip(producer.names[:-1], producer.inputs))
    size = producer.term_size(made, sizes)
    own = sum(min(float((owned or {}).get(n, producer.term_size(t, sizes) / P)), producer.term_size(t, sizes))
              for n, t in others + reads)
    phi = weighted_footprint(producer.inputs, (1.0,) * len(reads), sizes, producer.variables, size // P)[0]
    phi *= 1 - NOISE
    kappa, m = -(-size // P), len(reads)
    terms = tuple(t for _, t in others) + producer.inputs + (made,)

    def value(lam: float) -> tuple[float, float]:
        """The bound at ``lam`` and its slope in ``lam`` (the weighted terms' sizes at the optimum)."""
        words, sizes_at = weighted_footprint(terms, (1.0,) * len(others) + (lam / m,) * m + (1.0 - lam,), sizes,
                                             consumer.variables, points)
        bound = words * (1 - NOISE) + (1 - lam / m) * phi - (1 - lam) * kappa - own
        return bound, (sum(sizes_at[t] for t in producer.inputs) - phi) / m - sizes_at[made] + kappa

    best, slope = value(0.0)
    lo, hi = 0.0, 1.0
    if slope > 0:
        for _ in range(JOINT_STEPS):
            mid = 0.5 * (lo + hi)
            words, slope = value(mid)
            best = max(best, words)
            lo, hi = (mid, hi) if slope > 0 else (lo, mid)
    return max(best, 0.0)
