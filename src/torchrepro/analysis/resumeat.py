"""``check --resume-at K``: did the resumed run continue exactly, and if not, what was not restored (layer L4).

Run 1 trains straight through; run 2 trains to step K, checkpoints and stops (``stopped``), and a fresh process
resumes from the checkpoint (``resumed``). :func:`splice` joins run 2's two processes into one run (steps 1..K
from the first, K+1.. from the second, renumbered), which :func:`~torchrepro.analysis.compare.compare_runs`
compares with run 1 step by step. :func:`diagnose` then says what the resume did not restore, in causal order,
at the first divergent step d:

1. the **parameters** the resumed process started from (its ``init`` event) against run 1's after step K;
2. the **optimizer state** before the resumed process's first step (``state_before``) against run 1's after K;
3. the **learning rate** of step d (the LR scheduler's state);
4. the **data batch** of step d: other samples (the sampler's indices differ: data position), or the same
   samples with other values (augmentation or worker RNG);
5. the **RNG state** where step d starts (for d = K+1: as the first ``backward()`` after the restart begins,
   the ``boundary`` events; later: after step d-1): which of torch's, CUDA's, Python's and NumPy's differ;
6. else the step's computation itself differs (a nondeterministic op, or state torchrepro does not record).

A divergence at or before step K is not about the resume: the script is not reproducible run to run.

Under torchrun (:class:`RanksResume`) each rank's two processes of run 2 are joined and diagnosed against that
rank's run 1, as above; the check's verdict is the first rank that did not resume exactly (else rank 0).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..record.store import Run
from .causes import SHARED_CWD, cause, with_commands
from .compare import CheckResult, explain

if TYPE_CHECKING:
    import torch

SCHEMA = "torchrepro.check-resume/1"
_VALUES = re.compile(r"(step|backward|grads|state)_(\d{6})")
_SHOWN = 3

RNG_NAMES = {"torch": "torch's global generator (dropout, torch.rand*, randperm)", "cuda": "the CUDA generators",
             "random": "Python's random", "numpy": "NumPy's global RandomState"}

# What to do, by the kind of script (a trainer's own resume, or a script's own loop)
_CALLBACK = {"lightning": "add torchrepro.integrations.lightning.ReproducibleCallback() to Trainer(callbacks=[...])",
             "transformers": "add torchrepro.integrations.transformers.ReproducibleCallback() to "
                             "Trainer(callbacks=[...])"}
@dataclass
class SplicedRun(Run):
    """Run 2 of ``check --resume-at K``: the stopped process's steps 1..K, then the resumed process's, renumbered.

    Value files are read from the process that wrote them (``step_N`` with N > K is the resumed process's
    ``step_{N-K}``)."""

    stopped: Run | None = None
    resumed: Run | None = None
    k: int = 0
    skipped_batches: int = 0  # batches the restarted process fetched before its first step and are not compared
    unfetched_batches: int = 0  # batches run 1 fetched after step K (validation) that the restarted process did not

    def values(self, name: str, *, mmap: bool = False) -> dict[str, torch.Tensor] | None:
        assert self.stopped is not None and self.resumed is not None
        if name == "init":
            return self.stopped.values(name, mmap=mmap)
        if name == "final":
            return self.resumed.values(name, mmap=mmap)
        m = _VALUES.fullmatch(name)
        if m is None:
            return None
        n = int(m.group(2))
        if n <= self.k:
            return self.stopped.values(name, mmap=mmap)
        return self.resumed.values(f"{m.group(1)}_{n - self.k:06d}", mmap=mmap)


def splice(stopped: Run, resumed: Run, k: int, reference: Run | None = None) -> SplicedRun:
    """One run from run 2's two processes: its first K steps, then every step of the restarted process.

    The restarted process's first step holds every batch it fetched before that step: those it skipped to reach
    its data position too. With ``reference`` (run 1), only as many of them as run 1's step K+1 holds are kept,
    the last ones (``skipped_batches`` counts the others)."""
    mode = stopped.step_mode
    first = stopped.steps()[:k]
    after = [dict(e, n=int(e.get("n") or 0) + k) for e in resumed.steps()]
    skipped = unfetched = 0
    ref = reference.steps()[k] if reference is not None and len(reference.steps()) > k else None
    if after and ref is not None:
        want, got = len(ref.get("batches") or []), list(after[0].get("batches") or [])
        if len(got) > want:
            skipped = len(got) - want
            after[0]["batches"] = got[skipped:]
            if isinstance(after[0].get("batch_indices"), list):
                after[0]["batch_indices"] = after[0]["batch_indices"][-want:] if want else []
        elif got and len(got) < want and list(ref.get("batches") or [])[-len(got):] == got:
            # run 1 also fetched batches after step K that the restarted process has no reason to fetch again
            # (a validation loop run after step K, before the next step): the batches training took are the same
            unfetched = want - len(got)
            after[0]["batches"] = list(ref["batches"][:unfetched]) + got
            ia, ri = after[0].get("batch_indices"), ref.get("batch_indices")
            if isinstance(ia, list) and isinstance(ri, list) and len(ri) == want and ri[-len(ia):] == ia:
                after[0]["batch_indices"] = list(ri[:unfetched]) + ia
    events = stopped.of_kind("init")[:1] + first + after + resumed.of_kind("final")[:1]
    algorithms = {a for r in (stopped, resumed) for a in str(r.manifest.get("fingerprint_algorithm") or "").split("+")
                  if a}
    manifest = {**resumed.manifest, "command": stopped.manifest.get("command"), "step_mode": mode,
                "steps": len(first) + len(after), "trace_records": len(events),
                "fingerprint_algorithm": "+".join(sorted(algorithms)) or None,
                "compiled": stopped.manifest.get("compiled") or resumed.manifest.get("compiled") or []}
    return SplicedRun(path=stopped.path, manifest=manifest, events=events, stopped=stopped, resumed=resumed, k=k,
                      skipped_batches=skipped, unfetched_batches=unfetched)


@dataclass
class Restored:
    """One line of the resume's check list: was this restored (True/False; None: not recorded or not reached)."""

    key: str  # parameters | optimizer-state | scheduler-state | data | rng-state
    label: str
    restored: bool | None
    where: str  # "after step 5", "step 6"
    names: list[str] = field(default_factory=list)
    text: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"what": self.key, "label": self.label, "restored": self.restored, "where": self.where,
                "names": self.names, "text": self.text}


@dataclass
class ResumeResult:
    """The outcome of ``check --resume-at K`` (as data; ``to_json`` gives the ``torchrepro.check-resume/1`` body)."""

    k: int
    comparison: CheckResult
    trainer: str
    checkpoint: str | None
    runs: dict[str, str]
    steps: dict[str, int]
    cause: str | None = None
    step: int | None = None
    tensors: list[str] = field(default_factory=list)
    detail: str | None = None
    restored: list[Restored] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # (check's options without --resume-at, the user's command): the commands in the fix are this check's own
    # (see causes.with_commands); None: left as `torchrepro check ... -- ...`
    rerun: tuple[list[str], list[str]] | None = None

    @property
    def verdict(self) -> str:
        return self.comparison.verdict

    @property
    def first_divergent(self) -> dict[str, Any] | None:
        """What the comparison found first at the first divergent step: kind, label and tensor names."""
        first = self.comparison.first[0] if self.comparison.first else None
        return {"kind": first.kind, "label": first.label, "names": first.names} if first else None

    @property
    def what(self) -> str | None:
        wording = cause(self.cause).resume if self.cause else None
        return wording.what if wording else None

    @property
    def explanation(self) -> str | None:
        if self.cause is None:
            return None
        if self.cause == SHARED_CWD:
            return explain(SHARED_CWD, self.comparison.working_directory)
        return self.detail

    @property
    def fix(self) -> str | None:
        if self.cause is None:
            return None
        callback = _CALLBACK.get(self.trainer)
        wording = cause(self.cause).resume
        assert wording is not None, f"cause {self.cause!r} has no resume wording"
        fix = wording.fix.format(k=self.k, callback=f"; with this trainer: {callback}" if callback else "")
        return with_commands(fix, *self.rerun) if self.rerun else fix

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "verdict": self.verdict,
            "resume_at": self.k,
            "trainer": self.trainer,
            "checkpoint": self.checkpoint,
            "steps": self.steps,
            "first_divergent_step": self.comparison.first_step,
            "cause": self.cause,
            "what": self.what,
            "step": self.step,
            "tensors": self.tensors,
            "first_divergent": self.first_divergent,
            "explanation": self.explanation,
            "fix": self.fix,
            "restored": [r.to_json() for r in self.restored],
            "notes": self.notes,
            "runs": self.runs,
            "comparison": self.comparison.to_json(),
        }


@dataclass
class RanksResume:
    """``check --resume-at K`` of a script on several ranks: each rank's resume diagnosed (``per_rank[r]``).

    A rank that did not resume exactly reaches the others through the gradient all-reduce of the same step: they
    diverge there too, with everything recorded on them restored (cause ``compute``). Those ranks ``follow`` the
    lead rank (their explanation says so), and the lead is the rank that names what was not restored."""

    nproc: int
    per_rank: list[ResumeResult]
    follows: dict[int, int] = field(default_factory=dict)  # rank -> the lead rank whose divergence reached it

    def __post_init__(self) -> None:
        rank, lead = self.lead
        if lead.verdict == "identical" or lead.cause == "compute" or lead.step is None:
            return
        for r, result in enumerate(self.per_rank):
            if r != rank and result.cause == "compute" and result.step is not None and result.step >= lead.step:
                self.follows[r] = rank
                result.detail = (f"Everything recorded on rank {r} was restored (parameters and optimizer state "
                                 f"after step {result.k}, the learning rate, batch and RNG state of step "
                                 f"{result.step}), yet step {result.step} computed other "
                                 f"{', '.join(d.label for d in result.comparison.first) or 'values'}: the ranks' "
                                 f"gradients are averaged at each step (DDP's all-reduce, FSDP's reduce-scatter), and "
                                 f"rank {rank} did not resume exactly ({lead.what}). Fix rank {rank}; rank {r} "
                                 "follows.")

    @property
    def lead(self) -> tuple[int, ResumeResult]:
        """The rank whose result is the check's: of the ranks that diverged first (earliest step), the first that
        names what was not restored, else the first of them; rank 0 when every rank resumed exactly."""
        diverged = [(r, res) for r, res in enumerate(self.per_rank) if res.verdict != "identical"]
        if not diverged:
            return 0, self.per_rank[0]
        first = min(res.step if res.step is not None else 1 << 62 for _, res in diverged)
        earliest = [(r, res) for r, res in diverged if (res.step if res.step is not None else 1 << 62) == first]
        return next(((r, res) for r, res in earliest if res.cause != "compute"), earliest[0])

    @property
    def verdict(self) -> str:
        return self.lead[1].verdict

    def to_json(self) -> dict[str, Any]:
        """The lead rank's ``torchrepro.check-resume/1`` body, with ``nproc_per_node``, ``lead_rank`` and ``ranks``
        (each rank's body, its ``rank`` and ``follows_rank`` first: the lead rank whose divergence reached it)."""
        rank, lead = self.lead
        return lead.to_json() | {"nproc_per_node": self.nproc, "lead_rank": rank,
                                 "ranks": [{"rank": r, "follows_rank": self.follows.get(r)} | res.to_json()
                                           for r, res in enumerate(self.per_rank)]}


def _diff(a: dict[str, Any] | None, b: dict[str, Any] | None, *, common_only: bool = False) -> list[str]:
    a, b = a or {}, b or {}
    keys = [k for k in a if k in b] if common_only else list(a) + [k for k in b if k not in a]
    return [k for k in keys if a.get(k) != b.get(k)]


def _names(names: list[str]) -> str:
    return ", ".join(names[:_SHOWN]) + (f" (+{len(names) - _SHOWN} more)" if len(names) > _SHOWN else "")


def _at(steps: list[dict[str, Any]], n: int) -> dict[str, Any] | None:
    return steps[n - 1] if 1 <= n <= len(steps) else None


def _check_parameters(straight: Run, resumed: Run, k: int) -> Restored:
    # optimizer mode: step K's params are after its update; backward mode: step K+1's, recorded before its update
    ref = _at(straight.steps(), k if straight.step_mode == "optimizer" else k + 1)
    init = resumed.of_kind("init")[:1]
    where = f"after step {k}"
    if ref is None or not init or not isinstance(ref.get("params"), dict):
        return Restored("parameters", "parameters", None, where, text="not recorded")
    names = _diff(ref["params"], init[0].get("params"), common_only=True)
    total = len([n for n in ref["params"] if n in (init[0].get("params") or {})])
    if names:
        return Restored("parameters", "parameters", False, where, names,
                        f"{len(names)} of {total} tensors differ: {_names(names)}")
    return Restored("parameters", "parameters", True, where, text=f"{total} tensors bitwise equal")


def _check_optimizer(straight: Run, resumed: Run, k: int) -> Restored:
    where = f"after step {k}"
    if straight.step_mode != "optimizer":
        return Restored("optimizer-state", "optimizer state", None, where, text="no torch.optim optimizer")
    firsts: dict[int, dict[str, Any]] = {}
    for e in resumed.steps():
        if isinstance(e.get("state_before"), dict):
            firsts.setdefault(int(e.get("opt") or 0), e["state_before"])
    if not firsts:
        return Restored("optimizer-state", "optimizer state", None, where, text="not recorded")
    names: list[str] = []
    total = 0
    for opt, before in firsts.items():
        ref = [e for e in straight.steps()[:k] if int(e.get("opt") or 0) == opt]
        state = ref[-1].get("state") if ref else {}
        total += len(set(state or {}) | set(before))
        names += [n for n in _diff(state, before) if n not in names]
    if not names:
        return Restored("optimizer-state", "optimizer state", True, where,
                        text=f"{total} entries bitwise equal" if total else "no state (equal)")
    how = (f"the resumed optimizer started with no state ({len(names)} entries missing: {_names(names)})"
           if not any(firsts.values()) else f"{len(names)} of {total} entries differ: {_names(names)}")
    return Restored("optimizer-state", "optimizer state", False, where, names, how)


def _check_lr(straight: list[dict[str, Any]], spliced: list[dict[str, Any]], d: int) -> Restored:
    a, b = _at(straight, d), _at(spliced, d)
    where = f"step {d}"
    if a is None or b is None or "lr" not in a or "lr" not in b:
        return Restored("scheduler-state", "learning rate", None, where, text="not recorded")
    if a.get("lr") != b.get("lr"):
        return Restored("scheduler-state", "learning rate", False, where, ["lr"],
                        f"{a.get('lr')} in the uninterrupted run, {b.get('lr')} after the resume")
    return Restored("scheduler-state", "learning rate", True, where, text="equal")


def _check_data(straight: list[dict[str, Any]], spliced: list[dict[str, Any]], d: int, k: int) -> Restored:
    a, b = _at(straight, d), _at(spliced, d)
    where = f"step {d}"
    if a is None or b is None:
        return Restored("data", "data batch", None, where, text="not reached")
    ba, bb = a.get("batches") or [], b.get("batches") or []
    if not ba and not bb:
        return Restored("data", "data batch", None, where, text="no DataLoader batch recorded")
    if ba == bb:
        return Restored("data", "data batch", True, where, text="same samples, same values")
    ia, ib = a.get("batch_indices"), b.get("batch_indices")
    known = (isinstance(ia, list) and isinstance(ib, list) and bool(ia) and bool(ib) and None not in ia + ib
             and len(ia) == len(ba) and len(ib) == len(bb))
    seen = next((n for n, e in enumerate(straight[:d - 1], start=1) if set(e.get("batches") or []) & set(bb)), None)
    again = f"; the resumed run's batch is the one the uninterrupted run saw at step {seen}" if seen else ""
    if seen == 1 or (seen is not None and seen <= k and seen == d - k):
        again += " (the epoch started again from its first batch)"
    if known and ia != ib:
        return Restored("data", "data batch", False, where, ["data-position"],
                        f"other samples: the order differs (the sampler gave other indices){again}")
    if known:
        return Restored("data", "data batch", False, where, ["data-values"],
                        "the same samples (same indices) with other values")
    return Restored("data", "data batch", False, where, ["data"],
                    f"the batch differs (its sample indices are not known: an IterableDataset){again}")


def _rng_at(run_steps: list[dict[str, Any]], boundary: list[dict[str, Any]], d: int, k: int) -> dict[str, Any] | None:
    """The RNG states where step d starts: the boundary event for d = K+1, else after step d-1."""
    if d == k + 1:
        return boundary[0].get("rng") if boundary else None
    prev = _at(run_steps, d - 1)
    return prev.get("rng") if prev is not None else None


def used_generators(run: Run) -> list[str]:
    """The generators training drew from: those whose state changed between two of the run's recorded steps."""
    seen: dict[str, set[Any]] = {}
    for e in run.steps():
        for name, fp in (e.get("rng") or {}).items():
            seen.setdefault(name, set()).add(fp)
    return [n for n in RNG_NAMES if len(seen.get(n, ())) > 1]


def _check_rng(straight: Run, spliced_steps: list[dict[str, Any]], resumed: Run, d: int, k: int) -> Restored:
    where = f"start of step {d}"
    a = _rng_at(straight.steps(), straight.of_kind("boundary"), d, k)
    b = _rng_at(spliced_steps, resumed.of_kind("boundary"), d, k)
    if not isinstance(a, dict) or not isinstance(b, dict):
        return Restored("rng-state", "RNG state", None, where, text="not recorded")
    used = used_generators(straight)
    names = [n for n in _diff(a, b) if a.get(n) is not None or b.get(n) is not None]
    unused = [n for n in names if n not in used]
    one = len(unused) == 1
    also = (f"; {', '.join(RNG_NAMES.get(n, n) for n in unused)} also differ{'s' if one else ''}, but training "
            f"never drew from {'it' if one else 'them'}" if unused else "")
    if [n for n in names if n in used]:
        return Restored("rng-state", "RNG state", False, where, [n for n in names if n in used],
                        "differs: " + ", ".join(RNG_NAMES.get(n, n) for n in names if n in used) + also)
    if not used:
        return Restored("rng-state", "RNG state", True, where, text="unused (training drew no random numbers)" + also)
    return Restored("rng-state", "RNG state", True, where, text=f"equal ({', '.join(used)}){also}")


def diagnose(straight: Run, stopped: Run, resumed: Run, comparison: CheckResult, k: int, *, trainer: str = "script",
             checkpoint: str | None = None, runs: dict[str, str] | None = None) -> ResumeResult:
    """What the resume did not restore, in causal order, at the first divergent step (see the module docs)."""
    spliced = splice(stopped, resumed, k, straight)
    s_steps, r_steps = straight.steps(), spliced.steps()
    result = ResumeResult(k=k, comparison=comparison, trainer=trainer, checkpoint=checkpoint, runs=runs or {},
                          steps={"uninterrupted": len(s_steps), "before_checkpoint": len(stopped.steps()[:k]),
                                 "after_resume": len(resumed.steps())})
    if spliced.skipped_batches:
        result.notes.append(f"The resumed process fetched {spliced.skipped_batches} more batch(es) before its first "
                            f"step than the uninterrupted run did for step {k + 1} (it skipped to its data position, "
                            "or evaluated): they are not compared.")
    if spliced.unfetched_batches:
        result.notes.append(f"The uninterrupted run fetched {spliced.unfetched_batches} batch(es) after step {k} "
                            "that the resumed process did not (a validation or other loop run after the step the "
                            "checkpoint was taken at): they are taken as equal, and the batches of step "
                            f"{k + 1} are compared.")
    d = comparison.first_step if comparison.verdict == "diverged" else None
    at = d if d is not None and d > k else k + 1
    result.restored = [_check_parameters(straight, resumed, k), _check_optimizer(straight, resumed, k),
                       _check_lr(s_steps, r_steps, at), _check_data(s_steps, r_steps, at, k),
                       _check_rng(straight, r_steps, resumed, at, k)]
    if d is None:
        unused = [r for r in result.restored if r.restored is False]
        for r in unused:
            result.notes.append(f"The {r.label} at {r.where} was not restored ({r.text}), but every step compared "
                                "is identical: nothing used it yet. A longer run may diverge.")
        return result
    result.step = d
    first_names = comparison.first[0].names if comparison.first else []
    if comparison.cause == SHARED_CWD:
        result.cause, result.tensors = SHARED_CWD, first_names
        return result
    if d <= k:
        result.cause, result.tensors = "before-checkpoint", first_names
        result.detail = (f"The runs diverged at step {d}, before the checkpoint at step {k}: the script is not "
                         f"reproducible even without a restart (check's cause: {comparison.cause}), so the resume "
                         "cannot be judged.")
        return result
    broken = next((r for r in result.restored if r.restored is False), None)
    if broken is not None:
        result.cause = broken.names[0] if broken.key == "data" else broken.key
        result.tensors = first_names if broken.key in ("data", "scheduler-state") else broken.names
        result.detail = _detail(result, broken, d, first_names)
    elif {diff.kind for diff in comparison.first} <= {"steps"}:
        result.cause, result.tensors = "steps", []
        result.detail = (f"Every step both runs took is identical, but the resumed run took {len(resumed.steps())} "
                         f"steps after the restart where the uninterrupted run took {len(s_steps) - k} more: the "
                         "step counter (or the epoch) was not restored.")
    else:
        result.cause, result.tensors = "compute", first_names
        result.detail = (f"Everything recorded was restored (parameters and optimizer state after step {k}, the "
                         f"learning rate, batch and RNG state of step {d}), yet step {d} computed something else "
                         f"({', '.join(diff.label for diff in comparison.first)}): a nondeterministic op, or state "
                         "torchrepro does not record (buffers such as BatchNorm's running statistics, a GradScaler's "
                         "scale, train/eval mode, a counter in the script).")
    return result


def _detail(result: ResumeResult, broken: Restored, d: int, first_names: list[str]) -> str:
    k = result.k
    ok = [r.label for r in result.restored[:result.restored.index(broken)] if r.restored]
    before = f" ({', '.join(ok)} restored)" if ok else ""
    cause = result.cause
    if cause == "parameters":
        return (f"The resumed process did not start from the parameters of step {k}{before}: {broken.text}. "
                "The checkpoint was not loaded into the model, or holds other weights.")
    if cause == "optimizer-state":
        return (f"The optimizer state the resumed process started from is not the one after step {k}{before}: "
                f"{broken.text}. Its first update (step {d}) then moves the parameters differently.")
    if cause == "scheduler-state":
        return (f"The learning rate of step {d} differs{before}: {broken.text}. The LR scheduler's state (its step "
                "count) was not restored.")
    if cause == "data-position":
        return (f"The resumed run's batch at step {d} holds other samples than the uninterrupted run's{before}: "
                f"{broken.text}. The data position (the sampler's order, the epoch, the batches already consumed) "
                "was not restored.")
    if cause == "data-values":
        return (f"The resumed run's batch at step {d} holds the same samples with other values{before}: the "
                "augmentation drew other random numbers (in worker processes their seeds come from a base seed drawn "
                "when the iterator is created; without workers, from the main process's RNG state).")
    if cause == "data":
        return f"The resumed run's batch at step {d} differs{before}: {broken.text}."
    return (f"The random-number state at the start of step {d} {broken.text}{before}. The RNG state was not "
            f"restored (or something drew from it after the restore), so dropout and other random ops of step {d} "
            "draw other numbers.")
