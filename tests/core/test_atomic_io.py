"""Atomic writes never replace what is not a regular file, keep symlinks, and clean up only their own temp files."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from torchrepro._core.errors import OutputDirError
from torchrepro._core.io import atomic_write, atomic_write_bytes, stale_temps
from torchrepro.cli import main


def _fifo_reader(path: Path, got: list[bytes]) -> threading.Thread:
    def read() -> None:
        with open(path, "rb") as f:
            got.append(f.read())

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


# --- item: never replace a non-regular file; keep symlinks ------------------------------------------------
def test_env_output_through_a_symlink_updates_the_target_and_keeps_the_link(tmp_path, capsys):
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    target = real_dir / "env.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert main(["env", "-o", str(link)]) == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text())["torchrepro"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "real"]  # no temp left beside the link
    assert [p.name for p in real_dir.iterdir()] == ["env.json"]


def test_env_output_into_a_fifo_writes_through_it(tmp_path, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = _fifo_reader(fifo, got)
    assert main(["env", "-o", str(fifo)]) == 0
    reader.join(timeout=60)
    assert json.loads(got[0])["torchrepro"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]
    capsys.readouterr()
    import socket

    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tmp_path / "s.sock"))
        assert main(["env", "-o", str(tmp_path / "s.sock")]) == 2
        assert capsys.readouterr().err == (f"torchrepro: error: -o {tmp_path / 's.sock'}: is a socket, not a "
                                           "regular file; torchrepro does not replace it: name a file.\n")
    finally:
        sock.close()


def test_atomic_write_into_a_fifo_keeps_the_fifo(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = _fifo_reader(fifo, got)
    atomic_write_bytes(fifo, b"through")
    reader.join(timeout=60)
    assert got == [b"through"] and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_atomic_write_to_dev_null_keeps_the_device():
    atomic_write_bytes("/dev/null", b"nothing")
    mode = os.lstat("/dev/null").st_mode
    assert stat.S_ISCHR(mode) and os.major(os.lstat("/dev/null").st_rdev) == 1


def test_env_output_to_dev_stdout_is_printed(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    p = subprocess.run([sys.executable, "-m", "torchrepro", "env", "-o", "/dev/stdout"], capture_output=True,
                       text=True, timeout=120, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["torchrepro"]
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    out = tmp_path / "out.json"  # `env -o /dev/stdout > out.json`: written into the file the shell opened
    with open(out, "wb") as f:
        inode = os.fstat(f.fileno()).st_ino
        p = subprocess.run([sys.executable, "-m", "torchrepro", "env", "-o", "/dev/stdout"], stdout=f,
                           stderr=subprocess.PIPE, text=True, timeout=120, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(out.read_text())["torchrepro"] and out.stat().st_ino == inode
    assert [x.name for x in tmp_path.iterdir()] == ["out.json"]


def test_a_directory_or_a_socket_is_refused_and_kept(tmp_path):
    with pytest.raises(OutputDirError, match=r"is a directory, not a file; name a file to write"):
        atomic_write_bytes(tmp_path, b"x")
    assert tmp_path.is_dir()
    import socket

    sock_path = tmp_path / "s.sock"
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(sock_path))
        with pytest.raises(OutputDirError, match=r"s.sock: is a socket, not a regular file; torchrepro does not "
                                                 r"replace it: name a file"):
            atomic_write_bytes(sock_path, b"x")
        assert stat.S_ISSOCK(os.lstat(sock_path).st_mode)
    finally:
        sock.close()


def test_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "a.json"
    link.symlink_to(tmp_path / "b.json")
    atomic_write_bytes(link, b"{}")
    assert link.is_symlink() and (tmp_path / "b.json").read_bytes() == b"{}"


# --- item: stale temp files of a killed writer are removed, nothing else ---------------------------------------
def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_temps_of_dead_writers_are_removed_and_nothing_else(tmp_path):
    target = tmp_path / "ckpt.pt"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        dead = tmp_path / f".ckpt.pt.torchrepro-{_dead_pid()}-abc12345.tmp"
        live = tmp_path / f".ckpt.pt.torchrepro-{sleeper.pid}-def67890.tmp"
        other_target = tmp_path / f".other.pt.torchrepro-{_dead_pid()}-abc12345.tmp"
        foreign = tmp_path / ".ckpt.pt.XYZ.tmp"  # not our pattern (another tool's, or an older torchrepro's)
        fresh_dead = tmp_path / f".ckpt.pt.torchrepro-{_dead_pid()}-fresh123.tmp"
        for p in (dead, live, other_target, foreign, fresh_dead):
            p.write_bytes(b"x" * 100)
        old = time.time() - 600
        for p in (dead, live, other_target, foreign):
            os.utime(p, (old, old))
        atomic_write(target, lambda f: f.write(b"new"), clean_stale=True)
        left = sorted(p.name for p in tmp_path.iterdir())
        assert left == sorted(p.name for p in (target, live, other_target, foreign, fresh_dead))
        assert target.read_bytes() == b"new"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_stale_temps_are_only_regular_files_of_the_pattern(tmp_path):
    target = tmp_path / "c.pt"
    name = f".c.pt.torchrepro-{_dead_pid()}-aaaa1111.tmp"
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "keep").write_text("k")
    (tmp_path / name).symlink_to(tmp_path / "d")  # a symlink of our pattern: never followed, never removed
    old = time.time() - 600
    os.utime(tmp_path / name, (old, old), follow_symlinks=False)
    assert stale_temps(target) == []
    assert (tmp_path / "d" / "keep").exists()


def test_temp_name_carries_the_writers_pid(tmp_path):
    seen: list[str] = []

    def write(f) -> None:
        seen.extend(p.name for p in tmp_path.iterdir())
        f.write(b"x")

    atomic_write(tmp_path / "out.json", write)
    assert len(seen) == 1 and seen[0].startswith(f".out.json.torchrepro-{os.getpid()}-") and seen[0].endswith(".tmp")


def test_figures_are_written_atomically_through_a_symlink(tmp_path):
    plt = pytest.importorskip("matplotlib.pyplot")
    from torchrepro.cli._series import save_figure

    (tmp_path / "real.png").write_bytes(b"old")
    link = tmp_path / "plot.png"
    link.symlink_to(tmp_path / "real.png")
    fig = plt.figure()
    fig.add_subplot().plot([1, 2])
    save_figure(fig, link)
    assert link.is_symlink() and (tmp_path / "real.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plot.png", "real.png"]
