"""Deterministic ``conv_transpose2d``: PyTorch's transposed convolution under cuDNN's deterministic algorithms, or
built from ordinary convolutions (zero insertion, or one convolution per output phase)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.autograd.function import once_differentiable
from torch.nn.modules.utils import _pair

from ._checks import ArgumentError, UnsupportedOptionError, _scalar


@contextmanager
def cudnn_deterministic(device: torch.device) -> Iterator[None]:
    """cuDNN's deterministic algorithms (and no benchmarking) for the ops inside, on CUDA; restored after."""
    if device.type != "cuda":
        yield
        return
    before = (torch._C._get_cudnn_deterministic(), torch._C._get_cudnn_benchmark())
    torch._C._set_cudnn_deterministic(True)
    torch._C._set_cudnn_benchmark(False)
    try:
        yield
    finally:
        torch._C._set_cudnn_deterministic(before[0])
        torch._C._set_cudnn_benchmark(before[1])


class _Convolution(torch.autograd.Function):
    """``aten.convolution`` whose forward and backward both run with cuDNN's deterministic algorithms."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                args: tuple[Any, ...]) -> torch.Tensor:
        ctx.args, ctx.has_bias = args, b is not None
        ctx.save_for_backward(x, w)
        with cudnn_deterministic(x.device):
            return torch.ops.aten.convolution(x, w, b, *args)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, w = ctx.saved_tensors
        stride, padding, dilation, transposed, output_padding, groups = ctx.args
        bias_sizes = [w.shape[1] * groups] if transposed else [w.shape[0]]
        mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]]
        with cudnn_deterministic(x.device):
            gx, gw, gb = torch.ops.aten.convolution_backward(grad, x, w, bias_sizes, stride, padding, dilation,
                                                             transposed, output_padding, groups, mask)
        return gx, gw, gb, None


def _zero_insertion(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: list[int],
                    padding: list[int], output_padding: list[int], groups: int, dilation: list[int]) -> torch.Tensor:
    """Transposed convolution as: insert stride-1 zeros between inputs, pad, convolve with the flipped kernel."""
    n, c, h, w = x.shape
    up = x.new_zeros(n, c, (h - 1) * stride[0] + 1, (w - 1) * stride[1] + 1)
    up[:, :, :: stride[0], :: stride[1]] = x
    kh, kw = weight.shape[-2:]
    ph, pw = dilation[0] * (kh - 1) - padding[0], dilation[1] * (kw - 1) - padding[1]
    up = torch.nn.functional.pad(up, (pw, pw + output_padding[1], ph, ph + output_padding[0]))
    cin, cout_g = weight.shape[:2]
    flipped = (weight.view(groups, cin // groups, cout_g, kh, kw).transpose(1, 2)
               .reshape(groups * cout_g, cin // groups, kh, kw).flip(-2, -1))
    return _Convolution.apply(up, flipped, bias, ([1, 1], [0, 0], dilation, False, [0, 0], groups))


def _phases(size: int, out: int, stride: int, padding: int, dilation: int,
            kernel: int) -> list[tuple[int, int, int, int, int, int]]:
    """Per output phase r (positions q = o + padding with q % stride == r) along one dimension: the kernel taps
    that reach it (start, step), the input padding (left, right) that makes it a plain dilated correlation, the
    dilation of the sub-kernel, and the first output position it fills."""
    step = stride // math.gcd(stride, dilation)
    found = []
    for r in range(stride):
        taps = [t for t in range(kernel) if (t * dilation) % stride == r]
        first_m = -((r - padding) // stride)  # ceil((padding - r) / stride)
        last_m = (padding + out - 1 - r) // stride
        if not taps or last_m < first_m:
            continue
        offset = (taps[0] * dilation - r) // stride
        sub_dilation = dilation // math.gcd(stride, dilation)
        reach = offset + (len(taps) - 1) * sub_dilation
        found.append((taps[0], step, reach - first_m, last_m - offset - (size - 1), sub_dilation,
                      stride * first_m + r - padding))
    return found


def _output_size(x: torch.Tensor, weight: torch.Tensor, stride: list[int], padding: list[int],
                 output_padding: list[int], dilation: list[int]) -> tuple[int, int]:
    sizes = tuple((x.shape[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (weight.shape[2 + i] - 1)
                  + output_padding[i] + 1 for i in range(2))
    if min(sizes) < 1:
        raise ArgumentError(f"conv_transpose2d: Given input size per channel: ({x.shape[2]} x {x.shape[3]}). "
                            f"Calculated output size per channel: ({sizes[0]} x {sizes[1]}). Output size is too "
                            "small; use less padding or a larger input")
    return sizes[0], sizes[1]


def _subpixel(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: list[int],
              padding: list[int], output_padding: list[int], groups: int, dilation: list[int]) -> torch.Tensor:
    """Transposed convolution as stride**2 ordinary convolutions, one per output phase, interleaved: the sums of
    zero insertion + convolution without the zeros."""
    n, c, h, w = x.shape
    cin, cout_g, kh, kw = weight.shape
    out_h, out_w = _output_size(x, weight, stride, padding, output_padding, dilation)
    kernel = weight.view(groups, cin // groups, cout_g, kh, kw).transpose(1, 2).reshape(groups * cout_g,
                                                                                      cin // groups, kh, kw)
    rows = _phases(h, out_h, stride[0], padding[0], dilation[0], kh)
    cols = _phases(w, out_w, stride[1], padding[1], dilation[1], kw)
    # Pad once, by the most any phase needs; each phase convolves a window (a view) of it.
    top, bottom = max([r[2] for r in rows] + [0]), max([r[3] for r in rows] + [0])
    left, right = max([c[2] for c in cols] + [0]), max([c[3] for c in cols] + [0])
    padded = torch.nn.functional.pad(x, (left, right, top, bottom))
    y = x.new_zeros(n, groups * cout_g, out_h, out_w)
    for th, sh, pad_t, pad_b, dh, oh in rows:
        for tw, sw, pad_l, pad_r, dw, ow in cols:
            window = padded[:, :, top - pad_t: padded.shape[2] - bottom + pad_b,
                            left - pad_l: padded.shape[3] - right + pad_r]
            sub = kernel[:, :, th::sh, tw::sw].flip(-2, -1)
            phase = _Convolution.apply(window, sub, None, ([1, 1], [0, 0], [dh, dw], False, [0, 0], groups))
            y[:, :, oh :: stride[0], ow :: stride[1]] = phase
    return y if bias is None else y + bias.view(1, -1, 1, 1)


_CONSTRUCTIONS = ("native", "zero_insertion", "subpixel")

# PyTorch's checks of a transposed convolution's parameters: name, smallest value it accepts, its message.
_CONV_LIMITS = (
    ("padding", 0, "negative padding is not supported"),
    ("output_padding", 0, "negative output_padding is not supported"),
    ("stride", 1, "non-positive stride is not supported"),
    ("dilation", 1, "dilation should be greater than zero"),
)


def _conv_params(**params: Any) -> dict[str, list[int]]:
    """Each parameter as a list of 2 ints (an int is used for both dims), as PyTorch requires."""
    found = {name: list(_pair(value)) for name, value in params.items()}
    for name, value in found.items():
        if len(value) != 2:
            raise ArgumentError(f"conv_transpose2d: expected {name} to be a single integer value or a list of 2 "
                                f"values to match the convolution dimensions, but got {name}={value}")
    return found


def _conv_checks(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, params: dict[str, list[int]],
                 groups: int) -> None:
    """What PyTorch's convolution checks before computing (the other constructions call it on other shapes)."""
    for name, low, message in _CONV_LIMITS:
        if min(params[name]) < low:
            raise ArgumentError(f"conv_transpose2d: {message}, got {name}={params[name]}")
    if groups <= 0:
        raise ArgumentError(f"conv_transpose2d: non-positive groups is not supported, got groups={groups}")
    if weight.dim() != 4:
        raise ArgumentError(f"conv_transpose2d: expected a 4-D weight (in_channels, out_channels/groups, kH, kW), "
                            f"got shape {list(weight.shape)}")
    if any(op >= s and op >= d for op, s, d in zip(params["output_padding"], params["stride"], params["dilation"])):
        raise ArgumentError(f"conv_transpose2d: output padding must be smaller than either stride or dilation, but "
                            f"got output_padding={params['output_padding']}, stride={params['stride']}, "
                            f"dilation={params['dilation']}")
    given = f"conv_transpose2d: Given transposed=1, weight of size {list(weight.shape)}"
    if weight.shape[0] % groups:
        raise ArgumentError(f"conv_transpose2d: Given groups={groups}, expected weight to be divisible by {groups} "
                            f"at dimension 0, but got weight of size {list(weight.shape)} instead")
    if x.shape[1] != weight.shape[0]:
        raise ArgumentError(f"{given}, expected input{list(x.shape)} to have {weight.shape[0]} channels, but got "
                            f"{x.shape[1]} channels instead")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[1] * groups):
        raise ArgumentError(f"{given}, expected bias to be 1-dimensional with {weight.shape[1] * groups} elements, "
                            f"but got bias of size {list(bias.shape)} instead")
    for other in (weight, bias):
        if other is not None and other.dtype != x.dtype:
            raise ArgumentError(f"conv_transpose2d: expected scalar type {_scalar(x)} but found {_scalar(other)}")


def conv_transpose2d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                     stride: Any = 1, padding: Any = 0, output_padding: Any = 0, groups: int = 1,
                     dilation: Any = 1, *, construction: str = "native") -> torch.Tensor:
    """Deterministic ``torch.nn.functional.conv_transpose2d`` (same arguments, same weight layout).

    ``construction="native"`` runs PyTorch's transposed convolution, forward and backward, with cuDNN's
    deterministic algorithms selected for this op only; ``"zero_insertion"`` is zero insertion + padding + an
    ordinary convolution with the flipped kernel (about stride**2 times the work); ``"subpixel"`` computes the
    same products without the zeros: one small ordinary convolution per output phase, interleaved. All three run
    their convolutions in the same deterministic cuDNN scope.

    >>> conv_transpose2d(torch.ones(1, 1, 2, 2), torch.ones(1, 1, 2, 2), stride=2).shape
    torch.Size([1, 1, 4, 4])
    """
    if construction not in _CONSTRUCTIONS:
        raise UnsupportedOptionError(f"conv_transpose2d: construction={construction!r}; expected one of "
                                     f"{', '.join(_CONSTRUCTIONS)}")
    if input.dim() not in (3, 4):
        raise ArgumentError(f"conv_transpose2d: Expected 3D (unbatched) or 4D (batched) input to conv_transpose2d, "
                            f"but got input of size: {list(input.shape)}")
    if input.dim() == 3:  # unbatched (C, H, W), as PyTorch accepts
        return conv_transpose2d(input.unsqueeze(0), weight, bias, stride, padding, output_padding, groups, dilation,
                                construction=construction).squeeze(0)
    params = _conv_params(stride=stride, padding=padding, output_padding=output_padding, dilation=dilation)
    if construction != "native":  # PyTorch's convolution checks the native construction's arguments itself
        _conv_checks(input, weight, bias, params, groups)
        _output_size(input, weight, **params)
    return _CONSTRUCTION_OF[construction](input, weight, bias, groups=groups, **params)


def _native(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: list[int],
            padding: list[int], output_padding: list[int], groups: int, dilation: list[int]) -> torch.Tensor:
    return _Convolution.apply(x, weight, bias, (stride, padding, dilation, True, output_padding, groups))


_CONSTRUCTION_OF = {"native": _native, "zero_insertion": _zero_insertion, "subpixel": _subpixel}
