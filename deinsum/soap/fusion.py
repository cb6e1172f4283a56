"""Fusion search over the SDG of a decomposition (soap.md section 6).

The SDG has one vertex per tensor (inputs and step results) and an edge from
every operand to the step result it feeds. A *group* is a connected set of
binary steps; it becomes one SOAP statement. A step that sums indices may feed
another step of its group: every einsum step is linear in each operand, so the
partial sums flow through and are reduced once, at the group's end (deferred
reduction). Every partition of the steps into groups is a candidate schedule.

Sequentially a schedule costs the sum of its groups' bounds. On P ranks the
busiest rank receives at least the sum of its groups' per-rank bounds (each group's
by averaging; each word belongs to one group: an input's to the group that reads it,
an intermediate's partial sums to the group that makes it, its complete values to the
group that reads it), connected groups counted by their *joint* bound where that is more
(:func:`deinsum.soap.parallel.joint_bound`), and the
*class bound* -- every algorithm that runs a contraction path fused as one of its
candidates -- is the minimum over candidates and over every contraction path of an
einsum of at most ``MAX_PATH_OPERANDS`` operands (opt_einsum's path beyond). Joint
bounds are computed where they can raise that minimum. The
*atomic* bound treats the whole einsum as one statement (the published bounds'
model); it does not hold for multi-step algorithms.

>>> from deinsum.decompose import decompose
>>> a = analyze(decompose("ijk,ja,ka->ia"))
>>> a.chosen, a.Q
(((0, 1),), 3*N_a*N_i*N_j*N_k/S**(2/3))
>>> [(c.partition, c.Q) for c in a.candidates][1]
(((0,), (1,)), 2*N_a*N_i*N_j*N_k/sqrt(S) + N_a*N_j*N_k)
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, Sequence

from ..errors import DeinsumError
from .numeric import NumericBound, check_positive, numeric_bound
from .parallel import (LAYOUT, ParallelBound, check_balance, check_ranks, independent_bound, joint_bound,
                       memory_bound, parallel_bound)
from .statement import Statement

if TYPE_CHECKING:   # closed forms (SymPy) load where they are asked for: sizes alone never need them
    from .symbolic import SymbolicBound

#: Fast memory (words) assumed for concrete sizes when no S is given: 2**27 words = 1 GiB of float64.
DEFAULT_S = 2**27
#: Without sizes, candidates are ranked by their bounds at N_v = REFERENCE_N for every index
#: and S = REFERENCE_S (or the given S).
REFERENCE_N = 2**16
REFERENCE_S = 2**20
#: The fusion search enumerates every partition; beyond this many it gives up.
MAX_CANDIDATES = 20_000


@dataclass(frozen=True)
class GroupBound:
    """One fused group: its steps (indices), statement and bounds.

    ``numeric`` is set for concrete sizes, ``parallel`` when P is given too;
    ``cost`` is the number the ranking used; ``S`` the given fast memory, if any.
    """

    steps: tuple[int, ...]
    statement: Statement
    numeric: NumericBound | None
    parallel: ParallelBound | None
    cost: float
    S: float | None = None

    @property
    def symbolic(self) -> SymbolicBound:
        """Closed form (computed on first use, then cached)."""
        from .symbolic import symbolic_bound
        return symbolic_bound(self.statement)

    @property
    def Q(self):
        """Sequential bound: a float for concrete sizes, else a SymPy expression (or None)."""
        if self.numeric is not None:
            return self.numeric.Q
        return self.subs(self.symbolic.Q)

    def subs(self, expr):
        """``expr`` with the given S substituted (no-op without one)."""
        if expr is None or self.S is None:
            return expr
        import sympy as sp
        from .statement import S as S_SYMBOL
        return expr.subs(S_SYMBOL, sp.Integer(int(self.S)) if self.S.is_integer() else sp.Float(self.S))


def _connected(unit, edges) -> bool:
    """Whether ``unit`` is connected by ``edges``."""
    seen, todo = {unit[0]}, [unit[0]]
    while todo:
        g = todo.pop()
        for a, b in edges:
            for x, y in ((a, b), (b, a)):
                if x == g and y in unit and y not in seen:
                    seen.add(y)
                    todo.append(y)
    return len(seen) == len(unit)


@dataclass(frozen=True)
class Candidate:
    """A partition of the steps into groups, with its total bound; ``joint``: ``(groups, words)`` of the
    joint bounds computed for it (:func:`analyze`); ``path``: see below."""

    partition: tuple[tuple[int, ...], ...]
    groups: tuple[GroupBound, ...]
    cost: float
    joint: tuple[tuple[tuple[tuple[int, ...], ...], float], ...] = ()
    path: tuple = ()      # the steps of another contraction path, which ``partition`` groups (empty: the analysis')

    @property
    def parallel_Q(self) -> float | None:
        """Per-rank bound of this schedule on P ranks (None without P): the sum of its groups'
        memory-independent bounds, connected groups counted by their joint bound instead where that is more
        (the most over sets of such units without a common group).

        Each group's words are its own (an input's, the result's, an intermediate's partial sums sent by
        the group that makes it, its complete values received by the group that reads it: distinct
        words), so the averaging argument holds for the sum.
        """
        if any(g.parallel is None for g in self.groups):
            return None
        alone = {g.steps: g.parallel.Q_indep for g in self.groups}
        gains = [(unit, w - sum(alone[g] for g in unit)) for unit, w in self.joint]
        gains = [(unit, gain) for unit, gain in gains if gain > 0]
        best = 0.0
        for chosen in range(1 << len(gains)):     # a handful of units at most: every set of them
            units = [gains[k] for k in range(len(gains)) if chosen >> k & 1]
            used = [g for unit, _ in units for g in unit]
            if len(used) == len(set(used)):
                best = max(best, sum(gain for _, gain in units))
        return sum(alone.values()) + best

    def joint_units(self) -> list[tuple[tuple[int, ...], ...]]:
        """Sets of two or more groups with a joint bound: connected by the intermediates they pass, largest
        first.

        >>> from deinsum.decompose import decompose
        >>> [c.joint_units() for c in analyze(decompose("ijk,ja,ka->ia")).candidates]
        [[], [((0,), (1,))]]
        """
        made = {g.statement.names[-1]: g.steps for g in self.groups}
        edges = {(made[n], g.steps) for g in self.groups for n in g.statement.names[:-1] if n in made}
        units = []
        for chosen in range(1, 1 << len(self.groups)):
            unit = tuple(g.steps for k, g in enumerate(self.groups) if chosen >> k & 1)
            if len(unit) > 1 and _connected(unit, edges):
                units.append(unit)
        return sorted(units, key=len, reverse=True)   # the largest first: it lifts a candidate most

    @property
    def Q(self):
        """Total sequential bound (float for concrete sizes; SymPy sum, or None where a group has none)."""
        parts = [g.Q for g in self.groups]
        if any(q is None for q in parts):
            return None
        if all(isinstance(q, float) for q in parts):
            return sum(parts)
        import sympy as sp
        return sp.Add(*parts)


@dataclass(frozen=True)
class Analysis:
    """Bounds, fusion candidates (best first) and the chosen schedule of one decomposition."""

    equation: str
    steps: tuple
    sizes: dict[str, int] | None
    S: float | None
    P: int | None
    sdg: tuple[tuple[str, str], ...]
    candidates: tuple[Candidate, ...]
    ranking: str
    atomic: ParallelBound | None = None      # the whole einsum as one statement (with sizes and P)
    owned: dict[str, float] | None = None    # average words per rank held at the start or end, if not |T|/P
    result_copies: float = 0.0               # words some rank receives because the result ends with copies
    inputs: tuple[str, ...] = ()             # the operands' subscripts (after the pre-pass): the other paths'
    rho: float | None = 1.0                  # the balance the parallel bounds assume (None: none made yet)

    @cached_property
    def _least(self) -> tuple[tuple[Candidate, ...], int, Candidate | None]:
        """The class bound's search, made on first use (planning does not need it): this path's candidates with
        the joint bounds that can decide the least, the number of paths covered, and the least candidate of the
        other paths (every path of at most ``MAX_PATH_OPERANDS`` operands)."""
        if self.atomic is None:
            return self.candidates, 1, None
        count = len(self.inputs)
        others = _other_paths(self.inputs, self.steps[-1].output, self.steps, self.sizes, self.P, self.owned,
                              self.rho) if 2 < count <= MAX_PATH_OPERANDS else []
        raised = _raise_least(list(self.candidates) + others, lambda c, unit, enough: self.joint(unit, c, enough))
        return (raised[:len(self.candidates)], len(contraction_paths(count)) if others else 1,
                min(raised[len(self.candidates):], key=lambda c: c.parallel_Q, default=None))

    @property
    def raised(self) -> tuple[Candidate, ...]:
        """This path's candidates with the joint bounds that can decide the class bound."""
        return self._least[0]

    @property
    def paths(self) -> int:
        """The contraction paths the class bound covers (1: this one only)."""
        return self._least[1]

    @property
    def elsewhere(self) -> Candidate | None:
        """The least candidate of the other paths, if any."""
        return self._least[2]

    def schedule_bound(self, partition) -> float:
        """The per-rank bound of one candidate with all its joint bounds (computed on first use), at least
        ``result_copies``.

        >>> from deinsum.decompose import decompose
        >>> a = analyze(decompose("ijk,ja,ka->ia", (1724,) * 3, (1724, 42), (1724, 42)), P=8)
        >>> [round(a.schedule_bound(c.partition)) for c in a.candidates]
        [81458, 81459]
        """
        c = next(c for c in self.candidates if c.partition == partition)
        return max(self.result_copies, replace(c, joint=tuple((u, self.joint(u)) for u in c.joint_units())).parallel_Q)

    def joint(self, unit: tuple[tuple[int, ...], ...], candidate: Candidate | None = None,
              enough: float = math.inf) -> float:
        """The joint bound of connected groups of ``candidate`` (default: of this analysis' path; cached), or a
        lower bound of it at least ``enough``."""
        groups = (candidate or self.candidates[0]).groups
        if candidate is None or not candidate.path:
            groups = [g for c in self.candidates for g in c.groups]
        of = {g.steps: g.statement for g in groups}
        return _joint(tuple(of[g] for g in unit), self.sizes, self.P, self.owned, enough, self.rho)

    def balanced(self, rho: float) -> Analysis:
        """This analysis with its parallel bounds for algorithms that keep every rank within ``rho`` times the
        average of every group (``rho = 1``: exact balance, as :func:`analyze` makes them).

        >>> from deinsum.decompose import decompose
        >>> a = analyze(decompose("ij,jk->ik", (5, 5), (5, 5)), P=4)      # a plan's busiest rank: 3 x 5 x 5 of 125/4
        >>> round(a.class_bound[0], 3), round(a.balanced(2.4).class_bound[0], 3)
        (11.014, 3.481)
        """
        rho = check_balance(rho)
        if rho == self.rho or self.P is None or self.sizes is None:
            return self
        bounded = {g.steps: replace(g, parallel=parallel_bound(g.statement, self.sizes, self.P, self.S, self.owned, rho))
                   for c in self.candidates for g in c.groups}
        return replace(self, candidates=tuple(replace(c, groups=tuple(bounded[g.steps] for g in c.groups))
                                              for c in self.candidates),
                       atomic=bounded[tuple(range(len(self.steps)))].parallel, rho=rho)

    @property
    def chosen(self) -> tuple[tuple[int, ...], ...]:
        return self.candidates[0].partition

    @property
    def groups(self) -> tuple[GroupBound, ...]:
        return self.candidates[0].groups

    @property
    def Q(self):
        return self.candidates[0].Q

    @property
    def class_bound(self) -> tuple[float, Candidate] | None:
        """``(words, candidate)``: the least over fusion candidates (of every contraction path where
        ``paths > 1``) of the largest group or joint bound per rank, at least ``result_copies`` (None
        without sizes and P).

        >>> from deinsum.decompose import decompose
        >>> a = analyze(decompose("ij,jk,kl->il", (300, 20), (20, 200), (200, 30)), P=3)
        >>> words, best = a.class_bound
        >>> round(words), best.partition, a.paths, round(a.atomic_words)  # the atomic bound is not below it
        (800, ((0,), (1,)), 3, 5523)
        """
        if self.candidates[0].parallel_Q is None:
            return None
        best = min((*self.raised, *([self.elsewhere] if self.elsewhere else [])), key=lambda c: c.parallel_Q)
        return max(best.parallel_Q, self.result_copies), best

    def memory_words(self, M: float) -> float:
        """The memory-dependent bound per rank (words received by the busiest rank) where every rank holds at most
        ``M`` words at any time and runs its groups one after another: half the least, over this path's
        candidates, of the sum of the groups' :func:`deinsum.soap.parallel.memory_bound` (words sent plus
        received; every word sent is received once).

        >>> from deinsum.decompose import decompose
        >>> a = analyze(decompose("ik,kj->ij", (4096, 4096), (4096, 4096)), P=4096)
        >>> round(a.memory_words(1.25 * 3 * 4096))
        72566
        """
        moved = {g.steps: memory_bound(g.statement, self.sizes, self.P, M) for c in self.candidates for g in c.groups}
        return min(sum(moved[g.steps] for g in c.groups) for c in self.candidates) / 2

    @property
    def covers(self) -> str:
        """What the class bound covers: every contraction path (at most ``MAX_PATH_OPERANDS`` operands), else
        opt_einsum's, its steps fused as any connected groups."""
        if len(self.steps) == 1:
            return "algorithms that compute this einsum's one step as one statement"
        if len(self.steps) + 1 <= MAX_PATH_OPERANDS:
            paths = f"any of the {self.paths} contraction paths (binary trees) of this einsum"
        else:
            paths = (f"opt_einsum's contraction path of this einsum (other paths are not covered beyond "
                     f"{MAX_PATH_OPERANDS} operands)")
        return f"algorithms that run {paths}, its steps fused as any connected groups"

    @property
    def atomic_words(self) -> float | None:
        """The atomic bound per rank: the whole einsum as one statement (None without sizes and P)."""
        return None if self.atomic is None else max(self.atomic.Q_indep, self.result_copies)

    @property
    def layout(self) -> str:
        if self.owned is None:
            return LAYOUT
        held = ", ".join(f"{name} {words:,.6g}" for name, words in self.owned.items())
        return f"words held at the start or end, over all ranks / P: {held}; every other tensor one copy, |T|/P"

    def __str__(self) -> str:
        from .report import text
        return text(self)

    def latex(self, rows=(), notes=()) -> str:
        """:func:`deinsum.soap.report.latex`: the groups' bounds, with ``rows`` a per-P table, and ``notes``."""
        from .report import latex
        return latex(self, rows, notes)

    def to_dict(self) -> dict:
        from .report import as_dict
        return as_dict(self)


def sdg(steps: Sequence) -> tuple[tuple[str, str], ...]:
    """Edges ``(operand tensor, result tensor)`` of the symbolic directed graph."""
    return tuple((o, s.name) for s in steps for o in s.operands)


def valid_groups(steps: Sequence) -> list[tuple[int, ...]]:
    """Connected sets of steps (partial sums may flow into a later step of the set).

    >>> from deinsum.decompose import decompose
    >>> valid_groups(decompose("ijk,ja,ka->ia").steps)
    [(0,), (1,), (0, 1)]
    >>> valid_groups(decompose("ij,jk,kl->il").steps)
    [(0,), (1,), (0, 1)]
    """
    producer = {s.name: k for k, s in enumerate(steps)}
    fusible = {k: set() for k in range(len(steps))}          # SDG edges between steps
    for k, s in enumerate(steps):
        for o in s.operands:
            if o in producer:
                fusible[k].add(producer[o])
                fusible[producer[o]].add(k)
    found: set[frozenset] = set()
    todo = [frozenset([k]) for k in fusible]
    while todo:                                              # grow connected sets one neighbour at a time
        g = todo.pop()
        if g in found:
            continue
        found.add(g)
        if len(found) > MAX_CANDIDATES:
            raise DeinsumError(f"more than {MAX_CANDIDATES} fusible groups for {len(steps)} steps")
        todo += [g | {k} for k in set().union(*(fusible[m] for m in g)) - g]
    groups = [tuple(sorted(g)) for g in found]
    return sorted(groups, key=lambda g: (len(g), g))


def partitions(steps: Sequence) -> list[tuple[tuple[int, ...], ...]]:
    """Every partition of the steps into valid groups.

    >>> from deinsum.decompose import decompose
    >>> partitions(decompose("ijk,ja,ka->ia").steps)
    [((0,), (1,)), ((0, 1),)]
    """
    by_first: dict[int, list[tuple[int, ...]]] = {}
    for g in valid_groups(steps):
        by_first.setdefault(g[0], []).append(g)
    out: list[tuple[tuple[int, ...], ...]] = []

    def extend(done: frozenset, chosen: tuple):
        if len(out) > MAX_CANDIDATES:
            raise DeinsumError(f"more than {MAX_CANDIDATES} fusion candidates for {len(steps)} steps")
        first = next((k for k in range(len(steps)) if k not in done), None)
        if first is None:
            out.append(chosen)
            return
        for g in by_first.get(first, []):
            if done.isdisjoint(g):
                extend(done | set(g), chosen + (g,))

    extend(frozenset(), ())
    return out


def analyze(decomposition, S: float | None = None, P: int | None = None,
            owned: dict[str, float] | None = None, result_copies: float = 0.0, rho: float | None = 1.0) -> Analysis:
    """SOAP analysis of a decomposition (``deinsum.decompose``): every fusion candidate with its
    bound, the best one, per-group statements, closed forms, size-aware bounds and tiles.

    ``S``: fast/local memory in words. Without sizes the bounds stay symbolic in S
    (S substituted when given); with sizes, S defaults to ``DEFAULT_S``. ``P``: ranks,
    for the parallel bounds (numeric for concrete sizes, SymPy expressions otherwise).
    ``rho``: the balance the parallel bounds assume (:meth:`Analysis.balanced`); None: no parallel bounds until
    :meth:`Analysis.balanced` makes them (a planner ranks fusion candidates by the sequential bounds alone, then
    bounds its plan at the plan's own balance). The unary pre-pass is not part of the bound.
    """
    steps = tuple(decomposition.steps) or tuple(s for s in decomposition.prepass if s.name == "out")
    if not steps:
        raise DeinsumError("the decomposition has no steps to analyse")
    sizes = None if decomposition.sizes is None else dict(decomposition.sizes)
    if S is not None:
        S = check_positive("S", S)
    elif sizes is not None:
        S = float(DEFAULT_S)
    if P is not None:
        P = check_ranks(P)
    rho = None if rho is None else check_balance(rho)
    groups = {}
    for g in valid_groups(steps):
        st = Statement.from_steps([steps[k] for k in g])
        if sizes is None:
            groups[g] = GroupBound(g, st, None, None, _reference_cost(st.terms, S or REFERENCE_S), S)
        else:
            num = numeric_bound(st, sizes, S)
            groups[g] = GroupBound(g, st, num, None, num.Q, S)
    cands = sorted((Candidate(p, tuple(groups[g] for g in p), sum(groups[g].cost for g in p))
                    for p in partitions(steps)), key=lambda c: (c.cost, len(c.partition), c.partition))
    atomic = None
    if P is not None and sizes is not None and rho is not None:
        bounded = {g: replace(b, parallel=parallel_bound(b.statement, sizes, P, S, owned, rho)) for g, b in groups.items()}
        cands = [replace(c, groups=tuple(bounded[g] for g in c.partition)) for c in cands]
        atomic = bounded[tuple(range(len(steps)))].parallel     # the steps form one tree: a valid group
    if sizes is None:
        s_text = f"S = {S:g}" if S is not None else f"S = {REFERENCE_S}"
        ranking = f"symbolic sizes: ranked at N_v = {REFERENCE_N} for every index, {s_text}"
    else:
        ranking = f"ranked by the size-aware numeric bound at S = {S:g}"
    equation = getattr(decomposition, "equation", ",".join(steps[0].subscripts) + "->" + steps[-1].output)
    return Analysis(equation, steps, sizes, S, P, sdg(steps), tuple(cands), ranking, atomic, owned or None,
                    float(result_copies), tuple(getattr(decomposition, "input_subscripts", ())), rho)


def _raise_least(cands: list[Candidate], joint) -> tuple[Candidate, ...]:
    """The candidates with their joint bounds (``joint(candidate, unit, enough)``) added where they can raise
    the least candidate bound: the least one takes its next joint bound until it has them all. A joint bound
    is searched only until it passes the least bound of a candidate that has all of its (``enough``): then
    the candidate it raises cannot be the least."""
    cands = list(cands)
    pending = [c.joint_units() for c in cands]
    heap = [(c.parallel_Q, k) for k, c in enumerate(cands)]
    heapq.heapify(heap)
    enough = min((c.parallel_Q for c, units in zip(cands, pending) if not units), default=math.inf)
    while heap:
        _, k = heapq.heappop(heap)
        if not pending[k]:
            break
        unit = pending[k].pop(0)
        cands[k] = replace(cands[k], joint=cands[k].joint + ((unit, joint(cands[k], unit, enough)),))
        if not pending[k]:
            enough = min(enough, cands[k].parallel_Q)
        heapq.heappush(heap, (cands[k].parallel_Q, k))
    return tuple(cands)


#: The class bound covers every contraction path of an einsum with at most this many operands (105 trees at
#: 5); beyond, opt_einsum's path only.
MAX_PATH_OPERANDS = 5


def contraction_paths(count: int) -> list[tuple[tuple[int, int], ...]]:
    """Every binary contraction tree of ``count`` operands once, as an opt_einsum path (pairs of positions
    in the list of live operands, each result appended).

    >>> [len(contraction_paths(n)) for n in (2, 3, 4, 5)], contraction_paths(3)
    ([1, 3, 15, 105], [((0, 1), (0, 1)), ((0, 2), (0, 1)), ((1, 2), (0, 1))])
    """
    found: dict[frozenset, tuple] = {}

    def walk(live: list[frozenset], path: tuple, tree: frozenset):
        if len(live) == 1:
            found.setdefault(tree, path)
        for a in range(len(live)):
            for b in range(a + 1, len(live)):
                both = live[a] | live[b]
                walk([x for k, x in enumerate(live) if k not in (a, b)] + [both], path + ((a, b),), tree | {both})

    walk([frozenset([k]) for k in range(count)], (), frozenset())
    return list(found.values())


def _tree(steps) -> frozenset:
    """The operands under each step of a path: what identifies the path."""
    under = {}
    for s in steps:
        under[s.name] = frozenset().union(*(under.get(o, {o}) for o in s.operands))
    return frozenset(under.values())


def _other_paths(subs, output: str, steps, sizes, P: int, owned, rho: float) -> list[Candidate]:
    """The fusion candidates (memory-independent group bounds) of every contraction path but ``steps``'."""
    from ..decompose import binary_steps
    mine, bounds, out = _tree(steps), {}, []
    for path in contraction_paths(len(subs)):
        other = tuple(binary_steps(subs, output, path))
        if _tree(other) == mine:
            continue
        groups = {}
        for g in valid_groups(other):
            st = Statement.from_steps([other[k] for k in g])
            if (st.terms, st.names) not in bounds:
                bounds[st.terms, st.names] = independent_bound(st, sizes, P, owned, rho)
            groups[g] = GroupBound(g, st, None, bounds[st.terms, st.names], 0.0)
        out += [Candidate(p, tuple(groups[g] for g in p), 0.0, path=other) for p in partitions(other)]
    return out


@lru_cache(maxsize=4096)
def _joint_cached(groups, sizes, P: int, owned, enough: float, rho: float) -> float:
    return joint_bound([Statement(*g) for g in groups], dict(sizes), P, dict(owned) if owned else None, enough, rho)


def _joint(groups: tuple[Statement, ...], sizes, P: int, owned, enough: float, rho: float) -> float:
    """:func:`joint_bound`, cached across paths (the same groups recur in several, their intermediates named
    apart: only which terms are the intermediates and which tensors are held matter)."""
    held = set(owned or ())
    made = {g.names[-1]: f"T{k}" for k, g in enumerate(groups)}
    canon = lambda st: (st.terms, tuple(made.get(n, n if n in held else "") for n in st.names))  # noqa: E731
    return _joint_cached(tuple(canon(g) for g in groups), tuple(sorted(sizes.items())), P,
                         tuple(sorted(owned.items())) if owned else None, enough, rho)


@lru_cache(maxsize=4096)
def _reference_cost(terms: tuple[str, ...], S: float) -> float:
    """Bound at the reference point: the closed form where there is one, else the numeric bound."""
    from .statement import S as S_SYMBOL
    from .symbolic import symbolic_bound
    st = Statement(terms)
    sym = symbolic_bound(st)
    if sym.has_bound:
        return float(REFERENCE_N) ** len(st.variables) / float(sym.rho.subs(S_SYMBOL, S))
    return numeric_bound(st, {v: REFERENCE_N for v in st.variables}, S).Q
