"""Parallel SOAP bounds for P ranks with S words of local memory each (soap.md section 5).

Balance: the memory-independent bounds hold for every algorithm in which every rank computes at most
``rho |V_g|/P`` of the ``|V_g|`` iterations of every group g (``rho >= 1``; a plan's own ``rho`` is the most,
over its groups, of its busiest rank's iterations over ``|V_g|/P``: uneven blocks and idle ranks included).
They rest on two facts about ``X(n)``, the least footprint of ``n`` iteration points (sides capped at the
sizes; by LP duality with the Hoelder-Brascamp-Lieb inequalities a lower bound for ANY set of ``n`` points):
``X`` is nondecreasing, and ``X(n)/n`` is nonincreasing for ``n <= |V|`` (from the optimal box of ``n`` points,
stretch sides that are below their caps by factors whose product is ``c = n'/n >= 1``: every term grows by at
most ``c``, so ``X(n') <= c X(n)``). The same holds for a weighted footprint (nonnegative weights per term).
Hence if every ``n_r <= m = rho |V|/P`` and ``sum_r n_r = |V|``, then
``sum_r X(n_r) >= sum_r n_r X(m)/m = |V| X(m)/m`` (at ``rho = 1``: ``P X(|V|/P)``).

* memory-independent (the class bound's per-group term, citable-bounds.md section 2): rank r touches at least
  ``X(n_r)`` words; summed over ranks, what the ranks must receive is at least
  ``sum_r X(n_r) - sum_T (words of T held at the start or end, over all ranks)``, so the busiest rank (at least
  the average) receives at least ``X_P - owned`` with ``X_P = (|V|/P) X(m)/m = X(m)/rho`` and
  ``owned = sum_T own(T)``, ``own(T)`` the average share per rank: ``|T|/P`` for one copy (the default),
  ``|T|`` for a tensor on every rank. A term whose footprint grows linearly in ``n`` (the big tensor of MTTKRP,
  its other indices' tiles at their caps) keeps exactly its share ``|T|/P``: only the terms that grow slower
  lose, by ``rho`` to a power below 1.
* joint (:func:`joint_bound`): connected groups, each but the top one making an intermediate another reads.
  A rank's iterations of a group need each intermediate element they read complete there: it receives a word
  for it (a complete value, or a partial sum to complete it) unless it computed all of the element's
  iterations itself (no recomputation, no partial sums consumed across groups). Let ``D_r`` be the top group's
  iterations rank r performs (``sum_r |D_r| = |V_top|``), ``N_s = |fused space| / |V_top|`` the points of the
  groups' fused statement per top iteration, and ``Q_r`` the fused points under ``D_r`` whose intermediates r
  made itself: the ``Q_r`` are disjoint, ``|Q_r| <= m_Q = rho |fused space| / P`` (r performs the iterations of
  every group under them), r touches at least ``Q_r``'s footprint on every term of the fused statement (the
  groups' reads from outside and the top group's result), and each intermediate element it receives covers at
  most ``K = max_T |fused space| / |T|`` points under ``D_r`` that are not in ``Q_r``, so it receives at least
  ``(N_s |D_r| - |Q_r|) / K`` such words. Summed over ranks, each term's words are at least its footprints less
  the words held and at least 0, so for every weight ``theta_U`` in [0, 1] per term the ranks receive at least
  ``sum_r [phi(q_r) - q_r / K] + |fused space| / K - P sum_U theta_U own(U)``, ``phi`` the weighted footprint
  ``sum_U theta_U |pi_U(Q)|`` (a lower bound for any set: the least over boxes). ``phi(q)/q`` is nonincreasing,
  so ``phi(q) - q/K >= q (phi(m_Q)/m_Q - 1/K)`` for ``q <= m_Q``, and with ``sum_r q_r <= |fused space|`` the
  busiest rank receives at least ``min(|fused space| / (P K), phi(m_Q) / rho) - sum_U theta_U own(U)``. Small
  weights on a term a rank may hold more of than it uses (the big tensor) keep the fused bound: KRP then TDOT,
  X A then B, or order-5 MTTKRP in four steps cost what the fused statement costs.
* memory-dependent (:func:`memory_bound`, segment argument; any balance): a rank that holds at most ``M`` words
  at any time and computes ``n_r`` iterations of a statement, cut into segments in each of which it sends and
  receives ``S`` words, touches in a segment at most ``2M + S`` words (those in memory at its start, received,
  in memory at its end or sent: nothing else, with no recomputation), so it computes at most ``chi(2M + S)``
  iterations there and moves at least ``S (n_r / chi(2M + S) - 1)`` words, for every ``S``. That is affine in
  ``n_r``: summed over ranks, at least ``P S (n / chi(2M + S) - 1)`` with ``n = |V|/P`` the average, whatever
  the balance. Every word sent is received once, so the ranks receive at least half of that and the busiest
  rank at least half of ``S (n / chi(2M + S) - 1)`` (summed over the groups a rank runs one after another).
  ``Q_dep`` keeps SOAP's sequential figure ``|V| / (P rho(S)) - (X0 - S)`` (S: fast memory) for the busiest
  rank (it computes at least ``|V|/P`` iterations), which deinsum prints no bound from.

The tile at ``m`` is the busiest rank's block that process-grid selection aims for.

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


def check_balance(rho) -> float:
    """``rho`` (the most a rank computes of a group, over the average ``|V_g|/P``) as a float >= 1, or DeinsumError.

    >>> check_balance(1), check_balance(1.25)
    (1.0, 1.25)
    """
    if isinstance(rho, bool) or not isinstance(rho, (int, float)) or not 1 <= rho < math.inf:
        raise DeinsumError(f"rho (a rank's most iterations of a group over |V_g|/P) must be a number >= 1, got {rho!r}")
    return float(rho)


def balance_text(rho: float | Mapping[int, float]) -> str:
    """The balance the memory-independent bounds assume, as every output words it: exact balance at ``rho = 1``,
    else each rank within ``rho`` times the average (``rho`` by P: a table of several P).

    >>> balance_text(1.0)
    'every rank computes 1/P of the iterations of every group (balance per group: exactly balanced)'
    >>> balance_text({8: 1.0357, 64: 1.0})[:119]
    'every rank computes at most rho |V_g|/P of the |V_g| iterations of every group g, rho = 1.0357 at P = 8 and 1 at P = 64'
    """
    by_p = rho if isinstance(rho, Mapping) else {None: rho}
    if all(r == 1 for r in by_p.values()):
        return "every rank computes 1/P of the iterations of every group (balance per group: exactly balanced)"
    values = " and ".join(f"{r:.6f}".rstrip("0").rstrip(".") + ("" if p is None else f" at P = {p}")
                          for p, r in by_p.items())
    return (f"every rank computes at most rho |V_g|/P of the |V_g| iterations of every group g, rho = {values} "
            f"(balance per group within the plan's own imbalance: its busiest rank's iterations of a group over "
            f"|V_g|/P, at most)")


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
    rho: float = 1.0                     # the balance assumed (module doc): a rank computes at most rho |V|/P

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
                "layout": self.layout, "rho": self.rho}


def check_ranks(P) -> int:
    if isinstance(P, bool) or not isinstance(P, int) or P < 1:
        raise DeinsumError(f"P must be an int >= 1, got {P!r}")
    return P


def parallel_bound(statement: Statement, sizes: Mapping[str, int], P: int, S: float,
                   owned: Mapping[str, float] | None = None, rho: float = 1.0) -> ParallelBound:
    """Memory-dependent and memory-independent per-rank figures of one statement, and the per-rank tile.

    Where every rank performs at most ``m = rho |V|/P`` iterations, the ranks touch at least ``P X_P`` words of
    the terms, ``X_P = X(m)/rho``; the busiest rank receives at least ``X_P - owned`` (module doc; ``X_P``
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
    pb = independent_bound(statement, sizes, P, owned, rho)
    seq = numeric_bound(statement, pb.sizes, S)
    if pb.XP == 0.0:
        return replace(pb, S=seq.S)
    Q_dep = max(0.0, seq.Q / P - (seq.X0 - seq.S)) if math.isfinite(seq.rho) else 0.0   # segment argument
    return replace(pb, S=seq.S, Q_dep=Q_dep)


def independent_bound(statement: Statement, sizes: Mapping[str, int], P: int,
                      owned: Mapping[str, float] | None = None, rho: float = 1.0) -> ParallelBound:
    """The memory-independent figure alone (:func:`parallel_bound` without S: ``S`` infinite, ``Q_dep`` 0).

    Within a balance ``rho`` a rank's block may be larger, its footprint per iteration smaller: matrix multiply
    8^3 on 8 ranks touches 384 words over all ranks at ``rho = 1``, at least 373 where a rank may compute 1.09x
    the average.

    >>> mm, sizes = Statement.from_terms(["ik", "kj"], "ij"), dict(i=8, j=8, k=8)
    >>> [round(independent_bound(mm, sizes, 8, rho=r).XP * 8) for r in (1, 1.09)]
    [384, 373]
    """
    P, rho = check_ranks(P), check_balance(rho)
    sizes = check_sizes(statement, sizes)
    names = statement.names or tuple(f"term{k}" for k in range(len(statement.terms)))
    share = [min(float((owned or {}).get(n, statement.term_size(t, sizes) / P)), statement.term_size(t, sizes))
             for n, t in zip(names, statement.terms)]
    own = float(sum(share))
    volume = statement.iteration_space(sizes)
    if is_trivial(statement, sizes):   # no rank need compute anything: nothing to bound
        return ParallelBound(statement, sizes, P, math.inf, 0.0, 0.0, 0.0, own, {v: float(n) for v, n in sizes.items()},
                             (), rho=rho)
    most = min(max(rho * volume / P, 1.0), float(volume))     # iterations a rank computes at most (at least one)
    pb = problem(statement, sizes)
    X, y = tile_for(pb, math.log(most))
    XP = X * volume / (P * most)                               # the least average footprint (module doc)
    tiles = split_tile(statement.variables, pb, y, sizes)
    bound = weighted_bound(statement.terms, sizes, statement.variables, np.array(share), most, volume / (P * most))
    return ParallelBound(statement, sizes, P, math.inf, 0.0, bound, XP, own, tiles, clamped(tiles, sizes), rho=rho)


#: Golden-section steps over each weight in :func:`joint_bound` (in log scale, down to ``1e-12``).
JOINT_STEPS = 12
LEAST_LOG_WEIGHT = math.log(1e-12)
GOLDEN = (math.sqrt(5) - 1) / 2


def joint_bound(groups: Sequence[Statement], sizes: Mapping[str, int], P: int,
                owned: Mapping[str, float] | None = None, enough: float = math.inf, rho: float = 1.0) -> float:
    """Words the busiest rank receives at least in the moves of connected ``groups`` (each but one making an
    intermediate another reads), each balanced over the P ranks within ``rho`` (module doc: ``Q_r`` holds the
    points of their fused statement whose intermediates rank r makes itself). ``owned`` as in
    :func:`parallel_bound` (intermediates between the groups are never held). The search stops once the bound
    reaches ``enough``.

    KRP then TDOT of MTTKRP (1724^3 x 42, P = 8): the groups alone bound 0 and 63,357 words, both together
    what the fused statement bounds, 81,459.

    >>> krp, tdot = Statement(("ja", "ka", "jka"), ("in1", "in2", "t0")), Statement(("ijk", "jka", "ia"),
    ...                                                                      ("in0", "t0", "out"))
    >>> round(joint_bound([krp, tdot], dict(i=1724, j=1724, k=1724, a=42), 8))
    81459
    """
    P, rho = check_ranks(P), check_balance(rho)
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
    kill = max(fused // top.term_size(g.output, sizes) for g in groups if g is not top)   # per element received
    most = min(max(rho * fused / P, 1.0), float(fused))     # |Q_r| at most
    received = fused / (P * kill)                           # the intermediates' words where no Q_r has a point
    named = [(n, t) for g in groups for n, t in zip(g.names[:-1], g.inputs) if n not in made]
    named += [(top.names[-1], top.output)]
    terms = tuple(t for _, t in named)
    own = np.array([min(float((owned or {}).get(n, top.term_size(t, sizes) / P)), top.term_size(t, sizes))
                    for n, t in named])

    return weighted_bound(terms, sizes, variables, own, most, fused / (P * most), received, enough)


def weighted_bound(terms: tuple[str, ...], sizes: Mapping[str, int], variables: str, own: np.ndarray, most: float,
                   scale: float, cap: float = math.inf, enough: float = math.inf) -> float:
    """The most, over weights ``theta_T`` in [0, 1], of ``min(cap, scale phi(most)) - sum_T theta_T own_T`` (module
    doc): ``phi`` the least weighted footprint of ``terms`` over boxes of ``most`` points. Weights below 1 are
    searched on the terms a rank may hold more of than it uses, the largest share first: where ``cap`` binds at
    unit weights, those whose size at ``most`` points, times ``scale``, is at most the share held; else those
    where it is less (the bound is concave in each weight, and its slope at 1 is that difference). The search
    stops once the bound reaches ``enough``.

    MTTKRP on 8 ranks with X on every rank: 0 at unit weights (8,120 words touched, 64,030 held), 46 with X's
    weight near 0 (the factors' and result's 76 words, t_a = 1, less their 30 words of shares).

    >>> terms, sizes = ("ijk", "ja", "ka", "ia"), dict(i=40, j=40, k=40, a=2)
    >>> own = np.array([40**3, 10, 10, 10])
    >>> round(weighted_bound(terms, sizes, "ijka", own, 40**3 * 2 / 8, 1.0))
    46
    """
    warm: dict = {}                                    # the search's solved tiles: each starts at the last

    def value(theta: np.ndarray) -> tuple[float, np.ndarray]:
        """The bound at weights ``theta`` and the terms' sizes at ``most`` points."""
        phi, at = weighted_footprint(terms, tuple(theta), sizes, variables, most, warm)
        return min(cap, phi * (1 - NOISE) * scale) - float(theta @ own), np.array([at[t] for t in terms])

    theta = np.ones(len(terms))
    best, at = value(theta)
    used = at * scale / np.maximum(own, 1e-300)       # what a rank uses of a term over what it holds
    held = np.flatnonzero(used <= 1 + 1e-6 if best + theta @ own >= cap else used < 1 - 1e-6)
    for k in sorted(held, key=lambda n: -own[n]):     # a smaller weight (golden section: phi is the least of
        if best >= enough:                             # linear functions of theta: concave)
            break
        lo, hi = LEAST_LOG_WEIGHT, 0.0

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
        tried = [(fc, c), (fd, d)] + ([(at_weight(lo), lo)] if lo == LEAST_LOG_WEIGHT else [])   # the end too
        fx, x = max(tried)
        if fx > best:
            best, theta[k] = fx, math.exp(x)
    return max(best, 0.0)


#: The segment sizes :func:`memory_bound` tries, as multiples of the memory M.
SEGMENTS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1, 2, 4, 8, 16, 32, 64)


def memory_bound(statement: Statement, sizes: Mapping[str, int], P: int, M: float) -> float:
    """Words the ranks send plus receive at least, over P, while they compute the iterations of ``statement``
    in any balance, each holding at most ``M`` words at any time (module doc: the most over segment sizes
    ``S`` in :data:`SEGMENTS` of ``S (n / chi(2M + S) - 1)``, ``n = |V|/P``).

    >>> mm = Statement(("ik", "kj", "ij"))       # 4096^3 on 4096 ranks, 1.25x the data share
    >>> round(memory_bound(mm, dict(i=4096, j=4096, k=4096), 4096, 1.25 * 3 * 4096))
    145132
    """
    P = check_ranks(P)
    sizes = check_sizes(statement, sizes)
    points = statement.iteration_space(sizes) / P
    if is_trivial(statement, sizes):
        return 0.0
    pb = problem(statement, sizes)
    best = 0.0
    for t in SEGMENTS:
        log_chi, _ = pb.chi(2 * M + t * M)
        if points <= math.exp(log_chi) * (1 + NOISE):   # one segment does a rank's work: so does every longer one
            break
        best = max(best, t * M * (points / (math.exp(log_chi) * (1 + NOISE)) - 1))
    return best
