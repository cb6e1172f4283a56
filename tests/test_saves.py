"""Issue 30, items 2, 3 and 8: saves write only regular files (a symlink through to its target), atomically;
no temporary file outlives a killed save; --validate takes the NaN and infinities numpy has as equal."""
import os
import signal
import socket
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

import deinsum
from deinsum.runtime import checks

BIG = 40 * 2**20   # float64s: a 320 MB save, long enough to be killed in the middle


def _node(path):
    info = os.lstat(path)
    return info.st_mode, info.st_rdev, info.st_ino, info.st_mtime_ns


def _device(folder):
    path = folder / "dev"
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 7))   # what /dev/full is
    except PermissionError:
        pytest.skip("mknod is not permitted here")
    return path, "is a character device, not a regular file"


def _fifo(folder):
    os.mkfifo(folder / "fifo")
    return folder / "fifo", "is a FIFO, not a regular file"


def _directory(folder):
    (folder / "dir").mkdir()
    (folder / "dir" / "keep").write_text("x")
    return folder / "dir", "is a directory"


def _link_to_fifo(folder):
    os.mkfifo(folder / "fifo")
    os.symlink("fifo", folder / "link")
    return folder / "link", "is a FIFO, not a regular file"


@pytest.mark.parametrize("make", [_device, _fifo, _directory, _link_to_fifo])
def test_saves_refuse_what_is_not_a_regular_file_and_leave_it_untouched(tmp_path, make):
    path, message = make(tmp_path)
    before = {p.name: _node(p) for p in tmp_path.rglob("*")}
    for save in (lambda: checks.save_atomically(path, np.arange(3)),
                 lambda: checks.write_atomically(path, lambda f: f.write(b"x"))):
        with pytest.raises(ValueError, match=message) as info:
            save()
        assert "\n" not in str(info.value)
    with pytest.raises(deinsum.DeinsumError, match=message):
        deinsum.compile("ij,jk->ik", (2, 3), (3, 2)).to_script(path, nprocs=1)
    assert {p.name: _node(p) for p in tmp_path.rglob("*")} == before


def test_an_empty_path_is_refused():
    with pytest.raises(ValueError, match="^output '' is an empty path, expected a file name$"):
        checks.save_atomically("", np.arange(3))


def test_a_symlink_is_written_through_to_its_target(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "out.npy").write_text("old")
    os.symlink("data/out.npy", tmp_path / "link.npy")
    os.symlink("data/new.npy", tmp_path / "dangling.npy")
    checks.save_atomically(tmp_path / "link.npy", np.arange(3))
    checks.save_atomically(tmp_path / "dangling.npy", np.arange(4))
    assert (tmp_path / "link.npy").is_symlink() and (tmp_path / "dangling.npy").is_symlink()
    assert np.load(tmp_path / "data" / "out.npy").tolist() == [0, 1, 2]
    assert np.load(tmp_path / "data" / "new.npy").tolist() == [0, 1, 2, 3]
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["dangling.npy", "data", "link.npy", "new.npy", "out.npy"]


def _temporaries(folder):
    return [p.name for p in folder.iterdir() if "deinsum-tmp" in p.name]


def _start_big_save(target):
    """A process that saves :data:`BIG` float64s to ``target``; returned once its temporary file grows."""
    code = f"import numpy as np; from deinsum.runtime import checks; checks.save_atomically({str(target)!r}, " \
           f"np.arange({BIG}, dtype=np.float64))"
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        sizes = [p.stat().st_size for p in target.parent.iterdir() if "deinsum-tmp" in p.name]
        if sizes and sizes[0] > 2**20:
            return proc
        time.sleep(0.005)
    proc.kill()
    pytest.fail("the save did not start, or ended before it could be interrupted")


def test_a_save_killed_with_sigkill_leaves_no_temporary_after_the_next_save(tmp_path):
    target = tmp_path / "out.npy"
    proc = _start_big_save(target)
    proc.kill()
    proc.wait(timeout=30)
    assert _temporaries(tmp_path) == [f".out.npy.deinsum-tmp.{socket.gethostname()}.{proc.pid}"]
    assert not target.exists()   # never a half-written target
    want = np.arange(BIG, dtype=np.float64)
    checks.save_atomically(target, want)
    assert _temporaries(tmp_path) == []
    assert np.array_equal(np.load(target, mmap_mode="r"), want)


def test_a_save_stopped_with_sigterm_removes_its_temporary(tmp_path):
    target = tmp_path / "out.npy"
    proc = _start_big_save(target)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM   # it still dies of the signal
    assert _temporaries(tmp_path) == [] and not target.exists()


def test_only_temporaries_of_dead_processes_on_this_host_are_removed(tmp_path):
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    try:
        prefix = f".out.npy.deinsum-tmp.{socket.gethostname()}."
        names = [f"{prefix}{live.pid}", f"{prefix}{dead.pid}", f"{prefix}{os.getpid()}",
                 f".out.npy.deinsum-tmp.elsewhere.{dead.pid}", f".other.npy.deinsum-tmp.{socket.gethostname()}.1"]
        for name in names:
            (tmp_path / name).write_text("stale?")
        checks.save_atomically(tmp_path / "out.npy", np.arange(3))
        assert sorted(_temporaries(tmp_path)) == sorted(names[:1] + names[3:])
    finally:
        live.kill()
        live.wait(timeout=30)


def test_emitted_script_refuses_an_empty_save_path_or_a_fifo(tmp_path):
    script = deinsum.compile("ij,jk->ik", (3, 2), (2, 2)).to_script(tmp_path / "p.py", nprocs=1)
    os.mkfifo(tmp_path / "fifo")
    for target, message in [("", "output '' is an empty path"), (tmp_path / "fifo", "is a FIFO")]:
        res = subprocess.run([sys.executable, str(script), "--save", str(target)], capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 2 and message in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and "total" not in res.stdout
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)


def test_validate_counts_matching_nan_and_infinities_as_equal(tmp_path):
    script = deinsum.compile("ij,jk->ik", (2, 2), (2, 2)).to_script(tmp_path / "p.py", nprocs=1)
    np.save(tmp_path / "a.npy", np.array([[np.nan, 1.0], [2.0, np.inf]]))
    np.save(tmp_path / "b.npy", np.array([[1.0, 0.0], [0.0, 1.0]]))
    res = subprocess.run([sys.executable, str(script), "--validate", "--load", str(tmp_path / "a.npy"),
                          str(tmp_path / "b.npy")], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONWARNINGS="error"))
    assert res.returncode == 0 and "validate: OK (max abs error 0)" in res.stdout, res.stdout + res.stderr
    assert "Warning" not in res.stderr, res.stderr
