"""SOAP I/O lower bounds: for every einsum program, the bound, the best fusion and the optimal tile.

Theory: ``shared/notes/soap.md`` (Kwasniewski et al.'s SOAP, as used by Deinsum SC'22).
A group of fused binary steps is one :class:`Statement`; its bound is
``Q >= |V| / rho`` with ``rho = min_{X > S} chi(X) / (X - S)``, where ``chi(X)`` is
the largest tile (``prod t_v``) whose access footprint is at most ``X`` words.
(``|V|/rho`` is SOAP's leading-order form: it drops the ``-(X0 - S)`` of one
partial segment.) When ``chi`` grows linearly (``sigma = 1``) the minimum is
approached as ``X -> oo``: closed forms then report ``X0 = oo``, while numeric
bounds take the minimum over ``S < X <= F`` (``F``: footprint of all of V).

* :func:`symbolic_bound` -- closed forms in ``N_<index>`` and ``S`` (SymPy, cached),
  cross-checked numerically; ``ok``/``reason`` say when only an asymptotic form exists.
* :func:`numeric_bound` -- size-aware bound for concrete sizes (geometric program),
  with the clamped dimensions; :func:`numeric_chi` evaluates ``chi(X)``.
* :func:`parallel_bound` -- memory-dependent and memory-independent per-rank bounds
  on P ranks, which one binds, and the per-rank tile.
* :func:`analyze` -- the SDG fusion search over a :func:`deinsum.decompose` result:
  every candidate partition with its bound, the chosen one, reports in text,
  LaTeX (booktabs) and JSON.

Example (MTTKRP, paper section IV-E):

>>> from deinsum.decompose import decompose
>>> from deinsum.soap import Statement, analyze, numeric_bound, symbolic_bound
>>> mttkrp = Statement.from_terms(["ijk", "ja", "ka"], "ia")
>>> b = symbolic_bound(mttkrp)
>>> b.Q, b.X0, b.rho
(3*N_a*N_i*N_j*N_k/S**(2/3), 5*S/2, S**(2/3)/3)
>>> b.tiles["a"], b.XP
(S**(2/3)/2, 5*2**(3/5)*N_a**(3/5)*N_i**(3/5)*N_j**(3/5)*N_k**(3/5)/(2*P**(3/5)))
>>> nb = numeric_bound(mttkrp, dict(i=4096, j=4096, k=4096, a=24), S=2**12)
>>> nb.clamped, f"{nb.Q:.4g}"                      # t_a would be S^(2/3)/2 = 128 > 24
(('a',), '6.895e+10')
>>> a = analyze(decompose("ijk,ja,ka->ia"))        # KRP then TDOT: fusing them is optimal
>>> a.chosen, a.Q
(((0, 1),), 3*N_a*N_i*N_j*N_k/S**(2/3))
>>> print(a)                                        # doctest: +ELLIPSIS
SOAP I/O lower bound of ijk,ja,ka->ia
  sizes: symbolic   S: symbolic
  schedule: [t0+out]   Q >= 3*N_a*N_i*N_j*N_k/S**(2/3)
...
"""
import importlib
import sys

from .fusion import DEFAULT_S, Analysis, Candidate, GroupBound, analyze, partitions, sdg, valid_groups
from .numeric import NumericBound, numeric_bound, numeric_chi
from .parallel import LAYOUT, ParallelBound, parallel_bound
from .statement import Statement, size_symbol


#: Names of the closed forms, made on first use (SymPy: planning with sizes never loads it), by module.
_LAZY = {"P": "statement", "S": "statement", "X": "statement", "SymbolicBound": "symbolic", "symbolic_bound": "symbolic"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def clear_caches() -> None:
    """Forget every cached statement structure, closed form and numeric problem (for cold timings)."""
    from . import fusion, numeric, statement
    caches = [statement.structure, numeric._problem, numeric._rho, numeric.tile_for, numeric._weighing,
              fusion._reference_cost, fusion._joint_cached]
    symbolic = sys.modules.get(f"{__name__}.symbolic")          # not loaded: nothing of it to forget
    for f in caches + ([symbolic._bound, symbolic._solve] if symbolic else []):
        f.cache_clear()


__all__ = [
    "DEFAULT_S", "LAYOUT", "P", "S", "X", "Analysis", "Candidate", "GroupBound", "NumericBound", "ParallelBound",
    "Statement", "SymbolicBound", "analyze", "clear_caches", "numeric_bound", "numeric_chi", "parallel_bound", "partitions",
    "sdg", "size_symbol", "symbolic_bound", "valid_groups",
]
