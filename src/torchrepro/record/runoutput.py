"""A running run's output, followed as its files grow: its last line (progress) and every line (``--show-output``).

A run's script writes its stdout and stderr into its run directory (``RUN/stdout.txt``, ``RUN/stderr.txt``; under
torchrun each rank into ``RUN/rankK/``). :class:`RunOutput` reads only what was appended since its last poll, the
way ``tail -f`` does: without ``lines``, at most :data:`TAIL_BYTES` of each file per poll (enough for its last
line, however large the file grows); with ``lines``, every complete line, once and in order per file, and at
:meth:`RunOutput.close` the last line even without its newline. The files themselves are left as they are.

>>> import tempfile
>>> run = Path(tempfile.mkdtemp())
>>> _ = (run / "stdout.txt").write_text("epoch 1 loss 0.52\\nepoch 2 ")
>>> seen = []
>>> out = RunOutput(run, lines=lambda source, text: seen.append((source, text)))
>>> out.poll(); seen, out.last
([('', 'epoch 1 loss 0.52')], 'epoch 2')
>>> out.close(); seen[-1]
('', 'epoch 2 ')
>>> import shutil; shutil.rmtree(run)
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .._core.table import printable

NAMES = ("stdout.txt", "stderr.txt")
TAIL_BYTES = 4096  # what is read of a file that grew, without lines: enough for a last line of a few KiB
CHUNK = 1 << 16  # bytes read at a time, with lines
LONGEST_PARTIAL = 1 << 20  # a line without a newline longer than this is passed on as it is
SHOWN_CHARS = 100  # of the last line, in progress
_RANK_DIR = re.compile(r"rank(\d+)\Z")
_BREAKS = re.compile(rb"[\r\n]")

Lines = Callable[[str, str], None]  # lines(source, text): source is "" for the run, "rank K" for a rank


@dataclass
class _Followed:
    path: Path
    source: str
    offset: int = 0
    partial: bytes = b""  # with lines: the start of a line whose newline has not been written yet
    recent: bytes = b""  # the last TAIL_BYTES bytes read
    changed: tuple[int, int] = (0, 0)  # (poll, mtime) of the last growth: the newest file has the last line


class RunOutput:
    """The output files of the run in ``run_dir`` (see the module docstring). ``lines(source, text)``: called with
    every complete line (``text`` as written, without its line break); None: only :attr:`last` is kept."""

    def __init__(self, run_dir: Path, lines: Lines | None = None) -> None:
        self.run_dir = run_dir
        self.lines = lines
        self._files: dict[Path, _Followed] = {}
        self._polls = 0

    def poll(self) -> None:
        """Read what every file of the run gained since the last poll."""
        self._polls += 1
        for followed in self._find():
            self._read(followed)

    def close(self) -> None:
        """A last poll; with ``lines``, the last line of each file even without its newline."""
        self.poll()
        for followed in self._files.values():
            if followed.partial and self.lines is not None:
                self.lines(followed.source, _text(followed.partial))
            followed.partial = b""

    @property
    def last(self) -> str:
        """The last non-blank line written to any of the files (after a ``\\r``, what a terminal would show), made
        printable and shortened; "rank K: " before a rank's; empty when nothing was written yet."""
        newest = sorted((f for f in self._files.values() if f.recent.strip()), key=lambda f: f.changed)
        if not newest:
            return ""
        line = next(seg for seg in reversed(_BREAKS.split(newest[-1].recent)) if seg.strip())
        text = printable(_text(line).strip())
        if len(text) > SHOWN_CHARS:
            text = text[:SHOWN_CHARS - 3] + "..."
        return f"{newest[-1].source}: {text}" if newest[-1].source else text

    def _find(self) -> list[_Followed]:
        """The run's files, then each rank's (by rank), as they appear."""
        paths = [(self.run_dir / name, "") for name in NAMES]
        with contextlib.suppress(OSError):
            ranks = sorted((int(m.group(1)), e.path) for e in os.scandir(self.run_dir)
                           if (m := _RANK_DIR.match(e.name)) and e.is_dir(follow_symlinks=False))
            paths += [(Path(p) / name, f"rank {r}") for r, p in ranks for name in NAMES]
        return [self._files.setdefault(path, _Followed(path, source)) for path, source in paths]

    def _read(self, f: _Followed) -> None:
        try:
            st = os.stat(f.path)
        except OSError:  # not written yet (a rank not started), or gone
            return
        if st.st_size < f.offset:  # replaced or truncated by the script: read it from its start
            f.offset, f.partial, f.recent = 0, b"", b""
        if st.st_size == f.offset:
            return
        start = f.offset if self.lines is not None else max(f.offset, st.st_size - TAIL_BYTES)
        try:
            with open(f.path, "rb") as fh:
                fh.seek(start)
                while True:
                    chunk = fh.read(CHUNK if self.lines is not None else st.st_size - start)
                    if not chunk:
                        break
                    f.offset = start = start + len(chunk)
                    f.recent = (f.recent + chunk)[-TAIL_BYTES:]
                    if self.lines is not None:
                        self._split(f, chunk)
                    else:
                        break
        except OSError:
            return
        f.changed = (self._polls, st.st_mtime_ns)

    def _split(self, f: _Followed, chunk: bytes) -> None:
        assert self.lines is not None
        *complete, f.partial = (f.partial + chunk).split(b"\n")
        for line in complete:
            self.lines(f.source, _text(line))
        if len(f.partial) > LONGEST_PARTIAL:
            self.lines(f.source, _text(f.partial))
            f.partial = b""


def _text(line: bytes) -> str:
    """A line as a terminal shows it: after its last carriage return (a progress bar redrawn in place), decoded.

    >>> _text(b"10%\\r50%\\r100%\\r"), _text(b"loss 0.5\\r")
    ('100%', 'loss 0.5')
    """
    line = line.rstrip(b"\r")
    return line[line.rfind(b"\r") + 1:].decode("utf-8", errors="replace")
