"""The Python API in one process (MPI singleton, P = 1): semantics, caching, errors."""
import json

import numpy as np
import pytest

import deinsum
from deinsum import DeinsumError


def test_einsum_matches_numpy_and_model():
    rng = np.random.default_rng(0)
    x, a, b = rng.standard_normal((5, 4, 3)), rng.standard_normal((4, 2)), rng.standard_normal((3, 2))
    np.testing.assert_allclose(deinsum.einsum("ijk,ja,ka->ia", x, a, b), np.einsum("ijk,ja,ka->ia", x, a, b))


def test_parametric_program_plans_per_shape_and_caches():
    prog = deinsum.compile("...ij,...jk->...ik")
    for shapes in [((2, 3, 4), (2, 4, 5)), ((3, 4), (4, 2))]:
        a, b = (np.random.default_rng(1).standard_normal(s) for s in shapes)
        np.testing.assert_allclose(prog(a, b), np.einsum("...ij,...jk->...ik", a, b))
        assert prog.last_run.matches_model
    assert prog.plan([(3, 4), (4, 2)], nprocs=1) is prog.plan([(3, 4), (4, 2)], nprocs=1)


def test_mixed_dtypes_follow_numpy():
    a = np.ones((3, 4), dtype=np.float32)
    b = np.ones((4, 2), dtype=np.complex64)
    out = deinsum.einsum("ij,jk->ik", a, b)
    assert out.dtype == np.einsum("ij,jk->ik", a, b).dtype


def test_reports_in_three_formats():
    prog = deinsum.compile("ijk,ja,ka->ia", (40, 30, 20), (30, 8), (20, 8))
    assert "SOAP I/O lower bound" in prog.report(nprocs=4) and "deinsum plan" in prog.report(nprocs=4)
    assert "\\toprule" in prog.report("latex")
    data = json.loads(prog.report("json", nprocs=4))
    assert len(data["received_bytes_per_rank"]) == 4 and len(data["peak_bytes_per_rank"]) == 4


def test_report_names_each_groups_local_kernel_and_gemm_library():
    """The kernel the cost model picks for rank 0's blocks, and the GEMM library, in text and JSON."""
    from deinsum.runtime.blas import gemm_library
    from deinsum.program import local_kernels
    prog = deinsum.compile("ijk,ja,ka->ia", (41, 30, 20), (30, 8), (20, 8))
    plan = prog.plan(nprocs=4)
    text = prog.report(nprocs=4)
    assert f"local kernels on rank 0's blocks (a cost model's pick; GEMMs: {gemm_library()}):" in text
    assert "\n    group 0: MTTKRP to (i): GEMM over (" in text
    assert json.loads(prog.report("json", nprocs=4))["local_kernels"] == {"gemm": gemm_library(),
                                                                         "rank 0": local_kernels(plan)}


def test_plan_is_pure_for_any_p():
    prog = deinsum.compile("ij,jk->ik", (97, 89), (89, 83))
    for p in (1, 7, 11, 13, 1000):
        plan = prog.plan(nprocs=p, inputs="local", result="distributed")
        assert all(g.grid.used <= p for g in plan.groups)
        assert len(plan.received_bytes()) == p


@pytest.mark.parametrize("call, message", [
    (lambda: deinsum.compile("ij,jk->ik", (2, 3), (3, 4))(np.ones((2, 3))), "takes 2 operands, got 1"),
    (lambda: deinsum.compile("ij,jk->ik", (2, 3), (3, 4)).plan(nprocs=0), "nprocs=0: expected a number of ranks, an integer from 1 to 16,777,216"),
    (lambda: deinsum.compile("ij,jk->ik", (2, 3), (3, 4)).plan(nprocs=2, inputs="disk"), "inputs='disk'"),
    (lambda: deinsum.compile("ij,jk->ik", (2, 3), (3, 4)).plan(nprocs=2, result="cloud"), "result='cloud'"),
    (lambda: deinsum.compile("ij,jk->ik", dtype="float1024"), "not a numpy data type"),
    (lambda: deinsum.compile("ij,jk->ik", dtype=bool), "expected an integer, float or complex"),
    (lambda: deinsum.compile("ij,jk->ik").plan(nprocs=2), "compiled without shapes"),
    (lambda: deinsum.compile("ij,jk->ik", (2, 3), (3, 4)).plan(), "number of ranks is unknown"),
    (lambda: deinsum.compile("...ij->ij").report(), "need shapes"),
    (lambda: deinsum.einsum("ij->ji", np.ones((2, 3)), inputs="local"), "pass shapes=[...], one per operand"),
    (lambda: deinsum.compile("ij,jk->ik", nprocs=2.5), "nprocs=2.5: expected a number of ranks"),
    (lambda: deinsum.compile("ij,jk->ik", nprocs=0), "nprocs=0: expected a number of ranks"),
    (lambda: deinsum.compile("ij,jk->ik", (2, 3), (3, 4)).analysis(nprocs=np.int64(0)), "nprocs=0: expected"),
    (lambda: deinsum.compile("ij,jk->ik", (2, 3), (3, 4), layouts="even"), "layouts='even': expected a dict"),
    (lambda: deinsum.compile("ij,jk->ik", layouts=["even"]), "layouts=['even']: expected a dict"),
    (lambda: deinsum.einsum("ij,jk->ik", np.ones((2, 3)), np.ones((3, 4)), comm="world"),
     "comm='world': expected an mpi4py communicator"),
    (lambda: deinsum.compile("ij,jk->ik", memory="x"), "memory='x': expected bytes >= 1, as an integer or with a unit (4GiB, 500MB)"),
    (lambda: deinsum.compile("ij,jk->ik", memory=float("inf")), "memory=inf: expected bytes >= 1, as an integer or with a unit (4GiB, 500MB)"),
    (lambda: deinsum.compile("ij,jk->ik", memory=-5), "memory=-5: expected bytes >= 1, as an integer or with a unit (4GiB, 500MB)"),
    (lambda: deinsum.compile("ij,jk->ik", memory="2 parsecs"), "memory='2 parsecs': expected bytes >= 1, as an integer or with a unit (4GiB, 500MB)"),
    (lambda: deinsum.compile("ij,jk->ik", threads="many"), "threads='many': expected one of auto, None"),
    (lambda: deinsum.compile("ij,jk->ik", (2, 3), (3, 4), result="bogus"),
     "result='bogus': expected one of all, root, distributed"),
    (lambda: deinsum.compile("ij,jk->ik", inputs="disk"), "inputs='disk': expected one of global, root, local"),
    (lambda: deinsum.compile("ij,jk->ik", (2, 3), (3, 4), layouts={"out": "even"}).report(nprocs=2),
     "layouts: 'out' pins the layout of a distributed result: pass result='distributed', not 'all'"),
    (lambda: deinsum.compile("ij,jk->ik", layouts={"out": "even"}, result="root")(np.ones((2, 3)), np.ones((3, 4))),
     "pass result='distributed', not 'root'"),
    (lambda: deinsum.compile("ij,jk->ik", (2, 3), (3, 4)).input_blocks(9, 2), "input_blocks: rank 9 is not a rank of 2"),
    (lambda: deinsum.compile("ij,jk->ik", (2, 3), (3, 4), nprocs=2)(np.ones((2, 3)), np.ones((3, 4))),
     "compiled for nprocs=2, called on 1 rank(s)"),
    (lambda: deinsum.compile("ij,jk->ik", (2, 3), (3, 4)).input_blocks(-1, 2), "rank -1 is not a rank of 2"),
    (lambda: deinsum.compile("ij,jk->ik", inputs="root")(np.ones((2, 3)), None),
     "operand 1 is None: with inputs='root' rank 0 passes the whole arrays"),
    (lambda: deinsum.einsum("ij,jk->ik", np.ones((2, 3), bool), np.ones((3, 4), bool)),
     "dtype bool: expected an integer, float or complex type"),
    (lambda: deinsum.compile("ij,jk->ik", (2, 3), (3, 4))(np.ones((2, 3)), np.ones((3, 4)), inputs="local"),
     None),
    (lambda: deinsum.compile("ij,jk->ik", (2, 3), (3, 4)).report("pdf"), "report format 'pdf'"),
    (lambda: deinsum.compile(["ij"]), "must be a string"),
    (lambda: deinsum.compile("ij,jk->ik", layouts={2: "even"}), "layouts: 'in2' is not a tensor of 'ij,jk->ik'"),
])
def test_errors_are_one_line_deinsum_errors(call, message):
    if message is None:  # a correct call: local blocks at P = 1 are the whole arrays
        assert call().shape == (2, 4)
        return
    with pytest.raises(DeinsumError) as err:
        call()
    assert message in str(err.value) and "\n" not in str(err.value)


def test_local_blocks_of_wrong_shape_are_named():
    prog = deinsum.compile("ij,jk->ik", (2, 3), (3, 4))
    with pytest.raises(DeinsumError, match=r"operand 0: rank 0 must pass its block of shape \(2, 3\)"):
        prog(np.ones((2, 2)), np.ones((3, 4)), inputs="local")


def test_every_entry_point_takes_numpy_integers_for_nprocs():
    prog = deinsum.compile("ij,jk->ik", (8, 6), (6, 4))
    assert prog.plan(nprocs=np.int64(4)).nprocs == 4
    assert prog.analysis(nprocs=np.int64(4)).P == prog.analysis(nprocs=4).P == 4
    assert prog.report(nprocs=np.int64(4)) == prog.report(nprocs=4)
    assert deinsum.compile("ij,jk->ik", nprocs=np.int32(3)).nprocs == 3
