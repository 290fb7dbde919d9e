"""The one table of default tolerances by dtype (torch.testing.assert_close's defaults), and the named presets of
``assert_deterministic`` built from it.

Example:
    >>> import torch
    >>> BY_DTYPE[torch.float32], PRESETS["fp32"]["rtol"] == BY_DTYPE[torch.float32][0]
    ((1.3e-06, 1e-05), True)
"""

from __future__ import annotations

import types
from collections.abc import Mapping

import torch

# (rtol, atol) by dtype: torch.testing.assert_close's defaults.
BY_DTYPE: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}
EXACT = (0.0, 0.0)  # integers, booleans: equal or not

# Presets for assert_deterministic(..., **PRESETS[name]). Run-to-run differences under autocast are a few units in
# the last place of the low-precision format: the presets allow about two (fp16: 2 * 2**-10, bf16: 2 * 2**-7,
# rounded up; bf16: assert_close's own), plus float32's absolute tolerance for values near zero.
_ATOL = BY_DTYPE[torch.float32][1]


def _preset(rtol: float, atol: float) -> Mapping[str, float]:
    return types.MappingProxyType({"atol": atol, "rtol": rtol})


PRESETS: Mapping[str, Mapping[str, float]] = types.MappingProxyType({
    "bitwise": _preset(*EXACT),
    "fp32": _preset(*BY_DTYPE[torch.float32]),
    "fp16-autocast": _preset(2e-3, _ATOL),
    "bf16-autocast": _preset(BY_DTYPE[torch.bfloat16][0], _ATOL),
})
