"""Comparing recorded runs: identical, or where, what and why they diverge.

Example:
    >>> from torchrepro.analysis.compare import compare_runs          # doctest: +SKIP
    >>> result = compare_runs([load_run("a"), load_run("b")])  # doctest: +SKIP
    >>> result.verdict, result.first_step, result.cause        # doctest: +SKIP
    ('diverged', 1, 'compute')
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from .._core.fingerprint import UNREADABLE
from ..record.store import COMPARE_GRAD_STEPS, GRAD_VALUE_STEPS, MODEL_INPUTS, Run
from ..record.workdir import left_out_text, shared_text
from .causes import SHARED_CWD, cause, with_commands
from .comparable import check_comparable
from .comparable import command_key as command_key  # re-exported: where the runs' commands are compared
from .tensordelta import _deltas, _differing_elements, _nonfinite, _worst, tensor_delta
from .tensordelta import ulp_distance as ulp_distance  # re-exported with tensor_delta: where tensors are compared

SCHEMA = "torchrepro.check/1"

# Recorded quantities in causal order: what a step consumes comes before what it produces.
KINDS = ("batches", "init", "loss", "grads", "params", "state", "steps")
LABELS = {
    "batches": "data batch",
    "init": "initial parameters",
    "loss": "loss",
    "grads": "gradients",
    "params": "parameters",
    "state": "optimizer state",
    "steps": "number of steps",
}

# Steps that saw no DataLoader batch record the inputs of the model's forward as their data (the recorder's
# "batches_source": "model-inputs"): a difference there is data too, told in these words.
MODEL_INPUTS_EXPLANATION = (
    "The runs fed different data to the model while the parameters were still identical: {where} differ. The "
    "script draws its batches (sample indices, noise, augmentation) from unseeded random numbers.")
MODEL_INPUTS_ACTION = (
    "Seed the data path: draw batch indices, noise and augmentation from seeded generators (torch.manual_seed(SEED) "
    "or torchrepro.seed_everything(SEED) before the loop, or a torch.Generator().manual_seed(SEED) passed as "
    "generator=) rather than os.urandom, the time or fresh unseeded generators.")


@dataclass
class Difference:
    """One recorded quantity that differs at one step, with the tensors involved."""

    kind: str
    step: int
    names: list[str] = field(default_factory=list)
    runs: tuple[int, int] = (0, 1)

    @property
    def label(self) -> str:
        return LABELS[self.kind]


@dataclass
class CheckResult:
    """The outcome of comparing N runs (as data; render it with the CLI or ``to_json``)."""

    verdict: str  # "identical" | "diverged"
    runs: list[str]
    step_mode: str
    steps: list[int]
    first_step: int | None = None
    first: list[Difference] = field(default_factory=list)  # what differs at the first divergent step
    kind_first_steps: dict[str, int] = field(default_factory=dict)
    cause: str | None = None
    losses: list[list[float | None]] = field(default_factory=list)
    loss_delta: list[float | None] = field(default_factory=list)
    param_delta: dict[int, float] = field(default_factory=dict)  # step -> max |Δ| over parameters
    final_max_abs_delta: float | None = None
    final_max_abs_delta_tensor: str | None = None
    max_ulp: int | None = None
    max_ulp_tensor: str | None = None
    # NaN/Inf positions that differ between runs (kept apart from |Δ|, which covers finite values only):
    # {"step" (None = final), "tensor", "runs" (indices, as in Difference.runs), "text" (runs numbered from 1)}
    nonfinite: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # max |Δ| of gradients and optimizer state where they first differ (from values/grads_N.pt, state_N.pt)
    value_deltas: list[dict[str, Any]] = field(default_factory=list)
    params_identical: bool | None = None  # no parameter differs at any step nor at the end
    value_delta_text: str | None = None  # "parameters identical so far; gradients differ by up to ..."
    compiled: dict[str, Any] | None = None  # torch.compile'd regions and whether the divergence lies in them
    working_directory: dict[str, Any] | None = None  # check's watch on its cwd (see note_shared_workdir)
    next_action: str | None = None  # replaces the cause's next action (diff of runs from two environments)
    # (check's options, the user's command): the commands in the next action and the shared-cwd warning are the
    # check that reproduces this one (see causes.with_commands); None: left as `torchrepro check ... -- ...`
    rerun: tuple[list[str], list[str]] | None = None
    # per run: None, or how check stopped it after the divergence ({"after_step", "first_divergent_step", ...})
    stopped: list[dict[str, Any] | None] = field(default_factory=list)
    # where the first differing data came from when no DataLoader batch was seen: {"source": "model-inputs",
    # "modules": [class names], "text": "the inputs of GPT.forward (no DataLoader seen)"}; None: DataLoader batches
    data_source: dict[str, Any] | None = None

    @property
    def explanation(self) -> str | None:
        if self.cause == "data" and self.data_source:
            return MODEL_INPUTS_EXPLANATION.format(where=self.data_source["text"])
        return explain(self.cause, self.working_directory) if self.cause else None

    @property
    def action(self) -> str | None:
        if self.next_action:
            text: str | None = self.next_action
        elif self.cause == "data" and self.data_source:
            text = MODEL_INPUTS_ACTION
        else:
            text = cause(self.cause).wording("check").action if self.cause else None
        return with_commands(text, *self.rerun) if text and self.rerun else text

    def set_rerun(self, options: list[str], command: list[str]) -> None:
        """Name the check that gave this result (:attr:`rerun`): its next action and the warning of a shared working
        directory then name that check's own command line with what to add."""
        self.rerun = (list(options), list(command))
        warning = (self.working_directory or {}).get("warning")
        if warning:
            self.working_directory = dict(self.working_directory or {}) | {
                "warning": with_commands(warning, options, command)}

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "verdict": self.verdict,
            "runs": self.runs,
            "step_mode": self.step_mode,
            "steps": self.steps,
            "first_divergent_step": self.first_step,
            "diverged_first": [asdict(d) | {"label": d.label} for d in self.first],
            "first_step_by_kind": self.kind_first_steps,
            "cause": self.cause,
            "explanation": self.explanation,
            "action": self.action,
            "losses": self.losses,
            "loss_max_abs_delta": self.loss_delta,
            "param_max_abs_delta": {str(k): v for k, v in sorted(self.param_delta.items())},
            "final_max_abs_delta_weight": self.final_max_abs_delta,
            "final_max_abs_delta_tensor": self.final_max_abs_delta_tensor,
            "max_ulp_distance": self.max_ulp,
            "max_ulp_tensor": self.max_ulp_tensor,
            "nonfinite_differences": self.nonfinite,
            "notes": self.notes,
            "value_deltas": self.value_deltas,
            "parameters_identical": self.params_identical,
            "value_delta_text": self.value_delta_text,
            "compiled": self.compiled,
            "working_directory": self.working_directory,
            "stopped": self.stopped,
            "data_source": self.data_source,
        }


def explain(name: str, working_directory: dict[str, Any] | None = None) -> str:
    """The cause's explanation; for a shared working directory, with the files named."""
    shared = (working_directory or {}).get("read_from_earlier_run") or []
    return cause(name).wording("check").explanation.format(files=shared_text(shared))


def shared_workdir_warning(shared: list[dict[str, Any]]) -> str | None:
    """What to tell when later runs read files an earlier run wrote in the shared working directory (or None)."""
    action = cause(SHARED_CWD).wording("check").action
    return f"{explain(SHARED_CWD, {'read_from_earlier_run': shared})} {action}" if shared else None


def note_shared_workdir(result: CheckResult, watch: dict[str, Any]) -> None:
    """Attach ``check``'s watch on its working directory to ``result``. When a later run read what an earlier
    one wrote there, the comparison is void: a divergence is blamed on that (the cause found otherwise is kept
    as ``cause_otherwise``), and an identical verdict gets the warning. With ``--fresh-cwd``, what the copies
    left out (FIFOs, sockets, devices) is a note."""
    shared = watch.get("read_from_earlier_run") or []
    result.working_directory = watch | {"warning": shared_workdir_warning(shared)}
    if shared and result.verdict == "diverged":
        result.working_directory["cause_otherwise"] = result.cause
        result.cause = SHARED_CWD
    if watch.get("not_copied"):
        result.notes.append(left_out_text({e["path"]: e["kind"] for e in watch["not_copied"]}, str(watch.get("root"))))
    if watch.get("watch_truncated"):
        result.notes.append(f"The working directory holds more than {watch.get('watched_entries_limit')} files and "
                            "folders: only the first ones were watched for files one run writes and a later run "
                            "reads (run check from the project's own directory, or use --fresh-cwd).")


def _diff_maps(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[str]:
    a, b = a or {}, b or {}
    return [k for k in list(a) + [k for k in b if k not in a] if a.get(k) != b.get(k)]


def _diff_lists(a: list[Any] | None, b: list[Any] | None, label: str) -> list[str]:
    a, b = a or [], b or []
    names = [f"{label}[{i}]" for i in range(max(len(a), len(b))) if i >= len(a) or i >= len(b) or a[i] != b[i]]
    return names


def input_modules(step: dict[str, Any]) -> list[str] | None:
    """The classes whose forward inputs a step recorded as its batches (no DataLoader batch in the step), parallel
    to ``batches``; None when its batches are DataLoader batches."""
    if step.get("batches_source") != MODEL_INPUTS:
        return None
    modules = step.get("input_modules")
    return [str(m) for m in modules] if isinstance(modules, list) else []


def _batch_names(x: dict[str, Any], y: dict[str, Any], fx: list[Any], fy: list[Any]) -> list[str]:
    """``batch[i]`` for each differing DataLoader batch; ``GPT.forward inputs[i]`` for the model's inputs."""
    names = _diff_lists(fx, fy, "batch")
    mods = input_modules(x)
    mods = mods if mods is not None else input_modules(y)
    if mods is None:
        return names
    out = []
    for name in names:
        i = int(name[len("batch["):-1])
        out.append(f"{mods[min(i, len(mods) - 1)] if mods else 'model'}.forward inputs[{i}]")
    return out


def data_source_of(runs: list[Run], diff: Difference) -> dict[str, Any] | None:
    """Where the differing batches of ``diff`` came from: ``{"source": "model-inputs", "modules", "text"}`` when
    a step of either run recorded the model's inputs (no DataLoader batch seen), else None (DataLoader batches)."""
    found = [input_modules(runs[i].steps()[diff.step - 1]) for i in diff.runs if 0 < diff.step <= len(runs[i].steps())]
    if all(m is None for m in found):
        return None
    modules = list(dict.fromkeys(m for mods in found if mods for m in mods))
    names = " and ".join(f"{m}.forward" for m in modules[:3]) or "the model's forward"
    return {"source": MODEL_INPUTS, "modules": modules, "text": f"the inputs of {names} (no DataLoader seen)"}


def _step_fields(step: dict[str, Any], mode: str) -> dict[str, Any]:
    entries = step.get("losses", []) if mode == "optimizer" else [step["loss"]]
    losses = [(x.get("fp"), x.get("value")) for x in entries]  # the fingerprint and the exact bits
    return {"batches": step.get("batches", []), "loss": losses, "grads": step.get("grads"),
            "params": step.get("params"), "state": step.get("state")}


def stop_of(run: Run) -> dict[str, Any] | None:
    """How ``check`` stopped ``run`` after a divergence (manifest ``stopped``), or None: it ran to its end."""
    stop = run.manifest.get("stopped")
    return stop if isinstance(stop, dict) else None


def _pair_differences(a: Run, b: Run, ia: int, ib: int, labels: tuple[str, str] | None = None) -> list[Difference]:
    """Every kind's first difference between two runs (at most one per kind).

    A run that ``check`` stopped after a divergence is compared up to its last step: its final parameters and
    its number of steps (fewer than the other's) are not differences. ``labels``: what to call the two runs
    (``compare``: A and B), else run numbers."""
    found: dict[str, Difference] = {}
    init_a, init_b = a.of_kind("init"), b.of_kind("init")
    if init_a and init_b:
        names = _diff_maps(init_a[0].get("params"), init_b[0].get("params"))
        if names:
            found["init"] = Difference("init", 0, names, (ia, ib))
    sa, sb = a.steps(), b.steps()
    for k, (x, y) in enumerate(zip(sa, sb), start=1):
        fx, fy = _step_fields(x, a.step_mode), _step_fields(y, b.step_mode)
        for kind in ("batches", "loss", "grads", "params", "state"):
            if kind in found:
                continue
            if kind == "batches":
                names = _batch_names(x, y, fx[kind], fy[kind])
            elif kind == "loss":
                names = _diff_lists(fx[kind], fy[kind], "loss")
            else:
                names = _diff_maps(fx[kind], fy[kind])
            if names:
                found[kind] = Difference(kind, k, names, (ia, ib))
    n = min(len(sa), len(sb))
    if "params" not in found:
        fa, fb = a.of_kind("final"), b.of_kind("final")
        if fa and fb and len(sa) == len(sb) and not (stop_of(a) or stop_of(b)):
            names = _diff_maps(fa[0].get("params"), fb[0].get("params"))
            if names:
                found["params"] = Difference("params", max(n, 1), names, (ia, ib))
    if len(sa) != len(sb) and not stop_of(a if len(sa) < len(sb) else b):
        na, nb = labels or (f"run {ia + 1}", f"run {ib + 1}")
        counts = [f"{na}: {len(sa)} steps", f"{nb}: {len(sb)} steps"]
        found["steps"] = Difference("steps", n + 1, counts, (ia, ib))
    return sorted(found.values(), key=lambda d: (d.step, KINDS.index(d.kind)))


def _loss_value(step: dict[str, Any], mode: str) -> float | None:
    entries = step.get("losses", []) if mode == "optimizer" else [step.get("loss", {})]
    values = [e.get("value") for e in entries if e.get("value") is not None]
    return float.fromhex(values[-1]) if values else None


def _same_float(x: float, y: float) -> bool:
    return x == y or (math.isnan(x) and math.isnan(y))


def _loss_deltas(result: CheckResult) -> None:
    """Per-step max |Δ loss| over runs (None when a loss is missing, or NaN/Inf in one run only; the first
    such step is reported in ``result.nonfinite``)."""
    seen = False
    for k in range(min(len(x) for x in result.losses)):
        vals = [x[k] for x in result.losses]
        if any(v is None for v in vals):
            result.loss_delta.append(None)
            continue
        base, worst = vals[0], 0.0
        for i, v in enumerate(vals[1:], start=2):
            if _same_float(base, v):  # type: ignore[arg-type]
                continue
            if math.isfinite(base) and math.isfinite(v):  # type: ignore[arg-type]
                worst = max(worst, abs(v - base))  # type: ignore[operator]
                continue
            worst = math.nan
            if not seen:
                result.nonfinite.append({"step": k + 1, "tensor": "loss", "runs": [0, i - 1], "text":
                                         f"loss: {base!r} in run 1, {v!r} in run {i}"})
        seen = seen or math.isnan(worst)
        result.loss_delta.append(None if math.isnan(worst) else worst)


def _values_name(step: int, mode: str) -> str:
    return f"step_{step:06d}" if mode == "optimizer" else f"backward_{step:06d}"


def _unreadable_notes(runs: list[Run]) -> list[str]:
    """What a recorder could not read or save ("unreadable: <reason>", ``values_error``): it was not compared."""
    notes: list[str] = []
    for i, run in enumerate(runs, start=1):
        batches = [(k, b) for k, s in enumerate(run.steps(), start=1) for b in s.get("batches", [])
                   if str(b).startswith(UNREADABLE) and input_modules(s) is None]
        inputs = [(k, b) for k, s in enumerate(run.steps(), start=1) for b in s.get("batches", [])
                  if str(b).startswith(UNREADABLE) and input_modules(s) is not None]
        if inputs:
            k, b = inputs[0]
            notes.append(f"Run {i}: the inputs of the model's forward (the data of steps without a DataLoader) could "
                         f"not be fingerprinted {len(inputs)} time(s), the first at step {k} ({b[len(UNREADABLE):]}); "
                         f"that data was not compared, so a divergence from step {k} on may come from the data.")
        if batches:
            k, b = batches[0]
            notes.append(f"Run {i}: {len(batches)} data batch(es) could not be read, the first at step {k} "
                         f"({b[len(UNREADABLE):]}); their data was not compared, so a divergence from step {k} on "
                         "may come from the data. Return tensors, arrays, numbers, strings, lists, dicts, "
                         "dataclasses or named tuples from the dataset and collate_fn.")
        tensors = sorted({f"{e.get('kind')} {name}" for e in run.events for part in ("params", "grads", "state")
                          for name, fp in (e.get(part) or {}).items() if str(fp).startswith(UNREADABLE)})
        if tensors:
            notes.append(f"Run {i}: {len(tensors)} recorded tensor(s) could not be fingerprinted and were not "
                         f"compared: {', '.join(tensors[:3])}{' ...' if len(tensors) > 3 else ''} (see trace.jsonl).")
        if run.manifest.get("values_error"):
            failed = run.manifest.get("values_failed") or ["?"]
            notes.append(f"Run {i}: parameter values are unavailable from {failed[0]!r} on "
                         f"({run.manifest['values_error']}), so max |Δ weight| misses those steps.")
    return notes


def compare_runs(runs: list[Run], *, one_command: bool = True) -> CheckResult:
    """Compare every run with the first one; the earliest divergence over all pairs is reported.

    ``one_command=False``: the runs ran different commands on purpose (see :func:`check_comparable`)."""
    if len(runs) < 2:
        raise ValueError("compare_runs needs at least two runs")
    check_comparable(runs, one_command=one_command)
    mode = runs[0].step_mode
    result = CheckResult(verdict="identical", runs=[str(r.path) for r in runs], step_mode=mode,
                         steps=[len(r.steps()) for r in runs], stopped=[stop_of(r) for r in runs])
    diffs: list[Difference] = []
    for i, other in enumerate(runs[1:], start=1):
        if other.step_mode != mode:
            diffs.append(Difference("steps", 1, [f"run 1 steps by {mode}", f"run {i + 1} steps by {other.step_mode}"],
                                    (0, i)))
            continue
        diffs.extend(_pair_differences(runs[0], other, 0, i, None if one_command else ("A", "B")))
    result.losses = [[_loss_value(s, mode) for s in r.steps()] for r in runs]
    result.compiled = _compiled_regions(runs)
    _loss_deltas(result)
    result.notes += _unreadable_notes(runs)
    if mode == "backward":
        result.notes.append("The script updates parameters without torch.optim, so each backward() call is "
                            "treated as one step.")
    if not diffs:
        return result

    result.verdict = "diverged"
    result.first_step = min(d.step for d in diffs)
    first: dict[str, Difference] = {}
    for d in sorted(diffs, key=lambda d: (d.step, KINDS.index(d.kind))):
        result.kind_first_steps.setdefault(d.kind, d.step)
        if d.step == result.first_step:
            first.setdefault(d.kind, d)
    result.first = sorted(first.values(), key=lambda d: KINDS.index(d.kind))
    kinds = {d.kind for d in result.first}
    if "init" in result.kind_first_steps:
        result.cause = "initial-weights"
    elif result.first[0].kind == "batches":
        result.cause = "data"
        result.data_source = data_source_of(runs, result.first[0])
    elif kinds <= {"steps"}:
        result.cause = "steps"
    else:
        result.cause = "compute"
    _growth(runs, result)
    _value_deltas(runs, result)
    _in_compiled_code(result)
    return result


# --- gradients and optimizer state while the parameters are still identical ------------------------------
_VALUE_KINDS = {"grads": ("grads", "gradients differ"), "state": ("state", "optimizer state differs")}


def _value_deltas(runs: list[Run], result: CheckResult) -> None:
    """max |Δ| of the gradients and optimizer state at the step where each first differs, from the value snapshots
    the recorder keeps of the first steps (``values/grads_N.pt``, ``values/state_N.pt``); and the sentence saying
    so while the parameters are identical."""
    result.params_identical = "params" not in result.kind_first_steps and "init" not in result.kind_first_steps
    parts: list[str] = []
    for kind, (prefix, label) in _VALUE_KINDS.items():
        step = result.kind_first_steps.get(kind)
        if step is None:
            continue
        name = f"{prefix}_{step:06d}"
        va = runs[0].values(name)
        entry: dict[str, Any] = {"kind": kind, "step": step, "max_abs_delta": None, "tensor": None,
                                 "elements_differing": None, "elements": None, "max_ulp": None}
        if va is not None:
            for other in runs[1:]:
                vb = other.values(name)
                if vb is None:
                    continue
                deltas = _deltas(va, vb)
                m, where = _worst(deltas, "max_abs")
                if where is not None and (entry["max_abs_delta"] is None or m > entry["max_abs_delta"]):
                    differing = [n for n, d in deltas.items() if not d.equal]
                    entry.update(max_abs_delta=m, tensor=where, max_ulp=deltas[where].max_ulp,
                                 elements_differing=sum(_differing_elements(va[n], vb[n]) for n in differing),
                                 elements=sum(va[n].numel() for n in differing), tensors_differing=len(differing))
        result.value_deltas.append(entry)
        if entry["max_abs_delta"] is not None:
            count = entry.get("tensors_differing") or 1
            parts.append(f"{label} by up to {entry['max_abs_delta']:.3g} (step {step}, largest in {entry['tensor']}; "
                         f"{entry['elements_differing']} of {entry['elements']} elements differ in the "
                         f"{count} tensor{'s that differ' if count != 1 else ' that differs'})")
        else:
            parts.append(f"{label} from step {step} on (by how much is unknown: no snapshot of that step was "
                         f"kept; check keeps them for its first {GRAD_VALUE_STEPS} steps, compare for its first "
                         f"{COMPARE_GRAD_STEPS}, when they fit in the values budget)")
    if parts:
        head = "parameters identical so far; " if result.params_identical else ""
        result.value_delta_text = head + "; ".join(parts)


# --- torch.compile ---------------------------------------------------------------------------------------
def _compiled_regions(runs: list[Run]) -> dict[str, Any] | None:
    """The compiled regions run 1 recorded (``manifest["compiled"]``), or None when nothing was compiled."""
    regions = runs[0].manifest.get("compiled") or []
    return {"regions": regions, "in_compiled_code": None, "region": None, "tensors": [], "text": None} if regions \
        else None


def region_text(region: dict[str, Any]) -> str:
    """``TinyGPT compiled at train.py:79 (`model = torch.compile(model)`, backend inductor, mode default)``."""
    where = f" at {region['file']}:{region['line']}" if region.get("file") else ""
    code = f"`{region['code']}`, " if region.get("code") else ""
    path = f" (module path {region['module_path']!r})" if region.get("module_path") else ""
    return (f"{region['target']}{path} compiled{where} ({code}backend {region.get('backend')}, "
            f"mode {region.get('mode') or 'default'})")


def _in_compiled_code(result: CheckResult) -> None:
    """Whether the first divergent tensors belong to a compiled module (by parameter name prefix)."""
    info = result.compiled
    if info is None or result.verdict != "diverged":
        return
    names = [n for d in result.first if d.kind in ("loss", "grads", "params", "state") for n in d.names]
    losses = any(d.kind == "loss" for d in result.first)
    for region in info["regions"]:
        prefix = region.get("param_prefix")
        if prefix is None:
            continue
        mine = [n for n in names if n.startswith(prefix)]
        if losses and region.get("module_path") == "":  # the whole model is compiled: so is its loss
            mine = mine or [n for n in names if n.startswith("loss")]
        if mine:
            info.update(in_compiled_code=True, region=region["index"], tensors=mine)
            info["text"] = (f"the first divergent tensors ({', '.join(mine[:3])}{' ...' if len(mine) > 3 else ''}) "
                            f"are computed by code that torch.compile generated: {region_text(region)}. "
                            "`--locate` measures the compiled kernels themselves.")
            return
    functions = [r for r in info["regions"] if r.get("param_prefix") is None]
    if functions:
        info["text"] = ("the script compiles functions whose tensors cannot be told apart by name ("
                        + "; ".join(region_text(r) for r in functions[:3]) + "): the divergence may lie in them.")
    else:
        info["in_compiled_code"] = False
        info["text"] = ("the first divergent tensors are not computed by the compiled modules ("
                        + "; ".join(region_text(r) for r in info["regions"][:3]) + ").")


def _growth(runs: list[Run], result: CheckResult) -> None:
    """Per-step max |Δ parameter| and final max |Δ weight| and ULP distance, from saved values.

    |Δ| and ULPs cover values finite in both runs; NaN/Inf positions that differ go to ``result.nonfinite``
    (at the first step that has any, and at the end).
    """
    base = runs[0]
    mode = result.step_mode
    nonfinite_step_seen = False
    for k in range(0, min(result.steps) + 1):
        name = "init" if k == 0 else _values_name(k, mode)
        va = base.values(name)
        if va is None:
            continue
        worst: float | None = None  # None: no other run kept this step (nothing measured: no 0.0 in the table)
        found: list[dict[str, Any]] = []
        for i, other in enumerate(runs[1:], start=2):
            vb = other.values(name)
            if vb is not None:
                deltas = _deltas(va, vb)
                worst = max(worst or 0.0, _worst(deltas, "max_abs")[0])
                found += _nonfinite(deltas, k, i)
        if worst is None:
            continue
        result.param_delta[k] = worst
        if found and not nonfinite_step_seen:
            result.nonfinite += found
            nonfinite_step_seen = True
    fa = base.values("final") if not stop_of(base) else None
    if fa is None and not stop_of(base):
        result.notes.append("Parameter values were not saved, so max |Δ weight| is unknown (record them with "
                            "`torchrepro run --keep-values`; `check` always keeps them).")
        return
    if fa is None:
        return
    for i, other in enumerate(runs[1:], start=2):
        fb = other.values("final") if not stop_of(other) else None
        if fb is None:  # not saved, or the run was stopped: its final parameters are those of an earlier step
            continue
        deltas = _deltas(fa, fb)
        m, where = _worst(deltas, "max_abs")
        if result.final_max_abs_delta is None or m > result.final_max_abs_delta:
            result.final_max_abs_delta, result.final_max_abs_delta_tensor = m, where
        u, uwhere = _worst(deltas, "max_ulp")
        if result.max_ulp is None or u > result.max_ulp:
            result.max_ulp, result.max_ulp_tensor = int(u), uwhere
        result.nonfinite += _nonfinite(deltas, None, i)


# --- the tensors of the first divergent step, one row each (the HTML report's per-tensor table) -------------
_SNAPSHOT = {"init": lambda step, mode: "init", "params": lambda step, mode: _values_name(step, mode),
             "grads": lambda step, mode: f"grads_{step:06d}", "state": lambda step, mode: f"state_{step:06d}"}


def first_step_tensors(runs: list[Run], result: CheckResult) -> list[dict[str, Any]]:
    """One row per tensor that differs where its kind first differs: ``{"tensor", "kind", "label", "step",
    "elements_differing", "elements", "max_abs_delta", "max_ulp"}``, run 1 against the run that differs most; the
    numbers are None where no value snapshot of that step was kept (the fingerprints still say it differs).

    Batches, losses and step counts have no per-tensor values: they stay in ``result.first``.
    """
    rows: list[dict[str, Any]] = []
    for diff in result.first:
        name_of = _SNAPSHOT.get(diff.kind)
        if name_of is None:
            continue
        snapshot = name_of(diff.step, result.step_mode)
        va = runs[0].values(snapshot)
        if va is None and diff.kind == "params" and diff.step >= min(result.steps, default=0):
            snapshot, va = "final", runs[0].values("final")  # parameters that differ only at the end
        others = [o.values(snapshot) for o in runs[1:]] if va is not None else []
        for tensor in diff.names:
            row: dict[str, Any] = {"tensor": tensor, "kind": diff.kind, "label": diff.label, "step": diff.step,
                                   "elements_differing": None, "elements": None, "max_abs_delta": None,
                                   "max_ulp": None}
            a = va.get(tensor) if va is not None else None
            for vb in others:
                b = vb.get(tensor) if vb is not None else None
                if a is None or b is None:
                    continue
                d = tensor_delta(a, b)
                if d is None or d.equal:
                    continue
                if row["max_abs_delta"] is None or d.max_abs > row["max_abs_delta"]:
                    row.update(max_abs_delta=d.max_abs, max_ulp=d.max_ulp, elements=a.numel(),
                               elements_differing=_differing_elements(a, b))
            rows.append(row)
    return rows
