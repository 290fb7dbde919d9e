"""Comparing a run with the runs beside it while it records, so that ``check`` can stop it once it knows.

``check`` gives the recorder of a later run (``Recorder(divergence=...)``) the run directories to compare: run 1
and this run (one after the other), or every run (``check --parallel``). After each of its steps the recorder asks
:meth:`DivergenceWatch.after_step` whether to stop: the first step at which any run differs from run 1 is found
as the trace lines are written (the same fields and the same rules as :mod:`torchrepro.analysis.compare`), and the
run stops ``after`` steps later, so that the growth of the difference is still recorded for those steps.

Exactness: at its step ``n`` a run waits until every compared pair is known up to step ``n - after`` (run 1 is
complete in a sequential check; with ``--parallel`` the slowest run never waits), so that every run stops at
exactly ``first divergent step + after`` whatever the timing.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .store import MANIFEST, TRACE

POLL_S = (0.002, 0.05)  # the wait for a slower run polls its trace from the first to the second interval
CHUNK = 1 << 20  # bytes of a trace read at a time


def _fields(event: dict[str, Any], mode: str) -> tuple[Any, ...]:
    """What ``compare`` compares at one step: batches, loss fingerprints, gradients, parameters, state."""
    if mode == "optimizer":
        losses = [x.get("fp") if isinstance(x, dict) else None for x in event.get("losses") or []]
    else:
        loss = event.get("loss")
        losses = [loss.get("fp") if isinstance(loss, dict) else None]
    maps = tuple(_as_map(event.get(k)) for k in ("grads", "params", "state"))
    return (list(event.get("batches") or []), losses, *maps)


def _as_map(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _same_map(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """``compare._diff_maps`` finds nothing: a missing name counts as a null fingerprint."""
    return all(a.get(k) == b.get(k) for k in {*a, *b})


def same_step(x: tuple[Any, ...], y: tuple[Any, ...]) -> bool:
    """Whether two steps' :func:`_fields` are equal as ``compare`` sees them."""
    return x[0] == y[0] and x[1] == y[1] and all(_same_map(a, b) for a, b in zip(x[2:], y[2:]))


class _Tail:
    """The step events of one run's trace, read as they are appended (complete lines only)."""

    def __init__(self, run_dir: Path, mode: str) -> None:
        self.dir = run_dir
        self.kind = b'{"kind":"step"' if mode == "optimizer" else b'{"kind":"backward"'
        self.mode = mode
        self.offset = 0
        self.partial = b""
        self.steps: dict[int, tuple[Any, ...]] = {}  # step number -> fields, until every pair compared it
        self.count = 0
        self.init: dict[str, Any] | None = None
        self.ended = False

    def read(self, limit: int) -> None:
        """Read what was appended, until ``limit`` steps are known (memory stays small: run 1 of a sequential
        check is complete, and long) or the end of what is written."""
        if self.ended:
            return
        # the manifest is written once the process has ended: after it, the trace holds every line it will
        finished = os.path.lexists(self.dir / MANIFEST)
        try:
            with open(self.dir / TRACE, "rb") as f:
                f.seek(self.offset)
                while self.count < limit and not self.ended:
                    chunk = f.read(CHUNK)
                    if not chunk:
                        self.ended = finished
                        break
                    self.offset += len(chunk)
                    self._parse(chunk)
        except FileNotFoundError:
            self.ended = finished

    def _parse(self, chunk: bytes) -> None:
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        for line in lines:
            if line.startswith(self.kind):
                self.count += 1
                self.steps[self.count] = _fields(json.loads(line), self.mode)
            elif line.startswith(b'{"kind":"init"') and self.init is None:
                params = json.loads(line).get("params")
                self.init = params if isinstance(params, dict) else {}
            elif line.startswith(b'{"kind":"final"'):
                self.ended = True


@dataclass
class _Pair:
    """Run ``a`` (run 1) against run ``b``: identical up to ``cursor``, or first different at ``diverged``."""

    a: int
    b: int
    cursor: int = 0
    diverged: int | None = None
    done: bool = False  # both ended with the same steps, all identical (compare looks at the final parameters)
    init_seen: bool = False

    def update(self, tails: list[_Tail]) -> None:
        ta, tb = tails[self.a], tails[self.b]
        if self.diverged is not None or self.done:
            return
        if not self.init_seen and (ta.count or ta.ended) and (tb.count or tb.ended):
            self.init_seen = True  # init is written before the first step: both have it, if they have one
            if ta.init is not None and tb.init is not None and not _same_map(ta.init, tb.init):
                self.diverged = 0
                return
        if not self.init_seen:
            return
        while self.cursor < min(ta.count, tb.count):
            k = self.cursor + 1
            if not same_step(ta.steps[k], tb.steps[k]):
                self.diverged = k
                return
            self.cursor = k
        if (ta.ended and ta.count == self.cursor and tb.count > self.cursor) or \
                (tb.ended and tb.count == self.cursor and ta.count > self.cursor):
            self.diverged = self.cursor + 1  # one run took more steps than the other
        elif ta.ended and tb.ended:
            self.done = True

    def known_through(self, n: int) -> bool:
        """Whether this pair's first divergence, if it is at step ``n`` or before, is known."""
        return self.done or self.diverged is not None or self.cursor >= n


def stop_plan(dirs: list[Path], me: int, after: int, numbers: list[int] | None = None) -> dict[str, Any]:
    """``LaunchOptions.divergence_stop`` of the run recorded into ``dirs[me]``: compare with ``dirs`` (run 1 first)
    and stop ``after`` steps after the first divergence; ``numbers``: the runs' numbers in the check."""
    return {"runs": [str(d.resolve()) for d in dirs], "me": me, "after": after,
            "numbers": numbers or list(range(1, len(dirs) + 1))}


@dataclass
class DivergenceWatch:
    """Stop this run ``after`` steps after the first divergence from run 1 of any of ``runs``.

    ``runs``: the run directories, run 1's first; ``me``: this run's index in them.
    """

    runs: list[Path]
    me: int
    after: int
    mode: str = "optimizer"
    numbers: list[int] = field(default_factory=list)  # the runs' numbers in the check (default 1, 2, ...)
    first: int | None = None
    diverged_runs: list[int] = field(default_factory=list)
    waited_s: float = 0.0
    _tails: list[_Tail] = field(default_factory=list)
    _pairs: list[_Pair] = field(default_factory=list)

    @classmethod
    def from_options(cls, config: dict[str, Any], mode: str) -> DivergenceWatch:
        """From ``LaunchOptions.divergence_stop``: ``{"runs": [dir, ...], "me": i, "after": K, "numbers": [...]}``."""
        runs = [Path(p) for p in config["runs"]]
        return cls(runs=runs, me=int(config["me"]), after=int(config["after"]), mode=mode,
                   numbers=[int(x) for x in config.get("numbers") or ()])

    def __post_init__(self) -> None:
        self.numbers = self.numbers or list(range(1, len(self.runs) + 1))
        self._tails = [_Tail(p, self.mode) for p in self.runs]
        self._pairs = [_Pair(0, j) for j in range(1, len(self.runs))]

    def _update(self, n: int) -> None:
        for tail in self._tails:  # at step n, no run's steps after n are needed
            tail.read(n)
        for pair in self._pairs:
            pair.update(self._tails)
        lowest = min((p.cursor for p in self._pairs), default=0)
        for tail in self._tails:  # steps every pair has compared are not needed again
            for k in [k for k in tail.steps if k <= lowest]:
                del tail.steps[k]
        found = [p.diverged for p in self._pairs if p.diverged is not None]
        if found:
            self.first = min(found)
            self.diverged_runs = [self.numbers[p.b] for p in self._pairs if p.diverged == self.first]

    def after_step(self, n: int) -> bool:
        """Called once step ``n`` of this run is in its trace: whether the run stops now."""
        t0, pause = time.perf_counter(), POLL_S[0]
        while True:
            self._update(n)
            if self.first is not None and n >= self.first + self.after:
                break
            if all(p.known_through(n - self.after) for p in self._pairs):
                break
            time.sleep(pause)  # a run beside this one has not reached step n - after yet
            pause = min(pause * 2, POLL_S[1])
        self.waited_s += time.perf_counter() - t0
        return self.first is not None and n >= self.first + self.after

    def facts(self, stopped_after: int | None) -> dict[str, Any] | None:
        """What goes into the manifest as ``stopped`` (None when the run was not stopped)."""
        if stopped_after is None or self.first is None:
            return None
        me = self.numbers[self.me]
        if self.diverged_runs == [me]:
            reason = (f"it diverged from run {self.numbers[0]} at step {self.first}; it was stopped {self.after} "
                      f"steps later")
        else:
            others = ", ".join(f"run {r}" for r in self.diverged_runs)
            reason = (f"{others} diverged from run {self.numbers[0]} at step {self.first}; every run was stopped "
                      f"{self.after} steps later")
        return {"after_step": stopped_after, "first_divergent_step": self.first, "steps_after": self.after,
                "diverged_runs": self.diverged_runs, "reason": reason, "waited_s": round(self.waited_s, 3)}
