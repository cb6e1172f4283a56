"""Einsum front end: grammar, validation, normalisation and binary steps.

``decompose`` parses any numpy einsum (explicit or implicit output, ``...``
broadcasting, repeated indices, single-operand sums, batch indices, 0-d
operands, non-ASCII letters), applies a unary pre-pass (broadcast squeezes,
diagonals, single-operand sums) and splits the rest into binary steps with
opt_einsum, using the real sizes when given.

>>> d = decompose("ijk,ja,ka->ia", (8, 9, 10), (9, 4), (10, 4))
>>> [(s.operation, s.kind) for s in d.steps]
[('ja,ka->jka', 'KRP'), ('ijk,jka->ia', 'TDOT')]
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from numbers import Integral
from typing import Mapping, Sequence

import opt_einsum

from .errors import DeinsumError

#: Size assumed for every index when planning without shapes (symbolic plans).
SYMBOLIC_SIZE = 1000


@dataclass(frozen=True)
class Step:
    """One step ``operands -> name``: a binary contraction, or a unary op on one operand.

    >>> Step("t0", ("in1", "in2"), ("ja", "ka"), "jka").kind
    'KRP'
    """

    name: str
    operands: tuple[str, ...]
    subscripts: tuple[str, ...]
    output: str
    summed: str = ""
    kind: str = ""
    flops: int | None = None

    def __post_init__(self):
        if not self.summed:
            inputs = "".join(self.subscripts)
            object.__setattr__(self, "summed", "".join(sorted(set(inputs) - set(self.output))))
        if not self.kind:
            object.__setattr__(self, "kind", classify(self.subscripts, self.output))

    @property
    def operation(self) -> str:
        return ",".join(self.subscripts) + "->" + self.output

    @property
    def batch(self) -> str:
        """Indices in both operands and kept in the output (Hadamard/batch indices)."""
        if len(self.subscripts) != 2:
            return ""
        a, b = self.subscripts
        return "".join(c for c in a if c in b and c in self.output)


def classify(subscripts: Sequence[str], output: str) -> str:
    """Name the kernel of a step.

    >>> classify(("ij", "jk"), "ik"), classify(("ijk", "jka"), "ia"), classify(("bij", "bjk"), "bik")
    ('GEMM', 'TDOT', 'batched GEMM')
    >>> classify(("ij", "ij"), "ij"), classify(("i", "j"), "ij"), classify(("ii",), "i")
    ('Hadamard', 'outer', 'diagonal')
    """
    if len(subscripts) == 1:
        (sub,) = subscripts
        if len(set(sub)) < len(sub):
            return "diagonal"
        if set(output) < set(sub):
            return "sum"
        return "transpose" if output != sub else "copy"
    a, b = subscripts
    batch = [c for c in a if c in b and c in output]
    summed = [c for c in a if c in b and c not in output]
    free_a = [c for c in a if c not in b]
    free_b = [c for c in b if c not in a]
    if summed:
        if batch:
            return "batched GEMM"
        if len(a) == len(b) == 2 and len(summed) == 1:
            return "GEMM"
        return "TDOT"
    if batch:
        return "KRP" if free_a and free_b else "Hadamard"
    return "outer" if free_a and free_b else "scale"


@dataclass(frozen=True)
class Decomposition:
    """A normalised einsum: unary pre-pass + binary steps; prints like opt_einsum's PathInfo.

    ``sizes`` is None for symbolic plans (then ``assumption`` says how the order was chosen).
    Pre-pass steps replace their operand (``in0`` -> ``in0``); with a single
    operand the pre-pass produces ``out`` directly and ``steps`` is empty.
    """

    equation: str
    raw_subscripts: tuple[str, ...]
    input_names: tuple[str, ...]
    input_subscripts: tuple[str, ...]
    output: str
    sizes: Mapping[str, int] | None
    prepass: tuple[Step, ...]
    steps: tuple[Step, ...]
    assumption: str | None = None
    naive_flops: int | None = field(default=None, compare=False)
    raw_shapes: tuple[tuple[int, ...], ...] | None = None   # the operands' shapes (None: symbolic)

    @property
    def result_name(self) -> str:
        return "out"

    @property
    def flops(self) -> int | None:
        if self.sizes is None:
            return None
        return sum(s.flops or 0 for s in self.prepass + self.steps)

    def prepass_reason(self) -> str:
        """What the unary pre-pass does (it needs whole operands): one clause per operand it changes.

        >>> decompose("ij->ji", (3, 4)).prepass_reason()
        "'ij->ji' has one operand (a transpose)"
        >>> decompose("ii,ij->j", (3, 3), (3, 2)).prepass_reason()
        "in0 ('ii'): a diagonal over i"
        >>> decompose("ij,j->i", (5, 1), (3,)).prepass_reason()
        "in0 ('ij'): its axis j of size 1 broadcasts against in1 (j=3)"
        """
        if not self.steps:
            kinds = [s.kind for s in self.prepass if s.kind != "copy"] or ["copy"]
            return f"{self.equation!r} has one operand (a {' and a '.join(kinds)})"
        clauses = []
        for step in self.prepass:
            (sub,), n = step.subscripts, self.input_names.index(step.operands[0])
            others = {m: s for m, s in zip(self.input_names, self.raw_subscripts) if m != step.operands[0]}
            parts = []
            for c in dict.fromkeys(sub):
                if sub.count(c) > 1:
                    parts.append(f"a diagonal over {c}")
                elif c not in step.output and any(c in s for s in others.values()):
                    partners = ", ".join(m for m, s in others.items() if c in s)
                    parts.append(f"its axis {c} of size 1 broadcasts against {partners} ({c}={self.sizes[c]})")
                elif c not in step.output:
                    parts.append(f"a sum over {c}, which no other operand has")
            clauses.append(f"in{n} ({self.raw_subscripts[n]!r}): {', '.join(parts)}")
        return "; ".join(clauses)

    def __str__(self) -> str:
        lines = [f"  Complete contraction:  {self.equation}"]
        if self.sizes is None:
            lines.append(f"  Sizes: symbolic ({self.assumption})")
        else:
            lines.append("  Sizes: " + (" ".join(f"{k}={v}" for k, v in self.sizes.items()) or "(scalars)"))
            speedup = self.naive_flops / max(self.flops, 1)
            lines.append(f"  Naive FLOP count: {self.naive_flops:.4g}   Optimized FLOP count: {self.flops:.4g}"
                         f"   Theoretical speedup: {speedup:.4g}")
        header = f"  {'step':>4}  {'result':<6}  {'operation':<28}  {'kind':<12}  {'summed':<8}  {'batch':<6}  flops"
        lines += [header, "  " + "-" * (len(header) - 2)]
        for n, s in enumerate(self.prepass + self.steps):
            flops = "-" if s.flops is None else f"{s.flops:.4g}"
            lines.append(f"  {n:>4}  {s.name:<6}  {s.operation:<28}  {s.kind:<12}  {s.summed or '-':<8}  "
                         f"{s.batch or '-':<6}  {flops}")
        return "\n".join(lines)


@dataclass(frozen=True)
class ParsedEinsum:
    """An einsum with ``...`` expanded into fresh letters and the output made explicit."""

    subscripts: tuple[str, ...]
    output: str
    sizes: dict[str, int] | None
    equation: str


def _fresh_letters(used: set[str], count: int) -> list[str]:
    letters, n = [], 0
    while len(letters) < count:
        c = opt_einsum.get_symbol(n)
        if c not in used:
            letters.append(c)
        n += 1
    return letters


def _check_term(term: str, where: str) -> None:
    body = term.replace("...", "", 1)
    if "..." in body or "." in body:
        raise DeinsumError(f"{where} {term!r}: '.' is only allowed as one ellipsis '...'")
    for c in body:
        if not c.isalpha():
            raise DeinsumError(f"{where} {term!r}: invalid index character {c!r} (indices are letters)")


def as_shape(shape, what: str = "a shape") -> tuple[int, ...]:
    """``shape`` as a tuple of non-negative Python ints, else a one-line DeinsumError.

    >>> import numpy as np
    >>> as_shape([4, np.int64(5)])
    (4, 5)
    >>> as_shape((4.5, 5), "operand 0")
    Traceback (most recent call last):
    ...
    deinsum.errors.DeinsumError: operand 0: shape (4.5, 5) must be a sequence of non-negative integers
    """
    try:
        dims = tuple(shape)
    except TypeError:
        raise DeinsumError(f"{what}: shape {shape!r} must be a sequence of non-negative integers") from None
    if not all(isinstance(n, Integral) and not isinstance(n, bool) and n >= 0 for n in dims):
        raise DeinsumError(f"{what}: shape {shape!r} must be a sequence of non-negative integers")
    return tuple(int(n) for n in dims)


def parse(equation: str, *shapes: Sequence[int] | None) -> ParsedEinsum:
    """Validate ``equation`` against operand shapes (or none, for a symbolic plan).

    >>> p = parse("...ij,jk", (5, 2, 3), (3, 4))
    >>> p.subscripts, p.output
    (('aij', 'jk'), 'aik')
    >>> parse("ij,jk->ik", (2, 3), (4, 5))
    Traceback (most recent call last):
    ...
    deinsum.errors.DeinsumError: operand 1 ('jk'): index 'j' has size 4, but operand 0 ('ij') gives it size 3
    """
    if not isinstance(equation, str):
        raise DeinsumError(f"the einsum equation must be a string, not {type(equation).__name__}")
    eq = "".join(equation.split())
    if eq.count("->") > 1:
        raise DeinsumError(f"equation {equation!r} has more than one '->'")
    lhs, arrow, out = eq.partition("->")
    if "-" in lhs or ">" in lhs or (arrow and ("-" in out or ">" in out)):
        raise DeinsumError(f"equation {equation!r}: '-' and '>' may only appear together as '->'")
    terms = lhs.split(",")
    shapes = tuple(as_shape(s, f"operand {n}") for n, s in enumerate(shapes))
    symbolic = len(shapes) == 0
    if not symbolic and len(shapes) != len(terms):
        raise DeinsumError(f"equation {equation!r} has {len(terms)} operand(s) but {len(shapes)} were given")
    for n, term in enumerate(terms):
        _check_term(term, f"operand {n}")
    if arrow:
        _check_term(out, "output")
    used = set(eq) - set(".,->")

    # expand the ellipsis into fresh letters, aligned from the right (numpy broadcasting)
    ell_dims = []
    for n, term in enumerate(terms):
        if "..." not in term:
            ell_dims.append(0)
            if not symbolic and len(shapes[n]) != len(term):
                raise DeinsumError(f"operand {n} ({term!r}) has {len(term)} indices but {len(shapes[n])} dimensions")
            continue
        if symbolic:
            raise DeinsumError(f"operand {n} ({term!r}): '...' needs operand shapes")
        nd = len(shapes[n]) - (len(term) - 3)
        if nd < 0:
            raise DeinsumError(f"operand {n} ({term!r}) has {len(term) - 3} indices but only "
                               f"{len(shapes[n])} dimensions")
        ell_dims.append(nd)
    n_ell = max(ell_dims, default=0)
    fresh = _fresh_letters(used, n_ell)
    subs = []
    for term, nd in zip(terms, ell_dims):
        subs.append(term.replace("...", "".join(fresh[n_ell - nd:])) if "..." in term else term)

    # sizes, with numpy's size-1 broadcasting
    sizes: dict[str, int] | None = None
    if not symbolic:
        for n, sub in enumerate(subs):
            for c in sorted(set(sub)):
                dims = {shapes[n][k] for k, x in enumerate(sub) if x == c}
                if len(dims) > 1:
                    raise DeinsumError(f"operand {n} ({terms[n]!r}): repeated index {c!r} has unequal "
                                       f"dimensions {sorted(dims)}")
        sizes, origin = {}, {}
        for n, (sub, shape) in enumerate(zip(subs, shapes)):
            for c, d in zip(sub, shape):
                if c in sizes and sizes[c] != d and 1 not in (d, sizes[c]):
                    m = origin[c]
                    what = "ellipsis dimension" if c in fresh else f"index {c!r}"
                    raise DeinsumError(f"operand {n} ({terms[n]!r}): {what} has size {d}, but operand {m} "
                                       f"({terms[m]!r}) gives it size {sizes[c]}")
                if c not in sizes or sizes[c] == 1:
                    sizes[c], origin[c] = d, n

    if sizes is not None:
        for n, sub in enumerate(subs):
            check_volume(f"operand {n} ({terms[n]!r})", sub, sizes)

    # output
    if arrow:
        if n_ell and "..." not in out:
            raise DeinsumError(f"output {out!r}: operands broadcast over '...' but the output has no '...'")
        output = out.replace("...", "".join(fresh))
        for c in output:
            if output.count(c) > 1:
                raise DeinsumError(f"output {out!r}: index {c!r} appears more than once")
            if not any(c in s for s in subs):
                raise DeinsumError(f"output {out!r}: index {c!r} does not appear in any operand")
    else:
        counts = {}
        for s in subs:
            for c in s:
                counts[c] = counts.get(c, 0) + 1
        output = "".join(fresh) + "".join(sorted(c for c, k in counts.items() if k == 1 and c not in fresh))
    return ParsedEinsum(tuple(subs), output, sizes, ",".join(subs) + "->" + output)


#: Most elements a tensor may have: its bytes (up to 16 per element) must fit in an int64.
MAX_ELEMENTS = 2**59


def check_volume(what: str, sub: str, sizes: Mapping[str, int]) -> None:
    """A one-line DeinsumError if the tensor ``sub`` has more than ``MAX_ELEMENTS`` elements.

    >>> check_volume("operand 0", "ij", {"i": 2**40, "j": 2**20})
    Traceback (most recent call last):
    ...
    deinsum.errors.DeinsumError: operand 0 has 2**60 elements; at most 2**59 are supported
    """
    n = prod(sizes[c] for c in sub)
    if n > MAX_ELEMENTS:
        raise DeinsumError(f"{what} has {'2**' + str(n.bit_length() - 1) if n & (n - 1) == 0 else f'{n:.3g}'} "
                           f"elements; at most 2**59 are supported")


def _flops(indices: str, summed: bool, nterms: int, sizes: Mapping[str, int]) -> int:
    """opt_einsum's FLOP model: |V| * (max(1, nterms - 1) + inner)."""
    return prod(sizes[c] for c in set(indices)) * (max(1, nterms - 1) + int(summed))


def _prepass(parsed: ParsedEinsum, sizes: Mapping[str, int] | None, shapes) -> tuple[list[str], list[Step]]:
    """Unary pre-pass: broadcast squeezes, diagonals and single-operand sums, per operand."""
    subs, steps = list(parsed.subscripts), []
    for n, sub in enumerate(parsed.subscripts):
        others = set(parsed.output).union(*(s for m, s in enumerate(parsed.subscripts) if m != n))
        keep = []
        for k, c in enumerate(sub):
            broadcast = sizes is not None and shapes[n][k] == 1 and sizes[c] != 1
            if c in others and not broadcast and c not in keep:
                keep.append(c)
        new = "".join(keep)
        if new != sub and (len(subs) > 1):
            st = Step(f"in{n}", (f"in{n}",), (sub,), new)
            if sizes is not None:
                st = _with_flops(st, sizes)
            steps.append(st)
            subs[n] = new
    if len(subs) == 1:
        distinct = "".join(dict.fromkeys(subs[0]))
        if distinct != subs[0]:   # diagonal first, so the step the bounds analyse has distinct indices
            st = Step("in0", ("in0",), (subs[0],), distinct)
            steps.append(_with_flops(st, sizes) if sizes is not None else st)
            subs[0] = distinct
        st = Step("out", ("in0",), (subs[0],), parsed.output)
        steps.append(_with_flops(st, sizes) if sizes is not None else st)
    return subs, steps


def _with_flops(step: Step, sizes: Mapping[str, int]) -> Step:
    flops = _flops("".join(step.subscripts), bool(step.summed), len(step.subscripts), sizes)
    return Step(step.name, step.operands, step.subscripts, step.output, step.summed, step.kind, flops)


def binary_steps(subs: Sequence[str], output: str, path: Sequence[tuple[int, int]]) -> list[Step]:
    """The binary steps of a contraction ``path`` (opt_einsum's form: pairs of positions in the list of
    live operands, each result appended) over operands ``in0, in1, ...`` with ``subs``: every index
    summed as soon as no later operand and not the output needs it.

    >>> [s.operation for s in binary_steps(["ij", "jk", "kl"], "il", [(1, 2), (0, 1)])]
    ['jk,kl->jl', 'ij,jl->il']
    """
    live, steps = [(f"in{n}", sub) for n, sub in enumerate(subs)], []
    for n, pair in enumerate(path):
        (na, sa), (nb, sb) = (live[k] for k in pair)
        live = [t for k, t in enumerate(live) if k not in pair]
        last = n == len(path) - 1
        if last:
            out = output
        else:
            needed = set(output).union(*(s for _, s in live))
            # free indices first (operand order), shared ones last: KRP ja,ka->jka
            shared = [c for c in sa if c in sb]
            order = [c for c in sa + sb if c not in shared] + shared
            out = "".join(c for c in order if c in needed)
        steps.append(Step("out" if last else f"t{n}", (na, nb), (sa, sb), out))
        live.append((steps[-1].name, out))
    return steps


def decompose(equation: str, *shapes: Sequence[int], optimize: str = "auto") -> Decomposition:
    """Parse, normalise and split ``equation`` into binary steps (see module docstring).

    ``shapes`` are the operands' shapes; without them the plan is symbolic and the
    contraction order assumes every index has size ``SYMBOLIC_SIZE``.
    """
    parsed = parse(equation, *shapes)
    sizes = parsed.sizes
    subs, pre = _prepass(parsed, sizes, shapes)
    plan_sizes = sizes if sizes is not None else {c: SYMBOLIC_SIZE for s in subs for c in s}
    names = [f"in{n}" for n in range(len(subs))]
    steps: list[Step] = []
    if len(subs) > 1:
        plan_shapes = [tuple(plan_sizes[c] for c in s) for s in subs]
        try:
            path, _ = opt_einsum.contract_path(",".join(subs) + "->" + parsed.output, *plan_shapes,
                                               shapes=True, optimize=optimize)
        except (ValueError, TypeError, KeyError) as exc:
            raise DeinsumError(f"equation {equation!r}: opt_einsum could not plan it ({exc})") from None
        if any(len(pair) != 2 for pair in path):
            raise DeinsumError(f"equation {equation!r}: unexpected {max(map(len, path))}-ary step in opt_einsum path")
        for step in binary_steps(subs, parsed.output, path):
            if sizes is not None:
                check_volume(f"intermediate {step.name} ({step.operation})", step.output, sizes)
            steps.append(_with_flops(step, sizes) if sizes is not None else step)
    naive = None
    if sizes is not None:
        naive = _flops("".join(parsed.subscripts), bool(set("".join(parsed.subscripts)) - set(parsed.output)),
                       len(parsed.subscripts), sizes)
    assumption = None if sizes is not None else f"contraction order planned with every index of size {SYMBOLIC_SIZE}"
    return Decomposition(parsed.equation, parsed.subscripts, tuple(names), tuple(subs), parsed.output,
                         sizes, tuple(pre), tuple(steps), assumption, naive,
                         None if sizes is None else tuple(as_shape(s) for s in shapes))
