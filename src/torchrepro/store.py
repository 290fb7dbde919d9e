"""Run directories: the on-disk record of one training run (layer L2).

A run directory holds::

    manifest.json      format, command, exit status, seed, flags, torch version, device, step count, timings
    trace.jsonl        one JSON object per event (init, backward, step, final), in order
    values/*.pt        optional parameter values (``torch.save`` of a flat {name: tensor} dict, weights only)
    stdout.txt, stderr.txt   the script's output, when captured by ``torchrepro check``

The manifest is written last, atomically: a directory without one is an incomplete run.
See docs/formats.md for every field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import torch

from ._io import atomic_write_json
from .errors import RunDirError

FORMAT = "torchrepro.run"
VERSION = 1
MANIFEST = "manifest.json"
TRACE = "trace.jsonl"
VALUES = "values"
OPS = "ops.jsonl"


class TraceWriter:
    """Appends events to ``trace.jsonl`` one line at a time (flushed, so a killed run keeps what it had)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / VALUES).mkdir(exist_ok=True)
        self._f: IO[str] = open(self.dir / TRACE, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self.records = 0

    def write(self, event: dict[str, Any]) -> None:
        self._f.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._f.flush()
        self.records += 1

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()


def read_trace_lines(run_dir: str | Path) -> tuple[list[dict[str, Any]], bool]:
    """Events of a trace file and whether its last line was cut off (a killed run)."""
    path = Path(run_dir) / TRACE
    events: list[dict[str, Any]] = []
    truncated = False
    if not path.exists():
        return events, truncated
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    for i, line in enumerate(lines):
        if not line:
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # the last line, without a newline: cut off mid-write
                truncated = True
                break
            raise RunDirError(path, f"line {i + 1} is not valid JSON; the trace is corrupt.",
                              "Record the run again with `torchrepro run --record DIR -- ...`.") from None
    return events, truncated


def write_manifest(run_dir: str | Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Write ``manifest.json`` (format and version first) atomically; return what was written."""
    full = {"format": FORMAT, "version": VERSION, **manifest}
    atomic_write_json(Path(run_dir) / MANIFEST, full)
    return full


@dataclass
class Run:
    """A loaded, validated run directory."""

    path: Path
    manifest: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("kind") == kind]

    @property
    def step_mode(self) -> str:
        return str(self.manifest.get("step_mode", "optimizer"))

    def steps(self) -> list[dict[str, Any]]:
        """The step records: optimizer steps, or backward calls when the script has no optimizer."""
        return self.of_kind("step" if self.step_mode == "optimizer" else "backward")

    def values(self, name: str) -> dict[str, torch.Tensor] | None:
        """Saved parameter values ``values/<name>.pt`` (e.g. ``init``, ``step_000003``, ``final``) or None."""
        path = self.path / VALUES / f"{name}.pt"
        if not path.exists():
            return None
        try:
            data = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise RunDirError(path, f"cannot be read ({type(exc).__name__}: {exc}); it may be truncated.",
                              "Record the run again.") from None
        if not isinstance(data, dict):
            raise RunDirError(path, f"holds a {type(data).__name__}, expected a dict of tensors.")
        return data


def load_run(run_dir: str | Path) -> Run:
    """Read and validate a run directory; raise :class:`RunDirError` naming the problem."""
    path = Path(run_dir)
    if not path.is_dir():
        raise RunDirError(path, "is not a directory.", "Pass a directory written by `torchrepro run --record DIR`.")
    mpath = path / MANIFEST
    if not mpath.exists():
        raise RunDirError(path, f"has no {MANIFEST}: it is not a run directory, or the run did not finish.",
                          "Pass a directory written by `torchrepro run --record DIR`.")
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RunDirError(mpath, f"is not valid JSON ({exc}); it is corrupt or truncated.",
                          "Record the run again.") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise RunDirError(mpath, f"has format {got!r}, expected {FORMAT!r}.",
                          "Pass a directory written by `torchrepro run --record DIR`.")
    if manifest.get("version") != VERSION:
        raise RunDirError(mpath, f"has format version {manifest.get('version')!r}; this torchrepro reads "
                          f"version {VERSION}.", "Use the torchrepro version that recorded it, or record again.")
    events, _ = read_trace_lines(path)
    expected = manifest.get("trace_records")
    if expected != len(events):
        raise RunDirError(path / TRACE, f"has {len(events)} complete records but the manifest lists {expected}; "
                          "the trace is truncated or was modified.", "Record the run again.")
    return Run(path=path, manifest=manifest, events=events)
