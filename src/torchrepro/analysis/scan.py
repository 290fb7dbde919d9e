"""Scan one training step for ops that are nondeterministic on a target device.

A light ``TorchDispatchMode`` sees every ATen op of one step and asks the registry of nondeterministic ops
(:mod:`torchrepro.control.registry`) about it *for the target device*, so a scan that runs on CPU lists what would be
nondeterministic, raise or warn under deterministic mode on CUDA. Each finding names the op, the module, the
user's source line (for backward ops: the forward line that created the autograd node), how often it ran and
the known alternative.

Example:
    >>> report = torchrepro.scan(model, (x,), optimizer, device="cuda")  # doctest: +SKIP
    >>> [(f.op, f.module, f.line) for f in report.findings]  # doctest: +SKIP
    [('aten.index_add_', 'pool', 31), ('aten.upsample_bilinear2d_backward', 'up', 40)]

``torchrepro scan -- python train.py`` does the same for an unmodified script: :func:`child_main` runs in the
launcher's child process, scans from the start of the script to the end of its first optimizer step (or first
``backward()`` when the script has no ``torch.optim`` optimizer) and writes the report as JSON.
"""

from __future__ import annotations

import copy
import json
import os
import runpy
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.overrides import TorchFunctionMode

from .._core.dispatchmode import QuietDispatchMode
from .._core.errors import ReproError
from .._core.io import atomic_write_json
from .._core.modules import ModuleContext, discover_models, optimizers_exist
from .._core.naming import renamed
from .._core.patches import Patches
from .._core.table import render_table
from ..control.registry import match
from ..control.rng import isolate_rng

SCHEMA = "torchrepro.scan/1"
SCAN_ENV = "TORCHREPRO_SCAN"  # the child's configuration: {"out": path, "device": kind, "steps": n}
DEVICES = ("cpu", "cuda")
_NODE_KEY = "torchrepro.scan"  # key in an autograd node's metadata dict: (file, line, module) of its forward call
_TORCH_DIR = os.path.dirname(torch.__file__)
_OWN_DIR = os.path.dirname(os.path.dirname(__file__))  # the torchrepro package, every subpackage

# What to do about a finding, by what deterministic mode does with the op (the registry's deterministic_mode).
_FIX_BY_MODE = {
    "switches kernel": "deterministic mode fixes it: torchrepro.deterministic()",
    "raises": "no deterministic kernel: deterministic mode raises here",
    "warns": "no deterministic kernel: deterministic mode only warns",
    "nothing": "deterministic mode does not change it",
}


class ScanError(ReproError):
    """Arguments :func:`scan` cannot use (device, inputs, loss), or a scan child that wrote no report."""


def device_kind(device: str | torch.device) -> str:
    """``"cuda:1"`` -> ``"cuda"``; refuse device kinds the registry has no entries for.

    >>> device_kind("cuda:0")
    'cuda'
    """
    kind = device.type if isinstance(device, torch.device) else str(device).partition(":")[0].strip().lower()
    if kind not in DEVICES:
        raise ScanError(f"scan checks ops for device kind 'cpu' or 'cuda' (the registry's devices), got {device!r}. "
                        "Pass device='cuda' to check before running on GPUs, or device='cpu'.")
    return kind


@dataclass(frozen=True)
class ScanFinding:
    """One op that is nondeterministic (or raises/warns under deterministic mode) on the target device, at one
    place: op, phase (forward/backward/optimizer), module path, user source line, and how often it ran there."""

    op: str
    phase: str
    module: str
    file: str | None
    line: int | None
    code: str
    count: int
    when: str
    deterministic_mode: str
    alternative: str
    verified_on: str
    ran_on: str = ""  # the device kind the op ran on during the scan

    @property
    def fix(self) -> str:
        """What to change: the registry's alternative, else what deterministic mode does about it."""
        base = _FIX_BY_MODE.get(self.deterministic_mode, f"deterministic mode: {self.deterministic_mode}")
        if not self.alternative:
            return base
        if self.deterministic_mode == "switches kernel":
            return f"{self.alternative} (or {base.split(': ', 1)[1]})"
        return self.alternative

    def source(self) -> str:
        """``train.py:12`` (relative to the working directory when below it), or a note when no line is known."""
        if not self.file:
            return "(no user source line)"
        path = self.file
        try:
            rel = os.path.relpath(path)
            path = rel if not rel.startswith("..") else path
        except ValueError:
            pass
        return f"{path}:{self.line}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "fix": self.fix}
    to_dict = renamed("to_json", "to_dict")


@dataclass
class ScanReport:
    """What a scan found: ``findings`` (empty when clean), for device kind ``device``.

    ``step_mode`` says what was scanned: ``"optimizer"`` (up to the end of ``steps`` optimizer steps),
    ``"backward"`` (``steps`` ``backward()`` calls, no optimizer), ``"script"`` (the script ended before a
    step: all of it) or ``"call"`` (:func:`scan`: one forward, backward and optimizer step).
    """

    device: str
    findings: list[ScanFinding] = field(default_factory=list)
    step_mode: str = "call"
    steps: int = 1
    ops_seen: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.findings

    @property
    def exit_code(self) -> int:
        return 0 if self.clean else 1

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "verdict": "clean" if self.clean else "found", "exit_code": self.exit_code,
                "device": self.device, "step_mode": self.step_mode, "steps": self.steps,
                "ops_seen": self.ops_seen, "findings": [f.to_json() for f in self.findings], "notes": self.notes}
    to_dict = renamed("to_json", "to_dict")

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ScanReport:
        names = set(ScanFinding.__dataclass_fields__)
        findings = [ScanFinding(**{k: v for k, v in f.items() if k in names}) for f in doc.get("findings", [])]
        return cls(device=doc["device"], findings=findings, step_mode=doc.get("step_mode", "call"),
                   steps=int(doc.get("steps", 0)), ops_seen=int(doc.get("ops_seen", 0)),
                   notes=list(doc.get("notes", [])))

    def scope(self) -> str:
        unit = {"optimizer": "optimizer step", "backward": "backward() call"}.get(self.step_mode)
        if unit is None:
            return "the whole script" if self.step_mode == "script" else "one training step"
        return f"{self.steps} {unit}{'s' if self.steps != 1 else ''}"

    def render(self) -> str:
        """The report as text: a table of findings (rich when installed) and the source lines."""
        if self.clean:
            lines = [f"torchrepro scan: CLEAN - no op in {self.scope()} ({self.ops_seen} ATen ops) is "
                     f"nondeterministic, raises or warns under deterministic mode on {self.device}."]
        else:
            n = len({f.op for f in self.findings})
            lines = [f"torchrepro scan: FOUND {n} op{'s' if n != 1 else ''} that would be nondeterministic, raise or "
                     f"warn under deterministic mode on {self.device} ({len(self.findings)} place"
                     f"{'s' if len(self.findings) != 1 else ''}, {self.scope()}, {self.ops_seen} ATen ops)", ""]
            groups: dict[tuple[str, str, str, str], list[ScanFinding]] = {}
            for f in self.findings:  # one row per op and source line; the modules that ran it are listed
                groups.setdefault((f.op, f.phase, f.source(), f.deterministic_mode), []).append(f)
            rows = [[op, phase, _modules_text([f.module for f in group]), source, str(sum(f.count for f in group)),
                     mode] for (op, phase, source, mode), group in groups.items()]
            lines.append(render_table(["op", "phase", "module", "source", "count", "deterministic mode"], rows,
                                      right={4}))
            lines += ["", f"What and how to fix (on {self.device}):"]
            seen: set[tuple[str, str]] = set()
            for f in self.findings:
                if (f.op, f.when) in seen:
                    continue
                seen.add((f.op, f.when))
                lines.append(f"  {f.op}: nondeterministic {f.when}; deterministic mode {f.deterministic_mode}.")
                lines.append(f"      fix: {f.fix}")
            sources = {f.source(): f.code for f in self.findings if f.file and f.code}
            if sources:
                lines += ["", "Source lines:"] + [f"  {where}: {code}" for where, code in sources.items()]
        lines += [f"Note: {note}" for note in self.notes]
        return "\n".join(lines)

    __str__ = render


def _modules_text(modules: list[str], limit: int = 2) -> str:
    """``conv1, layer1.0.conv1 (+18 more)``; ``-`` for ops outside any module."""
    names = list(dict.fromkeys(m or "-" for m in modules))
    return ", ".join(names[:limit]) + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


# --- the scanner -------------------------------------------------------------------------------------------
def _user_frame(depth: int = 2) -> tuple[str, int] | None:
    """(file, line) of the innermost stack frame outside torch, torchrepro and the import machinery."""
    f: Any = sys._getframe(depth)
    while f is not None:
        name = f.f_code.co_filename
        if not (name.startswith(_TORCH_DIR) or name.startswith(_OWN_DIR) or name.startswith("<frozen")
                or name.endswith(("/contextlib.py", "/runpy.py"))):
            return name, f.f_lineno
        f = f.f_back
    return None


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x)


def _code_line(path: str | None, line: int | None, cache: dict[str, list[str]]) -> str:
    if not path or not line:
        return ""
    if path not in cache:
        try:
            cache[path] = Path(path).read_text(errors="replace").splitlines()
        except OSError:
            cache[path] = []
    text = cache[path]
    return text[line - 1].strip() if 0 < line <= len(text) else ""


class _Dispatch(QuietDispatchMode):
    def __init__(self, scanner: Scanner) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.scanner = scanner

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if self.scanner.recording:  # before running it: under the user's own deterministic mode it may raise
            self.scanner.see(func, args, kwargs)
        return func(*args, **kwargs)


class _Function(TorchFunctionMode):
    """Labels each autograd node with the user's source line and module of the torch call that created it."""

    def __init__(self, scanner: Scanner) -> None:
        super().__init__()
        self.scanner = scanner

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.scanner.recording and torch.is_grad_enabled():
            self.scanner.label(out)
        return out


_OP_NAMES: dict[Any, str] = {}


class Scanner:
    """Collects registry matches for the ATen ops run between :meth:`start` and :meth:`stop`.

    >>> with Scanner("cuda") as s:  # doctest: +SKIP
    ...     model(x).sum().backward()
    >>> s.report().findings  # doctest: +SKIP
    """

    def __init__(self, device: str | torch.device = "cuda", *, models: Mapping[str, nn.Module] | None = None) -> None:
        self.device = device_kind(device)
        self.models = models
        self.ops_seen = 0
        self.recording = False
        self._match = match
        # (op, phase, module, file, line, when) -> [count, entry, devices]
        self._found: dict[tuple[Any, ...], list[Any]] = {}
        self._errors: dict[str, str] = {}
        self._names: dict[int, str] = {}
        self._lookups_left = 8  # modules created in forward (nn.ReLU()(x)) must not cost a walk of the models each
        self._context = ModuleContext(self._module_name)
        self._modes: list[Any] = []

    # --- where an op is -------------------------------------------------------------------------------
    def _module_name(self, mod: nn.Module) -> str:
        name = self._names.get(id(mod))
        if name is None and self._lookups_left:  # not seen yet: look the models up again (rarely)
            self._lookups_left -= 1
            models = self.models if self.models is not None else discover_models()
            for prefix, model in models.items():
                for sub_name, sub in model.named_modules():
                    self._names.setdefault(id(sub), ".".join(x for x in (prefix, sub_name) if x)
                                           or type(sub).__name__)
        return self._names.setdefault(id(mod), type(mod).__name__) if name is None else name

    def _where(self) -> tuple[str, str, str | None, int | None]:
        """(phase, module, file, line) of the op being dispatched."""
        if self._context.in_optimizer:
            site = _user_frame(3)
            return "optimizer", "", site[0] if site else None, site[1] if site else None
        node = torch._C._current_autograd_node()
        if node is not None:
            try:
                file, line, module = node.metadata.get(_NODE_KEY, (None, None, ""))  # type: ignore[attr-defined]
            except AttributeError:
                file, line, module = None, None, ""
            return "backward", module, file, line
        site = _user_frame(3)
        return "forward", self._context.path, site[0] if site else None, site[1] if site else None

    def see(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        name = _OP_NAMES.get(func)
        if name is None:
            name = _OP_NAMES[func] = str(func.overloadpacket)
        self.ops_seen += 1
        try:
            entry = self._match(name, args, kwargs, self.device)
        except Exception as exc:  # a registry condition that cannot read these arguments: note it, never break
            self._errors.setdefault(name, f"{type(exc).__name__}: {exc}")
            return
        if entry is None:
            return
        phase, module, file, line = self._where()
        key = (name, phase, module, file, line, entry.when)
        slot = self._found.get(key)
        if slot is None:
            slot = self._found[key] = [0, entry, set()]
        slot[0] += 1
        ran_on = next((t.device.type for t in _tensors(args)), None)
        if ran_on:
            slot[2].add(ran_on)

    def label(self, out: Any) -> None:
        """Give each new autograd node behind ``out`` the current source line and module (backward ops read it)."""
        todo = [t.grad_fn for t in _tensors(out)]
        site: tuple[Any, ...] | None = None
        while todo:
            node = todo.pop()
            if node is None or type(node).__name__ == "AccumulateGrad":
                continue
            try:
                meta: dict[str, Any] = node.metadata  # type: ignore[assignment]  # a dict (torch's stub: a method)
            except AttributeError:
                continue
            if _NODE_KEY in meta:
                continue
            if site is None:
                frame = _user_frame(3)
                site = (frame[0] if frame else None, frame[1] if frame else None,
                        self._context.path)
            meta[_NODE_KEY] = site
            todo.extend(fn for fn, _ in node.next_functions)

    # --- start / stop ---------------------------------------------------------------------------------
    def start(self) -> Scanner:
        if self._modes:
            self.recording = True
            return self
        self._context.install()
        mode: Any
        for mode in (_Function(self), _Dispatch(self)):
            try:
                mode.__enter__()
            except BaseException:
                self.stop()
                raise
            self._modes.append(mode)
        self.recording = True
        return self

    def stop(self) -> None:
        self.recording = False
        for m in reversed(self._modes):
            m.__exit__(None, None, None)
        self._context.remove()
        self._modes = []

    def __enter__(self) -> Scanner:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def report(self, *, step_mode: str = "call", steps: int = 1) -> ScanReport:
        """The findings so far, in the order the ops first ran."""
        cache: dict[str, list[str]] = {}
        findings = [
            ScanFinding(op=name, phase=phase, module=module, file=_absolute(file), line=line,
                        code=_code_line(file, line, cache), count=count, when=entry.when,
                        deterministic_mode=entry.deterministic_mode, alternative=entry.alternative,
                        verified_on=entry.verified_on, ran_on=",".join(sorted(devices)))
            for (name, phase, module, file, line, _), (count, entry, devices) in self._found.items()
        ]
        notes = [f"the registry could not judge {op} ({err}); it is not listed" for op, err in self._errors.items()]
        return ScanReport(device=self.device, findings=findings, step_mode=step_mode, steps=steps,
                          ops_seen=self.ops_seen, notes=notes)


def _absolute(file: str | None) -> str | None:
    """A code object's file name as an absolute path (scripts run by a relative path have relative names)."""
    return os.path.abspath(file) if file and not file.startswith("<") else file


# --- the library function -------------------------------------------------------------------------------
def _call(model: Callable[..., Any], inputs: Any) -> Any:
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def _default_loss(out: Any) -> torch.Tensor:
    """The sum of every floating-point output that requires grad (a stand-in loss to run backward on)."""
    found = [t for t in _tensors(list(out.values()) if isinstance(out, Mapping) else out) if t.requires_grad]
    if not found:
        raise ScanError(f"the model's output ({type(out).__name__}) holds no tensor that requires grad, so there "
                        "is no backward pass to scan. Pass loss_fn=lambda out: ... returning a scalar loss, or "
                        "check that the model has trainable parameters and runs with gradients enabled.")
    loss = found[0].sum()
    for t in found[1:]:
        loss = loss + t.sum()
    return loss


class _Restore:
    """Puts the model's parameters, buffers and gradients and the optimizer's state back after the scan."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        self.model, self.optimizer = model, optimizer
        self.state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.grads = {p: (p.grad.detach().clone() if p.grad is not None else None) for p in model.parameters()}
        self.opt_state = copy.deepcopy(optimizer.state_dict()) if optimizer is not None else None

    def __enter__(self) -> _Restore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.model.load_state_dict(self.state)
        for p, g in self.grads.items():
            p.grad = g
        if self.optimizer is not None and self.opt_state is not None:
            self.optimizer.load_state_dict(self.opt_state)


def scan(model: nn.Module, example_inputs: Any, optimizer: torch.optim.Optimizer | None = None, *,
         device: str | torch.device = "cuda", loss_fn: Callable[[Any], torch.Tensor] | None = None,
         restore: bool = True) -> ScanReport:
    """Run one training step (forward, ``loss_fn``, backward, ``optimizer.step()``) and list the ops that would be
    nondeterministic, raise or warn under deterministic mode on ``device`` -- where the step itself runs does not
    matter, so a CPU machine can check a model for CUDA.

    ``example_inputs`` is one tensor, a tuple/list of positional arguments or a dict of keyword arguments.
    Without ``loss_fn`` the loss is the sum of every output tensor that requires grad. With ``restore`` (the
    default) parameters, buffers, gradients, optimizer state and every RNG are put back afterwards.

    >>> import torch, torchrepro
    >>> class Pool(torch.nn.Module):
    ...     def forward(self, x):
    ...         return torch.zeros(2, 4).index_add_(0, torch.tensor([0, 1, 0]), x)
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), Pool())
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> report = torchrepro.scan(model, (torch.ones(3, 4),), opt, device="cuda")   # runs on CPU, checks for CUDA
    >>> report.clean, [(f.op, f.module) for f in report.findings]
    (False, [('aten.index_add_', '1')])
    >>> torchrepro.scan(model, (torch.ones(3, 4),), opt, device="cpu").clean
    True
    """
    scanner = Scanner(device, models={"": model})
    keep = _Restore(model, optimizer) if restore else None
    try:
        with isolate_rng(), scanner:
            out = _call(model, example_inputs)
            loss = loss_fn(out) if loss_fn is not None else _default_loss(out)
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
                raise ScanError(f"loss_fn must return a scalar tensor that requires grad, got {_describe(loss)}. "
                                "Return e.g. F.mse_loss(out, target) computed from the model's output.")
            loss.backward()
            if optimizer is not None:
                optimizer.step()
    finally:
        if keep is not None:
            keep.__exit__(None, None, None)
    return scanner.report(step_mode="call", steps=1)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} (requires_grad={value.requires_grad})"
    return f"a {type(value).__name__}"


# --- the child side of `torchrepro scan -- python train.py` ----------------------------------------------
class _ScanDone(SystemExit):
    """Raised from a step hook once the scanned steps are done: ends the script cleanly (code 0)."""

    def __init__(self) -> None:
        super().__init__(0)


class _StepStopper:
    """Counts optimizer steps and ``backward()`` calls; raises :class:`_ScanDone` after ``steps`` steps.

    With a ``torch.optim`` optimizer alive, ``backward()`` calls before its step are gradient accumulation: the
    scan waits for the optimizer step. Without one, each ``backward()`` is a step.
    """

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.optimizer_steps = 0
        self.backward_calls = 0
        self.done = False
        self._has_optimizer: bool | None = None
        self._patches = Patches()

    @property
    def step_mode(self) -> str:
        return "optimizer" if self.optimizer_steps else ("backward" if self.backward_calls else "script")

    def _stop(self) -> None:
        self.done = True
        raise _ScanDone()

    def install(self) -> _StepStopper:
        orig = torch.autograd.backward
        stopper = self

        def backward(*args: Any, **kwargs: Any) -> Any:
            result = orig(*args, **kwargs)
            stopper.backward_calls += 1
            if not stopper.optimizer_steps and stopper.backward_calls >= stopper.steps:
                if stopper._has_optimizer is None:
                    stopper._has_optimizer = optimizers_exist()
                if not stopper._has_optimizer:
                    stopper._stop()
            return result

        def step_hook(opt: Any, args: Any, kwargs: Any) -> None:
            stopper.optimizer_steps += 1
            if stopper.optimizer_steps >= stopper.steps:
                stopper._stop()

        self._patches.set(torch.autograd, "backward", backward)
        self._patches.hook(register_optimizer_step_post_hook(step_hook))
        return self

    def uninstall(self) -> None:
        self._patches.undo()


def child_code() -> str:
    """The ``python -c`` code that the launcher's child runs: :func:`child_main` with ``KIND TARGET ARGS``."""
    return "from torchrepro.analysis.scan import child_main; child_main()"


def _run_target(kind: str, target: str, args: list[str]) -> None:
    """Run the user's script, module or code as ``__main__`` with its own ``sys.argv``, as the launcher does."""
    from ..record.child import _run_code

    sys.argv = ["-c" if kind == "code" else target, *args]
    if kind == "code":
        _run_code(target)
        return
    if sys.path[:1] == [""]:  # put there for our own `python -c`: a script run sees its directory instead
        sys.path.pop(0)
    if kind == "module":
        sys.path.insert(0, os.getcwd())
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, str(Path(target).resolve().parent))
        runpy.run_path(target, run_name="__main__")


def _print_user_traceback(exc: BaseException) -> None:
    """The script's traceback on stderr, without the frames of torchrepro and runpy that started it and of the
    scanner's modes."""
    tb, started = exc.__traceback__, False
    while tb is not None and tb.tb_next is not None:
        code = tb.tb_frame.f_code
        ours = code.co_filename.startswith(_OWN_DIR) or "runpy" in code.co_filename
        if started and not ours:
            break
        started = started or (code.co_filename == __file__ and code.co_name == "_run_target")
        tb = tb.tb_next
    report = traceback.TracebackException(type(exc), exc, tb)
    kept = []
    for frame in report.stack:  # the frames of our dispatch/function modes and below would not be there without us
        if frame.filename.startswith(_OWN_DIR):
            break
        kept.append(frame)
    report.stack = traceback.StackSummary.from_list(kept)
    print("".join(report.format()), end="", file=sys.stderr, flush=True)


def child_main() -> None:
    """In the launcher's child: scan the user's script (``sys.argv[1:]`` = KIND TARGET ARGS) until the end of
    the configured number of steps and write the report to the file named in ``$TORCHREPRO_SCAN``."""
    config = json.loads(os.environ.pop(SCAN_ENV))
    kind, target, *args = sys.argv[1:]
    pid = os.getpid()
    scanner = Scanner(config["device"])
    stopper = _StepStopper(int(config.get("steps", 1)))
    failed = True
    try:
        stopper.install()
        scanner.start()
        _run_target(kind, target, args)
        failed = False
    except _ScanDone:
        failed = not stopper.done  # raised by our hook, not caught and re-raised from elsewhere
    except SystemExit as exc:
        failed = exc.code not in (None, 0)
        raise
    except BaseException as exc:
        _print_user_traceback(exc)
        raise SystemExit(1) from None
    finally:
        scanner.stop()
        stopper.uninstall()
        if os.getpid() == pid:  # also when the script failed: what was found before may explain it
            steps = stopper.optimizer_steps or stopper.backward_calls
            report = scanner.report(step_mode=stopper.step_mode, steps=steps)
            atomic_write_json(Path(config["out"]), {**report.to_json(), "complete": not failed})
