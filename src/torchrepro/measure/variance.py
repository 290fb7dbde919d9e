"""Statistics of repeated runs: implementation noise vs seed noise, detectable differences, and the
step-time summaries of ``torchrepro bench``.

The spread between runs with different seeds and the spread between runs with the same seed (GPU
nondeterminism) can fall in the same band. :func:`analyze_variance` measures both from a script's
final loss or metric and says how small a difference between two configurations the noise lets one detect:

* the test: a two-sided two-sample t-test (Welch) at level ``alpha`` on ``n`` runs per configuration;
* the smallest difference it detects with probability ``power``:
  ``(t(1 - alpha/2, 2n - 2) + t(power, 2n - 2)) * sigma * sqrt(2 / n)``, the usual normal-theory approximation,
  with ``sigma`` the standard deviation measured here (seed-to-seed for configurations run with different seeds,
  same-seed for configurations run with one fixed seed).

>>> round(t_quantile(0.975, 4), 4)
2.7764
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .._core.naming import renamed

SCHEMA = "torchrepro.variance/1"
ALPHA = 0.05
POWER = 0.8
SAME_BAND = 0.5  # implementation std / seed std at or above which the two noises are "in the same band"
DETECT_NS = (3, 5, 10, 20)


# --- Student's t distribution (no SciPy needed) -------------------------------------------------------------
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        even = m * (b - m) * x / ((a + m2 - 1) * (a + m2))
        odd = -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1))
        for num in (even, odd):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` > 0 degrees of freedom (bisection on :func:`t_cdf`)."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def min_detectable_difference(sigma: float, n: int, *, alpha: float = ALPHA, power: float = POWER) -> float:
    """Smallest true difference of means that a two-sided two-sample t-test on ``n`` runs per configuration
    detects at level ``alpha`` with probability ``power``, when each run's value has standard deviation ``sigma``."""
    if n < 2:
        raise ValueError(f"a two-sample t-test needs at least 2 runs per configuration, got {n}")
    df = 2 * n - 2
    return (t_quantile(1 - alpha / 2, df) + t_quantile(power, df)) * sigma * math.sqrt(2.0 / n)


# --- groups of runs -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GroupStats:
    """One group of runs: its values (in run order), mean, sample standard deviation and range."""

    label: str
    values: list[float]
    seeds: list[int]
    mean: float
    std: float
    min: float
    max: float
    identical: bool  # every value has the same bits

    @property
    def range(self) -> float:
        return self.max - self.min

    @classmethod
    def of(cls, label: str, values: Sequence[float], seeds: Sequence[int]) -> GroupStats:
        vals = [float(v) for v in values]
        finite = [v for v in vals if math.isfinite(v)]
        if len(finite) != len(vals):
            bad = [i + 1 for i, v in enumerate(vals) if not math.isfinite(v)]
            raise ValueError(f"{label}: run(s) {bad} produced a value that is not finite "
                             f"({[vals[i - 1] for i in bad]})")
        identical = len({v.hex() for v in vals}) == 1
        std = statistics.stdev(vals) if len(vals) > 1 and not identical else 0.0
        return cls(label, vals, list(seeds), statistics.fmean(vals), std, min(vals), max(vals), identical)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "range": self.range, "values_hex": [v.hex() for v in self.values]}
    to_dict = renamed("to_json", "to_dict")


VERDICTS = {
    "deterministic": "runs with the same seed give bit-identical values: the spread comes from the seed alone",
    "same-band": "same-seed nondeterminism is about as large as the seed-to-seed spread",
    "seed-dominated": "same-seed nondeterminism is small next to the seed-to-seed spread",
    "seed-insensitive": "the value does not change with the seed torchrepro gives the script",
}

ACTIONS = {
    "deterministic": "Two configurations run with the same seed differ for a real reason (for that seed); across "
                     "seeds, only differences above the seed-to-seed detectable difference stand out from seed "
                     "noise.",
    "same-band": "Fixing the seed does not make two runs comparable here: run with deterministic mode "
                 "(--deterministic, torchrepro.deterministic()) to remove the same-seed noise, or compare "
                 "configurations over several seeds.",
    "seed-dominated": "Same-seed noise is small but not zero: with one fixed seed, differences below the same-seed "
                      "detectable difference are noise; deterministic mode removes it.",
    "seed-insensitive": "The script probably seeds itself with a constant. Let torchrepro choose: call "
                        "torchrepro.seed_everything() without an argument (it reads TORCHREPRO_SEED), or read the "
                        "seed from the TORCHREPRO_SEED environment variable.",
}


@dataclass(frozen=True)
class VarianceReport:
    """Implementation noise (same seed) vs seed noise (different seeds) of one value, with detectable differences."""

    value: str  # "final loss" or "metric NAME"
    same_seed: GroupStats
    seeds: GroupStats
    verdict: str
    alpha: float
    power: float
    detectable: list[dict[str, float]] = field(default_factory=list)  # across seeds: [{"n": n, "difference": d}]
    detectable_same_seed: dict[str, float] = field(default_factory=dict)  # same seed, n = len(same_seed.values)

    @property
    def ratio(self) -> float | None:
        """Same-seed std / seed-to-seed std (None when the seed-to-seed std is 0)."""
        return self.same_seed.std / self.seeds.std if self.seeds.std > 0 else None

    @property
    def seed_only_std(self) -> float:
        """The part of the seed-to-seed spread not explained by same-seed noise: sqrt(max(0, s_seed² - s_same²))."""
        return math.sqrt(max(0.0, self.seeds.std ** 2 - self.same_seed.std ** 2))

    @property
    def test(self) -> str:
        return (f"two-sided two-sample t-test (Welch), alpha={self.alpha:g}, power={self.power:g}: detectable "
                "difference = (t(1-alpha/2, 2n-2) + t(power, 2n-2)) * sigma * sqrt(2/n)")

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "value": self.value, "verdict": self.verdict, "title": VERDICTS[self.verdict],
            "action": ACTIONS[self.verdict], "same_seed": self.same_seed.to_json(), "seeds": self.seeds.to_json(),
            "ratio": self.ratio, "seed_only_std": self.seed_only_std, "test": self.test, "alpha": self.alpha,
            "power": self.power, "detectable": self.detectable, "detectable_same_seed": self.detectable_same_seed,
        }
    to_dict = renamed("to_json", "to_dict")


def _verdict(same: GroupStats, seeds: GroupStats) -> str:
    if seeds.std == 0:
        return "seed-insensitive"
    if same.identical:
        return "deterministic"
    return "same-band" if same.std / seeds.std >= SAME_BAND else "seed-dominated"


def analyze_variance(same_seed: GroupStats, seeds: GroupStats, *, value: str = "final loss", alpha: float = ALPHA,
                     power: float = POWER, ns: Sequence[int] = DETECT_NS) -> VarianceReport:
    """Compare the two groups; see the module docs for the test and the detectable difference."""
    if len(same_seed.values) < 2 or len(seeds.values) < 2:
        raise ValueError("analyze_variance needs at least 2 runs in each group")
    sizes = sorted({*ns, len(seeds.values)})
    detectable = [{"n": n, "difference": min_detectable_difference(seeds.std, n, alpha=alpha, power=power)}
                  for n in sizes]
    n_same = len(same_seed.values)
    same = {"n": n_same, "difference": min_detectable_difference(same_seed.std, n_same, alpha=alpha, power=power)}
    return VarianceReport(value, same_seed, seeds, _verdict(same_seed, seeds), alpha, power, detectable, same)


# --- step times (torchrepro bench) --------------------------------------------------------------------------
def quantiles(values: Sequence[float], qs: Sequence[float]) -> list[float]:
    """Linear-interpolation quantiles (NumPy's default method)."""
    t = torch.tensor(list(values), dtype=torch.float64)
    return torch.quantile(t, torch.tensor(list(qs), dtype=torch.float64)).tolist()


@dataclass(frozen=True)
class TimeStats:
    """Step times of one configuration, in milliseconds."""

    steps: int
    median: float
    q1: float
    q3: float

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @classmethod
    def of(cls, times_ms: Sequence[float]) -> TimeStats:
        q1, med, q3 = quantiles(times_ms, (0.25, 0.5, 0.75))
        return cls(len(times_ms), med, q1, q3)


def overhead_ci(base: Sequence[float], other: Sequence[float], *, level: float = 0.95, resamples: int = 2000,
                seed: int = 0) -> tuple[float, float, float]:
    """``median(other) / median(base) - 1`` and a percentile-bootstrap confidence interval for it.

    Steps are resampled within each configuration (``resamples`` times, from a fixed ``seed``, so the interval is
    the same for the same times). It covers step-to-step noise; drift between processes is what the alternating
    run order of ``torchrepro bench`` is for.
    """
    b = torch.tensor(list(base), dtype=torch.float64)
    o = torch.tensor(list(other), dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    mb = b[torch.randint(len(b), (resamples, len(b)), generator=gen)].quantile(0.5, dim=1)
    mo = o[torch.randint(len(o), (resamples, len(o)), generator=gen)].quantile(0.5, dim=1)
    ratios = mo / mb - 1.0
    lo, hi = torch.quantile(ratios, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)).tolist()
    point = float(o.quantile(0.5) / b.quantile(0.5) - 1.0)
    return point, lo, hi
