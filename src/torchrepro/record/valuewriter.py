"""Parameter value snapshots (``values/``): written by a background thread, within a byte budget.

The recorder (:mod:`torchrepro.record.recorder`) takes each snapshot's host copy synchronously, at the step, and
hands it to :class:`ValueWriter`; which steps get one is the recorder's :class:`~.settings.ValueSettings`.
"""

from __future__ import annotations

import queue
import threading
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch

from .._core.dtensor import local_shards
from .._core.errors import ReproWarning
from .._core.io import atomic_write


def _warn(message: str) -> None:
    warnings.warn(f"torchrepro: {message}", ReproWarning, stacklevel=4)


class ValueWriter:
    """Writes parameter value snapshots in a background thread; the copy itself is taken synchronously.

    Memory: at most one extra host copy of the parameters exists at any time. A snapshot is written straight
    from that copy into its file (no serialised buffer in between); while the writer is still busy with an
    earlier snapshot, a new one is skipped (counted in ``skipped_busy``) unless the two together stay under
    ``SMALL`` bytes -- small models never skip, a 7B model never holds two copies. The final snapshot waits.

    A write that fails (a full disk, a permission error) never blocks or stops training: the first failure is
    kept in ``error`` and warned about, that snapshot and every later one are dropped (listed in ``failed``),
    and ``saved`` lists only the files that were written.
    """

    SMALL = 64 << 20  # bytes in flight that never cause a skip

    def __init__(self, directory: Path, budget: int) -> None:
        self.dir = directory
        self.budget = budget
        self.used = 0
        self.saved: list[str] = []
        self._failed: list[tuple[int, str]] = []  # (submission number, name): both threads append
        self._submitted = 0
        self.skipped = 0  # over the budget
        self.skipped_busy = 0  # the writer was still busy with a large earlier snapshot
        self.error: str | None = None
        self._warned = False
        self._inflight = 0  # bytes copied but not yet written
        self._idle = threading.Condition()
        self._q: queue.SimpleQueue[tuple[int, str, dict[str, torch.Tensor], int] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name="torchrepro-values", daemon=True)
        self._thread.start()

    @property
    def failed(self) -> list[str]:
        """Snapshots not written (after a failure), in the order they were submitted."""
        return [name for _, name in sorted(self._failed)]

    def _fail(self, n: int, name: str, exc: BaseException) -> None:
        self._failed.append((n, name))
        if self.error is None:
            self.error = f"{self.dir / name}.pt: {type(exc).__name__}: {exc}"

    def _work(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            n, name, values, size = item
            try:
                if self.error is not None:  # after a failure nothing more is written: the values have a gap
                    self._failed.append((n, name))
                    continue
                try:  # durable=False: a rename is atomic; fsync per step would cost more than the write
                    atomic_write(self.dir / f"{name}.pt", lambda f, v=values: torch.save(v, f),  # type: ignore[misc]
                                 durable=False)
                except Exception as exc:
                    self._fail(n, name, exc)
                else:
                    self.saved.append(name)
            finally:
                del values, item
                with self._idle:
                    self._inflight -= size
                    self._idle.notify_all()

    def _wait_idle(self) -> bool:
        """Wait until every queued snapshot is written; False if the writer thread has ended."""
        with self._idle:
            while self._inflight and self._thread.is_alive():
                self._idle.wait(0.1)
        return self._thread.is_alive()

    def _warn_once(self) -> None:
        if self.error is not None and not self._warned:
            self._warned = True
            _warn(f"could not save parameter values ({self.error}); training goes on, but values from "
                  f"{self.failed[0]!r} on are not recorded, so comparisons of this run cannot report "
                  f"max |Δ weight|. Free space or fix permissions in {self.dir}, or record without values.")

    def submit(self, name: str, params: Mapping[str, torch.Tensor], *, force: bool = False) -> None:
        self._warn_once()
        params = local_shards(params)  # DTensors (FSDP2, tensor parallel): this rank's shard, as a plain tensor
        n = self._submitted = self._submitted + 1
        if self.error is not None:
            self._failed.append((n, name))
            return
        size = sum(p.numel() * p.element_size() for p in params.values())
        # The budget covers every snapshot, the initial one included; each leaves room for the final snapshot
        # (``force=True``, the same parameters), so the last values are kept whenever one snapshot fits.
        reserve = 0 if force else size
        if self.used + size + reserve > self.budget:
            self.skipped += 1
            return
        if force:
            if not self._wait_idle():
                self._fail(n, name, RuntimeError("the value writer thread has stopped"))
                return
        elif self._inflight and self._inflight + size > self.SMALL:
            self.skipped_busy += 1
            return
        self.used += size
        try:
            values = {k: v.detach().to("cpu", copy=True) for k, v in params.items()}
        except Exception as exc:
            self._fail(n, name, exc)
            return
        if not self._thread.is_alive():
            self._fail(n, name, RuntimeError("the value writer thread has stopped"))
            return
        with self._idle:
            self._inflight += size
        self._q.put((n, name, values, size))

    def close(self) -> None:
        """Write what is queued and stop the thread; returns once it has ended."""
        self._q.put(None)
        self._thread.join()
        self._warn_once()
