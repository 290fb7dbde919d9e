"""Slow imports that a prestarted run of ``check`` makes before its turn, once run 1 has shown they are safe.

A torch optimizer's constructor imports ``torch._dynamo`` (with sympy and inductor's config: 1.3-1.6 s on a 2-core
machine), so a run prestarted by ``check`` (:func:`~torchrepro.record.launcher.start_gated`) would still pay for
that import after its gate opens, on the critical path. Run 1 watches for that import (:class:`ImportWatch`): when
it starts while the environment and ``sys.path`` are as they were when the script started (the script changed
neither before it), run 1 writes its name into ``warm.json`` in its run directory, at the start of the import. The
prestarted run, still waiting before its script, reads that file and makes the same import
(:func:`warm_imports`), so that it overlaps with run 1's. The script then finds the module imported, as its own
``import`` would have left it: the same code, run with the same environment and search path. The environment
variables the import sets (``TORCHINDUCTOR_CACHE_DIR``) are put back until the script's own ``import`` of the
module (:class:`EnvReplay`), so that the script starts with run 1's environment. Anything else (another
environment, another search path, another module, a failed import) and nothing is imported ahead.

Example (what the launcher does)::

    watch = ImportWatch(Path("out/run1"), path_entry="/src").install()   # run 1, just before its script
    replay = warm_imports(Path("out/run1/warm.json"), gate_fd, path_entry="/src")  # run 2, while it waits
    if replay is not None:
        replay.install()  # just before the script: the variables the imports set come back at its own import
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import select
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._core.io import atomic_write
from .outdir import WARM as WARM_FILE

WARMABLE = ("torch._dynamo",)  # imported by every torch.optim constructor; safe to make early (see the module doc)
POLL_S = 0.05  # how often a waiting run looks for run 1's file


class ImportWatch:
    """A ``sys.meta_path`` entry that never finds anything: it notes when a :data:`WARMABLE` module's import
    starts, and writes its name into ``out/warm.json`` if the environment and ``sys.path`` are still those the
    script started with."""

    def __init__(self, out: Path, *, path_entry: str | None) -> None:
        self.path = out / WARM_FILE
        self.pending = {name for name in WARMABLE if name not in sys.modules}
        self.env = dict(os.environ)
        self.sys_path = ([path_entry] if path_entry is not None else []) + list(sys.path)
        self.modules: list[str] = []

    def install(self) -> ImportWatch:
        if self.pending:
            sys.meta_path.insert(0, self)
        return self

    def uninstall(self) -> None:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname not in self.pending:
            return None
        self.pending.discard(fullname)
        if not self.pending:
            self.uninstall()
        if dict(os.environ) == self.env and sys.path == self.sys_path:
            self.modules.append(fullname)
            with contextlib.suppress(OSError):  # an optimisation only: a run that cannot write it is not harmed
                data = json.dumps({"modules": self.modules}).encode()
                atomic_write(self.path, lambda f: f.write(data), durable=False)
        return None


def _listed(path: Path) -> list[str]:
    """The modules run 1 named in ``path`` that may be imported ahead (nothing else it may hold)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    names = doc.get("modules") if isinstance(doc, dict) else None
    return [n for n in names if n in WARMABLE] if isinstance(names, list) else []


@contextlib.contextmanager
def _search_path(entry: str | None) -> Iterator[None]:
    """``sys.path`` as the script will have it (its directory first), for the import; restored after."""
    saved = list(sys.path)
    if entry is not None:
        sys.path.insert(0, entry)
    try:
        yield
    finally:
        sys.path[:] = saved


def warm_imports(source: Path, gate_fd: int, *, path_entry: str | None) -> EnvReplay | None:
    """In a prestarted run: until the gate ``gate_fd`` can be read, wait for run 1's ``source`` file and make the
    imports it lists. The environment variables those imports set are put back as they were (the script starts
    with run 1's environment) and returned as an :class:`EnvReplay` to install, which sets them again when the
    script imports the module, as its own import would have. None when nothing was imported (the gate opened
    first); the gate itself is left to read."""
    while True:
        ready, _, _ = select.select([gate_fd], [], [], POLL_S)
        if ready:
            return None  # the gate opened (or closed) first: nothing imported ahead
        names = _listed(source)
        if names:
            break
    before = dict(os.environ)
    done = []
    with _search_path(entry=path_entry):
        for name in names:
            if name in sys.modules:
                continue
            try:
                __import__(name)
            except Exception:  # noqa: BLE001 - then the script imports it itself, as in run 1
                break
            done.append(name)
    after = dict(os.environ)
    changes = {k: (before.get(k), after.get(k)) for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    for key, (old, _) in changes.items():
        _set(key, old)
    return EnvReplay(done, changes) if done else None


def _set(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


class EnvReplay:
    """Sets again the environment variables that imports made ahead set, at the script's first ``import`` of one
    of those modules (``import torch._dynamo``, which a torch optimizer's constructor and ``torch.compile`` run),
    as the script's own import would have; a variable the script has set meanwhile is left as it is.

    Example::

        replay = EnvReplay(["torch._dynamo"], {"TORCHINDUCTOR_CACHE_DIR": (None, "/tmp/torchinductor_me")})
        replay.install()  # os.environ gets the variable back when the script imports torch._dynamo
    """

    def __init__(self, modules: list[str], changes: dict[str, tuple[str | None, str | None]]) -> None:
        self.modules = modules
        self.changes = changes
        self._original = builtins.__import__
        self.done = False

    def install(self) -> EnvReplay:
        if self.changes:
            builtins.__import__ = self._import
        return self

    def uninstall(self) -> None:
        if builtins.__import__ == self._import:
            builtins.__import__ = self._original

    def _import(self, name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if not self.done and level == 0 and any(name == m or name.startswith(m + ".") for m in self.modules):
            self.done = True  # once, even if another wrapper of __import__ now calls this one
            self.uninstall()
            self.apply()
        return self._original(name, globals, locals, fromlist, level)

    def apply(self) -> None:
        for key, (old, new) in self.changes.items():
            if os.environ.get(key) == old:
                _set(key, new)
