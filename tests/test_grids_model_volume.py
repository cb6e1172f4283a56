"""scripts/model_volume.py: the chosen grid never models more volume than the original artifact's grid."""
import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "model_volume.py"


def load_script():
    spec = importlib.util.spec_from_file_location("model_volume", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module        # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_chosen_grid_is_never_worse_than_the_artifact_grid_and_the_soap_column_is_filled(capsys, monkeypatch):
    """One modeling of the suite (the planner at the paper's sizes takes a while) for every check; the SOAP
    column is filled when the soap module is there."""
    script = load_script()
    rows = script.rows()
    assert {r.nprocs for r in rows} == {8, 64, 512}
    compared = [r for r in rows if r.artifact_grid is not None]
    assert len(compared) == len(rows) == 25
    for r in compared:
        assert r.volume <= r.artifact_volume, r
    mm = {r.nprocs: r for r in rows if r.kernel == "1MM"}
    assert mm[512].grid == (8, 8, 8) and mm[512].ratio == 1.0
    if script.soap_bound_function() is None:
        assert all(r.soap_bound is None for r in rows)
    else:
        assert all(r.soap_bound > 0 for r in rows)
    monkeypatch.setattr(script, "rows", lambda: rows)      # main() prints these rows, not a second modeling
    script.main([])
    text = capsys.readouterr().out
    assert "artifact/ours" in text and "MTTKRP-O5-M4" in text and "TTMc-O5 step 4" in text
