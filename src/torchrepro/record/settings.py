"""The recorder's settings, grouped by feature: small frozen dataclasses, checked as they are made.

:class:`~torchrepro.record.recorder.Recorder` takes one object per feature -- what it keeps of parameter values
(:class:`ValueSettings`), which steps it traces op by op (:class:`TraceSettings`), what ``check --resume-at``
needs (:class:`ResumeMarks`), when it ends the script (:class:`StopSettings`) -- and :class:`RecorderSettings`
holds them all (``Recorder.settings``). The flat keyword arguments the recorder took before these existed
(``keep_values=``, ``trace_steps=``, ...) are still accepted and mapped onto them (:meth:`RecorderSettings.build`).

They are plain data, torch-free: picklable, and JSON-able in the form :func:`dataclasses.asdict` gives them
(``to_json``/``from_json``), which is how launch options travel to the child process:

>>> values = ValueSettings(keep=True, schedule="sampled")
>>> ValueSettings.from_json(values.to_json()) == values
True
>>> ValueSettings(budget=-1)
Traceback (most recent call last):
...
ValueError: ValueSettings.budget (values_budget) must be an int >= 0 (bytes), got -1
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

DEFAULT_VALUES_BUDGET = 1 << 30  # bytes of parameter values kept per run


def sampled_step(n: int) -> bool:
    """Whether step ``n`` gets a value snapshot under ``value_schedule="sampled"`` (what ``check`` uses).

    Every step up to 16, then 8 steps per doubling (17, 18, 20, ..., 32, 36, ..., 64, 72, ...): the same steps in
    every run, so compared runs have the same snapshots; a long run costs O(log steps) snapshots.

    >>> [n for n in range(1, 65) if sampled_step(n)][14:]
    [15, 16, 18, 20, 22, 24, 26, 28, 30, 32, 36, 40, 44, 48, 52, 56, 60, 64]
    """
    return n <= 16 or n % (1 << (n.bit_length() - 4)) == 0


# value schedule -> whether step n gets a value snapshot
SCHEDULES: dict[str, Callable[[int], bool]] = {"every": lambda n: True, "sampled": sampled_step}
TRACE_MODES = ("optimizer", "backward")  # what a traced "step" counts: optimizer steps or backward() calls

_S = TypeVar("_S", bound="_Settings")


def _kw(keyword: str) -> dict[str, Any]:
    """A field's metadata: the recorder's flat keyword argument it replaces (named in errors)."""
    return {"keyword": keyword}


class _Settings:
    """What the settings classes share: checks with errors that name the setting, and the JSON form."""

    def _bad(self, name: str, expected: str, value: Any, error: type[Exception] = ValueError) -> Exception:
        keyword = next(f.metadata.get("keyword") for f in dataclasses.fields(self) if f.name == name)  # type: ignore[arg-type]
        also = f" ({keyword})" if keyword and keyword != name else ""
        return error(f"{type(self).__name__}.{name}{also} must be {expected}, got {value!r}")

    def _int(self, name: str, *, low: int, optional: bool = False, unit: str = "") -> None:
        value = getattr(self, name)
        if value is None and optional:
            return
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._bad(name, f"an int{' or None' if optional else ''}", value, TypeError)
        if value < low:
            raise self._bad(name, f"an int >= {low}{f' ({unit})' if unit else ''}", value)

    def _bool(self, name: str) -> None:
        if not isinstance(getattr(self, name), bool):
            raise self._bad(name, "True or False", getattr(self, name), TypeError)

    def _choice(self, name: str, choices: list[str]) -> None:
        if getattr(self, name) not in choices:
            raise self._bad(name, f"one of {choices}", getattr(self, name))

    def to_json(self) -> dict[str, Any]:
        """The settings as JSON values: :func:`dataclasses.asdict`'s dict, with lists for tuples."""
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_json(cls: type[_S], data: Mapping[str, Any]) -> _S:
        """The settings from :meth:`to_json`'s dict (or :func:`dataclasses.asdict`'s, read back from JSON); a key
        left out takes its default, an unknown key is refused."""
        if not isinstance(data, Mapping):
            raise TypeError(f"{cls.__name__}.from_json needs a dict, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} setting(s) {unknown}; known: {sorted(known)}")
        return cls(**{k: cls._field_from_json(k, v) for k, v in data.items()})

    @classmethod
    def _field_from_json(cls, name: str, value: Any) -> Any:
        return value


def _jsonable(value: Any) -> Any:
    if isinstance(value, _Settings):
        return value.to_json()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


@dataclass(frozen=True, kw_only=True)
class ValueSettings(_Settings):
    """What the recorder keeps of the values themselves (``values/``), besides fingerprints.

    - ``keep``: save parameter values at the scheduled steps (what max |Δ weight| and ULP distances need);
    - ``budget``: bytes of snapshots per run at most, the initial and final ones included (a snapshot that would
      not leave room for the final one is skipped);
    - ``schedule``: which steps get a snapshot: ``"every"`` step, or ``"sampled"`` (:func:`sampled_step`: steps
      1-16, then 8 per doubling; what ``check`` uses, so that snapshots stay a small share of a long run's time);
    - ``grad_steps``: with ``keep``, also save gradients and optimizer state for this many steps (``None``: the
      ``TORCHREPRO_GRAD_VALUE_STEPS`` environment variable, else 0), from step ``grad_start`` on;
    - ``full_tensors``: under torchrun, also record the *full* tensor of every DTensor parameter and gradient
      (FSDP2, tensor parallel): assembled with ``full_tensor()`` (a collective, on every rank) at the scheduled
      steps and written once, by rank 0, into ``rank0/full`` (:mod:`torchrepro.record.fullview`), so that runs
      sharded differently (another world size or mesh) can be compared.

    >>> ValueSettings(keep=True, schedule="sampled", grad_steps=3)
    ValueSettings(keep=True, budget=1073741824, schedule='sampled', grad_steps=3, grad_start=1, full_tensors=False)
    """

    keep: bool = field(default=False, metadata=_kw("keep_values"))
    budget: int = field(default=DEFAULT_VALUES_BUDGET, metadata=_kw("values_budget"))
    schedule: str = field(default="every", metadata=_kw("value_schedule"))
    grad_steps: int | None = field(default=None, metadata=_kw("grad_value_steps"))
    grad_start: int = field(default=1, metadata=_kw("grad_value_start"))
    full_tensors: bool = False  # no flat keyword of the recorder: new with the settings objects

    def __post_init__(self) -> None:
        self._bool("keep")
        self._bool("full_tensors")
        self._int("budget", low=0, unit="bytes")
        self._choice("schedule", sorted(SCHEDULES))
        self._int("grad_steps", low=0, optional=True)
        self._int("grad_start", low=1, unit="a step number")

    def due(self, n: int) -> bool:
        """Whether step ``n`` gets a value snapshot under :attr:`schedule`."""
        return SCHEDULES[self.schedule](n)


@dataclass(frozen=True, kw_only=True)
class TraceSettings(_Settings):
    """Which steps the recorder traces op by op (``ops.jsonl``, see :mod:`torchrepro.record.optrace`).

    - ``steps``: ``(first, last)``, the steps traced (0: model construction, up to the first ``backward()``), or
      ``None`` to trace none;
    - ``mode``: what a step is for that range: ``"optimizer"`` steps or ``"backward"`` calls (a script without
      ``torch.optim``).

    >>> TraceSettings(steps=[3, 4])  # a list (read from JSON) becomes a tuple
    TraceSettings(steps=(3, 4), mode='optimizer')
    """

    steps: tuple[int, int] | None = field(default=None, metadata=_kw("trace_steps"))
    mode: str = field(default="optimizer", metadata=_kw("trace_mode"))

    def __post_init__(self) -> None:
        steps = self.steps
        if steps is not None:
            if (not isinstance(steps, (list, tuple)) or len(steps) != 2
                    or any(isinstance(n, bool) or not isinstance(n, int) for n in steps)):
                raise self._bad("steps", "a pair of ints (first, last) or None", steps, TypeError)
            if not 0 <= steps[0] <= steps[1]:
                raise self._bad("steps", "(first, last) with 0 <= first <= last", steps)
            object.__setattr__(self, "steps", (steps[0], steps[1]))
        self._choice("mode", list(TRACE_MODES))


@dataclass(frozen=True, kw_only=True)
class ResumeMarks(_Settings):
    """What ``check --resume-at K`` needs to say what a resume did not restore (see :mod:`.resumeat`).

    - ``enabled``: record the RNG states after every step (``rng``), the sample indices of each batch
      (``batch_indices``, from the sampler of a map-style DataLoader) and the optimizer state before each
      optimizer's first step (``state_before``);
    - ``boundary_after``: write a ``boundary`` event (the RNG states) as the first ``backward()`` after step N
      starts (0: the first one of the process); ``None``: none;
    - ``stop_after``: end the script (``MaxStepsReached``) as the first ``backward()`` after step N starts, so that
      what the script does between step N and the next step (saving a checkpoint) is done; ``None``: never.

    >>> ResumeMarks(enabled=True, boundary_after=0)  # the resumed run's marks
    ResumeMarks(enabled=True, boundary_after=0, stop_after=None)
    """

    enabled: bool = field(default=False, metadata=_kw("resume_marks"))
    boundary_after: int | None = field(default=None, metadata=_kw("boundary_after"))
    stop_after: int | None = field(default=None, metadata=_kw("stop_after"))

    def __post_init__(self) -> None:
        self._bool("enabled")
        self._int("boundary_after", low=0, optional=True)
        self._int("stop_after", low=0, optional=True)


@dataclass(frozen=True, kw_only=True)
class StopSettings(_Settings):
    """When the recorder ends the script (a clean ``SystemExit(0)``, ``MaxStepsReached``), besides ``stop_after``.

    - ``max_steps``: after this many steps: optimizer steps, or, when no ``torch.optim`` optimizer exists,
      ``backward()`` calls (then as the next ``backward()`` starts, so the hand update of the last step is done);
    - ``divergence``: compare each step with other runs as they record, and stop ``after`` steps after the first
      divergence from run 1: ``{"runs": [dir, ...], "me": i, "after": K}`` (see
      :class:`~torchrepro.record.divergence.DivergenceWatch`; what ``check`` gives its runs).

    >>> StopSettings(max_steps=10)
    StopSettings(max_steps=10, divergence=None)
    """

    max_steps: int | None = field(default=None, metadata=_kw("max_steps"))
    divergence: dict[str, Any] | None = field(default=None, metadata=_kw("divergence"))

    def __post_init__(self) -> None:
        self._int("max_steps", low=0, optional=True)
        if self.divergence is not None and not isinstance(self.divergence, Mapping):
            raise self._bad("divergence", 'a dict {"runs": [...], "me": i, "after": K} or None', self.divergence,
                            TypeError)


_GROUPS: dict[str, type[_Settings]] = {"values": ValueSettings, "trace": TraceSettings, "resume": ResumeMarks,
                                       "stop": StopSettings}


@dataclass(frozen=True, kw_only=True)
class RecorderSettings(_Settings):
    """Every setting of a :class:`~torchrepro.record.recorder.Recorder` (its ``settings``): one object per feature,
    and two of their own:

    - ``timing``: record only step boundaries (``t`` of each event, taken after synchronising CUDA), no
      fingerprints: what ``torchrepro bench`` times;
    - ``check_ranks_every``: in a distributed program, compare the replicas across ranks after every N-th
      optimizer step (:func:`torchrepro.distributed.ranks.check_consistency`); ``None`` or 0: never.

    >>> s = RecorderSettings.build(keep_values=True, max_steps=5)  # the flat keywords, mapped
    >>> s == RecorderSettings(values=ValueSettings(keep=True), stop=StopSettings(max_steps=5))
    True
    >>> RecorderSettings.from_json(s.to_json()) == s
    True
    """

    values: ValueSettings = field(default_factory=ValueSettings)
    trace: TraceSettings = field(default_factory=TraceSettings)
    resume: ResumeMarks = field(default_factory=ResumeMarks)
    stop: StopSettings = field(default_factory=StopSettings)
    timing: bool = field(default=False, metadata=_kw("timing"))
    check_ranks_every: int | None = field(default=None, metadata=_kw("check_ranks_every"))

    def __post_init__(self) -> None:
        for name, kind in _GROUPS.items():
            if not isinstance(getattr(self, name), kind):
                raise self._bad(name, f"a {kind.__name__}", getattr(self, name), TypeError)
        self._bool("timing")
        self._int("check_ranks_every", low=0, optional=True)

    @classmethod
    def _field_from_json(cls, name: str, value: Any) -> Any:
        return _GROUPS[name].from_json(value) if name in _GROUPS else value

    @classmethod
    def build(cls, *, values: ValueSettings | None = None, trace: TraceSettings | None = None,
              resume: ResumeMarks | None = None, stop: StopSettings | None = None, timing: bool = False,
              check_ranks_every: int | None = None, **flat: Any) -> RecorderSettings:
        """The settings from the recorder's keyword arguments: the objects, or the flat keywords of their fields
        (``keep_values=True`` is ``values=ValueSettings(keep=True)``); a flat keyword that is ``None`` is not given.
        An object and a flat keyword of the same group together are refused (which should win is not clear)."""
        given: dict[str, _Settings | None] = {"values": values, "trace": trace, "resume": resume, "stop": stop}
        fields_of: dict[str, dict[str, Any]] = {name: {} for name in _GROUPS}
        for keyword, value in flat.items():
            if keyword not in FLAT_KEYWORDS:
                raise TypeError(f"Recorder() got an unexpected keyword argument {keyword!r}")
            if value is None:
                continue
            group, name = FLAT_KEYWORDS[keyword]
            if given[group] is not None:
                raise TypeError(f"Recorder() got both {group}={type(given[group]).__name__}(...) and {keyword}=; "
                                f"give {name}={value!r} inside the {type(given[group]).__name__}")
            fields_of[group][name] = value
        groups = {name: given[name] if given[name] is not None else kind(**fields_of[name])
                  for name, kind in _GROUPS.items()}
        return cls(**groups, timing=timing, check_ranks_every=check_ranks_every)  # type: ignore[arg-type]


# the recorder's flat keyword arguments -> (group, field): from the fields' metadata
FLAT_KEYWORDS: dict[str, tuple[str, str]] = {
    f.metadata["keyword"]: (group, f.name) for group, kind in _GROUPS.items()
    for f in dataclasses.fields(kind) if "keyword" in f.metadata  # type: ignore[arg-type]
}
