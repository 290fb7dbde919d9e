"""Drop-in modules: same constructors, parameters and ``state_dict`` keys as their ``torch.nn`` namesakes.

>>> import torch
>>> from torchrepro.nn import ConvTranspose2d
>>> layer = ConvTranspose2d(4, 2, 3, stride=2)
>>> layer.load_state_dict(torch.nn.ConvTranspose2d(4, 2, 3, stride=2).state_dict())
<All keys matched successfully>
"""

from __future__ import annotations

from typing import Any

import torch

from . import functional as F
from ._convtranspose import _CONSTRUCTIONS

__all__ = ["ConvTranspose2d", "EmbeddingBag"]


class ConvTranspose2d(torch.nn.ConvTranspose2d):
    """``torch.nn.ConvTranspose2d`` whose forward and backward are deterministic (see ``F.conv_transpose2d``).

    One keyword beyond PyTorch's: ``construction`` ("native", "subpixel" or "zero_insertion").
    """

    def __init__(self, *args: Any, construction: str = "native", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if construction not in _CONSTRUCTIONS:
            raise F.UnsupportedOptionError(f"ConvTranspose2d: construction={construction!r}; expected one of "
                                           f"{', '.join(_CONSTRUCTIONS)}")
        if self.padding_mode != "zeros":
            raise F.UnsupportedOptionError(f"ConvTranspose2d: padding_mode={self.padding_mode!r}; only 'zeros' "
                                           "exists for transposed convolutions")
        self.construction = construction

    def forward(self, input: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        output_padding = self._output_padding(input, output_size, list(self.stride), list(self.padding),  # type: ignore[arg-type]
                                              list(self.kernel_size), 2, list(self.dilation))
        return F.conv_transpose2d(input, self.weight, self.bias, self.stride, self.padding, output_padding,
                                  self.groups, self.dilation, construction=self.construction)


_UNSUPPORTED = (  # attribute, value PyTorch's default has, what to do instead
    ("max_norm", None, "renormalise the weight yourself under torch.no_grad()"),
    ("scale_grad_by_freq", False, "scale the gradient after backward"),
    ("sparse", False, "use dense gradients"),
    ("padding_idx", None, "mask those lookups with per_sample_weights of 0"),
    ("include_last_offset", False, "drop the last offset"),
)


class EmbeddingBag(torch.nn.EmbeddingBag):
    """``torch.nn.EmbeddingBag`` (modes "sum" and "mean") whose weight gradient is summed in index order.

    >>> bag = EmbeddingBag(10, 3, mode="sum")
    >>> bag(torch.tensor([[1, 2], [3, 3]])).shape
    torch.Size([2, 3])
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, default, instead in _UNSUPPORTED:
            if getattr(self, name) != default:
                raise F.UnsupportedOptionError(f"EmbeddingBag: {name}={getattr(self, name)!r} is not provided by "
                                               f"the deterministic version; {instead}")
        if self.mode not in ("sum", "mean"):
            raise F.UnsupportedOptionError(f"EmbeddingBag: mode={self.mode!r}; use 'sum' or 'mean'")

    def forward(self, input: torch.Tensor, offsets: torch.Tensor | None = None,
                per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        return F.embedding_bag(input, self.weight, offsets, self.mode, per_sample_weights)
