"""Process grids: which Cartesian grid a fused group runs on.

Everything here is pure planning and needs no MPI ranks (the runtime makes the
grids' communicators: ``deinsum.runtime.runner.Runtime.cart``).

* :class:`GridChoice` - a group's grid, and the layouts of its tensors on it.
* :func:`balanced_split`, :func:`ordered_factorisations` - how a number of ranks factors over axes.
* :func:`candidate_grids` - the ordered factorisations of P (or fewer ranks) over a group's indices.
* :func:`estimate_words` - a fast estimate, vectorised over candidate grids, of what the busiest
  rank receives; the planner scores the best few candidates exactly with
  :func:`deinsum.redistribute.received_words`, the one volume model.

>>> sizes = dict(i=10, j=10, k=10, a=10)
>>> choice = GridChoice("ijka", (2, 2, 2, 1), "ia", 8)
>>> choice.layout("ia", sizes)      # the output before reduction: partial sums over j and k
Layout(shape=(10, 10), grid=(2, 2, 2, 1), axes=(0, None), partial=(1, 2))
"""
from __future__ import annotations

import math
from functools import lru_cache
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from deinsum.errors import DeinsumError
from deinsum.layout import Layout, block_range

__all__ = ["GridChoice", "candidate_grids", "estimate_words", "block_imbalance", "balanced_split",
           "ordered_factorisations"]

#: Fewer than P ranks are searched when P has a prime factor above this, or when no grid of P
#: ranks fits the sizes: then the largest counts below P whose prime factors are all <= SMOOTH_PRIME
#: (at most FEWER_RANK_COUNTS of them) compete too.
SMOOTH_PRIME = 7
FEWER_RANK_COUNTS = 4
#: At most this many candidate grids per group; past it the smallest indices are left unsplit (the
#: reason says so).
MAX_CANDIDATE_GRIDS = 8192


# ----------------------------------------------------------------------------- factorisations of P

def balanced_split(shape: Sequence[int], parts: int, cubic: bool = True) -> tuple[int, ...]:
    """The factorisation of ``parts`` over the axes of ``shape`` with the smallest largest block.

    Ties go to the larger smallest block, then to the most cube-like block
    (least sum of extents; not with ``cubic`` False), then to splitting leading
    axes more (blocks contiguous in C order where they can be).

    >>> balanced_split((5, 10), 4), balanced_split((3, 4), 7), balanced_split((8, 8), 4, cubic=False)
    ((2, 2), (1, 7), (4, 1))
    """
    return _balanced_split(tuple(int(n) for n in shape), int(parts), bool(cubic))


@lru_cache(maxsize=4096)
def _balanced_split(shape: tuple[int, ...], parts: int, cubic: bool) -> tuple[int, ...]:
    rows = factorisations(parts, len(shape))
    if rows.shape[0] == 0:
        raise DeinsumError(f"cannot split a 0-d tensor into {parts} parts")
    n = np.array(shape, dtype=np.int64)
    extents = -(-n // rows)
    largest = np.prod(extents, axis=1)
    smallest = np.prod(n // rows, axis=1)
    order = np.lexsort(tuple(-rows[:, x] for x in reversed(range(len(shape))))
                       + (extents.sum(axis=1),) * cubic + (-smallest, largest))
    return tuple(int(p) for p in rows[order[0]])


def ordered_factorisations(n: int, caps: Sequence[int]) -> np.ndarray:
    """Every ``(f_0, ..., f_{k-1})`` with product ``n`` and ``f_v <= caps[v]``, as rows of an int64 array.

    Built per prime factor (bounded compositions of its exponent), so primes
    and prime powers are as cheap as smooth numbers.

    >>> sorted(map(tuple, ordered_factorisations(12, (4, 3)).tolist()))
    [(4, 3)]
    >>> ordered_factorisations(7, (3, 3)).shape, ordered_factorisations(3, ()).shape
    ((0, 2), (0, 0))
    """
    caps = np.array(caps, dtype=np.int64)
    if caps.size == 0:  # a grid over no index has one rank
        return np.ones((int(n == 1), 0), dtype=np.int64)
    rows = np.ones((1, caps.size), dtype=np.int64)
    for prime, exponent in sorted(prime_factors(n).items(), reverse=True):
        most = [max_power(prime, int(c)) for c in caps]
        factors = prime ** _bounded_compositions(exponent, most)
        rows = (rows[:, None, :] * factors[None, :, :]).reshape(-1, caps.size)
        rows = rows[(rows <= caps).all(axis=1)]
    return rows


@lru_cache(maxsize=256)
def factorisations(n: int, k: int) -> np.ndarray:
    """:func:`ordered_factorisations` of ``n`` over ``k`` factors without caps (cached, read-only)."""
    rows = ordered_factorisations(n, (n,) * k)
    rows.flags.writeable = False
    return rows


def prime_factors(n: int) -> dict[int, int]:
    """``{prime: exponent}`` of ``n``.

    >>> prime_factors(360)
    {2: 3, 3: 2, 5: 1}
    """
    factors: dict[int, int] = {}
    d = 2
    while d * d <= n:
        while n % d == 0:
            factors[d] = factors.get(d, 0) + 1
            n //= d
        d += 1
    if n > 1:
        factors[n] = factors.get(n, 0) + 1
    return factors


def max_power(prime: int, cap: int) -> int:
    """The largest ``e`` with ``prime ** e <= cap``."""
    power = 0
    while prime ** (power + 1) <= cap:
        power += 1
    return power


def _bounded_compositions(total: int, most: Sequence[int]) -> np.ndarray:
    """Rows ``c`` with ``sum(c) == total`` and ``0 <= c[v] <= most[v]``."""
    k = len(most)
    if k == 0:
        return np.zeros((1 if total == 0 else 0, 0), dtype=np.int64)
    room_after = np.concatenate([np.cumsum(most[::-1])[::-1], [0]])
    rows = np.zeros((1, 0), dtype=np.int64)
    sums = np.zeros(1, dtype=np.int64)
    for v in range(k - 1):
        values = np.arange(most[v] + 1, dtype=np.int64)
        new = sums[:, None] + values[None, :]
        keep_row, keep_value = np.nonzero((new <= total) & (new + room_after[v + 1] >= total))
        rows = np.column_stack([rows[keep_row], values[keep_value]])
        sums = new[keep_row, keep_value]
    last = total - sums
    fits = (last >= 0) & (last <= most[-1])
    return np.column_stack([rows[fits], last[fits]])


# ----------------------------------------------------------------------------- grids

@dataclass(frozen=True)
class GridChoice:
    """The process grid of one fused group: ``dims[v]`` ranks along index ``indices[v]``.

    ``volume`` is the modeled number of words the busiest rank receives
    (inputs from their source layouts, the output's partial sums reduced into
    its target layout); ``reason`` says why this grid, and why any ranks idle.
    """

    indices: str
    dims: tuple[int, ...]
    output: str
    nprocs: int
    volume: int = 0
    reason: str = ""

    @property
    def used(self) -> int:
        """Ranks with a block of the iteration space: ``prod(dims)``."""
        return math.prod(self.dims)

    @property
    def idle(self) -> int:
        """Ranks left out of the grid (they still hold and send input data)."""
        return self.nprocs - self.used

    @property
    def reduction_dims(self) -> tuple[int, ...]:
        """Grid dimensions of the reduction indices (in ``indices`` but not in ``output``)."""
        return tuple(v for v, c in enumerate(self.indices) if c not in self.output)

    def layout(self, subscripts: str, sizes: Mapping[str, int], partial: bool | None = None) -> Layout:
        """Layout on this grid of the tensor with ``subscripts``.

        ``partial`` (default: ``subscripts == output``) marks the un-reduced
        output: partial over the reduction dims that have more than one rank.
        Pass ``partial=False`` for an input whose subscripts equal the output's.

        >>> c = GridChoice("ijk", (2, 1, 3), "ik", 6, 0, "")
        >>> c.layout("ij", {"i": 4, "j": 5})
        Layout(shape=(4, 5), grid=(2, 1, 3), axes=(0, None), partial=())
        """
        unknown = set(subscripts) - set(self.indices)
        if unknown or len(set(subscripts)) != len(subscripts):
            raise DeinsumError(f"tensor '{subscripts}' on grid over '{self.indices}': "
                               f"{'unknown index ' + repr(sorted(unknown)[0]) if unknown else 'repeated index'}")
        missing = [c for c in subscripts if c not in sizes]
        if missing:
            raise DeinsumError(f"tensor '{subscripts}': no size given for index '{missing[0]}'")
        shape = tuple(sizes[c] for c in subscripts)
        return self._layout(subscripts, shape, subscripts == self.output if partial is None else bool(partial))

    @lru_cache(maxsize=2048)   # (a plan with its bounds asks for up to 1,200 at P = 65,536, 1,820 at 2^20: TTMc-O5)
    def _layout(self, subscripts: str, shape: tuple[int, ...], partial: bool) -> Layout:
        """:meth:`layout` of a checked tensor of ``shape`` (cached: the planner asks for the same blocks again)."""
        summed = tuple(g for g in self.reduction_dims if self.dims[g] > 1) if partial else ()
        axes = tuple(self.indices.index(c) if self.dims[self.indices.index(c)] > 1 else None for c in subscripts)
        return Layout(shape, self.dims, axes, summed)

    def __str__(self) -> str:
        grid = ", ".join(f"{c}={p}" for c, p in zip(self.indices, self.dims))
        return f"grid [{grid}] on {self.used} of {self.nprocs} ranks, {self.volume} words/rank: {self.reason}"


def candidate_grids(nprocs: int, indices: str, sizes: Mapping[str, int]) -> tuple[np.ndarray, str]:
    """Candidate grid dims (rows over ``indices``; a dimension never gets more ranks than its size) and a note.

    The ordered factorisations of ``nprocs``, plus grids on fewer ranks when ``nprocs``
    has a prime factor above SMOOTH_PRIME or no grid of ``nprocs`` fits. When there
    would be more than MAX_CANDIDATE_GRIDS, the smallest indices stay unsplit.

    >>> rows, note = candidate_grids(4, "ij", dict(i=4, j=4))
    >>> rows.tolist(), note
    ([[1, 4], [2, 2], [4, 1]], 'searched 3 grids on 4 ranks')
    """
    caps = [max(1, int(sizes[c])) for c in indices]
    order = sorted(range(len(indices)), key=lambda v: (caps[v], v), reverse=True)
    dropped = []
    while _count_bound(nprocs, caps) > MAX_CANDIDATE_GRIDS:
        v = order.pop()
        caps[v] = 1
        dropped.append(indices[v])
    blocks = [ordered_factorisations(nprocs, caps)]
    if max(prime_factors(nprocs), default=1) > SMOOTH_PRIME or blocks[0].shape[0] == 0:
        for count in _smooth_counts_below(nprocs):
            if len(blocks) > FEWER_RANK_COUNTS:
                break
            rows = ordered_factorisations(count, caps)
            if rows.shape[0]:
                blocks.append(rows)
    counts = [int(b[0].prod()) for b in blocks if b.shape[0]]
    note = f"searched {sum(b.shape[0] for b in blocks)} grids on {', '.join(map(str, counts))} ranks"
    if dropped:
        note += f" (left unsplit: {', '.join(dropped)})"
    return np.concatenate(blocks), note


def _count_bound(n: int, caps: Sequence[int]) -> int:
    """An upper bound on the number of capped ordered factorisations of ``n``."""
    free = sum(1 for c in caps if c > 1)
    return math.prod(math.comb(e + free - 1, free - 1) if free else int(e == 0) for e in prime_factors(n).values())


def _smooth_counts_below(n: int) -> list[int]:
    """Numbers below ``n`` whose prime factors are all <= SMOOTH_PRIME, largest first."""
    counts = {1}
    for prime in (p for p in range(2, SMOOTH_PRIME + 1) if prime_factors(p) == {p: 1}):
        counts |= {c * prime ** e for c in counts for e in range(1, max_power(prime, n) + 1) if c * prime ** e < n}
    return sorted((c for c in counts if c < n), reverse=True)


def estimate_words(indices: str, sizes: Mapping[str, int], dims: np.ndarray, nprocs: int,
                   reads: Sequence[tuple[str, Layout | None]], output: str, target: Layout | None) -> np.ndarray:
    """Estimated words the busiest rank receives, per candidate grid (rows of ``dims``); vectorised.

    ``reads``: ``(subscripts, source)`` of every input; ``source=None`` is a tensor
    whose start the planner chooses (its home on the grid: an all-gather inside
    its replication group, ``B (1 - 1/g)``). A fixed source is charged, at a few
    sample ranks, what the rank's block lacks of it. The output is charged a
    reduce-scatter over its reduction group (``B (1 - 1/R)``), plus, for a fixed
    ``target``, what the target block holds beyond that share. A pre-score only:
    the planner ranks the best candidates again by the exact model.

    >>> dims = np.array([[2, 2, 2], [8, 1, 1]])
    >>> estimate_words("ijk", dict(i=8, j=8, k=8), dims, 8, [("ij", None), ("jk", None)], "ik", None).tolist()
    [24, 56]
    """
    n = np.array([max(int(sizes[c]), 0) for c in indices], dtype=np.int64)
    block = -(-n // dims)                                        # rank 0 holds the largest blocks
    pos = {c: v for v, c in enumerate(indices)}
    used = dims.prod(axis=1)

    def words(sub):
        return np.prod(block[:, [pos[c] for c in sub]], axis=1) if sub else np.ones(len(dims), dtype=np.int64)

    def group(sub):
        return np.prod(dims[:, [v for v, c in enumerate(indices) if c not in sub]], axis=1)

    total = np.zeros(len(dims), dtype=np.float64)
    ranks = np.unique(np.array([0, nprocs // 3, nprocs // 2, nprocs - 1]))[:, None]   # sample ranks x grids
    after = np.cumprod(dims[:, :0:-1], axis=1)[:, ::-1]          # ranks per step of each grid dimension's coords
    for sub, source in reads:
        b = words(sub)
        if source is None:
            total += b * (1 - 1 / group(sub))
            continue
        src_lo, src_hi = source.boxes_of(ranks[:, 0])
        need = np.ones((len(ranks), len(dims)), dtype=np.int64)
        have = np.ones_like(need)
        for x, c in enumerate(sub):
            v = pos[c]
            digit = (ranks // after[:, v] if v < dims.shape[1] - 1 else ranks) % dims[:, v]
            lo, hi = block_range(n[v], dims[:, v], digit)
            need *= hi - lo
            have *= np.clip(np.minimum(hi, src_hi[:, x:x + 1]) - np.maximum(lo, src_lo[:, x:x + 1]), 0, None)
        held = have * (ranks < source.nranks) // source.n_summands
        total += np.maximum(np.where(ranks < used, need - held, 0).max(axis=0), 0)
    out = words(output)
    fan_in = group(output)
    total += out * (1 - 1 / fan_in)
    if target is not None:
        total += np.maximum(target.largest_block() - np.ceil(out / fan_in), 0)
    return np.round(total).astype(np.int64)


def block_imbalance(dims: np.ndarray, indices: str, sizes: Mapping[str, int]) -> np.ndarray:
    """Per grid (rows of ``dims``), the spread of its per-rank block extents in log space: 0 for
    cubic blocks (a tie-break between grids of equal modeled volume).

    >>> block_imbalance(np.array([[2, 2], [4, 1]]), "ij", dict(i=8, j=8)).round(3).tolist()
    [0.0, 0.961]
    """
    extent = np.array([max(sizes[c], 1) for c in indices], dtype=float)
    gap = np.log(extent / dims)
    if gap.shape[1]:
        gap -= gap.mean(axis=1, keepdims=True)
    return (gap ** 2).sum(axis=1)
