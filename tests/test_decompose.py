"""The einsum front end: grammar, validation, binary steps, sequential executor."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deinsum import DeinsumError
from deinsum.decompose import decompose, parse
from deinsum.program import execute
from suite import SUITE, shapes_for

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
RTOL = {np.float32: 1e-4, np.complex64: 1e-4, np.float64: 1e-10, np.complex128: 1e-10}


def random_operands(shapes, dtype, rng):
    ops = []
    for s in shapes:
        x = rng.uniform(-1, 1, s)
        if np.dtype(dtype).kind == "c":
            x = x + 1j * rng.uniform(-1, 1, s)
        ops.append(np.asarray(x, dtype=dtype))
    return ops


def assert_matches_numpy(eq, shapes, dtype, rng):
    ops = random_operands(shapes, dtype, rng)
    got = execute(decompose(eq, *shapes), *ops)
    want = np.einsum(eq, *ops)
    assert np.shape(got) == np.shape(want), eq
    assert got.dtype == np.asarray(want).dtype, eq
    # error scale: the same einsum over absolute values bounds every rounding error
    scale = np.einsum(eq, *[np.abs(o).astype(np.float64) for o in ops])
    assert np.all(np.abs(got - want) <= RTOL[dtype] * (scale + np.abs(want))), eq


GRAMMAR = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),                 # explicit output
    ("ab,bc", [(3, 4), (4, 5)]),                      # implicit output
    ("ba,cb", [(4, 3), (5, 4)]),                      # implicit output is alphabetical
    ("...ij,...jk->...ik", [(5, 1, 2, 3), (4, 3, 6)]),  # ellipsis with broadcasting
    ("...i,...i", [(2, 3), (3,)]),                    # implicit output keeps ellipsis dims
    ("i...->...", [(3, 2, 2)]),                      # single operand ellipsis
    ("ii->i", [(4, 4)]),                             # diagonal
    ("ii", [(4, 4)]),                                # trace (implicit)
    ("ii->", [(4, 4)]),                              # trace
    ("iij,jk->ik", [(3, 3, 4), (4, 5)]),             # diagonal inside a contraction
    ("ijk->", [(2, 3, 4)]),                          # full sum
    ("ij->ji", [(2, 3)]),                            # transpose
    ("ijk,ja->ia", [(3, 4, 5), (4, 2)]),             # single-operand sum (k)
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),        # batched GEMM
    ("ij,ij->ij", [(3, 4), (3, 4)]),                 # Hadamard
    ("ij,ij->ij", [(1, 4), (3, 4)]),                 # size-1 broadcasting of a labelled index
    ("ja,ka->jka", [(3, 2), (4, 2)]),                # Khatri-Rao
    ("i,j->ij", [(3,), (4,)]),                       # outer product
    ("i,j,k", [(2,), (3,), (4,)]),                   # 3-way outer product
    (",ij->ij", [(), (2, 3)]),                       # 0-d operand
    (",", [(), ()]),                                 # scalars only
    ("ij,jk,kl,lm,mn,no->io", [(2, 3), (3, 4), (4, 5), (5, 2), (2, 3), (3, 2)]),  # many operands
    ("αβ,βγ->αγ", [(2, 3), (3, 4)]),                 # non-ASCII letters
    ("i j , j k -> i k", [(2, 3), (3, 4)]),          # spaces
    ("ij,jk->ik", [(0, 3), (3, 4)]),                 # empty dimension
    ("ijk,jka,ka,al->il", [(4, 5, 6), (5, 6, 3), (6, 3), (3, 7)]),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("eq,shapes", GRAMMAR, ids=[g[0] for g in GRAMMAR])
def test_grammar_table(eq, shapes, dtype):
    if any(ord(c) > 127 for c in eq):  # numpy only takes ASCII: compare with a renamed equation
        ops = random_operands(shapes, dtype, np.random.default_rng(1))
        got = execute(decompose(eq, *shapes), *ops)
        np.testing.assert_allclose(got, np.einsum("ij,jk->ik", *ops), rtol=RTOL[dtype])
    else:
        assert_matches_numpy(eq, shapes, dtype, np.random.default_rng(1))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", sorted(SUITE))
def test_suite_kernels(name, dtype):
    eq, sizes = SUITE[name]
    assert_matches_numpy(eq, shapes_for(eq, sizes), dtype, np.random.default_rng(2))


LETTERS = "abcdefg"


@st.composite
def random_einsums(draw):
    nops = draw(st.integers(2, 6))
    pool = LETTERS[: draw(st.integers(1, 6))]
    sizes = {c: draw(st.integers(1, 7)) for c in pool}
    terms = [draw(st.lists(st.sampled_from(pool), min_size=0, max_size=4)) for _ in range(nops)]
    used = sorted(set("".join("".join(t) for t in terms)))
    if draw(st.booleans()):
        eq = ",".join("".join(t) for t in terms)          # implicit output
    else:
        out = draw(st.permutations(used))[: draw(st.integers(0, len(used)))]
        eq = ",".join("".join(t) for t in terms) + "->" + "".join(out)
    shapes = [tuple(sizes[c] for c in t) for t in terms]
    return eq, shapes


def random_einsum_all_dtypes(case, seed):
    eq, shapes = case
    rng = np.random.default_rng(seed)
    for dtype in DTYPES:
        assert_matches_numpy(eq, shapes, dtype, rng)


def sample(count: int):
    """A test of :func:`random_einsum_all_dtypes` on ``count`` random einsums."""
    return settings(max_examples=count, deadline=None, suppress_health_check=[HealthCheck.too_slow])(
        given(random_einsums(), st.integers(0, 2**32 - 1))(random_einsum_all_dtypes))


test_random_einsums_all_dtypes = sample(250)
test_random_einsums_all_dtypes_1000 = pytest.mark.slow(sample(1000))


MALFORMED = [
    (("ij,jk->ik", (2, 3)), "2 operand(s) but 1 were given"),
    (("ij,jk->ik", (2, 3), (3, 4), (4,)), "2 operand(s) but 3 were given"),
    (("ij,jk->ik", (2, 3), (4, 5)), "operand 1 ('jk'): index 'j' has size 4"),
    (("ij,jk->ik", (2, 3, 1), (3, 4)), "operand 0 ('ij') has 2 indices but 3 dimensions"),
    (("ijk,jk->i", (2, 3, 4), (3,)), "operand 1 ('jk') has 2 indices but 1 dimensions"),
    (("ij,jk->iz", (2, 3), (3, 4)), "output 'iz': index 'z' does not appear"),
    (("ij,jk->ii", (2, 3), (3, 4)), "output 'ii': index 'i' appears more than once"),
    (("i1,1k->ik", (2, 3), (3, 4)), "operand 0 'i1': invalid index character '1'"),
    (("ij,j_->i", (2, 3), (3, 4)), "operand 1 'j_': invalid index character '_'"),
    (("ij,jk->i$", (2, 3), (3, 4)), "output 'i$': invalid index character '$'"),
    (("ij,jk->ik->i", (2, 3), (3, 4)), "more than one '->'"),
    (("ij,jk-ik", (2, 3), (3, 4)), "'-' and '>' may only appear together"),
    (("ij,jk>ik", (2, 3), (3, 4)), "'-' and '>' may only appear together"),
    (("i..j,jk->ik", (2, 3), (3, 4)), "operand 0 'i..j': '.' is only allowed as one ellipsis"),
    (("......i,i->i", (2, 3), (3,)), "operand 0 '......i': '.' is only allowed as one ellipsis"),
    (("...ij,...jk->...ik", (2, 2, 3), (3, 3, 4)), "ellipsis dimension has size 3, but operand 0"),
    (("...ij,jk->ik", (5, 2, 3), (3, 4)), "output 'ik': operands broadcast over '...' but the output has no"),
    (("...ijk,jk->i", (2, 3), (3, 4)), "operand 0 ('...ijk') has 3 indices but only 2 dimensions"),
    (("ii->i", (3, 4)), "operand 0 ('ii'): repeated index 'i' has unequal dimensions [3, 4]"),
    ((42, (2, 3)), "must be a string, not int"),
    (("ij,jk->ik", (2, -3), (3, 4)), "operand 0: shape (2, -3) must be a sequence of non-negative integers"),
    (("ij,jk->ik", (4.5, 5), (5, 6)), "operand 0: shape (4.5, 5) must be a sequence of non-negative integers"),
    (("ij,jk->ik", ("a", 5), (5, 6)), "operand 0: shape ('a', 5) must be"),
    (("...ij->ij",), "operand 0 ('...ij'): '...' needs operand shapes"),
    (("ij,jk->ik", (2, 3), (5, 4)), "but operand 0 ('ij') gives it size 3"),
]


@pytest.mark.parametrize("args,message", MALFORMED, ids=[str(m[0][0]) + "|" + m[1][:24] for m in MALFORMED])
def test_malformed_inputs(args, message):
    with pytest.raises(DeinsumError) as err:
        decompose(*args)
    text = str(err.value)
    assert message in text and "\n" not in text
    assert isinstance(err.value, ValueError)


def test_executor_checks_operand_count():
    d = decompose("ij,jk->ik", (2, 3), (3, 4))
    with pytest.raises(DeinsumError, match="takes 2 operands, got 1"):
        execute(d, np.ones((2, 3)))


def test_steps_kinds_and_table():
    d = decompose("ijk,ja,ka->ia", (30, 30, 30), (30, 24), (30, 24))
    assert [(s.operation, s.kind, s.summed) for s in d.steps] == [
        ("ja,ka->jka", "KRP", ""), ("ijk,jka->ia", "TDOT", "jk")]
    assert d.steps[0].batch == "a"
    table = str(d)
    assert "Complete contraction:  ijk,ja,ka->ia" in table and "KRP" in table and "TDOT" in table
    assert d.flops == sum(s.flops for s in d.steps) and d.flops < d.naive_flops


def test_symbolic_plan_states_assumption():
    d = decompose("ijklm,jb,kc,ld,me->ibcde")
    assert d.sizes is None and "every index of size" in d.assumption
    assert "symbolic" in str(d)
    assert all(s.flops is None for s in d.steps)


def test_real_sizes_change_the_order():
    # a tiny rank R makes contracting the big tensor last the cheap order
    small = decompose("ij,jk,kl->il", (1000, 2), (2, 1000), (1000, 1000))
    big = decompose("ij,jk,kl->il", (1000, 1000), (1000, 2), (2, 1000))
    assert small.steps[0].operands != big.steps[0].operands


def test_parse_expands_ellipsis():
    p = parse("...ij,...jk->...ik", (5, 1, 2, 3), (4, 3, 6))
    assert len(p.output) == 4 and p.sizes[p.output[0]] == 5 and p.sizes[p.output[1]] == 4
