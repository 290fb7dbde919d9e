"""record/runoutput.py (a run's output files followed as they grow) and the progress that shows them (record/runs.py
Progress): lines once each and whole, the last line, ranks, and a display failure that surfaces."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from torchrepro.record import runoutput
from torchrepro.record.runoutput import RunOutput
from torchrepro.record.runs import Progress, showing_output


def _append(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        f.write(data)


def test_lines_cut_across_polls_are_passed_on_once_whole_and_in_order(tmp_path):
    seen: list[tuple[str, str]] = []
    out = RunOutput(tmp_path, lines=lambda source, text: seen.append((source, text)))
    out.poll()  # no file yet
    _append(tmp_path / "stdout.txt", b"first\nsec")
    out.poll()
    _append(tmp_path / "stdout.txt", b"ond\n\nthird \xc3")
    out.poll()
    out.poll()  # nothing new: nothing again
    _append(tmp_path / "stdout.txt", b"\xa9")
    out.close()
    assert seen == [("", "first"), ("", "second"), ("", ""), ("", "third é")]


def test_without_lines_only_the_tail_of_a_large_file_is_read(tmp_path, monkeypatch):
    reads: list[int] = []
    real_open = open

    class Counting:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def seek(self, n):
            self.f.seek(n)

        def read(self, n=-1):
            data = self.f.read(n)
            reads.append(len(data))
            return data

    monkeypatch.setattr(runoutput, "open", lambda p, mode: Counting(real_open(p, mode)), raising=False)
    _append(tmp_path / "stderr.txt", b"x" * 10_000_000 + b"\nepoch 3 loss 0.1\n")
    out = RunOutput(tmp_path)
    out.poll()
    assert out.last == "epoch 3 loss 0.1" and sum(reads) == runoutput.TAIL_BYTES


def test_the_last_line_is_the_newest_files_as_a_terminal_shows_it_made_printable(tmp_path):
    out = RunOutput(tmp_path)
    _append(tmp_path / "stdout.txt", b"epoch 1\n")
    out.poll()
    assert out.last == "epoch 1"
    _append(tmp_path / "stderr.txt", b" 10%|#   \r 50%|#####  \r")
    out.poll()
    assert out.last == "50%|#####"  # a progress bar redrawn in place: what the terminal shows last
    _append(tmp_path / "stdout.txt", b"\x1b[31mred\x1b[0m " + b"y" * 200 + b"\n\n  \n")
    out.poll()
    assert out.last == ("\\x1b[31mred\\x1b[0m " + "y" * 200)[:97] + "..."


def test_ranks_are_followed_in_their_own_directories_and_named(tmp_path):
    seen: list[tuple[str, str]] = []
    out = RunOutput(tmp_path, lines=lambda source, text: seen.append((source, text)))
    _append(tmp_path / "stdout.txt", b"torchrun says\n")
    _append(tmp_path / "rank1" / "stdout.txt", b"from rank 1\n")
    _append(tmp_path / "rank0" / "stderr.txt", b"from rank 0\n")
    _append(tmp_path / "rankings" / "stdout.txt", b"not a rank\n")
    out.poll()
    assert seen == [("", "torchrun says"), ("rank 0", "from rank 0"), ("rank 1", "from rank 1")]
    assert out.last.startswith("rank ")


def test_a_file_started_again_is_read_from_its_start(tmp_path):
    seen: list[str] = []
    out = RunOutput(tmp_path, lines=lambda source, text: seen.append(text))
    _append(tmp_path / "stdout.txt", b"a long first line\n")
    out.poll()
    (tmp_path / "stdout.txt").write_bytes(b"new\n")
    out.poll()
    assert seen == ["a long first line", "new"]


def test_show_output_lines_name_their_run_and_rank(tmp_path, monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    with showing_output():
        progress = Progress(2)
    update = progress.start(1, "", tmp_path)
    _append(tmp_path / "rank3" / "stdout.txt", b"hello\x07\n")
    update(0)
    _append(tmp_path / "stderr.txt", b"bye")
    progress.end(1)
    assert err.getvalue().splitlines() == ["torchrepro: run 1/2 ...", "[run 1 rank 3] hello\\x07", "[run 1] bye"]
    assert Progress(2).show is False  # only inside showing_output()


def test_a_display_that_fails_leaves_the_run_alone_and_is_raised_once_it_has_ended(tmp_path, monkeypatch):
    class Closed(io.StringIO):
        def write(self, text):
            if "last output" in text:
                raise BrokenPipeError(32, "Broken pipe")
            return super().write(text)

    monkeypatch.setattr("sys.stderr", Closed())
    monkeypatch.setenv("TORCHREPRO_PROGRESS_INTERVAL", "0")
    progress = Progress(2)
    update = progress.start(1, "", tmp_path)
    _append(tmp_path / "stdout.txt", b"epoch 1\n")
    update(1)  # the launch's poll: must not raise into the launcher while the script runs
    update(2)
    with pytest.raises(BrokenPipeError):
        progress.end(1)
    progress.end(1)  # once only
