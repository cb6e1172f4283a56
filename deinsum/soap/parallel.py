"""Parallel SOAP bounds for P ranks with S words of local memory each (soap.md section 5).

* memory-independent (the class bound's per-group term, citable-bounds.md section 2): if every
  rank performs ``|V|/P`` iterations (rounded down), rank r touches at least ``X_P`` words,
  ``chi(X_P) = |V|/P``; summed over ranks, what the ranks must receive is at least
  ``P X_P - sum_T (words of T held at the start or end, over all ranks)``, so the busiest rank
  receives at least ``X_P - owned`` with ``owned = sum_T own(T)`` and ``own(T)`` the average share
  per rank: ``|T|/P`` for one copy (the default), ``|T|`` for a tensor on every rank.
* joint (:func:`joint_bound`): connected groups, each but the top one making an intermediate another
  reads. A rank's iterations of a group need each intermediate element they read complete there: it
  receives a word for it (a complete value, or a partial sum to complete it) unless it computed all of
  the element's iterations itself (no recomputation, no partial sums consumed across groups). The
  points of the groups' fused statement whose intermediates a rank made itself form a set ``Q``; the
  rank touches at least ``Q``'s footprint on every term of the fused statement (the groups' reads from
  outside and the top group's result), and each intermediate element it receives removes at most
  ``K = max_T |fused space| / |T|`` points from ``Q``, so it receives at least
  ``(N_s |D| - |Q|) / K`` such words (``|D| >= floor(|V_top|/P)`` iterations of the top group, ``N_s``
  fused points per iteration of it), with ``|Q| <= min_g (|fused space| / |V_g|) ceil(|V_g|/P)``.
  Summed over ranks, each tensor's words are at least its footprints less the words held and at least 0,
  so for every weight ``theta_U`` in [0, 1] per term the busiest rank receives at least the least over
  ``|Q|`` of ``sum_U theta_U |pi_U(Q)| + (words of the intermediates)`` less ``sum_U theta_U own(U)``: a
  weighted footprint of the fused statement (convex in ``log |Q|``: a tangent at the largest ``|Q|``
  covers the smaller ones). Small weights on a term a rank may hold more of than it uses (the big
  tensor) keep the fused bound: KRP then TDOT, X A then B, or order-5 MTTKRP in four steps cost what the
  fused statement costs.
* memory-dependent (:func:`memory_bound`, segment argument): a rank that holds at most ``M`` words at
  any time and computes ``n = floor(|V|/P)`` iterations of a statement, cut into segments in each of
  which it sends and receives ``S`` words, touches in a segment at most ``2M + S`` words (those in
  memory at its start, received, in memory at its end or sent: nothing else, with no recomputation),
  so it computes at most ``chi(2M + S)`` iterations there and moves at least ``S (n / chi(2M + S) - 1)``
  words, for every ``S``. Every word sent is received once, so the busiest rank receives at least half
  of that (summed over the groups a rank runs one after another). ``Q_dep`` keeps SOAP's sequential
  figure ``|V| / (P rho(S)) - (X0 - S)`` (S: fast memory), which deinsum prints no bound from.

The tile at ``X_P`` is the per-rank block that process-grid selection aims for.

>>> from deinsum.soap import Statement
>>> pb = parallel_bound(Statement.from_terms(["ik", "kj"], "ij"), dict(i=4096, j=4096, k=4096), 64, 2**20)
>>> round(pb.Q_indep), round(pb.XP), round(pb.tiles["i"])    # 3 (n^3/P)^(2/3) - 3 n^2/P
(2359296, 3145728, 1024)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from ..errors import DeinsumError
import numpy as np

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
    pb = independent_bound(statement, sizes, P, owned)
    seq = numeric_bound(statement, pb.sizes, S)
    if pb.XP == 0.0:
        return replace(pb, S=seq.S)
    Q_dep = max(0.0, seq.Q / P - (seq.X0 - seq.S)) if math.isfinite(seq.rho) else 0.0   # segment argument
    return replace(pb, S=seq.S, Q_dep=Q_dep)


def independent_bound(statement: Statement, sizes: Mapping[str, int], P: int,
                      owned: Mapping[str, float] | None = None) -> ParallelBound:
    """The memory-independent figure alone (:func:`parallel_bound` without S: ``S`` infinite, ``Q_dep`` 0)."""
    P = check_ranks(P)
    sizes = check_sizes(statement, sizes)
    names = statement.names or tuple(f"term{k}" for k in range(len(statement.terms)))
    share = [min(float((owned or {}).get(n, statement.term_size(t, sizes) / P)), statement.term_size(t, sizes))
             for n, t in zip(names, statement.terms)]
    own = float(sum(share))
    points = statement.iteration_space(sizes) // P
    if is_trivial(statement, sizes) or points == 0:   # no rank need compute anything: nothing to bound
        return ParallelBound(statement, sizes, P, math.inf, 0.0, 0.0, 0.0, own, {v: float(n) for v, n in sizes.items()},
                             ())
    pb = problem(statement, sizes)
    XP, y = tile_for(pb, math.log(points))
    tiles = split_tile(statement.variables, pb, y, sizes)
    return ParallelBound(statement, sizes, P, math.inf, 0.0, max(XP * (1 - NOISE) - own, 0.0), XP, own, tiles,
                         clamped(tiles, sizes))


#: Golden-section steps over each weight in :func:`joint_bound` (in log scale, down to ``1e-12``).
JOINT_STEPS = 12
GOLDEN = (math.sqrt(5) - 1) / 2


def joint_bound(groups: Sequence[Statement], sizes: Mapping[str, int], P: int,
                owned: Mapping[str, float] | None = None, enough: float = math.inf) -> float:
    """Words the busiest rank receives at least in the moves of connected ``groups`` (each but one making an
    intermediate another reads), each balanced over the P ranks (module doc: ``Q`` holds the points of
    their fused statement whose intermediates a rank makes itself). ``owned`` as in :func:`parallel_bound`
    (intermediates between the groups are never held). The search stops once the bound reaches ``enough``.

    KRP then TDOT of MTTKRP (1724^3 x 42, P = 8): the groups alone bound 0 and 63,357 words, both together
    what the fused statement bounds, 81,459.

    >>> krp, tdot = Statement(("ja", "ka", "jka"), ("in1", "in2", "t0")), Statement(("ijk", "jka", "ia"),
    ...                                                                      ("in0", "t0", "out"))
    >>> round(joint_bound([krp, tdot], dict(i=1724, j=1724, k=1724, a=42), 8))
    81459
    """
    P = check_ranks(P)
    groups = tuple(groups)
    made = {g.names[-1]: g for g in groups}
    read = {n for g in groups for n in g.names[:-1]}
    tops = [g for n, g in made.items() if n not in read]
    if len(groups) < 2 or len(tops) != 1 or any(n not in read for n in made if made[n] is not tops[0]):
        raise DeinsumError(f"{'; '.join(g.equation for g in groups)}: a joint bound needs connected groups, all "
                           f"but one read by another")
    top = tops[0]
    for st in groups:
        sizes = {**sizes, **check_sizes(st, sizes)}
    if any(is_trivial(st, sizes) for st in groups):
        return 0.0
    variables = "".join(dict.fromkeys("".join(g.variables for g in groups)))
    fused = math.prod(sizes[v] for v in variables)
    points = top.iteration_space(sizes) // P
    summed = fused // top.iteration_space(sizes)          # points of Q per iteration of the top group
    kill = max(fused // top.term_size(g.output, sizes) for g in groups if g is not top)   # per element received
    most = min(fused // g.iteration_space(sizes) * -(-g.iteration_space(sizes) // P) for g in groups)
    named = [(n, t) for g in groups for n, t in zip(g.names[:-1], g.inputs) if n not in made]
    named += [(top.names[-1], top.output)]
    terms = tuple(t for _, t in named)
    own = np.array([min(float((owned or {}).get(n, top.term_size(t, sizes) / P)), top.term_size(t, sizes))
                    for n, t in named])

    def words(q: float) -> float:
        """The intermediates' words a rank receives at least where ``q`` fused points are its own."""
        return max(0.0, (summed * points - q) / kill)

    def value(theta: np.ndarray) -> tuple[float, np.ndarray]:
        """The bound at weights ``theta`` and the terms' sizes at the largest ``|Q|``."""
        top, at, slope = weighted_footprint(terms, tuple(theta), sizes, variables, most)
        top *= 1 - NOISE
        low = math.log(most)
        ends = [most, 0.0]                 # the least of the convex tangent bound plus words(q) is at an end
        if slope > 0:                      # of a piece: where the tangent or words(q) reaches 0
            ends.append(math.exp(low - top / slope))
        ends.append(summed * points)         # (where words(q) reaches 0)
        least = min(max(0.0, top + slope * (math.log(q) - low)) + words(q) if q > 0 else words(0.0)
                    for q in ends if q <= most)
        return least - float(theta @ own), np.array([at[t] for t in terms])

    theta = np.ones(len(terms))
    best, at = value(theta)
    held = [k for k in range(len(terms)) if at[k] <= own[k] * (1 + 1e-6)]   # terms a rank may hold more of
    for k in sorted(held, key=lambda n: -own[n]):     # than it uses: a smaller weight (golden section: the
        if best >= enough:                             # bound is concave in each weight)
            break
        lo, hi = math.log(1e-12), 0.0

        def at_weight(x: float) -> float:
            trial = theta.copy()
            trial[k] = math.exp(x)
            return value(trial)[0]

        c, d = hi - GOLDEN * (hi - lo), lo + GOLDEN * (hi - lo)
        fc, fd = at_weight(c), at_weight(d)
        for _ in range(JOINT_STEPS):
            if max(best, fc, fd) >= enough:
                break
            if fc >= fd:
                hi, d, fd = d, c, fc
                c = hi - GOLDEN * (hi - lo)
                fc = at_weight(c)
            else:
                lo, c, fc = c, d, fd
                d = lo + GOLDEN * (hi - lo)
                fd = at_weight(d)
        x = c if fc >= fd else d
        if max(fc, fd) > best:
            best, theta[k] = max(fc, fd), math.exp(x)
    return max(best, 0.0)


#: The segment sizes :func:`memory_bound` tries, as multiples of the memory M.
SEGMENTS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1, 2, 4, 8, 16, 32, 64)


def memory_bound(statement: Statement, sizes: Mapping[str, int], P: int, M: float) -> float:
    """Words a rank sends plus receives at least while it computes ``floor(|V|/P)`` iterations of
    ``statement`` holding at most ``M`` words at any time (module doc: the most over segment sizes ``S``
    in :data:`SEGMENTS` of ``S (n / chi(2M + S) - 1)``).

    >>> mm = Statement(("ik", "kj", "ij"))       # 4096^3 on 4096 ranks, 1.25x the data share
    >>> round(memory_bound(mm, dict(i=4096, j=4096, k=4096), 4096, 1.25 * 3 * 4096))
    145132
    """
    P = check_ranks(P)
    sizes = check_sizes(statement, sizes)
    points = statement.iteration_space(sizes) // P
    if is_trivial(statement, sizes) or points == 0:
        return 0.0
    pb = problem(statement, sizes)
    best = 0.0
    for t in SEGMENTS:
        log_chi, _ = pb.chi(2 * M + t * M)
        if points <= math.exp(log_chi) * (1 + NOISE):   # one segment does a rank's work: so does every longer one
            break
        best = max(best, t * M * (points / (math.exp(log_chi) * (1 + NOISE)) - 1))
    return best
