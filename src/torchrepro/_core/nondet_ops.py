"""The facts about nondeterministic ATen ops, as plain data (layer L0, standard library only).

The single source of truth behind :mod:`torchrepro.control.registry` (which matches ATen calls against these rows
at run time, with torch) and the linter's TR203 (which matches Python source against the same rows, without
torch). Each :class:`Row` says which ATen ops, on which device kind, under which condition (an :class:`Arg`: data
that each side interprets), what ``torch.use_deterministic_algorithms(True)`` does, a deterministic alternative,
where the claim was verified and where it comes from, and the Python spellings (:class:`Spelling`) that reach the
ops, with the argument conditions that make them do so.

Example:
    >>> row = next(r for r in rows_for("cuda") if "aten.index_copy_" in r.ops)
    >>> row.effect, [s.name for s in row.spellings]
    ('switches kernel', ['Tensor.index_copy_', 'Tensor.index_copy', 'torch.index_copy'])
    >>> CONDITIONS["no_accumulate"].describe()
    'accumulate=False'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEVICE_KINDS = ("cpu", "cuda")
SWITCHES, RAISES, WARNS, NOTHING = "switches kernel", "raises", "warns", "nothing"
EFFECTS = (SWITCHES, RAISES, WARNS, NOTHING)  # what use_deterministic_algorithms(True) does about a row

CPU_VERIFIED = "cpu, torch 2.13.0, tests/control/test_registry.py"
CUDA_UNVERIFIED = "not verified (needs a GPU: tools/verify_cuda_registry.py)"

# --- conditions -------------------------------------------------------------------------------------------------
# Tests an argument can pass. The first six have a meaning in Python source too (the linter judges literals);
# the last three need the real call (dtypes, sparsity, the process environment).
TRUE, FALSE, GIVEN, IN, NOT_IN, TENSOR = "true", "false", "given", "in", "not in", "tensor"
FLOAT_OR_COMPLEX, ANY_SPARSE, ENV_UNSET = "float or complex", "any sparse", "env unset"
TESTS = (TRUE, FALSE, GIVEN, IN, NOT_IN, TENSOR, FLOAT_OR_COMPLEX, ANY_SPARSE, ENV_UNSET)
STATIC_TESTS = frozenset({TRUE, FALSE, GIVEN, IN, NOT_IN, TENSOR})

_DESCRIBE = {  # test -> how a condition reads in a message
    TRUE: "{name}=True", FALSE: "{name}=False", GIVEN: "{name}", IN: "{name}={values}", NOT_IN: "{name} not {values}",
    TENSOR: "{name} tensor", FLOAT_OR_COMPLEX: "floating-point or complex {name}", ANY_SPARSE: "a sparse input",
    ENV_UNSET: "{name} unset",
}


@dataclass(frozen=True)
class Arg:
    """A condition on one argument of a call, as data: the argument ``name`` passes ``test`` (with ``values``).

    ``position`` is where the argument sits in a Python call (a Tensor method's first argument after ``self`` is
    0); ATen conditions leave it None, the op's schema knows. ``default`` is the value of an absent argument.

    >>> Arg("mode", IN, ("replicate",), position=2).describe()
    "mode='replicate'"
    """

    name: str | None
    test: str
    values: tuple[object, ...] = ()
    position: int | None = None
    default: object = None

    def describe(self, values: tuple[object, ...] | None = None) -> str:
        """How the condition reads, e.g. ``accumulate=False``; ``values`` overrides the listed values."""
        shown = "/".join(repr(v) for v in (self.values if values is None else values))
        return _DESCRIBE[self.test].format(name=self.name, values=shown)

    def shifted(self, by: int) -> Arg:
        """The same condition with the argument ``by`` positions later (``torch.f(x, ...)`` for ``x.f(...)``)."""
        return Arg(self.name, self.test, self.values, None if self.position is None else self.position + by,
                   self.default)


# ATen-level conditions by name (OpEntry.condition). Missing arguments take the schema default given here.
CONDITIONS: dict[str, Arg] = {
    "accumulate": Arg("accumulate", TRUE, default=False),
    "no_accumulate": Arg("accumulate", FALSE, default=False),
    "weights": Arg("weights", GIVEN),
    "src_tensor": Arg("src", TENSOR),
    "reduce_sum_mean": Arg("reduce", IN, ("sum", "mean")),
    "reduce_prod": Arg("reduce", IN, ("prod",)),
    "transposed": Arg("transposed", TRUE, default=False),
    "not_transposed": Arg("transposed", FALSE, default=False),
    "with_indices": Arg("dim", GIVEN),  # median(x, dim) returns indices
    "mode_max": Arg("mode", IN, (2,)),  # EmbeddingBag mode codes: sum 0, mean 1, max 2
    "reduced": Arg("reduction", NOT_IN, (0,), default=1),  # reduction codes: none 0, mean 1, sum 2
    "float_or_complex": Arg("self", FLOAT_OR_COMPLEX),  # or the dtype= argument when given
    "sparse_input": Arg(None, ANY_SPARSE),
    "cublas_workspace_unset": Arg("CUBLAS_WORKSPACE_CONFIG", ENV_UNSET),  # unset or not a :SIZE:COUNT value
}


# --- Python spellings -------------------------------------------------------------------------------------------
_SHORT = (("torch.nn.functional.", "F."), ("torch.nn.", "nn."))


@dataclass(frozen=True)
class Spelling:
    """A Python-level way to reach a row's op: ``name`` called with arguments that pass ``when``.

    ``name`` is ``Tensor.<method>`` (any receiver) or a qualified name (``torch.index_put``,
    ``torch.nn.functional.pad``, ``torch.nn.LSTM``). ``not_linted`` says why TR203 does not flag it ("": it does).

    >>> Spelling("torch.nn.functional.pad").label
    'F.pad'
    """

    name: str
    when: Arg | None = None
    not_linted: str = ""

    @property
    def label(self) -> str:
        for long, short in _SHORT:
            if self.name.startswith(long):
                return short + self.name[len(long):]
        return self.name


def _calls(name: str, when: Arg | None = None, *, inplace: bool = True, method: bool = True,
           function: bool = True, not_linted: str = "") -> tuple[Spelling, ...]:
    """``Tensor.name_``, ``Tensor.name`` and ``torch.name`` (whose ``when`` is one position later: the tensor)."""
    out = []
    if inplace:
        out.append(Spelling(f"Tensor.{name}_", when, not_linted))
    if method:
        out.append(Spelling(f"Tensor.{name}", when, not_linted))
    if function:
        out.append(Spelling(f"torch.{name}", when.shifted(1) if when else None, not_linted))
    return tuple(out)


def _nn(*names: str, when: Arg | None = None, not_linted: str = "") -> tuple[Spelling, ...]:
    return tuple(Spelling(f"torch.nn.{n}", when, not_linted) for n in names)


def _fn(*names: str, when: Arg | None = None, not_linted: str = "") -> tuple[Spelling, ...]:
    return tuple(Spelling(f"torch.nn.functional.{n}", when, not_linted) for n in names)


# Why some spellings are not linted (precision: flagging them would mostly flag deterministic code).
_VIA_BACKWARD = ("reached only through the backward of a common indexing op whose forward is deterministic "
                 "(and only when its input requires grad)")
_SETITEM = ("x[idx] = v: boolean masks and unique indices, the common case, are deterministic, and the indices "
            "are not visible in source")
_SPARSE = "sparsity is not visible in source, and dense bmm is deterministic"
_SHAPE = "only (N, C, H, W) inputs reach it; shapes are not visible in source, and (N, C) inputs are deterministic"
_DTYPE = "the dtype is not visible in source, and cumulative sums of integer masks (positions) are deterministic"

# --- the rows ---------------------------------------------------------------------------------------------------
DOCS = "torch.use_deterministic_algorithms documentation"
ATEN = "ATen source: the CUDA kernel calls alertNotDeterministic"
RNN_DOCS = "torch.nn.RNN/LSTM/GRU documentation (cuDNN RNN determinism note); ATen cudnn/RNN.cpp has no alert"
OBSERVED = "observed by tests/control/test_registry.py"

_ATOMIC = "accumulates with atomic adds whose order changes from run to run"
_WRITES = "writes duplicate indices in an order that changes from run to run (which write wins)"
_CONV = "cuDNN may pick a convolution algorithm whose results differ from run to run"
_TIES = "picks which of equal values' index to return in an order that changes from run to run"
_RNN = ("cuDNN's RNN kernels can differ from run to run on some cuDNN/CUDA versions unless CUBLAS_WORKSPACE_CONFIG "
        "fixes cuBLAS's workspace")
_SCAN = "adds in an order that changes from run to run"
_THREADS_ADD = "adds up duplicate indices in an order that changes from run to run"


@dataclass(frozen=True)
class Row:
    """One fact: ATen ``ops`` that can be nondeterministic on one ``device`` kind, and everything known about them.

    ``when`` is the human text (``condition``, a key of :data:`CONDITIONS`, is its machine form; None: always);
    ``effect`` is what deterministic mode does (one of :data:`EFFECTS`). ``cause`` and ``backward`` say what
    varies, for lint messages; ``cudnn`` marks rows that ``torch.backends.cudnn.deterministic = True`` fixes too;
    ``cudnn_only`` marks ops that dispatch only in a CUDA build with cuDNN (a CPU run never calls them).
    """

    ops: tuple[str, ...]
    device: str
    when: str
    effect: str
    alternative: str = ""
    condition: str | None = None
    verified_on: str = ""
    source: str = DOCS
    cause: str = _ATOMIC
    backward: bool = False
    cudnn: bool = False
    cudnn_only: bool = False
    spellings: tuple[Spelling, ...] = ()


def _cpu(ops: tuple[str, ...], when: str, effect: str, alternative: str = "", condition: str | None = None,
         **more: Any) -> Row:
    return Row(ops, "cpu", when, effect, alternative, condition, CPU_VERIFIED, OBSERVED, **more)


def _cuda(ops: tuple[str, ...], when: str, effect: str, alternative: str = "", condition: str | None = None,
          **more: Any) -> Row:
    return Row(ops, "cuda", when, effect, alternative, condition, CUDA_UNVERIFIED, **more)


_F = "torchrepro.nn.functional."
_DUP = "with duplicate indices"
_VARIES = "varies run to run with 2+ threads"  # tests/control/test_registry.py checks this phrase against observation
_NEAREST = "F.interpolate(mode='nearest') (deterministic backward), or upsample outside the differentiated path"
_INDEX_PUT = ("aten.index_put_", "aten.index_put", "aten._index_put_impl_")
_ACC = Arg("accumulate", TRUE, position=2, default=False)  # Tensor.index_put_(indices, values, accumulate)
_NO_ACC = Arg("accumulate", FALSE, position=2, default=False)
_LINEAR_MODES = ("linear", "bilinear", "bicubic", "trilinear")
_CONV_PLAIN = (*_nn("Conv1d", "Conv2d", "Conv3d", "LazyConv1d", "LazyConv2d", "LazyConv3d"),
               *_fn("conv1d", "conv2d", "conv3d"))
_CONV_TRANSPOSED = (*_nn("ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d", "LazyConvTranspose1d",
                         "LazyConvTranspose2d", "LazyConvTranspose3d"),
                    *_fn("conv_transpose1d", "conv_transpose2d", "conv_transpose3d"))
_CUBLAS_FIX = "CUBLAS_WORKSPACE_CONFIG=:4096:8 (or :16:8) set before CUDA starts, e.g. by torchrepro.deterministic()"

ROWS: tuple[Row, ...] = (
    # ---- CPU (observed by tests/control/test_registry.py on every run) ----
    _cpu(_INDEX_PUT, f"accumulate=True {_DUP} (also the backward of x[idx] with tensor indices); {_VARIES}",
         SWITCHES, _F + "index_put", "accumulate", cause=_THREADS_ADD,
         spellings=(*_calls("index_put", _ACC), Spelling("Tensor.__getitem__", None, _VIA_BACKWARD))),
    _cpu(_INDEX_PUT, f"accumulate=False {_DUP} (which write wins); {_VARIES}", SWITCHES,
         "unique indices, or " + _F + "index_put", "no_accumulate", cause=_WRITES,
         spellings=(*_calls("index_put", _NO_ACC), Spelling("Tensor.__setitem__", None, _SETITEM))),
    _cpu(("aten.put_", "aten.put"), f"accumulate=True {_DUP} (also the backward of torch.take); {_VARIES}",
         SWITCHES, _F + "index_put (on x.view(-1))", "accumulate", cause=_THREADS_ADD,
         spellings=_calls("put", _ACC)),
    _cpu(("aten.put_", "aten.put"), f"accumulate=False {_DUP} (which write wins); {_VARIES}", RAISES,
         "unique indices, or x.view(-1).index_put_((idx,), v) under deterministic mode", "no_accumulate",
         cause=_WRITES, spellings=_calls("put", _NO_ACC)),
    _cpu(("aten.index_copy_", "aten.index_copy"), f"{_DUP} (which write wins); {_VARIES}", SWITCHES,
         "unique indices", cause=_WRITES, spellings=_calls("index_copy")),
    _cpu(("aten.max_unpool2d", "aten.max_unpool3d"), f"{_DUP} (overlapping pooling windows)", RAISES,
         "non-overlapping pooling (stride >= kernel_size)", cause=_WRITES,
         spellings=(*_nn("MaxUnpool1d", "MaxUnpool2d", "MaxUnpool3d"),
                    *_fn("max_unpool1d", "max_unpool2d", "max_unpool3d"))),
    # ---- CUDA: switches kernel under deterministic mode ----
    _cuda(("aten.index_add_", "aten.index_add"), f"{_DUP} (atomicAdd; also the backward of index_select)",
          SWITCHES, _F + "index_add",
          spellings=(*_calls("index_add"), *_calls("index_select", inplace=False, not_linted=_VIA_BACKWARD),
                     Spelling("torch.repeat_interleave", None, _VIA_BACKWARD))),
    _cuda(("aten.scatter_add_", "aten.scatter_add"), f"{_DUP} (atomicAdd; also the backward of gather)",
          SWITCHES, _F + "scatter_add",
          spellings=(*_calls("scatter_add"), *_calls("gather", inplace=False, not_linted=_VIA_BACKWARD))),
    _cuda(("aten.scatter_reduce_", "aten.scatter_reduce"), f"reduce='sum' or 'mean' {_DUP}",
          SWITCHES, _F + "scatter_add (for 'mean', divide by the counts)", "reduce_sum_mean",
          spellings=_calls("scatter_reduce", Arg("reduce", IN, ("sum", "mean"), position=3))),
    _cuda(("aten.scatter_", "aten.scatter"), f"src is a tensor, {_DUP} (which write wins)",
          SWITCHES, "unique indices", "src_tensor", cause=_WRITES,
          spellings=_calls("scatter", Arg("src", TENSOR, position=2))),
    _cuda(_INDEX_PUT, f"accumulate=False {_DUP} (which write wins)", SWITCHES, "unique indices", "no_accumulate",
          cause=_WRITES, spellings=(*_calls("index_put", _NO_ACC), Spelling("Tensor.__setitem__", None, _SETITEM))),
    _cuda(("aten.index_copy_", "aten.index_copy"), _DUP, SWITCHES, "unique indices", cause=_WRITES,
          spellings=_calls("index_copy")),
    _cuda(("aten.convolution_backward",), "backward of ConvTranspose1d/2d/3d (cuDNN algorithm choice)",
          SWITCHES, "torchrepro.nn.ConvTranspose2d", "transposed", cause=_CONV, cudnn=True,
          spellings=_CONV_TRANSPOSED),
    _cuda(("aten.convolution_backward",), "backward of Conv1d/2d/3d (cuDNN algorithm choice)",
          SWITCHES, "", "not_transposed", cause=_CONV, cudnn=True,
          spellings=_CONV_PLAIN),
    _cuda(("aten.convolution",), "cuDNN algorithm choice (benchmark mode may pick a different one per run)",
          SWITCHES, "", cause=_CONV, cudnn=True,
          spellings=_CONV_PLAIN + _CONV_TRANSPOSED),
    _cuda(("aten.replication_pad1d_backward", "aten.replication_pad2d_backward", "aten.replication_pad3d_backward"),
          "backward only", SWITCHES, "", backward=True,
          spellings=(*_nn("ReplicationPad1d", "ReplicationPad2d", "ReplicationPad3d"),
                     *_fn("pad", when=Arg("mode", IN, ("replicate",), position=2)))),
    _cuda(("aten.max_pool3d_with_indices_backward",), "backward only", SWITCHES, "", backward=True,
          spellings=(*_nn("MaxPool3d"), *_fn("max_pool3d", "max_pool3d_with_indices"))),
    _cuda(("aten.bmm",), "sparse-dense inputs", SWITCHES, "", "sparse_input",
          spellings=_calls("bmm", inplace=False, not_linted=_SPARSE)),
    # ---- CUDA: raises under deterministic mode ----
    _cuda(("aten.put_", "aten.put"), "accumulate=True (atomicAdd)", RAISES,
          _F + "index_put (on x.view(-1))", "accumulate",
          spellings=(*_calls("put", _ACC), Spelling("torch.take", None, _VIA_BACKWARD))),
    _cuda(("aten.put_", "aten.put"), f"accumulate=False {_DUP}", RAISES, "unique indices", "no_accumulate",
          cause=_WRITES, spellings=_calls("put", _NO_ACC)),
    _cuda(("aten.upsample_linear1d_backward", "aten.upsample_bilinear2d_backward",
           "aten.upsample_bicubic2d_backward", "aten.upsample_trilinear3d_backward"),
          "backward only (F.interpolate linear/bilinear/bicubic/trilinear)", RAISES, _NEAREST, backward=True,
          spellings=(*_fn("interpolate", "upsample", when=Arg("mode", IN, _LINEAR_MODES, position=3)),
                     *_nn("Upsample", when=Arg("mode", IN, _LINEAR_MODES, position=2)),
                     *_fn("upsample_bilinear"), *_nn("UpsamplingBilinear2d"))),
    _cuda(("aten.grid_sampler_2d_backward", "aten.grid_sampler_3d_backward"), "backward only", RAISES, "",
          backward=True, spellings=_fn("grid_sample")),
    _cuda(("aten._embedding_bag_backward",), "backward of EmbeddingBag with mode='max'", RAISES,
          "EmbeddingBag mode='sum' (torchrepro.nn.EmbeddingBag)", "mode_max", backward=True,
          spellings=(*_fn("embedding_bag", when=Arg("mode", IN, ("max",), position=6)),
                     *_nn("EmbeddingBag", when=Arg("mode", IN, ("max",), position=5)))),
    _cuda(("aten.bincount",), "with weights (atomicAdd)", RAISES, _F + "bincount", "weights",
          spellings=_calls("bincount", Arg("weights", GIVEN, position=0), inplace=False)),
    _cuda(("aten.histc",), "always (atomicAdd)", RAISES, _F + "histc", spellings=_calls("histc", inplace=False)),
    _cuda(("aten._ctc_loss_backward",), "backward only", RAISES, "", backward=True,
          spellings=(*_fn("ctc_loss"), *_nn("CTCLoss"))),
    _cuda(("aten._adaptive_avg_pool2d_backward", "aten._adaptive_avg_pool3d_backward"), "backward only",
          RAISES, "AvgPool with a fixed kernel (input size divisible by output size)", backward=True,
          spellings=(*_nn("AdaptiveAvgPool2d", "AdaptiveAvgPool3d"),
                     *_fn("adaptive_avg_pool2d", "adaptive_avg_pool3d"))),
    _cuda(("aten.adaptive_max_pool2d_backward",), "backward only", RAISES, "", backward=True,
          spellings=(*_nn("AdaptiveMaxPool2d"), *_fn("adaptive_max_pool2d"))),
    _cuda(("aten.avg_pool3d_backward",), "backward only", RAISES, "", backward=True,
          spellings=(*_nn("AvgPool3d"), *_fn("avg_pool3d"))),
    _cuda(("aten.fractional_max_pool2d_backward", "aten.fractional_max_pool3d_backward"), "backward only",
          RAISES, "", backward=True,
          spellings=(*_nn("FractionalMaxPool2d", "FractionalMaxPool3d"),
                     *_fn("fractional_max_pool2d", "fractional_max_pool3d"))),
    _cuda(("aten.reflection_pad1d_backward", "aten.reflection_pad2d_backward", "aten.reflection_pad3d_backward"),
          "backward only", RAISES, "replicate padding (switches to a deterministic kernel)", backward=True,
          spellings=(*_nn("ReflectionPad1d", "ReflectionPad2d", "ReflectionPad3d"),
                     *_fn("pad", when=Arg("mode", IN, ("reflect",), position=2)))),
    _cuda(("aten.nll_loss2d_forward",),
          "NLLLoss/CrossEntropyLoss on (N, C, H, W) input with reduction 'mean' or 'sum' (atomicAdd)", RAISES,
          "reduction='none', then .mean() or .sum()", "reduced",
          spellings=(*_nn("NLLLoss", "CrossEntropyLoss", not_linted=_SHAPE),
                     *_fn("nll_loss", "cross_entropy", not_linted=_SHAPE))),
    _cuda(("aten.median", "aten.nanmedian"), "with a dim (indices output): which duplicate's index", RAISES,
          "", "with_indices", cause=_TIES,
          spellings=(*_calls("median", Arg("dim", GIVEN, position=0), inplace=False),
                     *_calls("nanmedian", Arg("dim", GIVEN, position=0), inplace=False))),
    _cuda(("aten.kthvalue",), "which duplicate's index is returned", RAISES, "", source=ATEN, cause=_TIES,
          spellings=_calls("kthvalue", inplace=False)),
    _cuda(("aten.cumsum", "aten.cumsum_"), "floating point or complex dtype", RAISES, "", "float_or_complex",
          cause=_SCAN, spellings=_calls("cumsum", not_linted=_DTYPE)),
    _cuda(("aten.scatter_reduce_", "aten.scatter_reduce"), f"reduce='prod' {_DUP}", RAISES, "",
          "reduce_prod", spellings=_calls("scatter_reduce", Arg("reduce", IN, ("prod",), position=3))),
    _cuda(("aten.max_unpool2d", "aten.max_unpool3d"), f"{_DUP} (overlapping pooling windows)", RAISES,
          "non-overlapping pooling (stride >= kernel_size)", cause=_WRITES,
          spellings=(*_nn("MaxUnpool1d", "MaxUnpool2d", "MaxUnpool3d"),
                     *_fn("max_unpool1d", "max_unpool2d", "max_unpool3d"))),
    _cuda(("aten.index_reduce_", "aten.index_reduce"), "always (atomic reductions, any reduce)", RAISES,
          "scatter_reduce with reduce='amax'/'amin' (deterministic), or " + _F + "scatter_add for sums",
          source=ATEN, cause="reduces with atomic operations whose order changes from run to run",
          spellings=_calls("index_reduce")),
    # ---- CUDA: deterministic mode does nothing ----
    _cuda(("aten._cudnn_rnn", "aten._cudnn_rnn_backward"),
          "cuDNN RNN (nn.RNN/LSTM/GRU): on some cuDNN/CUDA versions, while CUBLAS_WORKSPACE_CONFIG is unset",
          NOTHING, _CUBLAS_FIX, "cublas_workspace_unset", source=RNN_DOCS, cause=_RNN, cudnn_only=True,
          spellings=_nn("RNN", "LSTM", "GRU")),
)


def rows_for(device: str) -> tuple[Row, ...]:
    """The rows of one device kind (``"cpu"`` or ``"cuda"``).

    >>> {r.device for r in rows_for("cpu")}
    {'cpu'}
    """
    return tuple(r for r in ROWS if r.device == device)
