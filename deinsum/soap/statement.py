"""SOAP statements: the variables and access terms of a fused group of steps.

A group of binary steps is one statement. Its variables are all indices of the
group; its access terms are the tensors that cross the group boundary (every
tensor read from outside, and the output, last). Intermediates produced and
consumed inside the group are not terms.

>>> Statement.from_terms(["ijk", "ja", "ka"], "ia")
Statement('ijk,ja,ka->ia')
>>> st = Statement.from_terms(["ik", "kj"], "ij")
>>> st.variables, st.terms, st.iteration_space({"i": 2, "j": 3, "k": 4})
('ikj', ('ik', 'kj', 'ij'), 24)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from math import prod
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from ..errors import DeinsumError

if TYPE_CHECKING:   # SymPy loads on first use (see __getattr__)
    import sympy as sp


def __getattr__(name: str):
    """``S`` (fast memory), ``P`` (ranks) and ``X`` (a footprint): positive SymPy symbols, made on first
    use, so that planning with sizes never loads SymPy (a quarter of a second in every rank's start-up)."""
    if name not in ("S", "P", "X"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import sympy as sp
    globals()[name] = symbol = sp.Symbol(name, positive=True)
    return symbol


def size_symbol(index: str) -> sp.Symbol:
    """The size symbol ``N_<index>`` (a positive SymPy symbol)."""
    import sympy as sp
    return sp.Symbol(f"N_{index}", positive=True)


@dataclass(frozen=True)
class Statement:
    """Access terms of one SOAP statement, the output last (``names``: tensor names, optional)."""

    terms: tuple[str, ...]
    names: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self):
        terms = tuple(self.terms)
        object.__setattr__(self, "terms", terms)
        if len(terms) < 2:
            raise DeinsumError(f"a SOAP statement needs an input and an output term, got {terms!r}")
        for t in terms:
            if not isinstance(t, str) or len(set(t)) != len(t):
                raise DeinsumError(f"term {t!r}: indices must be a string of distinct characters")
        missing = set(terms[-1]) - set("".join(terms[:-1]))
        if missing:
            raise DeinsumError(f"output {terms[-1]!r}: index {sorted(missing)[0]!r} is in no input term")
        if self.names and len(self.names) != len(terms):
            raise DeinsumError(f"{len(self.names)} tensor names for {len(terms)} terms")

    @property
    def variables(self) -> str:
        """All indices, in order of first appearance."""
        return "".join(dict.fromkeys("".join(self.terms)))

    @property
    def output(self) -> str:
        return self.terms[-1]

    @property
    def inputs(self) -> tuple[str, ...]:
        return self.terms[:-1]

    @property
    def equation(self) -> str:
        return ",".join(self.inputs) + "->" + self.output

    def __repr__(self) -> str:
        return f"Statement({self.equation!r})"

    @classmethod
    def from_terms(cls, terms: Sequence[str], output: str) -> Statement:
        """Statement with input ``terms`` and ``output``."""
        return cls(tuple(terms) + (output,))

    @classmethod
    def from_steps(cls, steps: Sequence) -> Statement:
        """Statement of a connected group of steps (objects with ``name``, ``operands``,
        ``subscripts``, ``output``): reads from outside the group, then the group's output.

        >>> from deinsum.decompose import Step
        >>> krp = Step("t0", ("in1", "in2"), ("ja", "ka"), "jka")
        >>> tdot = Step("out", ("in0", "t0"), ("ijk", "jka"), "ia")
        >>> st = Statement.from_steps([krp, tdot])
        >>> st, st.names
        (Statement('ijk,ja,ka->ia'), ('in0', 'in1', 'in2', 'out'))
        """
        steps = list(steps)
        if not steps:
            raise DeinsumError("a statement needs at least one step")
        produced = {s.name for s in steps}
        reads: dict[str, str] = {}
        consumed = set()
        for s in steps:
            for name, sub in zip(s.operands, s.subscripts):
                if name in produced:
                    consumed.add(name)
                else:
                    reads.setdefault(name, sub)
        roots = [s for s in steps if s.name not in consumed]
        if len(roots) != 1:
            names = ", ".join(s.name for s in roots)
            raise DeinsumError(f"steps do not form one connected group (results {names} are all unread)")
        names = tuple(sorted(reads, key=_tensor_order)) + (roots[0].name,)
        return cls(tuple(reads[n] for n in names[:-1]) + (roots[0].output,), names)

    def iteration_space(self, sizes: Mapping[str, int] | None = None):
        """``|V|``: the product of the variables' sizes (a SymPy product of ``N_v`` without sizes)."""
        if sizes is None:
            import sympy as sp
            return sp.Mul(*(size_symbol(v) for v in self.variables))
        return prod(check_sizes(self, sizes).values())

    def term_size(self, term: str, sizes: Mapping[str, int] | None = None):
        """Number of elements of one term (symbolic without sizes)."""
        if sizes is None:
            import sympy as sp
            return sp.Mul(*(size_symbol(v) for v in term))
        return prod(int(sizes[v]) for v in term)


def _tensor_order(name: str):
    """Inputs ``inK`` first (by K), then intermediates ``tK`` (by K), then the rest."""
    head = name.rstrip("0123456789")
    tail = name[len(head):]
    return ({"in": 0, "t": 1}.get(head, 2), int(tail) if tail else -1, name)


def is_trivial(statement: Statement, sizes: Mapping[str, int] | None = None) -> bool:
    """No loop variables (a scalar operation) or an empty dimension: no I/O to bound.

    >>> is_trivial(Statement(("", "", ""))), is_trivial(Statement(("i", "i")), {"i": 0})
    (True, True)
    """
    return not statement.variables or (sizes is not None and any(sizes[v] == 0 for v in statement.variables))


def check_sizes(statement: Statement, sizes: Mapping[str, int]) -> dict[str, int]:
    """The sizes of the statement's variables as ints >= 0, or DeinsumError."""
    out = {}
    for v in statement.variables:
        if v not in sizes:
            raise DeinsumError(f"statement {statement.equation!r}: no size for index {v!r}")
        n = sizes[v]
        if isinstance(n, bool) or int(n) != n or n < 0:
            raise DeinsumError(f"statement {statement.equation!r}: index {v!r} has size {n!r}, expected an int >= 0")
        out[v] = int(n)
    return out


@dataclass(frozen=True)
class Structure:
    """A statement reduced to what the optimisation sees.

    ``classes``: variables grouped by identical term membership (only their
    product matters); ``terms``: distinct non-empty terms as tuples of class
    numbers, with ``mult`` copies each; ``scalars``: number of 0-d terms (one
    word each, a constant in every footprint).
    """

    classes: tuple[str, ...]
    terms: tuple[tuple[int, ...], ...]
    mult: tuple[int, ...]
    scalars: int

    def incidence(self) -> np.ndarray:
        """0/1 matrix: term (row) contains class (column)."""
        A = np.zeros((len(self.terms), len(self.classes)))
        for r, t in enumerate(self.terms):
            A[r, list(t)] = 1.0
        return A


@lru_cache(maxsize=4096)
def structure(terms: tuple[str, ...]) -> Structure:
    """Merge variables with identical membership and duplicate terms.

    >>> structure(("ijk", "jka", "ia"))
    Structure(classes=('i', 'jk', 'a'), terms=((0, 1), (1, 2), (0, 2)), mult=(1, 1, 1), scalars=0)
    """
    variables = "".join(dict.fromkeys("".join(terms)))
    member = {v: tuple(n for n, t in enumerate(terms) if v in t) for v in variables}
    classes = tuple("".join(vs) for vs in _group(variables, lambda v: member[v]))
    of = {v: n for n, c in enumerate(classes) for v in c}
    counted: dict[tuple[int, ...], int] = {}
    for t in terms:
        if t:
            key = tuple(sorted({of[v] for v in t}))
            counted[key] = counted.get(key, 0) + 1
    return Structure(classes, tuple(counted), tuple(counted.values()), sum(1 for t in terms if not t))


def _group(items, key):
    groups: dict = {}
    for it in items:
        groups.setdefault(key(it), []).append(it)
    return list(groups.values())


def canonical(statement: Statement) -> tuple[tuple[str, ...], dict[str, str]]:
    """Terms with variables renamed ``a, b, c, ...`` in order of first appearance, and the renaming.

    >>> canonical(Statement(("ik", "kj", "ij")))[0]
    ('ab', 'bc', 'ac')
    """
    rename = {v: chr(97 + n) if n < 26 else chr(0x100 + n) for n, v in enumerate(statement.variables)}
    return tuple("".join(sorted(rename[v] for v in t)) for t in statement.terms), rename
