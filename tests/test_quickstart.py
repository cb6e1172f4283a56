"""The README's main command: examples/quickstart.py under mpiexec, then the script it writes."""
from pathlib import Path

from mpirun import run_mpi_script

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "quickstart.py"


def test_quickstart_runs_and_its_script_validates(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the example writes mttkrp_program.py into the working directory
    res = run_mpi_script(4, EXAMPLE, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "SOAP I/O lower bound of ijk,ja,ka->ia" in res.stdout
    assert res.stdout.count("(model ") == 8  # two runs, four ranks each
    for line in res.stdout.splitlines():
        if "(model " in line:
            sent, received = line.split("sent ")[1].split(" B, received ")
            assert f"(model {int(sent)}/{int(received.split(' B')[0])})" in line
    script = tmp_path / "mttkrp_program.py"
    res = run_mpi_script(4, script, "--validate", "--repeat", "2", timeout=300)
    assert res.returncode == 0, res.stderr
    assert "validate: OK" in res.stdout and "measured bytes == model" in res.stdout


def test_the_readme_stands_on_its_own():
    """A user's clone has the repository only: the README names no file outside it (issue 30)."""
    from pathlib import Path
    import re
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "../" not in readme
    for target in re.findall(r"\]\(([^)#]+)\)", readme):          # every relative link resolves
        if "://" not in target:
            assert (Path(__file__).resolve().parents[1] / target).exists(), target
