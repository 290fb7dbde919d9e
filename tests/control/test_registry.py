"""The registry of nondeterministic ops: every CPU row's claim is observed here, on this machine, with 2 threads.

A CPU row needs an example call in ``EXAMPLES`` (keyed by op and condition); a row without one fails
``test_cpu_entry_claim_is_observed``, so no unverified CPU row can be added.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torchrepro
from torchrepro.control import registry
from torchrepro.control.registry import OpEntry, match, nondeterministic_ops, normalize_op

VARIES = "varies run to run with 2+ threads"
RUNS = 64  # most runs to observe a claimed variation (stops at the second distinct result)
ALERT = "does not have a deterministic implementation"


@pytest.fixture(autouse=True)
def _two_threads_and_flags():
    threads = torch.get_num_threads()
    flags = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(flags[0], warn_only=flags[1])


# ---- example calls -------------------------------------------------------------------------------------------
M = 500_000  # "which write wins" examples: each of M slots is written twice, once in each thread's half


@functools.cache
def _cross() -> tuple[torch.Tensor, torch.Tensor]:
    """Indices whose second half mirrors the first: slot perm[i] is written at i by one thread and at about the
    same moment (mirrored position) by the other, so the slot where the later writer changes moves run to run."""
    perm = torch.randperm(M, generator=torch.Generator().manual_seed(0))
    return torch.cat([perm, perm.flip(0)]), torch.cat([torch.zeros(M), torch.ones(M)])


@functools.cache
def _many() -> tuple[torch.Tensor, torch.Tensor]:
    """2M float values accumulated into 1000 slots: the summation order per slot follows the threads' timing."""
    idx = torch.randint(0, 1000, (2_000_000,), generator=torch.Generator().manual_seed(0))
    return idx, torch.randn(2_000_000, generator=torch.Generator().manual_seed(1))


def _getitem_backward() -> torch.Tensor:
    idx, vals = _many()
    x = torch.zeros(1000, requires_grad=True)
    x[idx].backward(vals)  # backward: aten.index_put(..., accumulate=True)
    return x.grad


def _take_backward() -> torch.Tensor:
    idx, vals = _many()
    x = torch.zeros(1000, requires_grad=True)
    torch.take(x, idx).backward(vals)  # backward: aten.put(..., accumulate=True)
    return x.grad


def _unpool(fn: Callable, pool: Callable, shape: tuple[int, ...]) -> Callable[[], torch.Tensor]:
    def call() -> torch.Tensor:
        x = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
        y, i = pool(x, 2, return_indices=True)
        return fn(y, i, 2)

    return call


F = torch.nn.functional
EXAMPLES: dict[tuple[str, str | None], Callable[[], torch.Tensor]] = {
    ("aten.index_put_", "accumulate"): lambda: torch.zeros(1000).index_put_((_many()[0],), _many()[1],
                                                                             accumulate=True),
    ("aten.index_put", "accumulate"): _getitem_backward,
    ("aten._index_put_impl_", "accumulate"): lambda: torch.ops.aten._index_put_impl_(
        torch.zeros(1000), (_many()[0],), _many()[1], accumulate=True),
    ("aten.index_put_", "no_accumulate"): lambda: torch.zeros(M).index_put_((_cross()[0],), _cross()[1]),
    ("aten.index_put", "no_accumulate"): lambda: torch.index_put(torch.zeros(M), (_cross()[0],), _cross()[1]),
    ("aten._index_put_impl_", "no_accumulate"): lambda: torch.ops.aten._index_put_impl_(
        torch.zeros(M), (_cross()[0],), _cross()[1]),
    ("aten.put_", "accumulate"): lambda: torch.zeros(1000).put_(_many()[0], _many()[1], accumulate=True),
    ("aten.put", "accumulate"): _take_backward,
    ("aten.put_", "no_accumulate"): lambda: torch.zeros(M).put_(_cross()[0], _cross()[1]),
    ("aten.put", "no_accumulate"): lambda: torch.put(torch.zeros(M), _cross()[0], _cross()[1]),
    ("aten.index_copy_", None): lambda: torch.zeros(M).index_copy_(0, _cross()[0], _cross()[1]),
    ("aten.index_copy", None): lambda: torch.index_copy(torch.zeros(M), 0, _cross()[0], _cross()[1]),
    ("aten.max_unpool2d", None): _unpool(F.max_unpool2d, F.max_pool2d, (1, 1, 4, 4)),
    ("aten.max_unpool3d", None): _unpool(F.max_unpool3d, F.max_pool3d, (1, 1, 4, 4, 4)),
}


class _Calls(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple, dict]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((normalize_op(func), args, kwargs or {}))
        return func(*args, **(kwargs or {}))


def _distinct(call: Callable[[], torch.Tensor], runs: int, *, stop_at: int | None = None) -> int:
    seen: set[bytes] = set()
    for _ in range(runs):
        seen.add(call().numpy().tobytes())
        if stop_at is not None and len(seen) >= stop_at:
            break
    return len(seen)


def _varies(call: Callable[[], torch.Tensor]) -> bool:
    """Two different results within RUNS runs with 2 threads, else with 4. A few runs suffice on an idle machine;
    on a loaded one the two threads sometimes run one after the other, which hides the race."""
    for threads in (2, 4):
        torch.set_num_threads(threads)
        if _distinct(call, RUNS, stop_at=2) == 2:
            return True
    return False


def _id(e: OpEntry) -> str:
    return f"{e.op}[{e.condition}]"


@pytest.mark.parametrize("entry", nondeterministic_ops("cpu"), ids=_id)
def test_cpu_entry_claim_is_observed(entry: OpEntry):
    call = EXAMPLES.get((entry.op, entry.condition))
    assert call is not None, (f"CPU row {entry.op} (condition {entry.condition}) has no example call in "
                              "tests/control/test_registry.py EXAMPLES: add one that shows its claimed behaviour.")
    # The claim names where it is verified: this test, on the CPU, with the torch it runs on (a claim written
    # for another torch version has not been verified until the registry says this one).
    here = Path(__file__)
    where = here.relative_to(here.parents[2]).as_posix()  # tests/control/test_registry.py
    assert entry.verified_on == f"cpu, torch {torch.__version__.split('+')[0]}, {where}"

    # The example really runs this op with this row's condition.
    with _Calls() as seen:
        call()
    assert any(match(name, args, kwargs, "cpu") == entry for name, args, kwargs in seen.calls), \
        f"the example never calls {entry.op} with condition {entry.condition}"

    torch.use_deterministic_algorithms(False)
    if VARIES in entry.when:
        assert _varies(call), f"{entry.op}: claimed to vary, but {RUNS} runs with 2 and with 4 threads gave one result"

    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    if entry.deterministic_mode == "raises":
        with pytest.raises(RuntimeError, match=ALERT):
            call()
    elif entry.deterministic_mode == "switches kernel":
        assert _distinct(call, 5) == 1
    elif entry.deterministic_mode == "warns":
        torch.use_deterministic_algorithms(True, warn_only=True)
        with pytest.warns(UserWarning, match=ALERT):
            call()
    else:  # "nothing": deterministic mode does not help
        assert entry.deterministic_mode == "nothing"
        assert _varies(call)


def test_every_example_belongs_to_a_cpu_row():
    rows = {(e.op, e.condition) for e in nondeterministic_ops("cpu")}
    assert set(EXAMPLES) == rows


def test_cpu_ops_checked_and_found_stable_are_not_listed():
    """What docs/policy.md says was checked on CPU with 2 threads and found stable (1 result over 5 runs), with
    the same worst-case inputs as the rows above: none of these may be listed for CPU."""
    idx, vals = _many()
    cross_idx, _ = _cross()
    stable = {
        "aten.index_add_": lambda: torch.zeros(1000).index_add_(0, idx, vals),
        "aten.scatter_add_": lambda: torch.zeros(1000).scatter_add_(0, idx, vals),
        "aten.scatter_": lambda: torch.zeros(M).scatter_(0, cross_idx, _cross()[1]),
        "aten.bincount": lambda: torch.bincount(idx, vals),
    }
    for op, call in stable.items():
        assert _distinct(call, 5) == 1, op
        assert not [e for e in nondeterministic_ops("cpu") if e.op == op]


# ---- the table is well-formed ---------------------------------------------------------------------------------
CONDITION_ARGS = {"accumulate": "accumulate", "no_accumulate": "accumulate", "weights": "weights",
                  "src_tensor": "src", "reduce_sum_mean": "reduce", "reduce_prod": "reduce",
                  "transposed": "transposed", "not_transposed": "transposed", "with_indices": "dim",
                  "mode_max": "mode", "float_or_complex": "self", "sparse_input": None, "reduced": "reduction",
                  "cublas_workspace_unset": None}


@pytest.mark.parametrize("entry", nondeterministic_ops(), ids=lambda e: f"{e.device}:{_id(e)}")
def test_entry_names_a_real_op_and_argument(entry: OpEntry):
    assert entry.op.startswith("aten.") and hasattr(torch.ops.aten, entry.op[5:]), entry.op
    assert entry.device in registry.DEVICE_KINDS
    assert entry.deterministic_mode in registry.DETERMINISTIC_MODE_EFFECTS
    assert entry.when
    if entry.condition is not None:
        arg = CONDITION_ARGS[entry.condition]
        assert arg is None or registry._arg_position(entry.op, arg) is not None, (entry.op, arg)
    if entry.device == "cuda":
        assert entry.verified_on == registry.CUDA_UNVERIFIED


def test_rows_are_unique_and_the_api_fields_are_the_agreed_ones():
    keys = [(e.op, e.device, e.condition) for e in nondeterministic_ops()]
    assert len(keys) == len(set(keys))
    assert list(nondeterministic_ops()[0].to_json()) == ["op", "device", "when", "deterministic_mode",
                                                         "alternative", "verified_on", "condition"]
    assert torchrepro.nondeterministic_ops is nondeterministic_ops and torchrepro.OpEntry is OpEntry


def test_alternatives_that_name_torchrepro_exist():
    names = {e.alternative.split(" ")[0] for e in nondeterministic_ops() if e.alternative.startswith("torchrepro.")}
    names |= {alt.split("(")[-1].split(")")[0] for e in nondeterministic_ops() for alt in [e.alternative]
              if "(torchrepro." in alt}
    assert "torchrepro.nn.functional.index_add" in names and "torchrepro.nn.ConvTranspose2d" in names
    for name in sorted(names):
        module, _, attr = name.rpartition(".")
        assert hasattr(importlib.import_module(module), attr), name


def test_every_cuda_row_has_an_example_in_the_gpu_check_that_calls_its_op():
    """tools/verify_cuda_registry.py checks CUDA rows on a GPU; here its examples run once on CPU and must dispatch
    each row's op with the row's condition (what the op does on CUDA is for the GPU run to observe)."""
    path = Path(__file__).resolve().parents[2] / "tools" / "verify_cuda_registry.py"
    spec = importlib.util.spec_from_file_location("verify_cuda_registry", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.smoke("cpu") == []
    assert set(tool.EXAMPLES) == {(e.op, e.condition) for e in nondeterministic_ops("cuda")}
    if not torch.cuda.is_available():
        assert tool.main([]) == 0  # no GPU: a message, exit 0


def test_issue_ops_are_listed_for_cuda():
    cuda = {e.op for e in nondeterministic_ops("cuda")}
    for op in ("index_add_", "scatter_add_", "index_put_", "upsample_bilinear2d_backward",
               "upsample_bicubic2d_backward", "upsample_linear1d_backward", "upsample_trilinear3d_backward",
               "grid_sampler_2d_backward", "_embedding_bag_backward", "bincount", "histc", "put_",
               "_ctc_loss_backward", "max_pool3d_with_indices_backward", "_adaptive_avg_pool2d_backward",
               "nll_loss2d_forward", "kthvalue", "median", "cumsum", "convolution_backward"):
        assert f"aten.{op}" in cuda, op


# ---- lookups ---------------------------------------------------------------------------------------------------
x, i1, v1 = torch.zeros(3), torch.tensor([0, 0]), torch.ones(2)
w = torch.ones(2)
MATCHES = [  # (op as given, args, kwargs, device, expected (deterministic_mode, condition) or None)
    ("aten.index_put_.default", (x, [i1], v1, True), {}, "cpu", ("switches kernel", "accumulate")),
    ("aten::index_put_", (x, [i1], v1), {"accumulate": True}, "cpu", ("switches kernel", "accumulate")),
    ("index_put_", (x, [i1], v1), {}, "cpu", ("switches kernel", "no_accumulate")),
    (torch.ops.aten.put_.default, (x, i1, v1), {}, "cpu", ("raises", "no_accumulate")),
    (torch.ops.aten.put, (x, i1, v1, True), {}, "cpu", ("switches kernel", "accumulate")),
    ("aten.put_", (x, i1, v1, True), {}, "cuda", ("raises", "accumulate")),
    ("aten.index_add_", (x, 0, i1, v1), {}, "cpu", None),
    ("aten.index_add_", (x, 0, i1, v1), {}, "cuda:0", ("switches kernel", None)),
    ("aten.index_add.default", (x, 0, i1, v1), {}, torch.device("cuda", 1), ("switches kernel", None)),
    ("aten.index_add_", (x, 0, i1, v1), {}, "mps", None),
    ("aten.bincount", (i1,), {}, "cuda", None),
    ("aten.bincount", (i1, w), {}, "cuda", ("raises", "weights")),
    ("aten.bincount", (i1,), {"weights": w}, "cuda", ("raises", "weights")),
    ("aten.cumsum", (i1, 0), {}, "cuda", None),
    ("aten.cumsum", (i1, 0), {"dtype": torch.float32}, "cuda", ("raises", "float_or_complex")),
    ("aten.cumsum.default", (x, 0), {}, "cuda", ("raises", "float_or_complex")),
    ("aten.median.default", (x,), {}, "cuda", None),
    ("aten.median.dim", (x, 0), {}, "cuda", ("raises", "with_indices")),
    ("aten.scatter_reduce.two", (x, 0, i1, v1, "sum"), {}, "cuda", ("switches kernel", "reduce_sum_mean")),
    ("aten.scatter_reduce.two", (x, 0, i1, v1, "prod"), {}, "cuda", ("raises", "reduce_prod")),
    ("aten.scatter_reduce.two", (x, 0, i1, v1, "amax"), {}, "cuda", None),
    ("aten.scatter_.value", (x, 0, i1, 1.0), {}, "cuda", None),
    ("aten.scatter_.src", (x, 0, i1, v1), {}, "cuda", ("switches kernel", "src_tensor")),
    ("aten.convolution_backward", (None,) * 7 + (True,), {}, "cuda", ("switches kernel", "transposed")),
    ("aten.convolution_backward", (None,) * 7 + (False,), {}, "cuda", ("switches kernel", "not_transposed")),
    ("aten._embedding_bag_backward", (None,) * 8 + (2,), {}, "cuda", ("raises", "mode_max")),
    ("aten._embedding_bag_backward", (None,) * 8 + (0,), {}, "cuda", None),
    ("aten.grid_sampler_2d_backward.default", (), {}, "cuda", ("raises", None)),
    ("aten.nll_loss2d_forward", (x, i1, None, 1, -100), {}, "cuda", ("raises", "reduced")),
    ("aten.nll_loss2d_forward", (x, i1, None, 0, -100), {}, "cuda", None),
    ("aten.grid_sampler_2d_backward", (), {}, "cpu", None),
]


@pytest.mark.parametrize("op,args,kwargs,device,expected", MATCHES)
def test_match(op, args, kwargs, device, expected):
    got = match(op, args, kwargs, device)
    assert (None if got is None else (got.deterministic_mode, got.condition)) == expected


def test_match_names_the_alternative_for_transposed_convolution():
    assert match("aten.convolution_backward", (None,) * 7 + (True,), {}, "cuda").alternative == \
        "torchrepro.nn.ConvTranspose2d"


@pytest.mark.parametrize("given", ["aten.index_add_", "aten::index_add_", "aten.index_add_.default", "index_add_",
                                   torch.ops.aten.index_add_.default, torch.ops.aten.index_add_])
def test_normalize_op(given):
    assert normalize_op(given) == "aten.index_add_"


def test_nondeterministic_ops_by_device():
    every = nondeterministic_ops()
    assert {e.device for e in nondeterministic_ops("cpu")} == {"cpu"}
    assert nondeterministic_ops("cuda:0") == nondeterministic_ops("cuda") == [e for e in every if e.device == "cuda"]
    assert len(every) == len(nondeterministic_ops("cpu")) + len(nondeterministic_ops("cuda"))
    with pytest.raises(ValueError, match=r"nondeterministic_ops\(device='tpu'\): expected one of \('cpu', 'cuda'\)"):
        nondeterministic_ops("tpu")


def test_registry_does_not_touch_global_state():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        before = torch.are_deterministic_algorithms_enabled()
        nondeterministic_ops()
        match("aten.put_", (x, i1, v1), {}, "cpu")
        assert torch.are_deterministic_algorithms_enabled() == before


def test_docs_table_lists_every_row():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "policy.md").read_text()
    table = doc.split("### The table")[1]
    for e in nondeterministic_ops():
        assert f"`{e.op.removeprefix('aten.')}`" in table and f"| {e.when} | {e.deterministic_mode} |" in table, e
