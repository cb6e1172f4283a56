"""Deterministic random einsums for the distributed tests (shared by test modules)."""
import numpy as np

LETTERS = "abcdefg"


def random_einsums(count, seed=0, max_ops=4, max_size=6):
    """``count`` (equation, shapes) pairs: 2..max_ops operands, sizes 1..max_size, batch and repeated
    indices, implicit output."""
    rng = np.random.default_rng(seed)
    cases = []
    while len(cases) < count:
        nops = int(rng.integers(2, max_ops + 1))
        pool = LETTERS[: int(rng.integers(2, 6))]
        sizes = {c: int(rng.integers(1, max_size + 1)) for c in pool}
        terms = ["".join(rng.choice(list(pool), size=min(len(pool), int(rng.integers(1, 4))), replace=False))
                 for _ in range(nops)]
        if rng.random() < 0.15:  # a repeated index (diagonal) in one operand
            terms[0] += terms[0][0]
        used = sorted(set("".join(terms)))
        if rng.random() < 0.3:
            eq = ",".join(terms)
        else:
            keep = [c for c in used if rng.random() < 0.5]
            eq = ",".join(terms) + "->" + "".join(rng.permutation(keep)) if keep else ",".join(terms) + "->"
        cases.append((eq, [tuple(sizes[c] for c in t) for t in terms]))
    return cases
