"""Numeric SOAP bounds for concrete sizes: the tile problem as a geometric program.

In log space ``y_v = log t_v`` the tile problem
``chi(X) = max prod t  s.t.  sum_T prod_{v in T} t_v <= X,  1 <= t_v <= N_v``
is convex. Its Lagrangian dual ``D(mu) = max_y sum(y) - mu * sum_T exp(a_T . y)``
over the box is a smooth concave maximisation (projected Newton), and
``log chi(X) = min_mu mu X + D(mu)``. Minimising over ``X`` in closed form turns
``rho = min_{S < X <= F} chi(X) / (X - S)`` into a 1-D minimisation over ``mu``
(``F``: footprint of the whole iteration space, where ``chi`` saturates at ``|V|``).

>>> from deinsum.soap import Statement
>>> mttkrp = Statement.from_terms(["ijk", "ja", "ka"], "ia")
>>> nb = numeric_bound(mttkrp, dict(i=10**4, j=10**4, k=10**4, a=24), S=10**4)
>>> nb.clamped, round(nb.tiles["i"], 6), round(nb.tiles["a"], 6)     # t_a wants S^(2/3)/2 = 232 > 24
(('a',), 208.333333, 24.0)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping

import numpy as np

from ..errors import DeinsumError
from .statement import Statement, Structure, check_sizes, is_trivial, structure

#: The inner Newton solve stops when the squared Newton decrement falls below this.
_DECREMENT_TOL = 1e-26


class Problem:
    """The tile problem of one statement with per-class bounds ``0 <= y_c <= hi_c``."""

    def __init__(self, st: Structure, hi: np.ndarray, incidence: np.ndarray | None = None):
        self.st = st
        self.A = st.incidence() if incidence is None else incidence   # (given: the same classes and terms)
        self.logm = np.log(np.asarray(st.mult, dtype=float))
        self.m0 = float(st.scalars)
        self.hi = np.asarray(hi, dtype=float)
        self.n = len(st.classes)
        self.unit = float(sum(st.mult))                       # footprint of one iteration (without scalars)
        self.full = float(np.exp(self.A @ self.hi + self.logm).sum()) if np.all(np.isfinite(self.hi)) else math.inf
        self.log_volume = float(self.hi.sum())
        self._y = np.zeros(self.n)

    def footprint(self, y: np.ndarray) -> float:
        """Words of the non-scalar terms touched by tile ``y``."""
        return float(np.exp(self.A @ y + self.logm).sum())

    def dual(self, mu: float) -> tuple[float, np.ndarray]:
        """``D(mu)`` and its maximiser ``y`` (projected Newton, warm-started)."""
        A, logm, hi = self.A, self.logm, self.hi
        y = np.clip(self._y, 0.0, hi)
        s = np.exp(A @ y + logm)
        f = y.sum() - mu * s.sum()
        for _ in range(100):
            grad = 1.0 - mu * (A.T @ s)
            free = ~(((y <= 0.0) & (grad < 0)) | ((y >= hi) & (grad > 0)))
            d = np.zeros(self.n)
            while free.any():                                  # Newton step on the free variables, dropping
                Af = A[:, free]                                # any that it would push through their bound
                H = mu * (Af.T * s) @ Af
                H[np.diag_indices_from(H)] += 1e-13 * H.trace() + 1e-300
                d[:] = 0.0
                d[free] = np.linalg.solve(H, grad[free])
                out = free & (((y <= 0.0) & (d < 0)) | ((y >= hi) & (d > 0)))
                if not out.any():
                    break
                free &= ~out
            slope = grad @ d                                   # squared Newton decrement
            if slope <= _DECREMENT_TOL:
                break
            d *= min(1.0, 30.0 / np.abs(d).max())
            step = 1.0
            while True:
                y_new = np.clip(y + step * d, 0.0, hi)
                s_new = np.exp(A @ y_new + logm)
                f_new = y_new.sum() - mu * s_new.sum()
                if f_new - f >= 1e-4 * min(slope * step, grad @ (y_new - y)) - 4e-16 * abs(f):
                    break
                step *= 0.5
                if step < 1e-10:
                    break
            if step < 1e-10:
                break
            y, s, f = y_new, s_new, f_new
        self._y = y
        return f, y

    def chi(self, X: float) -> tuple[float, np.ndarray]:
        """``log chi(X)`` and the optimal class tile ``y`` (``-inf`` when one iteration does not fit)."""
        Xp = X - self.m0
        if Xp < self.unit * (1 - 1e-12):
            return -math.inf, np.zeros(self.n)
        if Xp >= self.full:
            return self.log_volume, self.hi.copy()
        return self._solve(lambda y: math.log(self.footprint(y)) - math.log(Xp), Xp)

    def tile_for(self, log_iterations: float, warm: dict | None = None) -> tuple[float, np.ndarray]:
        """Smallest footprint ``X`` (and tile) with ``log chi(X) = log_iterations``; ``warm``: the caller's store of
        solved tiles to start from (:meth:`_least_footprint`)."""
        if log_iterations >= self.log_volume:
            return self.full + self.m0, self.hi.copy()
        if log_iterations <= 0:
            return self.unit + self.m0, np.zeros(self.n)
        if math.isfinite(self.log_volume):
            y = self._least_footprint(log_iterations, warm)
        else:
            _, y = self._solve(lambda y: y.sum() - log_iterations, math.exp(log_iterations))
        return self.footprint(y) + self.m0, y

    def _least_footprint(self, total: float, warm: dict | None = None) -> np.ndarray:
        """The tile ``y`` of least footprint with ``sum(y) = total`` (``0 < total < sum(hi)``): Newton on the
        free classes within the plane ``sum(y) = total``; a class that a step would push through its bound
        stays on it until its multiplier says it leaves (an active set; 3 steps on average, tens at most).
        ``warm``: where the caller keeps the last tile of each box (the same box with other weights starts
        there); the caller owns it, so a result depends on its own arguments only, never on what ran before in
        the process."""
        A, logm, hi = self.A, self.logm, self.hi
        y, fixed = hi * (total / hi.sum()), hi <= 0
        key = None if warm is None else (self.st.classes, self.st.terms, tuple(hi), total)
        if warm and key in warm:                               # the same box with other weights: start at its tile
            y, fixed = (a.copy() for a in warm[key])
        s, freed = np.exp(A @ y + logm), None
        for _ in range(500):
            grad, free = A.T @ s, np.flatnonzero(~fixed)
            d, k = np.zeros(self.n), len(free)
            if k:
                K = np.zeros((k + 1, k + 1))                   # [H 1; 1' 0]: a Newton step within the plane
                K[:k, :k] = (A[:, free].T * s) @ A[:, free]
                K[np.diag_indices(k)] += 1e-13 * np.trace(K) + 1e-300
                K[:k, k] = K[k, :k] = 1.0
                d[free] = np.linalg.solve(K, np.concatenate([-grad[free], [0.0]]))[:k]
            decrement, F = -(grad @ d), s.sum()
            y_new = None                                       # (optimal on a face once what a step can
            if decrement > 1e-14 * F:                          # still gain, decrement / 2, is F's rounding)
                with np.errstate(divide="ignore", invalid="ignore"):
                    room = np.where(fixed, np.inf, np.where(d > 0, (hi - y) / d, np.where(d < 0, -y / d, np.inf)))
                least = room.min()
                step = min(1.0, least)
                if least * np.abs(d).max() <= 1e-12:           # a class on its bound but for rounding: there
                    y_new = y + step * d
                else:
                    while True:                                # backtracking (Armijo)
                        y_new = y + step * d
                        if np.exp(A @ y_new + logm).sum() <= F - 1e-4 * step * decrement:
                            break
                        step *= 0.5
                        if step < 1e-14:                       # no step lowers F at this precision
                            y_new = None
                            break
            if y_new is None:                                  # optimal on this face: free a bound the
                nu = grad[free].mean() if k else 0.0           # multipliers reject, else done
                price = np.where(y <= 0, grad - nu, nu - grad)
                wrong = fixed & (hi > 0) & (price < -1e-12 * abs(nu))
                if not wrong.any():
                    break
                freed = int(np.argmin(np.where(wrong, price, np.inf)))
                fixed[freed] = False
                continue
            if step >= least:                                  # a bound stops the step: the class stays on it
                hit = int(np.argmin(room))
                fixed[hit] = True
                if hit == freed and step == 0:                 # the class just freed goes straight back: its
                    break                                      # multiplier's sign was rounding (a flat H)
                y_new[hit] = hi[hit] if d[hit] > 0 else 0.0
            y, freed = np.clip(y_new, 0.0, hi), None
            s = np.exp(A @ y + logm)
        else:
            return y
        if warm is not None:
            warm[key] = (y, fixed)
        return y

    def _solve(self, h, scale: float) -> tuple[float, np.ndarray]:
        """Root in ``log mu`` of the decreasing function ``h(y(mu))``; returns ``(sum y, y)``."""
        def g(lm):
            return h(self.dual(math.exp(lm))[1])

        self._y = np.zeros(self.n)

        lo, hi = math.log(1e-3 / scale), math.log(10 * (self.unit + self.n) / scale)
        while g(lo) < 0:
            lo -= 5.0
        while g(hi) > 0:
            hi += 5.0
        lm = _root(g, lo, hi, xtol=1e-14)
        _, y = self.dual(math.exp(lm))
        return float(y.sum()), y

    def rho(self, S: float) -> tuple[float, float, np.ndarray]:
        """``(log rho, X0, y at X0)``; ``log rho = inf`` when everything fits in ``S``.

        ``psi(log mu) = D(mu) + mu S' + 1 + log mu`` is minimised over a grid, then
        its derivative ``1 + mu (S' - footprint(y(mu)))`` is brought to zero next to
        the best grid point; the end ``X = F`` (whole iteration space) is a candidate too.
        """
        Sp = S - self.m0
        if Sp < self.unit:
            raise DeinsumError(f"fast memory S={S:g} words cannot hold one iteration "
                               f"({self.unit + self.m0:g} words)")
        if self.full <= Sp:
            return math.inf, self.full + self.m0, self.hi.copy()

        def psi(lm):
            mu = math.exp(lm)
            return self.dual(mu)[0] + mu * Sp + 1 + lm

        def dpsi(lm):
            mu = math.exp(lm)
            return 1 + mu * (Sp - self.footprint(self.dual(mu)[1]))

        lm_hi = math.log(10 * (self.unit + self.n) / Sp)       # X - S = S / (10 (unit + n)): far left of X0
        lm_lo = -math.log(self.full - Sp) if math.isfinite(self.full) else lm_hi - 40.0
        lm_hi = max(lm_hi, lm_lo + 10.0)
        grid = np.linspace(lm_hi, lm_lo, 13)                   # from small tiles up: warm starts
        self._y = np.zeros(self.n)
        k = int(np.argmin([psi(lm) for lm in grid]))
        a, b = grid[min(k + 1, len(grid) - 1)], grid[max(k - 1, 0)]
        lm = grid[k]                                           # refine where the derivative changes sign
        if dpsi(a) < 0 < dpsi(b):
            try:
                lm = _root(dpsi, a, b, xtol=1e-13)
            except ValueError:   # the warm-started inner solve moved dpsi's sign at an end (huge sizes): keep
                pass             # the grid point; psi there is >= its minimum, so Q = |V|/rho stays a lower bound
        best = psi(lm)
        if math.isfinite(self.full):
            edge = self.log_volume - math.log(self.full - Sp)
            if edge <= best:
                return edge, self.full + self.m0, self.hi.copy()
        _, y = self.dual(math.exp(lm))
        return best, self.footprint(y) + self.m0, y


def _root(f, a: float, b: float, xtol: float) -> float:
    """A root of ``f`` between ``a`` and ``b``, within ``xtol`` (plus 4e-16 relative); ValueError where
    ``f`` does not change sign there. False position with the Illinois step (a kept end's value is
    halved), which converges superlinearly (after 200 steps: the bracket's midpoint); SciPy's brentq
    would load its optimize package: a third of a second in every rank's start-up.

    >>> round(_root(lambda x: x * x - 2, 0.0, 2.0, 1e-14), 12)
    1.414213562373
    """
    fa, fb = f(a), f(b)
    if fa == 0 or fb == 0:
        return a if fa == 0 else b
    if (fa > 0) == (fb > 0):
        raise ValueError(f"no sign change between {a} and {b}")
    kept = 0                                   # +1: a was kept last step, -1: b was
    for _ in range(200):
        c = b - fb * (b - a) / (fb - fa)
        if not min(a, b) < c < max(a, b):      # rounding: bisect instead
            c = 0.5 * (a + b)
        fc = f(c)
        if fc == 0:
            return c
        if (fc > 0) == (fa > 0):
            a, fa = c, fc
            fb, kept = (0.5 * fb if kept == -1 else fb), -1
        else:
            b, fb = c, fc
            fa, kept = (0.5 * fa if kept == 1 else fa), 1
        if abs(b - a) <= xtol + 4e-16 * abs(c):
            return c
    return 0.5 * (a + b)


@lru_cache(maxsize=1024)
def _rho(pb: Problem, S: float) -> tuple[float, float, np.ndarray]:
    """:meth:`Problem.rho`, cached per (problem, S) (as many as :func:`_problem` keeps: an entry keeps its
    problem alive, and a problem it no longer keeps is never asked for again; a plan asks for about 10)."""
    return pb.rho(S)


@lru_cache(maxsize=1024)
def tile_for(pb: Problem, log_iterations: float) -> tuple[float, np.ndarray]:
    """:meth:`Problem.tile_for`, cached per (problem, iterations) (as many as :func:`_rho`, for its reason)."""
    return pb.tile_for(log_iterations)


@lru_cache(maxsize=1024)
def _problem(terms: tuple[str, ...], sizes: tuple[tuple[str, int], ...] | None) -> Problem:
    st = structure(terms)
    if sizes is None:
        hi = np.full(len(st.classes), math.inf)
    else:
        sz = dict(sizes)
        hi = np.array([sum(math.log(sz[v]) for v in c) for c in st.classes])
    return Problem(st, hi)


def problem(statement: Statement, sizes: Mapping[str, int] | None) -> Problem:
    """The (cached) numeric problem; ``sizes=None``: no upper bounds (the asymptotic problem)."""
    key = None if sizes is None else tuple(sorted(check_sizes(statement, sizes).items()))
    return _problem(statement.terms, key)


def weighted_footprint(terms: tuple[str, ...], weights: tuple[float, ...], sizes: Mapping[str, int],
                       variables: str, points: float, warm: dict | None = None) -> tuple[float, dict[str, float]]:
    """The least ``W = sum_T w_T |pi_T(B)|`` over boxes ``B`` of ``points`` points in the space of
    ``variables`` (sides <= N_v), and each term's projection size there.
    By LP duality with the Hoelder-Brascamp-Lieb inequalities of the coordinate projections (the sides
    included) ``W`` is also the least over ANY set of ``points`` points: a lower bound for every set.
    Terms of weight 0 cost nothing (their sizes are still reported); a variable in no weighted term is free.

    >>> round(weighted_footprint(("ik", "kj", "ij"), (1, 1, 1), dict(i=8, j=8, k=8), "ijk", 64)[0], 6)
    48.0
    >>> round(weighted_footprint(("ik", "kj", "ij"), (1, 1, 0), dict(i=8, j=8, k=8), "ijk", 64)[0], 6)  # j free
    16.0
    """
    kept = tuple(k for k, w in enumerate(weights) if w > 0)
    if points < 1 or not kept:
        return 0.0, {t: float(points >= 1) for t in terms}
    st, rows, hi, incidence, free = _weighing(terms, kept, variables, tuple(sizes[v] for v in variables))
    mult = [0.0] * len(st.terms)
    scalars = 0.0
    for k, row in zip(kept, rows):
        if row < 0:
            scalars += weights[k]
        else:
            mult[row] += weights[k]
    pb = Problem(Structure(st.classes, st.terms, tuple(mult), scalars), hi, incidence)
    footprint, y = pb.tile_for(math.log(points) - free, warm)
    side = {v: float(sizes[v]) for v in variables} | split_tile(variables, pb, y, sizes)    # free ones whole
    return footprint, {t: math.prod(side[v] for v in t) for t in terms}


@lru_cache(maxsize=4096)
def _weighing(terms: tuple[str, ...], kept: tuple[int, ...], variables: str, extents: tuple[int, ...]) -> tuple:
    """What :func:`weighted_footprint` solves for the ``kept`` terms (those weighted), whatever their weights:
    their structure, each one's row in it (-1: a scalar), the classes' log sizes, the incidence matrix, and the
    log size of the variables in none of them (free); cached (a weight search asks for the same terms often)."""
    sizes = dict(zip(variables, extents))
    st = structure(tuple(terms[k] for k in kept))
    of = {v: n for n, c in enumerate(st.classes) for v in c}
    rows = tuple(st.terms.index(tuple(sorted({of[v] for v in terms[k]}))) if terms[k] else -1 for k in kept)
    hi = np.array([sum(math.log(sizes[v]) for v in c) for c in st.classes])
    return st, rows, hi, st.incidence(), sum(math.log(sizes[v]) for v in variables if v not in of)


def split_tile(variables: str, pb: Problem, y: np.ndarray, sizes: Mapping[str, int] | None) -> dict[str, float]:
    """Per-variable tiles from class tiles: equal shares in log space, capped at each size."""
    out = {}
    for cls, yc in zip(pb.st.classes, y):
        caps = sorted(cls, key=lambda v: math.inf if sizes is None else sizes[v])
        left = float(yc)
        for n, v in enumerate(caps):
            share = left / (len(caps) - n)
            if sizes is not None:
                share = min(share, math.log(sizes[v]))
            out[v] = math.exp(share)
            left -= share
    return {v: out[v] for v in variables if v in out}


@dataclass(frozen=True)
class NumericBound:
    """SOAP bound for concrete sizes and fast memory ``S`` (words).

    ``rho = inf`` and ``Q = 0`` when the whole footprint fits in ``S``. ``clamped``:
    indices whose optimal tile is the whole dimension (``t_v = N_v > 1``).
    """

    statement: Statement
    sizes: dict[str, int]
    S: float
    V: int
    chi: float
    X0: float
    rho: float
    Q: float
    tiles: dict[str, float]
    clamped: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return math.isinf(self.rho)

    def to_dict(self) -> dict:
        return {"statement": self.statement.equation, "sizes": dict(self.sizes), "S": self.S, "V": self.V,
                "chi": self.chi, "X0": self.X0, "rho": self.rho, "Q": self.Q, "tiles": dict(self.tiles),
                "clamped": list(self.clamped), "fits": self.fits}


def clamped(tiles: Mapping[str, float], sizes: Mapping[str, int]) -> tuple[str, ...]:
    return tuple(v for v, t in tiles.items() if sizes[v] > 1 and t >= sizes[v] * (1 - 1e-9))


def numeric_bound(statement: Statement, sizes: Mapping[str, int], S: float) -> NumericBound:
    """Size-aware sequential bound ``Q >= |V| / rho`` with ``rho = min_{S<X<=F} chi(X)/(X-S)``."""
    sizes = check_sizes(statement, sizes)
    S = check_positive("S", S)
    if is_trivial(statement, sizes):  # nothing to tile: Q = 0
        V = statement.iteration_space(sizes)
        return NumericBound(statement, sizes, float(S), V, float(V), 0.0, math.inf, 0.0,
                            {v: float(n) for v, n in sizes.items()}, ())
    pb = problem(statement, sizes)
    log_rho, X0, y = _rho(pb, float(S))
    tiles = split_tile(statement.variables, pb, y, sizes)
    V = statement.iteration_space(sizes)
    rho = math.exp(log_rho) if math.isfinite(log_rho) else math.inf
    return NumericBound(statement, sizes, float(S), V, math.exp(float(y.sum())), X0, rho, V / rho, tiles,
                        clamped(tiles, sizes))


def numeric_chi(statement: Statement, sizes: Mapping[str, int] | None, X: float) -> tuple[float, dict[str, float]]:
    """``chi(X)`` and its optimal tile (``sizes=None``: no upper bounds).

    >>> from deinsum.soap import Statement
    >>> value, tile = numeric_chi(Statement.from_terms(["ik", "kj"], "ij"), None, 300.0)
    >>> round(value, 6), round(tile["i"], 6)
    (1000.0, 10.0)
    """
    pb = problem(statement, sizes)
    log_chi, y = pb.chi(float(X))
    return (math.exp(log_chi) if log_chi > -math.inf else 0.0), split_tile(statement.variables, pb, y, sizes)


def check_positive(name: str, value) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise DeinsumError(f"{name} must be a positive number, got {value!r}") from None
    if not v > 0 or math.isinf(v):
        raise DeinsumError(f"{name} must be a positive finite number, got {value!r}")
    return v
