"""The paper's benchmark suite (../shared/notes/benchmarks.md) at small sizes, shared by tests."""
SUITE = {
    "1MM": ("ij,jk->ik", {"i": 7, "j": 5, "k": 6}),
    "2MM": ("ij,jk,kl->il", {"i": 7, "j": 5, "k": 6, "l": 4}),
    "3MM": ("ij,jk,kl,lm->im", {"i": 7, "j": 5, "k": 6, "l": 4, "m": 3}),
    "MTTKRP-O3-M0": ("ijk,ja,ka->ia", {"i": 7, "j": 6, "k": 5, "a": 3}),
    "MTTKRP-O3-M1": ("ijk,ia,ka->ja", {"i": 7, "j": 6, "k": 5, "a": 3}),
    "MTTKRP-O3-M2": ("ijk,ia,ja->ka", {"i": 7, "j": 6, "k": 5, "a": 3}),
    "MTTKRP-O5-M0": ("ijklm,ja,ka,la,ma->ia", {"i": 5, "j": 4, "k": 3, "l": 4, "m": 3, "a": 2}),
    "MTTKRP-O5-M2": ("ijklm,ia,ja,la,ma->ka", {"i": 5, "j": 4, "k": 3, "l": 4, "m": 3, "a": 2}),
    "MTTKRP-O5-M4": ("ijklm,ia,ja,ka,la->ma", {"i": 5, "j": 4, "k": 3, "l": 4, "m": 3, "a": 2}),
    "TTMc-O5-M0": ("ijklm,jb,kc,ld,me->ibcde", {"i": 5, "j": 4, "k": 3, "l": 4, "m": 3,
                                                "b": 2, "c": 3, "d": 2, "e": 2}),
}


def shapes_for(eq, sizes):
    return [tuple(sizes[c] for c in term) for term in eq.split("->")[0].split(",")]
