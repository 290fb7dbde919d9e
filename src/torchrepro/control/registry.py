"""A checked registry of nondeterministic ATen ops, kept as data (layer L1).

Each row says which op, on which device kind, when it is nondeterministic, what
``torch.use_deterministic_algorithms(True)`` does about it, a known deterministic alternative, and where the
claim was verified. CPU rows are verified by ``tests/control/test_registry.py`` on every test run; CUDA rows come from
PyTorch's documentation and source and are checked by ``tools/verify_cuda_registry.py`` on a machine with a GPU.

Example:
    >>> from torchrepro.control.registry import match, nondeterministic_ops
    >>> entry = match("aten.index_add_.default", (), {}, "cuda")
    >>> entry.deterministic_mode, entry.alternative
    ('switches kernel', 'torchrepro.nn.functional.index_add')
    >>> match("aten.index_add_", (), {}, "cpu") is None
    True
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

DEVICE_KINDS = ("cpu", "cuda")
DETERMINISTIC_MODE_EFFECTS = ("switches kernel", "raises", "warns", "nothing")

CPU_VERIFIED = "cpu, torch 2.13.0, tests/control/test_registry.py"
CUDA_UNVERIFIED = "not verified (needs a GPU: tools/verify_cuda_registry.py)"

_MISSING = object()


@functools.cache
def _arg_position(op: str, name: str) -> int | None:
    """Position of argument ``name`` in the schema of ``op`` (the first overload that has it)."""
    packet = getattr(torch.ops.aten, op.partition(".")[2], None)
    if packet is None:
        return None
    for overload in packet.overloads():
        names = [a.name for a in getattr(packet, overload)._schema.arguments]
        if name in names:
            return names.index(name)
    return None


def _arg(op: str, args: tuple, kwargs: dict, name: str, default: Any = _MISSING) -> Any:
    """The value of argument ``name`` in an ATen call of ``op`` (positional or keyword)."""
    if name in kwargs:
        return kwargs[name]
    pos = _arg_position(op, name)
    if pos is not None and pos < len(args):
        return args[pos]
    return default


def _is_float_or_complex(op: str, args: tuple, kwargs: dict) -> bool:
    dtype = _arg(op, args, kwargs, "dtype", None)
    if dtype is None:
        x = _arg(op, args, kwargs, "self", None)
        dtype = x.dtype if isinstance(x, torch.Tensor) else None
    return dtype is not None and (dtype.is_floating_point or dtype.is_complex)


def _any_sparse(op: str, args: tuple, kwargs: dict) -> bool:
    return any(isinstance(a, torch.Tensor) and a.is_sparse for a in (*args, *kwargs.values()))


# Machine-checked conditions, by name: (op, args, kwargs) -> bool. Missing arguments take the schema default.
CONDITIONS: dict[str, Callable[[str, tuple, dict], bool]] = {
    "accumulate": lambda op, a, k: bool(_arg(op, a, k, "accumulate", False)),
    "no_accumulate": lambda op, a, k: not _arg(op, a, k, "accumulate", False),
    "weights": lambda op, a, k: _arg(op, a, k, "weights", None) is not None,
    "src_tensor": lambda op, a, k: isinstance(_arg(op, a, k, "src", None), torch.Tensor),
    "reduce_sum_mean": lambda op, a, k: _arg(op, a, k, "reduce", None) in ("sum", "mean"),
    "reduce_prod": lambda op, a, k: _arg(op, a, k, "reduce", None) == "prod",
    "transposed": lambda op, a, k: bool(_arg(op, a, k, "transposed", False)),
    "not_transposed": lambda op, a, k: not _arg(op, a, k, "transposed", False),
    "with_indices": lambda op, a, k: _arg(op, a, k, "dim", None) is not None,  # median(x, dim) returns indices
    "mode_max": lambda op, a, k: _arg(op, a, k, "mode", None) == 2,  # EmbeddingBag mode codes: sum 0, mean 1, max 2
    "reduced": lambda op, a, k: _arg(op, a, k, "reduction", 1) != 0,  # reduction codes: none 0, mean 1, sum 2
    "float_or_complex": _is_float_or_complex,
    "sparse_input": _any_sparse,
}


@dataclass(frozen=True)
class OpEntry:
    """One row of the registry: an ATen op that can be nondeterministic on one device kind."""

    op: str  # ATen op packet name, e.g. "aten.index_add_"
    device: str  # "cpu" | "cuda"
    when: str  # human text: "backward only", "accumulate=True", "with duplicate indices", "always"
    deterministic_mode: str  # what use_deterministic_algorithms(True) does: switches kernel | raises | warns | nothing
    alternative: str  # a deterministic replacement, or "" if none is known
    verified_on: str  # where the claim was observed, or "not verified (...)"
    condition: str | None = None  # a key of CONDITIONS; None means always

    def applies(self, args: tuple, kwargs: dict) -> bool:
        """Whether this row's condition holds for an ATen call with these arguments."""
        if self.condition is None:
            return True
        return CONDITIONS[self.condition](self.op, tuple(args), dict(kwargs or {}))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_F = "torchrepro.nn.functional."
_DUP = "with duplicate indices"
_VARIES = "varies run to run with 2+ threads"  # tests/control/test_registry.py checks this phrase against observation
_NEAREST = "F.interpolate(mode='nearest') (deterministic backward), or upsample outside the differentiated path"

# (op packet names, device, when, deterministic_mode, alternative, condition). CPU rows first: each is observed
# by tests/control/test_registry.py on every run; a CPU row without an example call there fails the test-suite.
_ROWS: list[tuple[tuple[str, ...], str, str, str, str, str | None]] = [
    # ---- CPU (observed here) ----
    (("aten.index_put_", "aten.index_put", "aten._index_put_impl_"), "cpu",
     f"accumulate=True {_DUP} (also the backward of x[idx] with tensor indices); {_VARIES}",
     "switches kernel", _F + "index_put", "accumulate"),
    (("aten.index_put_", "aten.index_put", "aten._index_put_impl_"), "cpu",
     f"accumulate=False {_DUP} (which write wins); {_VARIES}", "switches kernel",
     "unique indices, or " + _F + "index_put", "no_accumulate"),
    (("aten.put_", "aten.put"), "cpu", f"accumulate=True {_DUP} (also the backward of torch.take); {_VARIES}",
     "switches kernel", _F + "index_put (on x.view(-1))", "accumulate"),
    (("aten.put_", "aten.put"), "cpu", f"accumulate=False {_DUP} (which write wins); {_VARIES}", "raises",
     "unique indices, or x.view(-1).index_put_((idx,), v) under deterministic mode", "no_accumulate"),
    (("aten.index_copy_", "aten.index_copy"), "cpu",
     f"{_DUP} (which write wins); {_VARIES}", "switches kernel", "unique indices", None),
    (("aten.max_unpool2d", "aten.max_unpool3d"), "cpu", f"{_DUP} (overlapping pooling windows)", "raises",
     "non-overlapping pooling (stride >= kernel_size)", None),
    # ---- CUDA: switches kernel under deterministic mode ----
    (("aten.index_add_", "aten.index_add"), "cuda", f"{_DUP} (atomicAdd; also the backward of index_select)",
     "switches kernel", _F + "index_add", None),
    (("aten.scatter_add_", "aten.scatter_add"), "cuda", f"{_DUP} (atomicAdd; also the backward of gather)",
     "switches kernel", _F + "scatter_add", None),
    (("aten.scatter_reduce_", "aten.scatter_reduce"), "cuda", f"reduce='sum' or 'mean' {_DUP}",
     "switches kernel", _F + "scatter_add (for 'mean', divide by the counts)", "reduce_sum_mean"),
    (("aten.scatter_", "aten.scatter"), "cuda", f"src is a tensor, {_DUP} (which write wins)",
     "switches kernel", "unique indices", "src_tensor"),
    (("aten.index_put_", "aten.index_put", "aten._index_put_impl_"), "cuda",
     f"accumulate=False {_DUP} (which write wins)", "switches kernel", "unique indices", "no_accumulate"),
    (("aten.index_copy_", "aten.index_copy"), "cuda", _DUP, "switches kernel", "unique indices", None),
    (("aten.convolution_backward",), "cuda", "backward of ConvTranspose1d/2d/3d (cuDNN algorithm choice)",
     "switches kernel", "torchrepro.nn.ConvTranspose2d", "transposed"),
    (("aten.convolution_backward",), "cuda", "backward of Conv1d/2d/3d (cuDNN algorithm choice)",
     "switches kernel", "", "not_transposed"),
    (("aten.convolution",), "cuda", "cuDNN algorithm choice (benchmark mode may pick a different one per run)",
     "switches kernel", "", None),
    (("aten.replication_pad1d_backward", "aten.replication_pad2d_backward", "aten.replication_pad3d_backward"),
     "cuda", "backward only", "switches kernel", "", None),
    (("aten.max_pool3d_with_indices_backward",), "cuda", "backward only", "switches kernel", "", None),
    (("aten.bmm",), "cuda", "sparse-dense inputs", "switches kernel", "", "sparse_input"),
    # ---- CUDA: raises under deterministic mode ----
    (("aten.put_", "aten.put"), "cuda", "accumulate=True (atomicAdd)", "raises",
     _F + "index_put (on x.view(-1))", "accumulate"),
    (("aten.put_", "aten.put"), "cuda", f"accumulate=False {_DUP}", "raises", "unique indices", "no_accumulate"),
    (("aten.upsample_linear1d_backward", "aten.upsample_bilinear2d_backward",
      "aten.upsample_bicubic2d_backward", "aten.upsample_trilinear3d_backward"), "cuda",
     "backward only (F.interpolate linear/bilinear/bicubic/trilinear)", "raises", _NEAREST, None),
    (("aten.grid_sampler_2d_backward", "aten.grid_sampler_3d_backward"), "cuda", "backward only", "raises", "",
     None),
    (("aten._embedding_bag_backward",), "cuda",
     "backward of EmbeddingBag with mode='max'", "raises", "EmbeddingBag mode='sum' (torchrepro.nn.EmbeddingBag)",
     "mode_max"),
    (("aten.bincount",), "cuda", "with weights (atomicAdd)", "raises", _F + "bincount", "weights"),
    (("aten.histc",), "cuda", "always (atomicAdd)", "raises", _F + "histc", None),
    (("aten._ctc_loss_backward",), "cuda", "backward only", "raises", "", None),
    (("aten._adaptive_avg_pool2d_backward", "aten._adaptive_avg_pool3d_backward"), "cuda", "backward only",
     "raises", "AvgPool with a fixed kernel (input size divisible by output size)", None),
    (("aten.adaptive_max_pool2d_backward",), "cuda", "backward only", "raises", "", None),
    (("aten.avg_pool3d_backward",), "cuda", "backward only", "raises", "", None),
    (("aten.fractional_max_pool2d_backward", "aten.fractional_max_pool3d_backward"), "cuda", "backward only",
     "raises", "", None),
    (("aten.reflection_pad1d_backward", "aten.reflection_pad2d_backward", "aten.reflection_pad3d_backward"),
     "cuda", "backward only", "raises", "replicate padding (switches to a deterministic kernel)", None),
    (("aten.nll_loss2d_forward",), "cuda",
     "NLLLoss/CrossEntropyLoss on (N, C, H, W) input with reduction 'mean' or 'sum' (atomicAdd)", "raises",
     "reduction='none', then .mean() or .sum()", "reduced"),
    (("aten.median", "aten.nanmedian"), "cuda", "with a dim (indices output): which duplicate's index", "raises",
     "", "with_indices"),
    (("aten.kthvalue",), "cuda", "which duplicate's index is returned", "raises", "", None),
    (("aten.cumsum", "aten.cumsum_"), "cuda", "floating point or complex dtype", "raises", "", "float_or_complex"),
    (("aten.scatter_reduce_", "aten.scatter_reduce"), "cuda", f"reduce='prod' {_DUP}", "raises", "",
     "reduce_prod"),
    (("aten.max_unpool2d", "aten.max_unpool3d"), "cuda", f"{_DUP} (overlapping pooling windows)", "raises",
     "non-overlapping pooling (stride >= kernel_size)", None),
]


def _build() -> tuple[OpEntry, ...]:
    entries = []
    for ops, device, when, mode, alternative, condition in _ROWS:
        assert device in DEVICE_KINDS and mode in DETERMINISTIC_MODE_EFFECTS, (ops, device, mode)
        assert condition is None or condition in CONDITIONS, condition
        verified = CPU_VERIFIED if device == "cpu" else CUDA_UNVERIFIED
        entries.extend(OpEntry(op, device, when, mode, alternative, verified, condition) for op in ops)
    return tuple(entries)


ENTRIES: tuple[OpEntry, ...] = _build()
_BY_KEY: dict[tuple[str, str], list[OpEntry]] = {}
for _e in ENTRIES:
    _BY_KEY.setdefault((_e.op, _e.device), []).append(_e)


def normalize_op(op: Any) -> str:
    """The ATen packet name of ``op``: an OpOverload, a packet, or text such as ``"aten::index_add_"``,
    ``"aten.index_add_.default"`` or ``"index_add_"`` all give ``"aten.index_add_"``."""
    if not isinstance(op, str):
        op = str(getattr(op, "overloadpacket", op))
    name = op.replace("::", ".")
    parts = name.split(".")
    if len(parts) == 1:
        return f"aten.{parts[0]}"
    return f"{parts[0]}.{parts[1]}"


def device_kind(device: Any) -> str:
    """``"cuda"`` for ``"cuda"``, ``"cuda:1"`` or ``torch.device("cuda", 0)``; likewise for other kinds."""
    if isinstance(device, torch.device):
        return device.type
    return str(device).partition(":")[0].strip().lower()


def nondeterministic_ops(device: str | None = None) -> list[OpEntry]:
    """The registry: every entry, or those for one device kind (``"cpu"``, ``"cuda"``, ``"cuda:0"``).

    >>> rows = nondeterministic_ops("cpu")
    >>> sorted({r.deterministic_mode for r in rows})
    ['raises', 'switches kernel']
    """
    if device is None:
        return list(ENTRIES)
    kind = device_kind(device)
    if kind not in DEVICE_KINDS:
        raise ValueError(f"nondeterministic_ops(device={device!r}): expected one of {DEVICE_KINDS} (or 'cuda:N') "
                         "or None for every entry. The registry has no rows for other device kinds yet.")
    return [e for e in ENTRIES if e.device == kind]


def match(op_name: Any, args: tuple, kwargs: dict, device: Any) -> OpEntry | None:
    """The entry for ``op_name`` on ``device`` whose condition holds for these ATen call arguments, else None.

    >>> match("aten::put_", (None, None, None, True), {}, "cuda").when
    'accumulate=True (atomicAdd)'
    """
    for entry in _BY_KEY.get((normalize_op(op_name), device_kind(device)), ()):
        if entry.applies(args, kwargs or {}):
            return entry
    return None
