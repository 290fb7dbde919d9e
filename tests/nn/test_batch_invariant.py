"""torchrepro.batch_invariant(): CPU matrix products give a row the same bits whatever the number of rows, the
results are PyTorch's up to rounding, gradients flow, and PyTorch's kernels are back after the block."""

from __future__ import annotations

import pytest
import torch

import torchrepro
from torchrepro.nn.invariant import ROW_TILE, active, batch_invariant

WIDTH = 4096  # stock MKL kernels are batch variant at this width for a few rows (see docs/invariance.md)
SMALL_ROWS = (1, 2, 3, 7)


@pytest.fixture(scope="module")
def wide():
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(WIDTH, WIDTH)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(WIDTH, WIDTH, generator=g) / WIDTH**0.5)
    return lin, torch.randn(64, WIDTH, generator=g)


def _rows_differ(f, x: torch.Tensor) -> list[int]:
    """The row counts m for which f(x[:m]) is not bitwise f(x)[:m]."""
    with torch.no_grad():
        full = f(x)
        return [m for m in SMALL_ROWS if not torch.equal(f(x[:m]), full[:m])]


def test_stock_matmul_is_batch_variant_and_the_fix_makes_it_invariant(wide):
    lin, x = wide
    w = lin.weight.t()  # a view of the parameter, as F.linear passes it (not copied by the fix)
    ops = {"matmul (mm)": lambda a: a @ w, "nn.Linear (addmm)": lin}
    stock = {name: _rows_differ(f, x) for name, f in ops.items()}
    assert all(stock.values()), f"stock kernels were expected to be batch variant here: {stock}"
    with batch_invariant():
        fixed = {name: _rows_differ(f, x) for name, f in ops.items()}
    assert fixed == {name: [] for name in ops}


def test_checker_proves_the_fix_on_the_wide_linear(wide):
    lin, x = wide
    before = torchrepro.check_batch_invariance(lin, x, sizes=(2, 3, 7, 64), rows=[0], positions=(0,), locate=False)
    assert before.verdict == "variant" and {2, 3, 7} <= set(before.variant_sizes)
    with torchrepro.batch_invariant():
        after = torchrepro.check_batch_invariance(lin, x, sizes=(2, 3, 7, 64), rows=[5], positions=(0, -1),
                                                  locate=False)
    assert after.invariant and after.under_fix, after.summary()


def test_bmm_and_baddbmm_give_each_matrix_the_same_bits_whatever_the_batch():
    g = torch.Generator().manual_seed(1)
    a, b, c = torch.randn(9, 3, 512, generator=g), torch.randn(9, 512, 384, generator=g), torch.randn(9, 1, 384)
    with batch_invariant():
        full, fulladd = torch.bmm(a, b), torch.baddbmm(c, a, b, alpha=0.5)
        for n in (1, 2, 5):
            assert torch.equal(torch.bmm(a[:n], b[:n]), full[:n])
            assert torch.equal(torch.baddbmm(c[:n], a[:n], b[:n], alpha=0.5), fulladd[:n])
            assert torch.equal(torch.bmm(a[n:n + 1], b[n:n + 1]), full[n:n + 1])  # another position, alone


SHAPES = [(1, 5, 3), (ROW_TILE, 7, 4), (ROW_TILE + 1, 33, 17), (3 * ROW_TILE + 5, 64, 1)]


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_results_are_pytorchs_up_to_rounding(m, k, n, dtype):
    g = torch.Generator().manual_seed(m * 100 + k)
    a, b = torch.randn(m, k, generator=g, dtype=dtype), torch.randn(k, n, generator=g, dtype=dtype)
    bias_row, bias_full = torch.randn(n, generator=g, dtype=dtype), torch.randn(m, n, generator=g, dtype=dtype)
    bt = torch.randn(n, k, generator=g, dtype=dtype).t()  # a column-major view, as a Linear's weight.t()
    a3, b3 = torch.randn(2, m, k, generator=g, dtype=dtype), torch.randn(2, k, n, generator=g, dtype=dtype)
    cases = {
        "mm": lambda: torch.mm(a, b), "mm transposed": lambda: torch.mm(a, bt), "mm of a strided view": lambda:
        torch.mm(a[:, ::1][:, : k - 1], b[: k - 1]),
        "addmm row bias": lambda: torch.addmm(bias_row, a, b, beta=0.5, alpha=2.0),
        "addmm full bias": lambda: torch.addmm(bias_full, a, b),
        "bmm": lambda: torch.bmm(a3, b3), "baddbmm": lambda: torch.baddbmm(torch.ones(2, 1, n, dtype=dtype), a3, b3),
        "matmul 3-D @ 2-D": lambda: a3 @ b, "linear": lambda: torch.nn.functional.linear(a, bt.t(), bias_row),
    }
    stock = {name: f() for name, f in cases.items()}
    with batch_invariant():
        fixed = {name: f() for name, f in cases.items()}
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    for name in cases:
        assert fixed[name].shape == stock[name].shape and fixed[name].dtype == stock[name].dtype, name
        torch.testing.assert_close(fixed[name], stock[name], **tol, msg=name)


def test_gradients_flow_and_match():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 32, generator=g, requires_grad=True)
    lin = torch.nn.Linear(32, 8)
    lin(x).square().sum().backward()
    stock = x.grad.clone(), lin.weight.grad.clone()
    x.grad, lin.weight.grad = None, None
    with batch_invariant():
        lin(x).square().sum().backward()
    torch.testing.assert_close(x.grad, stock[0])
    torch.testing.assert_close(lin.weight.grad, stock[1])


def test_edge_cases_and_errors_are_pytorchs():
    with batch_invariant():
        assert torch.mm(torch.randn(0, 3), torch.randn(3, 4)).shape == (0, 4)
        assert torch.equal(torch.mm(torch.randn(2, 0), torch.randn(0, 4)), torch.zeros(2, 4))
        assert torch.equal(torch.mm(torch.ones(2, 3, dtype=torch.long), torch.ones(3, 2, dtype=torch.long)),
                           torch.full((2, 2), 3))
        with pytest.raises(RuntimeError, match="cannot be multiplied"):
            torch.mm(torch.randn(2, 3), torch.randn(4, 5))


def test_kernels_are_restored_on_exit_nesting_and_errors(wide):
    lin, x = wide
    w = lin.weight.detach().t()
    with torch.no_grad():
        before = x[:1] @ w
        with batch_invariant():
            fixed = x[:1] @ w
            with batch_invariant():  # nested: still in force after the inner block closes
                pass
            assert active() and torch.equal(x[:1] @ w, fixed)
        assert not active()
        assert torch.equal(x[:1] @ w, before) and not torch.equal(before, fixed)
        with pytest.raises(KeyError), batch_invariant():
            raise KeyError("boom")
        assert not active() and torch.equal(x[:1] @ w, before)


def test_decorator_form():
    @torchrepro.batch_invariant()
    def inside() -> bool:
        return active()

    assert inside() is True and not active()
    assert inside.__name__ == "inside"


# --- attention -----------------------------------------------------------------------------------------------
def _decode_attention(rows: int = 8, keys: int = 12):
    """One query per sequence over a cache of ``keys`` keys (a decode step), 4 heads of 64."""
    g = torch.Generator().manual_seed(3)
    return {name: torch.randn(rows, 4, n, 64, generator=g) for name, n in (("q", 1), ("k", keys), ("v", keys))}


def _attention(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def test_cpu_attention_is_batch_variant_when_decoding_and_the_fix_makes_it_invariant():
    torch.set_num_threads(2)  # the kernel splits a lone row's keys between threads (the shared fixture restores)
    batch = _decode_attention()
    result = torchrepro.check_batch_invariance(_attention, batch, sizes=(2, 8), rows=[0, 3], positions=(0,))
    assert result.verdict == "variant", "PyTorch's CPU attention was expected to be batch variant here"
    assert result.first_op is not None and result.first_op.op == "aten._scaled_dot_product_flash_attention_for_cpu"
    with torchrepro.batch_invariant():
        fixed = torchrepro.check_batch_invariance(_attention, batch, sizes=(2, 3, 8), rows=[0, 3], positions=(0, -1))
    assert fixed.invariant, fixed.summary()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_attention_results_and_gradients_are_pytorchs_up_to_rounding(dtype):
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 4, n, 8, generator=g).to(dtype).requires_grad_() for n in (3, 5, 5))
    masks = {"none": {}, "causal": {"is_causal": True}, "scale": {"scale": 0.3},
             "bool mask": {"attn_mask": torch.rand(2, 1, 3, 5, generator=g) > 0.3},
             "float mask": {"attn_mask": torch.randn(1, 1, 3, 5, generator=g).to(dtype)}}
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
    for name, kwargs in masks.items():
        stock = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
        stock_grads = torch.autograd.grad(stock.square().sum(), (q, k, v))
        with batch_invariant():
            fixed = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
            grads = torch.autograd.grad(fixed.square().sum(), (q, k, v))
        assert fixed.dtype == stock.dtype and fixed.stride() == stock.stride(), name
        torch.testing.assert_close(fixed, stock, **tol, msg=name)
        for a, b in zip(grads, stock_grads):
            torch.testing.assert_close(a, b, rtol=tol["rtol"] * 10, atol=tol["atol"] * 10, msg=name)


def test_left_padding_is_left_out_of_the_attention_sums():
    """A prompt of 5 tokens alone (causal) and left-padded to 7 beside a longer one, with the mask transformers
    builds (pad keys hidden; pad queries allowed every key): its real queries get the same bits."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 4, 7, 64, generator=g) for _ in range(3))
    pad = 2
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    mask = causal.expand(2, 1, 7, 7).clone()
    mask[0, :, :, :pad] = False
    mask[0, :, :pad, :] = True  # transformers un-masks the pad queries (no NaN rows)
    with batch_invariant():
        batched = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        alone = torch.nn.functional.scaled_dot_product_attention(q[:1, :, pad:], k[:1, :, pad:], v[:1, :, pad:],
                                                                  is_causal=True)
    assert torch.equal(batched[0, :, pad:], alone[0])
