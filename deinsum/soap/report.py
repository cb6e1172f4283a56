"""Text, LaTeX and JSON views of an :class:`~deinsum.soap.fusion.Analysis`.

>>> from deinsum.decompose import decompose
>>> from deinsum.soap import analyze
>>> a = analyze(decompose("ik,kj->ij"))
>>> print(a.latex().splitlines()[0])
\\begin{table}[t]
>>> a.to_dict()["groups"][0]["symbolic"]["Q"]
'2*N_i*N_j*N_k/sqrt(S)'
"""
from __future__ import annotations

import math

import sympy as sp

from .parallel import balance_text
from .statement import P as P_SYMBOL


def _num(x) -> str:
    return "-" if x is None else f"{x:.4g}"


def _words(x: float) -> str:
    """A bound on a count of words as the plan prints it: rounded up, with thousands separators."""
    return f"{max(0, math.ceil(x)):,}"


def _expr(e) -> str:
    return "-" if e is None else str(e)


def _group_name(a, g: tuple[int, ...]) -> str:
    return "+".join(a.steps[k].name for k in g)


def _partition_name(a, p) -> str:
    return " ".join(f"[{_group_name(a, g)}]" for g in p)


def _tiles(tiles: dict, fmt) -> str:
    return " ".join(f"{v}={fmt(t)}" for v, t in tiles.items()) or "-"


def _table(headers: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[c]) for r in [headers] + rows) for c in range(len(headers))]
    line = lambda r: indent + "  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip()
    return [line(headers), indent + "-" * (sum(widths) + 2 * len(widths) - 2)] + [line(r) for r in rows]


def _note(g) -> str:
    if g.symbolic.ok:
        return "exact"
    return "asymptotic" if g.symbolic.has_bound else "numeric only"


def text(a) -> str:
    """Readable report: chosen schedule, per-group table, candidates, parallel bounds, notes."""
    sizes = "symbolic" if a.sizes is None else " ".join(f"{k}={v}" for k, v in a.sizes.items())
    S = "symbolic" if a.S is None else f"{a.S:g} words"
    out = [f"SOAP I/O lower bound of {a.equation}", f"  sizes: {sizes}   S: {S}" + (f"   P: {a.P}" if a.P else ""),
           f"  schedule: {_partition_name(a, a.chosen)}   Q >= {_expr(a.Q) if a.sizes is None else _num(a.Q)}", ""]
    headers = ["group", "statement", "sigma", "X0", "rho", "Q >= (closed form)", "tile at X0", "form"]
    if a.sizes is not None:
        headers += ["Q >= (numeric)", "numeric tile", "clamped"]
    rows = []
    for g in a.groups:
        sym = g.symbolic
        row = [_group_name(a, g.steps), g.statement.equation, _expr(sym.sigma), _expr(g.subs(sym.X0)),
               _expr(g.subs(sym.rho)), _expr(g.subs(sym.Q)), _tiles({v: g.subs(t) for v, t in sym.tiles.items()}, str),
               _note(g)]
        if g.numeric is not None:
            row += [_num(g.numeric.Q), _tiles(g.numeric.tiles, lambda t: f"{t:.4g}"),
                    ",".join(g.numeric.clamped) or "-"]
        rows.append(row)
    out += _table(headers, rows)
    out += ["", f"  fusion candidates, best first ({a.ranking}):"]
    rows = [[_partition_name(a, c.partition), _num(c.cost), _expr(c.Q) if a.sizes is None else _num(c.Q)]
            for c in a.candidates]
    out += _table(["partition", "score", "Q >="], rows, "    ")
    if a.P is not None and a.sizes is not None:
        out += [""] + parallel_text(a)
    elif a.P is not None:
        out += ["", f"  parallel bounds per rank, P = {a.P} ({a.layout}):"]
        rows = []
        for g in a.groups:
            e = parallel_expressions(g, a.P)
            rows.append([_group_name(a, g.steps), _expr(e["Q_dep"]), _expr(e["Q_indep"]), _expr(e["XP"])])
        out += _table(["group", "memory-dependent", "memory-independent", "X_P"], rows, "    ")
    notes = [f"  {_group_name(a, g.steps)}: {g.symbolic.reason}" for g in a.groups if g.symbolic.reason]
    notes += [f"  {_group_name(a, g.steps)}: clamped {','.join(g.numeric.clamped)} (tile = whole dimension); the "
              f"closed form assumes no clamping, the numeric bound is the size-aware one"
              for g in a.groups if g.numeric is not None and g.numeric.clamped]
    if notes:
        out += ["", "  notes:"] + notes
    return "\n".join(out)


def _path_names(a, c) -> tuple[str, str]:
    """A candidate's groups by step names, and the path it lies on where that is not the analysis' own."""
    steps = c.path or a.steps
    groups = " ".join("[" + "+".join(steps[k].name for k in g) + "]" for g in c.partition)
    return groups, "; ".join(s.operation for s in c.path)


def parallel_text(a) -> list[str]:
    """The per-rank bounds of an analysis with sizes and P: the class bound with the groups of the fusion
    that attains it, and the atomic bound, each with its class (the assumptions: ``PlanBound``)."""
    words, best = a.class_bound
    steps = best.path or a.steps
    rows = [["+".join(steps[k].name for k in g.steps), _words(g.parallel.Q_indep), _num(g.parallel.XP),
             _num(g.parallel.owned), _tiles(g.parallel.tiles, lambda t: f"{t:.4g}")] for g in best.groups]
    atomic, copies = a.atomic, (f"; at least the result's copies, {_words(a.result_copies)}" if a.result_copies else "")
    rows.append(["(atomic)", _words(atomic.Q_indep), _num(atomic.XP), _num(atomic.owned),
                 _tiles(atomic.tiles, lambda t: f"{t:.4g}")])
    groups, path = _path_names(a, best)
    alone = {g.steps: g.parallel.Q_indep for g in best.groups}
    name = lambda g: "+".join(steps[k].name for k in g)  # noqa: E731
    joint = "".join(f"; {', '.join(name(g) for g in unit)} jointly {_words(w)}" for unit, w in best.joint
                    if w > sum(alone[g] for g in unit))
    return ([f"  per-rank lower bounds on P = {a.P} (words received by the busiest rank, any memory; {a.layout}; "
             f"{balance_text(a.rho)}):",
             f"    class bound >= {_words(words)}: {a.covers} (the least, over paths and candidates, of the sum of the "
             f"group bounds, connected groups by their joint bound where more; attained by {groups}"
             + (f" along the path {path}" if path else "") + f"{joint}{copies})",
             f"    atomic bound >= {_words(a.atomic_words)}: one-statement algorithms only (the whole einsum as one "
             f"statement{copies})"]
            + _table(["group", "bound", "X_P", "held", "per-rank tile"], rows, "    "))


def _tex_text(s: str) -> str:
    for c, r in (("\\", r"\textbackslash{}"), ("_", r"\_"), ("&", r"\&"), ("%", r"\%"), ("$", r"\$"),
                 ("#", r"\#"), ("{", r"\{"), ("}", r"\}"), ("^", r"\^{}"), ("~", r"\~{}")):
        s = s.replace(c, r)
    return s


def _tex(e) -> str:
    if e is None:
        return "--"
    if isinstance(e, float):
        if not math.isfinite(e):
            return r"$\infty$"
        mant, exp = f"{e:.3e}".split("e")
        return f"${float(mant):.3g}$" if abs(int(exp)) < 3 else f"${float(mant):.3g}\\times 10^{{{int(exp)}}}$"
    return f"${sp.latex(e)}$"


def _tex_words(x) -> str:
    """A count of words for a table: a whole number with thin-space thousands, or -- where unknown."""
    return "--" if x is None else f"${max(0, math.ceil(x)):,}$".replace(",", r"\,")


def latex(a, rows=(), notes=()) -> str:
    r"""A booktabs table of the chosen groups' sequential bounds (closed forms in ``S``; with sizes, the bound at
    the analysis' S, tiles clamped to the sizes), their total; then, with ``rows``, a per-P table of the per-rank
    bounds beside deinsum's plan, and ``notes`` (the class, assumptions and what is known) as text.

    ``rows``: mappings with ``P``, ``class``, ``atomic`` and ``plan`` (words; ``plan`` may be None).

    >>> from deinsum.decompose import decompose
    >>> from deinsum.soap import analyze
    >>> tex = analyze(decompose("ijk,ja,ka->ia", (1724,) * 3, (1724, 42), (1724, 42)), S=2**20, P=8).latex(
    ...     [dict(P=8, **{"class": 81459, "atomic": 81459, "plan": 81522})])
    >>> "t_{a} = 42 = N_{a}" in tex, r"$81\,522$ & $1.001$" in tex
    (True, True)
    """
    numeric = a.sizes is not None
    cols = ["Group", "Statement", r"$\sigma$", r"$X_0$", r"$\rho$", r"$Q \geq$ (closed form)"]
    cols += [f"$Q$ (sizes, $S = {_tex_count(a.S)}$)"] if numeric else []
    lines = [r"\begin{table}[t]", r"\centering", r"\small",
             rf"\caption{{SOAP I/O lower bound of \texttt{{{_tex_text(a.equation)}}} (one rank, fast memory $S$ "
             rf"words: words moved between it and slow memory).}}",
             r"\begin{tabular}{" + "l" * len(cols) + "}", r"\toprule", " & ".join(cols) + r" \\", r"\midrule"]
    clamped = False
    for g in a.groups:
        sym = g.symbolic
        mark = ""
        if numeric and g.numeric.clamped and sym.has_bound:
            mark, clamped = r"$^\dagger$", True
        row = [_tex_text(_group_name(a, g.steps)), rf"\texttt{{{_tex_text(g.statement.equation)}}}", _tex(sym.sigma),
               _tex(sym.X0), _tex(sym.rho), _tex(sym.Q) + mark]
        if numeric:
            row.append(_tex(g.numeric.Q))
        lines.append(" & ".join(row) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    text = []                                          # one paragraph each
    if numeric:
        text.append(rf"Total over the groups of the chosen fusion (the sum of the last column): $Q \geq$ "
                    rf"{_tex(float(a.Q))} words at these sizes and $S = {_tex_count(a.S)}$.")
        if clamped:
            text.append(r"$^\dagger$The closed form assumes no tile reaches its index's size; here some do (below), "
                        r"and the last column is the bound.")
    else:
        text.append(rf"Total over the groups of the chosen fusion: $Q \geq {sp.latex(a.Q)}$.")
    for g in a.groups:
        if numeric:
            tiles = ", ".join(f"t_{{{v}}} = {_tex_count(a.sizes[v])} = N_{{{v}}}" if v in g.numeric.clamped else
                              f"t_{{{v}}} = {_tex_count(g.numeric.tiles[v])}" for v in g.statement.variables)
            text.append(rf"\texttt{{{_tex_text(g.statement.equation)}}}: tile at $X_0$ (sizes, $S$): ${tiles}$.")
        elif g.symbolic.has_bound:
            tiles = ", ".join(f"t_{{{v}}} = {sp.latex(t)}" for v, t in g.symbolic.tiles.items())
            text.append(rf"\texttt{{{_tex_text(g.statement.equation)}}}: tile at $X_0$: ${tiles}$.")
    if rows:
        lines += ["", r"\begin{table}[t]", r"\centering", r"\small",
                  rf"\caption{{Per-rank lower bounds of \texttt{{{_tex_text(a.equation)}}} and deinsum's plan, in words "
                  rf"received by the busiest rank.}}",
                  r"\begin{tabular}{rrrrr}", r"\toprule",
                  r"$P$ & class bound & atomic bound & plan & plan / class bound \\", r"\midrule"]
        for r in rows:
            ratio = "--" if r["plan"] is None or not r["class"] else f"${r['plan'] / r['class']:.3f}$"
            lines.append(f"${r['P']}$ & {_tex_words(r['class'])} & {_tex_words(r['atomic'])} & "
                         f"{_tex_words(r['plan'])} & {ratio}" + r" \\")
        lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    for paragraph in text + [_tex_text(n) for n in notes]:
        lines += ["", paragraph]
    return "\n".join(lines)


def _tex_count(x: float) -> str:
    """A number in math mode: whole where it is, else 4 significant digits."""
    if float(x).is_integer():
        return f"{int(x):,}".replace(",", r"\,")
    mant, exp = f"{x:.3e}".split("e")
    return f"{x:.4g}" if abs(int(exp)) < 4 else f"{float(mant):.4g} \\times 10^{{{int(exp)}}}"


def _json_num(x):
    return float(x) if x is not None and math.isfinite(x) else None


def as_dict(a) -> dict:
    """JSON-ready data: expressions as strings, numbers as floats (non-finite -> None)."""
    def group(g) -> dict:
        d = {"steps": list(g.steps), "names": [a.steps[k].name for k in g.steps], "statement": g.statement.equation,
             "tensors": list(g.statement.names), "symbolic": g.symbolic.to_dict(), "cost": _json_num(g.cost)}
        if g.numeric is not None:
            d["numeric"] = {k: (_json_num(v) if isinstance(v, float) else v) for k, v in g.numeric.to_dict().items()}
        if g.parallel is not None:
            d["parallel"] = g.parallel.to_dict()
        elif a.P is not None:
            d["parallel"] = {k: _expr(v) for k, v in parallel_expressions(g, a.P).items()}
        return d

    def total(c):
        q = c.Q
        return _json_num(q) if isinstance(q, float) else (None if q is None else str(q))

    bounds = a.class_bound
    per_rank = None if bounds is None else {
        "metric": "words received by the busiest rank, any memory", "layout": a.layout,
        "balance": balance_text(a.rho), "rho": a.rho,
        "class_bound_words": bounds[0], "class_bound_partition": [list(g) for g in bounds[1].partition],
        "class_bound_path": [s.operation for s in bounds[1].path] or [s.operation for s in a.steps],
        "class_bound_covers": a.covers + ": the least over paths and candidates of the sum of the group bounds, "
                                         "connected groups by their joint bound where more",
        "atomic_bound_words": a.atomic_words, "result_copies_words": a.result_copies, "atomic_bound_covers": "one-statement algorithms only"}
    return {"equation": a.equation, "sizes": a.sizes, "S": a.S, "P": a.P, "layout": a.layout, "per_rank": per_rank,
            "sdg": [list(e) for e in a.sdg], "ranking": a.ranking,
            "chosen": [list(g) for g in a.chosen], "Q": total(a.candidates[0]),
            "groups": [group(g) for g in a.groups],
            "candidates": [{"partition": [list(g) for g in c.partition], "cost": _json_num(c.cost), "Q": total(c)}
                           for c in a.candidates]}


def parallel_expressions(group, P: int | None) -> dict[str, sp.Expr | None]:
    """Symbolic parallel bounds of a group (P and the given S substituted)."""
    sym = group.symbolic
    subs = {} if P is None else {P_SYMBOL: P}
    return {k: None if e is None else group.subs(e.subs(subs))
            for k, e in (("Q_dep", sym.Q_dep), ("Q_indep", sym.Q_indep), ("XP", sym.XP))}
