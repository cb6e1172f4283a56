"""scripts/bench_suite.py and its modules: paper sizes and grids, guarded model sweep, MPI worker, a tiny run."""
import json
import sys
from pathlib import Path

from mpirun import run_mpi_script

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import bench_suite  # noqa: E402
import model_volume  # noqa: E402
from suite_model import model_row, sweep  # noqa: E402
from suite_sizes import artifact_groups, weak_scaling_sizes  # noqa: E402

import deinsum  # noqa: E402


def test_weak_scaling_sizes_follow_benchmarks_md():
    assert weak_scaling_sizes("MTTKRP-O3-M1", 16) == dict(i=2048, j=2048, k=2048, a=48)
    assert weak_scaling_sizes("MTTKRP-O3-M0", 4096) == dict(i=8192, j=8192, k=8192, a=192)   # the P^(1/4) rule
    assert weak_scaling_sizes("3MM", 8) == dict.fromkeys("ijklm", 8192)
    assert weak_scaling_sizes("TTMc-O5-M0", 512) == dict(i=192, j=192, k=192, l=192, m=192, b=68, c=68, d=68, e=68)


def test_artifact_grids_where_benchmarks_md_lists_them():
    assert [grid for _, grid in artifact_groups("MTTKRP-O3-M2", 4)] == [(1, 2, 2, 1)]
    assert artifact_groups("MTTKRP-O3-M0", 16) == [] and artifact_groups("1MM", 4096) == []
    assert len(artifact_groups("TTMc-O5-M0", 512)) == 4 and artifact_groups("TTMc-O5-M0", 64) == []


def test_model_row_is_the_plan_and_the_artifact_volume_is_model_volumes():
    row = model_row("1MM", 8)
    n = 8192
    plan = deinsum.compile("ij,jk->ik", (n, n), (n, n)).plan(nprocs=8, inputs="local", result="distributed")
    assert row.received_max == max(r for _, r in plan.model_bytes())
    assert row.grids == ["ijk=" + "x".join(map(str, plan.groups[0].grid.dims))]
    group, sizes, artifact = model_volume.SUITE[0]          # 1MM: its artifact grid's volume, without the suite's
    assert group.kernel == "1MM"
    theirs = model_volume.grid_volume(group.indices, sizes(8), group.inputs, group.output, 8, artifact[8])
    assert row.artifact_bytes == 8 * theirs
    assert row.received_max >= row.schedule_bound >= row.lower_bound > 0   # no plan moves less than its bound
    assert row.construction == 8 * 25_165_824 and row.ratio_to_construction <= 1.10


def test_sweep_reports_plans_over_the_time_or_memory_limit(monkeypatch):
    """The children fork with the planner replaced: one never finishes, one asks for 8 GiB (deterministic)."""
    import time

    import numpy as np
    import suite_model

    real = suite_model.model_row
    monkeypatch.setattr(suite_model, "model_row", lambda kernel, nprocs: (
        time.sleep(3600) if kernel == "TTMc-O5-M0" else np.ones(2**30) if kernel == "3MM" else real(kernel, nprocs)))
    slow, starved, ok = sweep(["TTMc-O5-M0", "3MM", "MTTKRP-O3-M0"], [2], limit_s=5, limit_gib=1, workers=3)
    assert "5 s time limit" in slow.failure and slow.received_max is None   # (the real plan: well under 1 s)
    assert "1 GiB memory limit" in starved.failure and starved.received_max is None
    assert not ok.failure and ok.received_max > 0


def test_worker_times_phases_and_counts_bytes(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"threads": 1, "repeat": 5, "kernels": [
        {"name": "1MM", "equation": "ij,jk->ik", "sizes": {"i": 64, "j": 48, "k": 32}}]}))
    res = run_mpi_script(2, SCRIPTS / "suite_worker.py", str(spec), str(tmp_path / "out.json"), timeout=60)
    assert res.returncode == 0, res.stderr
    (run,) = json.loads((tmp_path / "out.json").read_text())["kernels"]
    assert len(run["wall"]) == len(run["in_grid"]) == len(run["phases"]["compute"]) == 5
    assert run["matches_model"] and run["bytes_received"] == run["model_received"]


def test_one_tiny_run_writes_tables_plots_and_targets(tmp_path, capsys):
    out = tmp_path / "results"
    assert bench_suite.main(["--kernels", "1MM", "MTTKRP-O3-M0", "--procs-model", "1", "8", "--procs-run", "1", "2",
                             "--scale", "0.1", "--repeat", "5", "--speedup-n", "96", "--timeout", "90",
                             "--out", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert names == {"README.md", "model_sweep.csv", "model_sweep.json", "measured.csv", "measured.json",
                     "volume_vs_bound.png", "time_breakdown.png"}
    summary = (out / "README.md").read_text()
    assert summary.count("Conditions") == 4 and "| kernel | P |" in summary
    threads = bench_suite.cores()
    assert f"MTTKRP-O3-M0: P=1 ({threads} threads) / opt_einsum ({threads} threads)" in summary
    targets = json.loads((out / "measured.json").read_text())["targets"]
    assert len(targets) == 2 + 1 + 2 and all(t[3] in ("PASS", "FAIL") for t in targets)
    assert len((out / "model_sweep.csv").read_text().splitlines()) == 1 + 2 * 2
    assert "ours/bound" in capsys.readouterr().out
