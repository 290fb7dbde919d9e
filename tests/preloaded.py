"""Run training scripts, each as a new process, without importing Lightning or transformers again in every one.

tests/scripts/preloaded.py imports the libraries once and forks a new process for each run (see its docstring for
what a run shares with a process started by ``python SCRIPT``). ``pipeline`` starts the first runs of a test on one
such process and the runs that continue them (resume a checkpoint they saved) on a second one: a resumed run never
shares the str hash seed of the run that saved its checkpoint.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

PRELOADED = Path(__file__).resolve().parent / "scripts" / "preloaded.py"


@dataclass
class Ended:
    rc: int
    stdout: str
    stderr: str


class _Server:
    """One tests/scripts/preloaded.py process: ``start`` a run, ``ended`` yields (name, exit code) as runs end."""

    def __init__(self, modules: list[str], env: Mapping[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, str(PRELOADED), *modules], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=dict(env), start_new_session=True)
        self.buffer = b""

    def start(self, name: str, argv: list[str], cwd: Path, logs: Path) -> None:
        request = {"name": name, "argv": argv, "cwd": str(cwd), "stdout": str(logs / f"{name}.stdout"),
                   "stderr": str(logs / f"{name}.stderr")}
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()

    def read(self) -> list[dict]:
        """The messages that have come (call when select says its stdout is readable)."""
        data = os.read(self.proc.stdout.fileno(), 1 << 16)
        if not data:
            raise RuntimeError(f"the preloaded process ended (exit code {self.proc.wait()}) with runs still going")
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]

    def close(self, kill: bool) -> None:
        if kill and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.stdin.close()
        self.proc.wait()
        self.proc.stdout.close()


def pipeline(first: dict[str, list[str]], then: dict[str, tuple[str, list[str]]], *, modules: list[str],
             env: Mapping[str, str], cwd: Path, logs: Path, timeout: float = 900, parallel: int = 0,
             on_end: Callable[[str], None] | None = None) -> dict[str, Ended]:
    """Run ``python ARGV`` for each of ``first`` (name -> argv) and ``then`` (name -> (the run it waits for, argv)),
    at most ``parallel`` at a time (0: no limit), in ``cwd``, with ``env``; stdout and stderr go to ``logs``.
    ``on_end(name)`` is called when a run of ``first`` has ended, before the runs that wait for it start."""
    logs.mkdir(parents=True, exist_ok=True)
    servers = {"first": _Server(modules, env), "then": _Server(modules, env)}
    queue = [("first", name, argv, None) for name, argv in first.items()] + \
            [("then", name, argv, after) for name, (after, argv) in then.items()]
    ready: set[str] = set()
    codes: dict[str, int] = {}
    running = 0
    deadline = time.monotonic() + timeout
    ok = False
    try:
        while queue or running or len(ready) < len(servers):
            for entry in list(queue):
                where, name, argv, after = entry
                if where not in ready or (after is not None and after not in codes) or \
                        (parallel and running >= parallel):
                    continue
                queue.remove(entry)
                servers[where].start(name, argv, cwd, logs)
                running += 1
            if queue and not running and len(ready) == len(servers):
                raise RuntimeError(f"runs wait for runs that never start: {[e[1] for e in queue]}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"runs still going after {timeout} s")
            by_fd = {s.proc.stdout.fileno(): (where, s) for where, s in servers.items()}
            for fd in select.select(list(by_fd), [], [], min(left, 1.0))[0]:
                where, server = by_fd[fd]
                for message in server.read():
                    if "ready" in message:
                        ready.add(where)
                        continue
                    codes[message["name"]] = message["rc"]
                    running -= 1
                    if where == "first" and on_end is not None:
                        on_end(message["name"])
        ok = True
    finally:
        for server in servers.values():
            server.close(kill=not ok)
    return {name: Ended(rc, (logs / f"{name}.stdout").read_text(), (logs / f"{name}.stderr").read_text())
            for name, rc in codes.items()}
