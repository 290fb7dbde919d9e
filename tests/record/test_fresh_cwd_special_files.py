"""`check --fresh-cwd` copies regular files, folders and symlinks only: a FIFO, socket or device in the working
directory is never opened, but left out and named (before: a character device such as /dev/zero was read until
the disk was full, 73.6 GB). Every copy here runs under RLIMIT_FSIZE, so a regression fails instead of filling
the disk."""

from __future__ import annotations

import errno
import json
import os
import resource
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import torchrepro.record.workdir as wd
from tests.record.test_workdir import PLAIN  # the same tiny seeded training script

SRC = str(Path(__file__).resolve().parents[2] / "src")
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
FSIZE = 32 * 2**20  # no file written under the limit grows past it: /dev/zero read into a copy stops there


def _bounded() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE, FSIZE))


def _specials(root: Path) -> None:
    """``zero`` (a character device, /dev/zero's numbers), ``sub/zero`` (another) and ``pipe`` (a FIFO)."""
    (root / "sub").mkdir(exist_ok=True)
    try:
        for path in (root / "zero", root / "sub" / "zero"):
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("mknod of a character device is not permitted here (needs root or CAP_MKNOD)")
    os.mkfifo(root / "pipe")


def test_a_copy_leaves_out_devices_and_fifos_and_names_them(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "data.txt").write_text("kept")
    (work / "link").symlink_to("/dev/zero")  # a symlink stays a link, whatever it points to
    _specials(work)
    code = textwrap.dedent(f"""
        import json, os
        from pathlib import Path
        from torchrepro.record.workdir import check_copyable, copy_workdir
        check_copyable(Path({str(work)!r}))
        copy = copy_workdir(Path({str(work)!r}), Path({str(tmp_path / "copy")!r}))
        print(json.dumps({{"path": str(copy.path), "left_out": copy.left_out}}))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=ENV,
                       preexec_fn=_bounded)
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    got = json.loads(p.stdout)
    copy = tmp_path / "copy"
    assert got == {"path": str(copy.resolve()),
                   "left_out": {"pipe": "FIFO", "zero": "character device", "sub/zero": "character device"}}
    assert sorted(os.listdir(copy)) == ["data.txt", "link", "sub"] and os.listdir(copy / "sub") == []
    assert (copy / "data.txt").read_text() == "kept" and os.readlink(copy / "link") == "/dev/zero"
    assert wd.left_out_text(got["left_out"], work) == (
        f"--fresh-cwd copies only the regular files, folders and symlinks of the working directory {work}; it left "
        "out pipe (FIFO), sub/zero (character device), zero (character device), which the runs' copies do not "
        "hold: a script that needs one must open it by its absolute path.")


def test_the_limits_count_only_what_is_copied(tmp_path, monkeypatch):
    """Entries left out (FIFOs) do not count against COPY_FILES; only regular files' bytes against COPY_BYTES."""
    for name in ("a", "b", "c"):
        os.mkfifo(tmp_path / f"pipe-{name}")
    (tmp_path / "train.py").write_text("x" * 100)
    (tmp_path / "folder").mkdir()
    monkeypatch.setattr(wd, "COPY_FILES", 2)
    monkeypatch.setattr(wd, "COPY_BYTES", 150)  # a folder's st_size (4096 on ext4) is no byte copied
    wd.check_copyable(tmp_path)
    (tmp_path / "more.txt").write_text("y" * 60)
    with pytest.raises(wd.WorkdirCopyError, match="holds more than 2 files"):
        wd.check_copyable(tmp_path)


def test_a_copy_that_fails_part_way_removes_only_what_it_made(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "out").mkdir()
    for i in range(4):
        (work / f"f{i}.txt").write_text(str(i) * 10)
    real_read = os.read
    reads = []

    def failing_read(fd: int, n: int) -> bytes:
        reads.append(fd)
        if len(reads) > 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_read(fd, n)

    monkeypatch.setattr(os, "read", failing_read)
    with pytest.raises(wd.WorkdirCopyError) as err:
        wd.copy_workdir(work, tmp_path / "out" / "run1-cwd")
    monkeypatch.undo()
    assert str(err.value).startswith(f"--fresh-cwd: could not copy the working directory {work} to "
                                     f"{tmp_path / 'out' / 'run1-cwd'} (")
    assert str(err.value).endswith("nothing of the copy was kept. Free disk space or fix the permissions, or drop "
                                   "--fresh-cwd.")
    assert os.listdir(tmp_path / "out") == [] and sorted(os.listdir(work)) == [f"f{i}.txt" for i in range(4)]

    # the working directory grew past COPY_BYTES since it was checked: stopped there, the copy removed
    monkeypatch.setattr(wd, "COPY_BYTES", 25)
    with pytest.raises(wd.WorkdirCopyError, match=r"grew past 0 MiB while it was copied; nothing of the copy"):
        wd.copy_workdir(work, tmp_path / "out" / "run1-cwd")
    assert os.listdir(tmp_path / "out") == []

    # something that is not an earlier copy in the copy's place is not torchrepro's: left alone
    (tmp_path / "out" / "run1-cwd").write_text("someone else's")
    monkeypatch.undo()
    with pytest.raises(wd.WorkdirCopyError, match="could not copy the working directory"):
        wd.copy_workdir(work, tmp_path / "out" / "run1-cwd")
    assert (tmp_path / "out" / "run1-cwd").read_text() == "someone else's"


def test_check_fresh_cwd_with_a_device_and_a_fifo_in_the_working_directory(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(PLAIN)
    _specials(work)
    p = subprocess.run([sys.executable, "-m", "torchrepro", "check", "--fresh-cwd", "--json", "--out",
                        str(tmp_path / "out"), "--", "python", "train.py"], capture_output=True, text=True,
                       timeout=600, cwd=work, env=ENV, preexec_fn=_bounded)
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    text = (f"--fresh-cwd copies only the regular files, folders and symlinks of the working directory {work}; it "
            "left out pipe (FIFO), sub/zero (character device), zero (character device), which the runs' copies do "
            "not hold: a script that needs one must open it by its absolute path.")
    assert p.stderr.count(f"torchrepro: warning: {text}") == 1  # at the first copy, not again for the second
    doc = json.loads(p.stdout)
    assert doc["verdict"] == "identical" and text in doc["notes"]
    assert doc["working_directory"]["not_copied"] == [{"path": "pipe", "kind": "FIFO"},
                                                      {"path": "sub/zero", "kind": "character device"},
                                                      {"path": "zero", "kind": "character device"}]
    for i in (1, 2):
        copy = tmp_path / "out" / f"run{i}-cwd"
        assert sorted(os.listdir(copy)) == ["sub", "train.py"] and os.listdir(copy / "sub") == []
