"""The full-tensor view of a sharded run (``--full-tensors``): every DTensor assembled, recorded once, by rank 0.

By default each rank records its *local shard* of a DTensor (FSDP2, tensor parallel; see ``_core/dtensor``): no
collective, but two runs sharded differently (2 vs 4 ranks, another mesh) hold other parts of every tensor and
cannot be compared. With ``ValueSettings(full_tensors=True)`` (``--full-tensors`` of ``run``, ``check`` and
``compare``) every rank also assembles the full tensor of each DTensor parameter and gradient with
``DTensor.full_tensor()`` -- a collective over the DTensor's mesh, so every rank calls it, for the same tensors in
the same order, at the same points: the initial parameters (as the first ``backward()`` starts) and the steps the
value schedule keeps (``ValueSettings.due``: every step for ``run --keep-values``, steps 1-16 then 8 per doubling
for ``check`` and ``compare``). Rank 0 fingerprints the full tensors and writes them as a run directory of its
own, ``RUN/rank0/full`` (``trace.jsonl``, ``values/``, ``manifest.json``): a run that looks like one process
trained the whole model, which ``compare`` reads like any other. Plain (non-DTensor) parameters are the full
tensor already and are recorded as they are.

What the full view leaves out: losses and data batches (each rank has its own, and their split depends on the
world size), optimizer state (as large again as the parameters, twice for Adam; the parameters it updates show
its effect at the next step). The final parameters are not gathered again (the script may have torn its process
group down by the time the recorder ends): when the last step was kept, its parameters are the final ones
(``"of_step"`` says which; ``values/final.pt`` is a copy of that step's). A step the schedule does not keep is
written with no tensors, so that step numbers line up across runs. DTensors whose mesh leaves rank 0 out
(pipeline stages) are gathered by their own mesh's ranks and not written.

Cost, per kept step: one all-gather of every parameter and every gradient (about as much traffic as FSDP2's own
all-gathers and reduce-scatter of a step), one full tensor at a time on each rank, and on rank 0 a fingerprint of
each and, with values kept, the full parameters (and the first steps' gradients) held until their host copy is
taken, written in the background. ``manifest.json``
says how long the gathering took (``full_view.gather_s``).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .._core.dtensor import dtensor_type
from .._core.fingerprint import algorithms_since, fingerprint, unreadable_text, usage_mark
from .settings import ValueSettings
from .store import VALUES, TraceWriter, write_manifest
from .valuewriter import ValueWriter

FULL = "full"  # the full view's run directory, inside rank 0's


def _rank() -> int | None:
    """This process's global rank when torch.distributed is initialized, else None."""
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return int(dist.get_rank())


def full_tensors(named: Mapping[str, torch.Tensor | None]) -> dict[str, torch.Tensor]:
    """``named`` with every DTensor assembled (``full_tensor()``: a collective over its mesh, which every rank of
    that mesh must call too); plain tensors as they are; DTensors whose mesh leaves this rank out, and ``None``,
    left out."""
    cls = dtensor_type()
    out: dict[str, torch.Tensor] = {}
    for name, t in named.items():
        if t is None:
            continue
        if cls is not None and isinstance(t, cls):
            if t.device_mesh.get_coordinate() is None:
                continue
            with torch.no_grad():
                t = t.detach().full_tensor()
        out[name] = t
    return out


class FullView:
    """The full-tensor view a recorder writes under torchrun with ``ValueSettings.full_tensors`` (see the module
    docs). Every rank gathers; rank 0 writes into ``rank_dir/full``. Inactive (nothing gathered, nothing written)
    outside an initialized process group."""

    def __init__(self, rank_dir: Path, values: ValueSettings) -> None:
        self.dir = Path(rank_dir) / FULL
        self.settings = values
        self.rank: int | None = None
        self.world: int | None = None
        self._decided = False
        self.trace: TraceWriter | None = None
        self.values: ValueWriter | None = None
        self.gathered = 0  # tensors assembled
        self.gather_s = 0.0  # seconds spent assembling them (collectives included)
        self.bytes = 0  # bytes of full tensors assembled
        self.steps = 0
        self.mode = "optimizer"
        self._last: tuple[int, dict[str, str], str] | None = None  # the last kept step: (n, fingerprints, values)
        self._fp_mark = usage_mark()
        self._t0 = time.perf_counter()

    @property
    def active(self) -> bool:
        if not self._decided:  # the process group exists by the first backward(): decided then, once
            self._decided = True
            self.rank = _rank()
            if self.rank is not None:
                self.world = int(torch.distributed.get_world_size())
            if self.rank == 0:
                self.trace = TraceWriter(self.dir)
                if self.settings.keep:
                    self.values = ValueWriter(self.dir / VALUES, self.settings.budget)
        return self.rank is not None

    def _gather(self, named: Mapping[str, torch.Tensor | None], *, keep: bool = False
                ) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
        """Assemble ``named`` one tensor at a time (every rank); on rank 0, fingerprint each (and with ``keep``
        hold it for the values): a full tensor lives on a rank only until then. Returns (fingerprints, kept)."""
        fps: dict[str, str] = {}
        kept: dict[str, torch.Tensor] = {}
        for name, t in named.items():
            start = time.perf_counter()
            full = full_tensors({name: t}).get(name)
            self.gather_s += time.perf_counter() - start
            if full is None:
                continue
            self.gathered += 1
            self.bytes += full.numel() * full.element_size()
            if self.trace is None:  # not rank 0: its part of the collective is done
                continue
            try:
                fps[name] = fingerprint(full)
            except Exception as exc:  # noqa: BLE001 - never break the script: the tensor is named unreadable
                fps[name] = unreadable_text(exc)
            if keep:
                kept[name] = full
        return fps, kept

    def _now(self) -> float:
        return round(time.perf_counter() - self._t0, 6)

    def init(self, params: Mapping[str, torch.Tensor]) -> None:
        """The initial parameters, assembled (every rank, as the first ``backward()`` starts)."""
        if not self.active:
            return
        fps, full = self._gather(params, keep=self.values is not None)
        if self.trace is not None:
            self.trace.write({"kind": "init", "t": self._now(), "params": fps})
            if self.values is not None:
                self.values.submit("init", full)

    def step(self, n: int, params: Mapping[str, torch.Tensor], *, due: bool, grad_values: bool,
             mode: str = "optimizer") -> None:
        """Step ``n`` (an optimizer step, or a ``backward()`` call in ``"backward"`` mode): its parameters and
        gradients assembled when ``due`` (the same on every rank), their values kept when values are, the
        gradients' when ``grad_values``. Rank 0 writes an event for every step, with no tensors when not due."""
        if not self.active:
            return
        self.mode, self.steps = mode, n
        fps: dict[str, dict[str, str]] = {"params": {}, "grads": {}}
        if due:
            fps_p, full_p = self._gather(params, keep=self.values is not None)
            fps_g, full_g = self._gather({k: p.grad for k, p in params.items()},
                                         keep=self.values is not None and grad_values)
            if self.trace is not None:
                fps = {"params": fps_p, "grads": fps_g}
                name = f"{'step' if mode == 'optimizer' else 'backward'}_{n:06d}"
                self._last = (n, fps["params"], name)
                if self.values is not None:
                    self.values.submit(name, full_p)
                    if grad_values and full_g:
                        self.values.submit(f"grads_{n:06d}", full_g)
        if self.trace is not None:
            event: dict[str, Any] = {"kind": "step" if mode == "optimizer" else "backward", "n": n, "t": self._now()}
            per_mode: dict[str, Any] = ({"losses": [], "state": {}} if mode == "optimizer"
                                        else {"loss": {"fp": None, "value": None}})  # losses: each rank its own
            self.trace.write(event | fps | per_mode)

    def finish(self, summary: Mapping[str, Any]) -> None:
        """Rank 0: flush the values and write the full view's ``manifest.json`` (the rank's ``summary`` gives the
        step counts and the device); the other ranks: nothing."""
        if self.trace is None:
            return
        if self.values is not None:
            self.values.close()
        if self._last is not None and self._last[0] == self.steps:  # the last step was kept: the final parameters
            self.trace.write({"kind": "final", "t": self._now(), "params": self._last[1], "of_step": self.steps})
            if self.values is not None and self._last[2] in self.values.saved:
                shutil.copyfile(self.dir / VALUES / f"{self._last[2]}.pt", self.dir / VALUES / "final.pt")
                self.values.saved.append("final")
        self.trace.close()
        write_manifest(self.dir, {
            "command": ["<full-tensor view of rank 0's run>"], "status": "ok", "exit_code": 0,
            "full_view": {"rank": self.rank, "world_size": self.world, "gathered": self.gathered,
                          "gather_s": round(self.gather_s, 6), "bytes": self.bytes},
            "step_mode": self.mode, "steps": self.steps,
            "optimizer_steps": self.steps if self.mode == "optimizer" else 0,
            "backward_calls": self.steps if self.mode == "backward" else summary.get("backward_calls", 0),
            "fingerprint_algorithm": algorithms_since(self._fp_mark), "trace_records": self.trace.records,
            "device": summary.get("device"), "torch": torch.__version__,
            "values_saved": list(self.values.saved) if self.values else [],
            "values_skipped": self.values.skipped if self.values else 0,
            "values_error": self.values.error if self.values else None,
            "values_failed": self.values.failed if self.values else [],
            "stopped_at_max_steps": bool(summary.get("stopped_at_max_steps")),
        })
