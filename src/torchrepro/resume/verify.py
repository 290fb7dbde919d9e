"""``verify_resume``: prove that a checkpoint resumes training bit for bit.

It runs the same training three times, each in a fresh Python process:

1. ``steps`` steps straight through;
2. ``resume_at`` steps, then ``save`` (default :func:`torchrepro.save_checkpoint`);
3. ``build`` + ``load`` (default :func:`torchrepro.load_checkpoint`) + the remaining steps;

and compares the losses, parameters and optimizer state of runs 1 and 2+3 after every step.

The contract (``build``, ``step``, ``save`` and ``load`` must be importable, module-level functions; a script
that calls ``verify_resume`` at its top level needs no ``if __name__ == "__main__":`` guard: each fresh process runs
the script up to that call, as the caller's process had, and stops there):

* ``build()`` runs once per process, after ``seed_everything(seed)``, and returns the training state as a
  dict: ``"model"`` (an ``nn.Module``, required) and any of ``"optimizer"``, ``"scheduler"``, ``"scaler"``,
  ``"loader"`` -- the keyword arguments of :func:`torchrepro.save_checkpoint`. With the default ``save`` and
  ``load`` no other key is allowed (each would be passed to them); a custom ``save``/``load`` may use more.
* ``step(state)`` gets that same dict, every step, in every process, and runs one training step; it returns
  the loss (a tensor or float; compared bit for bit) or None. It must take its batch from the state, so that
  the checkpoint restores where the data was: ``state["loader"].next_batch()`` (a
  :class:`~torchrepro.ResumableLoader`) returns the next batch and rolls over into the next epoch. An
  iterator made with ``iter(loader)`` ends with its epoch (``StopIteration``) and is not saved.

    def build():
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        return {"model": model, "optimizer": opt,
                "loader": torchrepro.ResumableLoader(dataset, batch_size=32, shuffle=True, seed=0)}

    def step(state):
        x, y = state["loader"].next_batch()
        state["optimizer"].zero_grad()
        loss = F.cross_entropy(state["model"](x), y)
        loss.backward()
        state["optimizer"].step()
        return loss

    report = torchrepro.verify_resume(build, step, steps=20, resume_at=10)
    assert report.identical, report
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from .._core.errors import ReproError
from .._core.fingerprint import fingerprint_many
from ..control.seeding import seed_everything
from .checkpoint import load_checkpoint, save_checkpoint


class ResumeRunError(ReproError):
    """One of the training processes of verify_resume failed."""


@dataclass
class ResumeReport:
    """Outcome of :func:`verify_resume`: identical, or the first step and tensor that differ."""

    identical: bool
    steps: int
    resume_at: int
    first_step: int | None = None
    what: str | None = None  # "loss", "parameter", "optimizer state" or "step count"
    tensor: str | None = None
    losses_straight: list[float | None] = field(default_factory=list)
    losses_resumed: list[float | None] = field(default_factory=list)

    def __str__(self) -> str:
        if self.identical:
            return (f"resume is bitwise exact: {self.steps} steps straight == {self.resume_at} steps + save + "
                    f"load in a new process + {self.steps - self.resume_at} steps (losses, parameters, "
                    "optimizer state)")
        return (f"resume differs from the uninterrupted run: first at step {self.first_step} "
                f"(resumed after step {self.resume_at}), {self.what} {self.tensor or ''}".rstrip())


def _ref(fn: Callable[..., Any]) -> str:
    mod = fn.__module__
    if "<locals>" in fn.__qualname__ or fn.__name__ == "<lambda>":
        raise TypeError(f"{fn.__qualname__} must be a module-level function so that a fresh process can import it")
    if mod == "__main__":
        main_file = getattr(sys.modules["__main__"], "__file__", None)
        if not main_file:
            raise TypeError(f"{fn.__qualname__} is defined in an interactive session (a REPL or notebook), which a "
                            "fresh process cannot import: put build and step in a .py file and import them from "
                            "there (or run that file with python).")
        mod = str(Path(main_file).resolve())
    return f"{mod}:{fn.__qualname__}"


SCRIPT_MODULE = "_torchrepro_resume_target"  # the name a child gives the caller's script (ran as __main__ there)
_loading: list[str] = []  # the script a child is executing to find build/step (see _load_script)


class _ScriptLoaded(BaseException):
    """Raised by the ``verify_resume`` call of a script that a child is loading, to end the load there."""


def _load_script(path: str) -> Any:
    """The caller's script (it ran as ``__main__``), loaded once per child under :data:`SCRIPT_MODULE`.

    A script that calls ``verify_resume`` at its top level, without an ``if __name__ == "__main__":`` guard, runs
    here up to that call -- exactly what had run in the caller's process when it called -- and stops there: the
    call raises :class:`_ScriptLoaded` instead of starting three more processes. build, step, save and load share
    this one module (its globals), as they did in the caller's process.
    """
    module = sys.modules.get(SCRIPT_MODULE)
    if module is not None and getattr(module, "__file__", None) == path:
        return module
    spec = importlib.util.spec_from_file_location(SCRIPT_MODULE, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[SCRIPT_MODULE] = module  # dataclasses and pickle look their module up there
    _loading.append(path)
    try:
        spec.loader.exec_module(module)
    except _ScriptLoaded:
        pass  # the script reached its verify_resume call: everything build and step need is defined
    finally:
        _loading.pop()
    return module


def _resolve(ref: str) -> Callable[..., Any]:
    mod_name, _, qual = ref.rpartition(":")
    if mod_name.endswith(".py"):
        module = _load_script(mod_name)
    else:
        module = importlib.import_module(mod_name)
    obj: Any = module
    for part in qual.split("."):
        obj = getattr(obj, part)
    return cast("Callable[..., Any]", obj)


def default_save(path: str, state: dict[str, Any], step: int) -> None:
    save_checkpoint(path, step=step, **state)


def default_load(path: str, state: dict[str, Any]) -> None:
    load_checkpoint(path, **state)


def _snapshot(state: dict[str, Any], loss: Any) -> dict[str, Any]:
    """Loss bits and fingerprints of parameters and optimizer-state tensors after one step."""
    named: dict[str, torch.Tensor] = {f"param:{k}": v for k, v in state["model"].state_dict().items()}
    opt = state.get("optimizer")
    if opt is not None:
        for pid, s in opt.state_dict()["state"].items():
            for key, value in s.items():
                if isinstance(value, torch.Tensor):
                    named[f"optimizer state:param{pid}.{key}"] = value
    fps = dict(zip(named, fingerprint_many(list(named.values()))))
    if isinstance(loss, torch.Tensor):
        loss = loss.detach().double().item() if loss.numel() == 1 else None
    return {"loss": float(loss).hex() if loss is not None else None, "fps": fps}


class ResumeContractError(ReproError):
    """``build`` or ``step`` does not keep verify_resume's contract (see the module docstring)."""


_CHECKPOINT_KEYS = ("model", "optimizer", "scheduler", "scaler", "loader")


def check_state(state: Any, build: str, *, default_io: bool) -> None:
    """Raise :class:`ResumeContractError` unless ``build()`` returned a state verify_resume can use."""
    if not isinstance(state, dict):
        raise ResumeContractError(f"verify_resume: build() ({build}) returned a {type(state).__name__}, expected a "
                                  f"dict with 'model' and any of {', '.join(_CHECKPOINT_KEYS[1:])}.")
    if not isinstance(state.get("model"), torch.nn.Module):
        got = "no 'model'" if "model" not in state else f"'model' = a {type(state['model']).__name__}"
        raise ResumeContractError(f"verify_resume: build() ({build}) returned {got}; expected 'model': the "
                                  "nn.Module being trained (its parameters are compared after every step).")
    extra = sorted(str(k) for k in state if k not in _CHECKPOINT_KEYS)
    if default_io and extra:
        raise ResumeContractError(
            f"verify_resume: build() ({build}) returned keys {extra} that save_checkpoint cannot take (it takes "
            f"{', '.join(_CHECKPOINT_KEYS)}). Keep the data position in 'loader' (a ResumableLoader: "
            "step() calls state['loader'].next_batch()), or pass save= and load= that save those keys too.")


def _one_step(step: Callable[[dict[str, Any]], Any], state: dict[str, Any], k: int) -> Any:
    try:
        return step(state)
    except StopIteration:
        raise ResumeContractError(
            f"verify_resume: step() raised StopIteration at step {k}: its batches ran out (an iterator made with "
            "iter(loader) ends with its epoch, and is not saved in the checkpoint). Take each batch with "
            "state['loader'].next_batch(): a ResumableLoader rolls over into the next epoch and its position is "
            "saved.") from None


def run_child(cfg: dict[str, Any]) -> None:
    seed_everything(cfg["seed"], workers=True)
    build, step = _resolve(cfg["build"]), _resolve(cfg["step"])
    state = build()
    check_state(state, cfg["build"], default_io=cfg["save"] == _ref(default_save) or cfg["load"] == _ref(default_load))
    if cfg["role"] == "resumed":
        _resolve(cfg["load"])(cfg["ckpt"], state)
    records = []
    for k in range(cfg["first"], cfg["last"] + 1):
        records.append(_snapshot(state, _one_step(step, state, k)))
    if cfg["role"] == "first":
        _resolve(cfg["save"])(cfg["ckpt"], state, cfg["last"])
    Path(cfg["out"]).write_text(json.dumps(records))


_ROLE = {"straight": "straight", "first": "interrupted", "resumed": "resumed"}  # cfg role -> the run's name


def _run(cfg: dict[str, Any], timeout: float) -> list[dict[str, Any]]:
    """Run one training process; kill it (and what it started) if it outlives ``timeout`` or we are stopped."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "PYTHONHASHSEED": "0"}
    what = f"the {_ROLE[cfg['role']]} run (steps {cfg['first']}..{cfg['last']})"
    proc = subprocess.Popen([sys.executable, "-m", "torchrepro.resume._child", json.dumps(cfg)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise ResumeRunError(f"verify_resume: {what} did not finish within {timeout:g} s and was killed. Pass a "
                             "larger timeout= if training is that slow, or look for a hang in build, step, save "
                             "or load.") from None
    except BaseException:
        _kill(proc)
        raise
    if proc.returncode != 0:
        tail = "\n".join(stderr.strip().splitlines()[-20:])
        raise ResumeRunError(f"verify_resume: {what} failed with exit code {proc.returncode}:\n{tail}")
    return cast("list[dict[str, Any]]", json.loads(Path(cfg["out"]).read_text()))


def _kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the child's process group (its data-loader workers too) and reap the child."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(OSError, ValueError):
        proc.communicate(timeout=30)


def verify_resume(
    build: Callable[[], dict[str, Any]],
    step: Callable[[dict[str, Any]], Any],
    *,
    steps: int,
    resume_at: int,
    seed: int = 0,
    save: Callable[[str, dict[str, Any], int], None] = default_save,
    load: Callable[[str, dict[str, Any]], None] = default_load,
    workdir: str | Path | None = None,
    timeout: float = 600,
) -> ResumeReport:
    """Check that ``resume_at`` steps + save + load in a new process + the rest equals ``steps`` straight.

    ``save(path, state, step)`` and ``load(path, state)`` default to torchrepro's checkpoints; pass your own
    to test another checkpointing scheme. Returns a :class:`ResumeReport`. The checkpoint and each run's
    results go to ``workdir`` (kept for inspection) or to a temporary directory that is removed afterwards, also
    on error. A run that outlives ``timeout`` seconds is killed with the processes it started, and
    :class:`ResumeRunError` names it (straight, interrupted or resumed).
    """
    if _loading:  # a child is loading the caller's script, which calls verify_resume at its top level
        raise _ScriptLoaded
    if not 0 < resume_at < steps:
        raise ValueError(f"need 0 < resume_at < steps, got resume_at={resume_at}, steps={steps}")
    with _work_dir(workdir) as work:
        base = {"seed": seed, "build": _ref(build), "step": _ref(step), "save": _ref(save), "load": _ref(load),
                "ckpt": str(work / "checkpoint.pt")}
        straight = _run({**base, "role": "straight", "first": 1, "last": steps,
                         "out": str(work / "straight.json")}, timeout)
        first = _run({**base, "role": "first", "first": 1, "last": resume_at, "out": str(work / "first.json")},
                     timeout)
        rest = _run({**base, "role": "resumed", "first": resume_at + 1, "last": steps,
                     "out": str(work / "rest.json")}, timeout)
    return _compare(straight, first + rest, steps, resume_at)


@contextlib.contextmanager
def _work_dir(workdir: str | Path | None) -> Iterator[Path]:
    """The caller's ``workdir`` (kept), or a fresh temporary directory removed on the way out, also on error."""
    if workdir is not None:
        Path(workdir).mkdir(parents=True, exist_ok=True)
        yield Path(workdir)
        return
    work = Path(tempfile.mkdtemp(prefix="torchrepro-resume-"))
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)  # made by mkdtemp just above: ours, with all that is in it


def _compare(straight: list[dict[str, Any]], resumed: list[dict[str, Any]], steps: int,
             resume_at: int) -> ResumeReport:
    """The first step at which the interrupted-and-resumed records differ from the straight ones."""
    report = ResumeReport(identical=True, steps=steps, resume_at=resume_at,
                          losses_straight=[float.fromhex(r["loss"]) if r["loss"] else None for r in straight],
                          losses_resumed=[float.fromhex(r["loss"]) if r["loss"] else None for r in resumed])
    for k, (a, b) in enumerate(zip(straight, resumed), start=1):
        if a["loss"] != b["loss"]:
            report.identical, report.first_step, report.what, report.tensor = False, k, "loss", None
            return report
        diff = [n for n in a["fps"] if a["fps"][n] != b["fps"].get(n)] + [n for n in b["fps"] if n not in a["fps"]]
        if diff:
            kind, _, name = diff[0].partition(":")
            report.identical, report.first_step, report.what, report.tensor = False, k, kind, name
            return report
    return report
