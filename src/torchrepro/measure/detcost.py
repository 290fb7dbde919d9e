"""What each setting of deterministic mode costs, and the cheapest configuration that is still bitwise
reproducible (``torchrepro bench --explain``).

Each setting ``S`` that :class:`~torchrepro.deterministic` switches is timed by toggling it alone: deterministic
mode with ``S`` against deterministic mode without it, in paired runs. A setting that acts only under another
(the uninitialized-memory fill acts only under deterministic algorithms) is timed inside it, and the other is
timed without it: so deterministic algorithms' row is their cost with the fill off, the fill's row what the fill
adds. Settings that do nothing on the device (cuDNN on a CPU) or in the script (inductor without
``torch.compile``) are listed as not applicable, not measured.

The search (:func:`cheapest`) starts from full deterministic mode and leaves out one setting at a time, the most
expensive first; each candidate is kept only when a check of it comes out bitwise identical.

>>> [p.name for p in plan("cpu", compiled=False) if p.reason is None]
['algorithms', 'fill-uninitialized-memory']
>>> plan("cpu", compiled=False)[2].reason
'not applicable on cpu'
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..control._settings import SETTINGS, Setting, call_text, without
from .variance import overhead_ci

FULL = "deterministic"
DEFAULT = "default"


def variant_name(left_out: Sequence[str]) -> str:
    """The bench variant of deterministic mode without the settings ``left_out`` (``deterministic`` for none); a
    setting acting only under another one left out is not named."""
    out = set(left_out)
    names = [s.name for s in SETTINGS if s.name in out and s.within not in out]
    return FULL if not names else f"{FULL}-without-{'+'.join(names)}"


@dataclass(frozen=True)
class Part:
    """One row of the explanation: a setting, why it is not measured (``reason``), and the two variants whose
    paired runs time it (``with_variant`` against ``without_variant``)."""

    setting: Setting
    reason: str | None
    with_variant: str | None = None
    without_variant: str | None = None

    @property
    def name(self) -> str:
        return self.setting.name


def _reason(s: Setting, device: str, compiled: bool) -> str | None:
    kind = device.split(":")[0]
    if s.scope == "cuda" and kind != "cuda":
        return f"not applicable on {kind}"
    if s.scope == "compile" and not compiled:
        return "not applicable: the script does not call torch.compile"
    return None


def plan(device: str, *, compiled: bool) -> list[Part]:
    """Every setting of deterministic mode, with the variants that time it on ``device`` (None where it does
    nothing there)."""
    parts = []
    applicable = [s.name for s in SETTINGS if _reason(s, device, compiled) is None]
    for s in SETTINGS:
        reason = _reason(s, device, compiled)
        if reason is not None:
            parts.append(Part(s, reason))
            continue
        inside = [d.name for d in SETTINGS if d.within == s.name and d.name in applicable]
        parts.append(Part(s, None, variant_name(inside), variant_name([s.name])))
    return parts


def variants(parts: Sequence[Part]) -> dict[str, dict[str, Any]]:
    """The variants to time, by name, as keyword arguments of ``deterministic()`` (default and full first)."""
    out: dict[str, dict[str, Any]] = {FULL: {}}
    for p in parts:
        for name in (p.with_variant, p.without_variant):
            if name is not None and name not in out:
                out[name] = without(name.removeprefix(f"{FULL}-without-").split("+"))
    return out


@dataclass(frozen=True)
class Cost:
    """A setting's measured cost: ``median(with) / median(without) - 1`` and its 95% CI (None: not measured)."""

    name: str
    title: str
    reason: str | None
    overhead: float | None = None
    ci: tuple[float, float] | None = None
    with_variant: str | None = None
    without_variant: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"setting": self.name, "title": self.title, "applicable": self.reason is None, "reason": self.reason,
                "overhead": self.overhead, "overhead_ci": list(self.ci) if self.ci else None,
                "with": self.with_variant, "without": self.without_variant}


def costs(parts: Sequence[Part], durations: dict[str, list[float]]) -> list[Cost]:
    """Each setting's cost from the step times (ms) of the variants, by name."""
    out = []
    for p in parts:
        if p.reason is not None or p.with_variant is None or p.without_variant is None:
            out.append(Cost(p.name, p.setting.title, p.reason))
            continue
        point, lo, hi = overhead_ci(durations[p.without_variant], durations[p.with_variant])
        out.append(Cost(p.name, p.setting.title, None, point, (lo, hi), p.with_variant, p.without_variant))
    return out


@dataclass
class Candidate:
    """A configuration tried by :func:`cheapest`: the settings left out, and the verdict of its check."""

    left_out: list[str]
    verdict: str
    detail: str = ""
    runs: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"left_out": self.left_out, "verdict": self.verdict, "detail": self.detail, "runs": self.runs}


Verify = Callable[[list[str]], Candidate]


def cheapest(ranked: Sequence[Cost], applicable: Sequence[str], verify: Verify) -> tuple[list[str] | None,
                                                                                        list[Candidate]]:
    """Leave out the settings of ``ranked`` one at a time (as ranked), each kept out only when ``verify`` (a check
    of deterministic mode without the settings given) says identical; full deterministic mode is checked when
    nothing can be left out. Returns the settings left out of the cheapest verified configuration (None when
    not even full deterministic mode was verified) and every candidate checked, in order.

    Leaving out every applicable setting is the script's own settings (``verify`` gets all of ``applicable``)."""
    left: list[str] = []
    tried: list[Candidate] = []
    verified = False
    for c in ranked:
        if c.name in left:
            continue
        candidate = verify(sorted_settings([*left, c.name]))
        tried.append(candidate)
        if candidate.verdict == "identical":
            left, verified = candidate.left_out, True
    if not verified:
        full = verify([])
        tried.append(full)
        if full.verdict != "identical":
            return None, tried
    return left, tried


def sorted_settings(names: Sequence[str]) -> list[str]:
    """``names`` in the order of SETTINGS, with the settings that act only under one of them."""
    chosen = set(names)
    chosen |= {s.name for s in SETTINGS if s.within in chosen}
    return [s.name for s in SETTINGS if s.name in chosen]


def ranking(found: Sequence[Cost]) -> list[Cost]:
    """The measured settings, most expensive first."""
    measured = [c for c in found if c.reason is None and c.overhead is not None]
    return sorted(measured, key=lambda c: -(c.overhead or 0.0))


def recommendation(left_out: list[str], applicable: Sequence[str]) -> dict[str, Any]:
    """How to ask for deterministic mode without ``left_out``: the call, the CLI flags, and the bench variant."""
    if set(applicable) <= set(left_out):
        return {"left_out": left_out, "deterministic": False, "call": None, "flags": [], "variant": DEFAULT,
                "summary": "no deterministic mode: the script's own settings are bitwise reproducible"}
    kwargs = without(left_out)
    flags = ["--deterministic", *(["--deterministic-except", ",".join(left_out)] if left_out else [])]
    return {"left_out": left_out, "deterministic": True, "kwargs": kwargs, "call": call_text(kwargs),
            "flags": flags, "variant": variant_name(left_out),
            "summary": "full deterministic mode" if not left_out else
            f"deterministic mode without {', '.join(left_out)}"}


def describe(kwargs: dict[str, Any]) -> str:
    """A variant of deterministic mode, as the call that asks for it."""
    return call_text(kwargs)
