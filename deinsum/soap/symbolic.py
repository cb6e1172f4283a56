"""Closed-form SOAP bounds with SymPy: chi(X), X0, rho, tiles and Q in terms of N_v and S.

Method (docs: shared/notes/soap.md section 4):

1. Variables with identical term membership are merged (only their product
   matters); duplicate terms become multiplicities; 0-d terms shift S.
2. The exponent LP ``max sum e  s.t.  sum_{v in T} e_v <= 1`` (Hölder-Brascamp-
   Lieb) gives ``sigma`` and, through strict complementarity, the terms that
   stay *tight* as ``X -> oo`` and the variables that stay at ``t_v = 1``.
3. The KKT conditions over the tight terms are linear in the budget shares
   ``w_T``: ``sum w_T = 1`` and ``sum_{T ∋ v} w_T = 1/sigma`` for every growing
   variable. The tile follows from ``sum_{v in T} log t_v = log(w_T X)``
   (minimum-norm solution), so ``chi(X) = c X^sigma`` exactly.
4. ``X0 = sigma S / (sigma - 1)``, ``rho = c sigma^sigma (sigma-1)^(1-sigma) S^(sigma-1)``,
   ``Q >= |V| / rho``; every result is cross-checked against the numeric
   geometric program before it is returned.

When a term is slack (e.g. the inputs of a Khatri-Rao product), the closed
form is that of the problem without it: a valid lower bound, tight to leading
order, flagged ``ok=False`` with the dropped terms in ``reason``. Symbolic
results assume no clamping (every ``N_v`` larger than its tile).

>>> from deinsum.soap import Statement
>>> b = symbolic_bound(Statement.from_terms(["ijk", "ja", "ka"], "ia"))
>>> b.ok, b.Q, b.X0, b.rho, b.tiles
(True, 3*N_a*N_i*N_j*N_k/S**(2/3), 5*S/2, S**(2/3)/3, {'i': S**(1/3), 'j': S**(1/3), 'k': S**(1/3), 'a': S**(2/3)/2})
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from fractions import Fraction
from functools import lru_cache

import numpy as np
import sympy as sp
from scipy.optimize import linprog

from .numeric import Problem
from .statement import P, S, X, Statement, Structure, canonical, is_trivial, structure

#: Larger statements are left to the numeric solver.
MAX_CLASSES = 16
#: Relative tolerance of the numeric cross-check of every closed form.
CHECK_RTOL = 1e-8
#: Fast-memory size at which closed forms are cross-checked.
CHECK_S = 1e6


class SymbolicFailure(Exception):
    """A closed form could not be found or did not pass its check (message: the reason)."""


@dataclass(frozen=True)
class Solution:
    """Closed form of one canonical statement (variables ``a, b, c, ...``)."""

    sigma: sp.Rational
    coef: sp.Expr                        # chi(X) = coef * (X - scalars)**sigma
    scalars: int
    tiles: dict[str, sp.Expr]            # canonical variable -> tile as a function of X
    dropped: tuple[int, ...]             # positions of terms left out (slack as X -> oo)

    def chi(self, x):
        return self.coef * (x - self.scalars) ** self.sigma

    def X0(self):
        if self.sigma == 1:
            return sp.oo
        return self.sigma * (S - self.scalars) / (self.sigma - 1) + self.scalars

    def rho(self):
        s = self.sigma
        if s == 1:
            return self.coef
        return self.coef * s ** s * (s - 1) ** (1 - s) * (S - self.scalars) ** (s - 1)

    def tiles_at(self, x):
        """Tiles at footprint ``x`` (scalar terms included)."""
        if x is sp.oo:
            return {v: sp.oo if t.has(X) else t for v, t in self.tiles.items()}
        return {v: t.subs(X, x - self.scalars) for v, t in self.tiles.items()}


@dataclass(frozen=True)
class SymbolicBound:
    """Closed-form SOAP bound of a statement (SymPy expressions in ``N_v``, ``S``, ``P``, ``X``).

    ``ok``: the expressions are the exact solution of the SOAP problem (cross-checked
    numerically). Otherwise ``reason`` says why; the expressions are then either
    those of the asymptotic problem without the slack terms ``dropped`` (a valid
    but not tight lower bound), or all None.

    ``chi`` (in X), ``X0``, ``rho``, ``tiles`` (index -> tile at X0), ``Q >= |V|/rho``;
    for P ranks: ``XP`` solves ``chi(XP) = |V|/P``, ``Q_dep = |V|/(P rho) - (X0 - S)``
    (memory-dependent, segment argument; a bound where positive), ``Q_indep = XP - owned`` (memory-independent; ``owned``: a rank's
    share of the inputs and of the result, evenly block-distributed, no replication),
    ``tiles_P`` (index -> tile at XP).
    """

    statement: Statement
    ok: bool
    reason: str = ""
    sigma: sp.Expr | None = None
    chi: sp.Expr | None = None
    X0: sp.Expr | None = None
    rho: sp.Expr | None = None
    tiles: dict[str, sp.Expr] = field(default_factory=dict)
    Q: sp.Expr | None = None
    XP: sp.Expr | None = None
    Q_dep: sp.Expr | None = None
    Q_indep: sp.Expr | None = None
    tiles_P: dict[str, sp.Expr] = field(default_factory=dict)
    dropped: tuple[str, ...] = ()

    @property
    def has_bound(self) -> bool:
        return self.Q is not None

    def to_dict(self) -> dict:
        """JSON-ready: expressions as strings, plus ``sigma`` as a float."""
        def s(e):
            return None if e is None else str(e)

        return {"statement": self.statement.equation, "ok": self.ok, "reason": self.reason,
                "sigma": s(self.sigma), "sigma_value": None if self.sigma is None else float(self.sigma),
                "chi": s(self.chi), "X0": s(self.X0), "rho": s(self.rho), "Q": s(self.Q),
                "tiles": {v: s(t) for v, t in self.tiles.items()}, "XP": s(self.XP), "Q_dep": s(self.Q_dep),
                "Q_indep": s(self.Q_indep), "tiles_P": {v: s(t) for v, t in self.tiles_P.items()},
                "dropped": list(self.dropped)}


def symbolic_bound(statement: Statement) -> SymbolicBound:
    """Closed-form bound of ``statement`` (cached in memory on the canonical statement)."""
    bound = _bound(statement.terms)
    return bound if bound.statement.names == statement.names else replace(bound, statement=statement)


@lru_cache(maxsize=2048)
def _bound(terms: tuple[str, ...]) -> SymbolicBound:
    statement = Statement(terms)
    if is_trivial(statement):
        return SymbolicBound(statement, False, "no loop variables (a scalar operation): nothing to bound")
    canon, rename = canonical(statement)
    try:
        sol = _solve(canon)
    except SymbolicFailure as exc:
        return SymbolicBound(statement, False, str(exc))
    back = {c: v for v, c in rename.items()}
    V = statement.iteration_space()
    X0, rho = sol.X0(), sol.rho()
    owned = sp.Add(*(statement.term_size(t) for t in statement.terms)) / P
    XP = sol.scalars + (V / (P * sol.coef)) ** (1 / sol.sigma)
    dropped = tuple(terms[k] for k in sol.dropped)
    reason = ""
    if dropped:
        reason = (f"no exact closed form: term(s) {', '.join(dict.fromkeys(dropped))} are slack as X -> oo, so chi(X) is not a "
                  f"power law; shown: the bound without them (valid, tight to leading order)")
    return SymbolicBound(
        statement, not dropped, reason, sol.sigma, sol.chi(X), X0, rho,
        _per_variable(sol.tiles_at(X0), back, statement), V / rho,
        XP, V / (P * rho) - (X0 - S), XP - owned, _per_variable(sol.tiles_at(XP), back, statement), dropped)


def _per_variable(tiles: dict[str, sp.Expr], back: dict[str, str], statement: Statement) -> dict[str, sp.Expr]:
    named = {back[c]: t for c, t in tiles.items()}
    return {v: named[v] for v in statement.variables}


@lru_cache(maxsize=2048)
def _solve(terms: tuple[str, ...]) -> Solution:
    """Closed form for canonical ``terms``; raises SymbolicFailure with the reason."""
    st = structure(terms)
    n, m = len(st.classes), len(st.terms)
    if n > MAX_CLASSES:
        raise SymbolicFailure(f"{n} variable classes (> {MAX_CLASSES}): left to the numeric solver")
    A = st.incidence()
    tight, grows = _lp_structure(A)
    K = [r for r in range(m) if tight[r]]
    I = [c for c in range(n) if grows[c]]
    w, lam = _shares(st, A, K, I)
    sigma = 1 / lam
    B = sp.Matrix([[int(A[r, c]) for c in I] for r in K])
    Bp = B.pinv()
    scale = [w[k] / st.mult[r] for k, r in enumerate(K)]
    for rhs in _log_coordinates(scale):
        if B * (Bp * rhs) != rhs:
            raise SymbolicFailure("the tile equations over the tight terms are inconsistent")
    class_tile = [sp.Integer(1)] * n
    for i, c in enumerate(I):
        ex = [Bp[i, k] for k in range(len(K))]
        if sum(ex) < 0:
            raise SymbolicFailure(f"the minimum-norm tile of {st.classes[c]!r} shrinks as X grows")
        class_tile[c] = sp.Mul(*(f ** e for f, e in zip(scale, ex))) * X ** sum(ex)
        if sum(ex) == 0 and class_tile[c] < 1:
            raise SymbolicFailure(f"the tile of {st.classes[c]!r} is below 1")
    coef = sp.Mul(*class_tile).subs(X, 1)
    tiles = {}
    for cls, t in zip(st.classes, class_tile):
        for v in cls:
            tiles[v] = t ** sp.Rational(1, len(cls))
    kept = {st.terms[r] for r in K}
    of = {v: k for k, cls in enumerate(st.classes) for v in cls}
    dropped = tuple(p for p, t in enumerate(terms) if t and tuple(sorted({of[v] for v in t})) not in kept)
    sol = Solution(sigma, coef, st.scalars, tiles, dropped)
    _check(sol, st, K)
    return sol


def _log_coordinates(values: list[sp.Rational]) -> list[sp.Matrix]:
    """``log(values) + log X`` split on the basis ``log X, log p`` (p prime): exact rational vectors."""
    factored = [sp.factorrat(v) for v in values]
    primes = sorted(set().union(*factored))
    return [sp.ones(len(values), 1)] + [sp.Matrix([f.get(p, 0) for f in factored]) for p in primes]


def _lp_structure(A: np.ndarray) -> tuple[list[bool], list[bool]]:
    """Terms tight in some optimal dual (weight > 0), and variables growing in some optimal primal."""
    m, n = A.shape
    primal = linprog(-np.ones(n), A_ub=A, b_ub=np.ones(m), bounds=(0, None), method="highs")
    if primal.status != 0:
        raise SymbolicFailure(f"exponent LP failed: {primal.message}")
    sigma = -primal.fun
    tol = 1e-9 * max(1.0, sigma)
    tight = []
    for r in range(m):          # max u_r  s.t.  A^T u >= 1, sum u <= sigma
        res = linprog(-np.eye(m)[r], A_ub=np.vstack([-A.T, np.ones((1, m))]),
                      b_ub=np.concatenate([-np.ones(n), [sigma + tol]]), bounds=(0, None), method="highs")
        tight.append(res.status == 0 and -res.fun > 1e-7)
    grows = []
    for c in range(n):          # max e_c  s.t.  A e <= 1, sum e >= sigma
        res = linprog(-np.eye(n)[c], A_ub=np.vstack([A, -np.ones((1, n))]),
                      b_ub=np.concatenate([np.ones(m), [-(sigma - tol)]]), bounds=(0, None), method="highs")
        grows.append(res.status == 0 and -res.fun > 1e-7)
    return tight, grows


def _shares(st: Structure, A: np.ndarray, K: list[int], I: list[int]) -> tuple[list[sp.Rational], sp.Rational]:
    """Exact KKT shares ``w_T`` (T in K) and ``lambda = 1/sigma``, checked exactly."""
    ws = sp.symbols(f"w0:{len(K)}", positive=True)
    lam = sp.Symbol("lam", positive=True)
    eqs = [sp.Add(*ws) - 1]
    eqs += [sp.Add(*(ws[k] for k, r in enumerate(K) if A[r, c])) - lam for c in I]
    sol = sp.linsolve(eqs, [*ws, lam])
    if not sol:
        raise SymbolicFailure("the KKT system over the tight terms has no solution")
    (vals,) = sol
    free = set().union(*(v.free_symbols for v in vals))
    if free:                    # pin the remaining freedom with the numeric optimum, then re-check exactly
        guess = dict(zip(ws, _numeric_shares(st, K)))
        vals = [v.subs(guess) for v in vals]
    w, lam_v = list(vals[:-1]), vals[-1]
    if any(not (x.is_Rational and x > 0) for x in w) or not (lam_v.is_Rational and 0 < lam_v <= 1):
        raise SymbolicFailure("the KKT shares of the tight terms are not positive rationals")
    for c in range(A.shape[1]):
        load = sum(w[k] for k, r in enumerate(K) if A[r, c])
        if (c in I and load != lam_v) or load < lam_v or load == 0:
            raise SymbolicFailure(f"KKT condition fails for {st.classes[c]!r}")
    return w, lam_v


def _numeric_shares(st: Structure, K: list[int]) -> list[sp.Rational]:
    """Budget shares of the tight terms at a large X, rationalised."""
    sub = Structure(st.classes, tuple(st.terms[r] for r in K), tuple(st.mult[r] for r in K), 0)
    pb = Problem(sub, np.full(len(st.classes), math.inf))
    X_big = 1e9 * pb.unit
    _, y = pb.chi(X_big)
    shares = np.exp(pb.A @ y + pb.logm) / X_big
    return [sp.Rational(Fraction(float(x)).limit_denominator(1000)) for x in shares]


def _check(sol: Solution, st: Structure, K: list[int]) -> None:
    """Compare the closed form with the numeric geometric program at ``S = CHECK_S``."""
    relaxed = Structure(st.classes, tuple(st.terms[r] for r in K), tuple(st.mult[r] for r in K), st.scalars)
    pb = Problem(relaxed, np.full(len(st.classes), math.inf))
    X0 = sol.X0().subs(S, CHECK_S)
    x = float(X0) if X0 is not sp.oo else 1e3 * CHECK_S
    chi_num = math.exp(pb.chi(x)[0])
    chi_sym = float(sol.chi(x))
    _close(chi_sym, chi_num, "chi(X)")
    tiles = {v: float(t.subs(X, x - sol.scalars)) for v, t in sol.tiles.items()}
    if min(tiles.values()) < 1 - 1e-12:
        raise SymbolicFailure("numeric cross-check failed: a tile is below 1")
    class_y = np.array([sum(math.log(tiles[v]) for v in cls) for cls in st.classes])
    _close(math.exp(class_y.sum()), chi_num, "tile volume")
    _close(pb.footprint(class_y) + sol.scalars, x, "tile footprint")
    if sol.sigma > 1:
        _close(float(sol.rho().subs(S, CHECK_S)), math.exp(pb.rho(CHECK_S)[0]), "rho")
    if sol.dropped:             # the relaxed chi must bound the true one from above
        full = Problem(st, np.full(len(st.classes), math.inf))
        if math.exp(full.chi(x)[0]) > chi_sym * (1 + CHECK_RTOL):
            raise SymbolicFailure("numeric cross-check failed: the relaxed chi is below the exact one")


def _close(sym: float, num: float, what: str) -> None:
    if not abs(sym - num) <= CHECK_RTOL * max(abs(num), 1e-300):
        raise SymbolicFailure(f"numeric cross-check failed for {what}: closed form {sym:.12g}, numeric {num:.12g}")
