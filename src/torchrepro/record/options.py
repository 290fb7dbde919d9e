"""How a script is launched and recorded (:class:`LaunchOptions`), grouped by feature.

The launcher hands these to the child process as JSON (:meth:`LaunchOptions.to_json`, read back by
:meth:`LaunchOptions.from_json`). What the recorder keeps and traces are the recorder's own settings
(:class:`~.settings.ValueSettings`, :class:`~.settings.TraceSettings`); ranks (:class:`RankOptions`) and the
working directory (:class:`WorkdirOptions`) are the launcher's.

>>> import json
>>> opts = LaunchOptions(seed=0, values=ValueSettings(keep=True), ranks=RankOptions(nproc_per_node=2))
>>> LaunchOptions.from_json(json.loads(json.dumps(opts.to_json()))) == opts
True
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .settings import TraceSettings, ValueSettings, _Settings

__all__ = ["LaunchOptions", "RankOptions", "TraceSettings", "ValueSettings", "WorkdirOptions"]


@dataclass(frozen=True, kw_only=True)
class RankOptions(_Settings):
    """A launch through torchrun (``torch.distributed.run``), one recording per rank into ``RECORD/rank{R}``.

    - ``nproc_per_node``: ranks on this node (``None``: one process, no torchrun);
    - ``nnodes``, ``node_rank``, ``rendezvous``: this is one node of several (torchrun's options; ``rendezvous``
      replaces ``--standalone``), each global rank recorded into ``RECORD/rank{G}``;
    - ``static``: ranks numbered ``node_rank * nproc_per_node + local rank`` (a static rendezvous);
    - ``output``: each rank writes its stdout/stderr into its rank directory.

    >>> RankOptions(nproc_per_node=2, output=True).nproc_per_node
    2
    """

    nproc_per_node: int | None = None
    nnodes: int = 1
    node_rank: int = 0
    rendezvous: list[str] | None = None
    static: bool = True
    output: bool = False

    def __post_init__(self) -> None:
        self._int("nproc_per_node", low=1, optional=True)
        self._int("nnodes", low=1)
        self._int("node_rank", low=0)
        self._bool("static")
        self._bool("output")


@dataclass(frozen=True, kw_only=True)
class WorkdirOptions(_Settings):
    """Where the script runs and what is watched there.

    - ``cwd``: the script's working directory (``None``: this process's; ``check --fresh-cwd`` gives a copy);
    - ``watch_since_ns``: note reads under the cwd of files changed since then (:class:`~.workdir.ReadAudit`).
    """

    cwd: str | None = None
    watch_since_ns: int | None = None

    def __post_init__(self) -> None:
        self._int("watch_since_ns", low=0, optional=True)


_GROUPS: dict[str, type[_Settings]] = {"values": ValueSettings, "trace": TraceSettings, "ranks": RankOptions,
                                       "workdir": WorkdirOptions}


@dataclass
class LaunchOptions:
    """Everything a launch needs: what to record where, seeding and deterministic mode, the groups above, and the
    plumbing of ``check`` (its ``--resume-at`` plan, its stop after a divergence, the gate of a prestarted run)."""

    record: str | None = None
    seed: int | None = None
    deterministic: bool = False
    determinism: dict[str, Any] = field(default_factory=dict)  # deterministic() keywords: settings left out
    max_steps: int | None = None
    values: ValueSettings = field(default_factory=ValueSettings)
    trace: TraceSettings = field(default_factory=TraceSettings)
    ranks: RankOptions = field(default_factory=RankOptions)
    workdir: WorkdirOptions = field(default_factory=WorkdirOptions)
    extra_env: dict[str, str] = field(default_factory=dict)
    audit: bool = False  # watch seeding, DataLoaders, autocast and CUBLAS_WORKSPACE_CONFIG (envinfo.ScriptProbe)
    timing: bool = False  # record step boundaries only (no fingerprints), device-synchronised: see bench
    torch_flags: dict[str, bool] = field(default_factory=dict)  # TORCH_FLAGS to set before the script starts
    resume_at: dict[str, Any] | None = None  # check --resume-at: {"phase", "step", "checkpoint"} (resumeat.ResumePlan)
    divergence_stop: dict[str, Any] | None = None  # check: stop K steps after a divergence (divergence.DivergenceWatch)
    gate_fd: int | None = None  # the child waits on this pipe before the script runs (start_gated)

    def __post_init__(self) -> None:
        for name, kind in _GROUPS.items():
            if not isinstance(getattr(self, name), kind):
                raise TypeError(f"LaunchOptions.{name} must be a {kind.__name__}, got {getattr(self, name)!r}")

    def to_json(self) -> dict[str, Any]:
        """The options as JSON values (the groups as their ``to_json()`` dicts)."""
        doc = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return doc | {name: getattr(self, name).to_json() for name in _GROUPS}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LaunchOptions:
        """:meth:`to_json`'s dict, read back (a group left out takes its defaults)."""
        fields: dict[str, Any] = {k: _GROUPS[k].from_json(v) if k in _GROUPS else v for k, v in data.items()}
        return cls(**fields)

    def with_values(self, **changes: Any) -> LaunchOptions:
        """A copy with ``values`` changed: ``opts.with_values(keep=False)``."""
        return dataclasses.replace(self, values=dataclasses.replace(self.values, **changes))

    def in_dir(self, **changes: Any) -> LaunchOptions:
        """A copy with ``workdir`` changed: ``opts.in_dir(cwd="/tmp/copy")``."""
        return dataclasses.replace(self, workdir=dataclasses.replace(self.workdir, **changes))
