"""check_batch_invariance on stock CPU ops: a wide Linear is batch variant (located at its addmm), LayerNorm /
softmax / elementwise models are invariant, BatchNorm in training mode mixes rows by design, run-to-run noise is told
apart, a tiny GPT-2 built from a config is variant at its first projection and invariant under the fix, and bad
inputs are refused with what was received."""

from __future__ import annotations

import pytest
import torch

import torchrepro
from torchrepro import BatchInvarianceError, check_batch_invariance

from .tinylm import PROMPTS, tiny_gpt2, word_tokenizer

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(autouse=True)
def _one_thread():
    """Many small ops: one thread keeps them fast on a busy machine (the shared fixture puts the count back).
    The kernels are batch variant at one thread as at two."""
    torch.set_num_threads(1)


def _rows(n: int, *shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, *shape, generator=torch.Generator().manual_seed(seed))


# --- a wide Linear: variant, located, fixed --------------------------------------------------------------------
@pytest.fixture(scope="module")
def wide():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.LayerNorm(4096), torch.nn.Linear(4096, 4096)), _rows(64, 4096)


def test_wide_linear_is_variant_and_located_at_its_addmm(wide):
    model, x = wide
    result = check_batch_invariance(model, x, sizes=(2, 3, 7, 64), rows=[0], positions=(0,))
    assert result.verdict == "variant" and not result.invariant and not result.row_mixing
    assert {2, 3, 7} <= set(result.variant_sizes)
    op = result.first_op
    assert op is not None and op.op == "aten.addmm" and op.kind == "kernel" and op.inputs_equal is True
    assert op.module == "1"  # the Linear, not the LayerNorm before it (invariant)
    assert op.file and op.file.endswith("test_invariance.py") and op.line  # the user's line that called the model
    assert {2, 3, 7} <= set(op.varies_at) and op.max_abs and op.max_abs > 0
    text = result.summary()
    assert "VARIANT" in text and "First batch-variant op: aten.addmm in `1`" in text
    assert "torchrepro.batch_invariant()" in result.fix()
    doc = result.to_json()
    assert doc["schema"] == "torchrepro.invariance/1" and doc["first_op"]["op"] == "aten.addmm"
    assert [s["size"] for s in doc["by_size"]] == [2, 3, 7, 64]


def test_the_row_is_traced_at_its_position_in_the_batch(wide):
    """The row slices compared op by op are the row's own: at the last position of a batch of 7, the addmm's row
    input is bitwise the row's input alone (any other slice would differ)."""
    model, x = wide
    result = check_batch_invariance(model, x, sizes=(7,), rows=[3], positions=(-1,))
    op = result.first_op
    assert op is not None and op.op == "aten.addmm" and op.inputs_equal is True and op.varies_at == [7]


def test_wide_linear_is_invariant_under_the_fix(wide):
    model, x = wide
    with torchrepro.batch_invariant():
        result = check_batch_invariance(model, x, sizes=(2, 3, 7, 64), rows=[0], positions=(0, -1))
    assert result.invariant and result.first_op is None and result.fix() is None, result.summary()
    assert "inside torchrepro.batch_invariant()" in result.summary()


# --- invariant, row-mixing, noisy --------------------------------------------------------------------------------
def test_layernorm_softmax_elementwise_model_is_invariant():
    model = torch.nn.Sequential(torch.nn.LayerNorm(256), torch.nn.GELU(), torch.nn.Softmax(dim=-1))
    result = check_batch_invariance(model, _rows(6, 256), sizes=(2, 3, 8, 33))
    assert result.invariant and result.verdict == "invariant"
    assert {c.status for c in result.comparisons} == {"invariant"} and len(result.comparisons) == 6 * 4 * 2
    assert "INVARIANT" in str(result)


def test_batchnorm_in_training_mode_is_reported_as_row_mixing_by_design():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv1d(4, 4, 3), torch.nn.BatchNorm1d(4), torch.nn.ReLU()).train()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    result = check_batch_invariance(model, _rows(6, 4, 10), sizes=(2, 4))
    assert result.verdict == "row-mixing" and result.row_mixing
    mixer = result.mixing_op or result.first_op
    assert mixer is not None and mixer.kind == "row-mixing" and mixer.op == "aten.native_batch_norm"
    assert mixer.module == "1"
    assert "not a kernel" in result.fix() and "model.eval()" in result.fix()
    assert "First op that mixes rows: aten.native_batch_norm" in result.summary()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())  # running stats put back
    model.eval()  # the same model for inference: no row mixing left
    assert not check_batch_invariance(model, _rows(6, 4, 10), sizes=(2, 4), locate=False).row_mixing


def test_a_model_that_refuses_one_row_but_mixes_rows_is_row_mixing():
    model = torch.nn.BatchNorm1d(8).train()  # raises on a batch of one row in training mode
    result = check_batch_invariance(model, _rows(4, 8), sizes=(2, 4))
    assert result.verdict == "row-mixing" and result.first_op is None
    assert "cannot run on one row alone" in result.notes[0] and "more than 1 value per channel" in result.notes[0]


def test_run_to_run_noise_is_told_apart_from_batch_variance():
    def noisy(x: torch.Tensor) -> torch.Tensor:
        return x + 1e-3 * torch.randn_like(x)

    result = check_batch_invariance(noisy, _rows(4, 16), sizes=(2,))
    assert result.verdict == "nondeterministic" and result.nondeterministic
    assert "not deterministic run to run" in result.fix()


def test_noise_only_in_batches_is_run_to_run_nondeterminism():
    def noisy_in_batches(x: torch.Tensor) -> torch.Tensor:
        return x + 1e-3 * torch.randn_like(x) if len(x) > 1 else x

    result = check_batch_invariance(noisy_in_batches, _rows(4, 16), sizes=(2, 3), locate=False)
    assert result.verdict == "nondeterministic"
    assert {c.status for c in result.comparisons} == {"nondeterministic"}


def test_an_op_whose_rows_cannot_be_mapped_is_named():
    """One extra row appended before the product: its output cannot be mapped to rows, and the first op that can
    (the slice back to the batch) says its inputs could not be compared."""
    w = _rows(4096, 64, seed=5)

    def through_cat(x: torch.Tensor) -> torch.Tensor:
        return (torch.cat([x, torch.zeros(1, x.shape[1])]) @ w)[: len(x)]

    result = check_batch_invariance(through_cat, _rows(8, 4096), sizes=(7,), rows=[0], positions=(0,))
    op = result.first_op
    assert result.verdict == "variant" and op is not None and op.op == "aten.slice"
    assert op.inputs_equal is None and "cannot be mapped to rows (they come through aten.cat" in op.note


def test_outputs_of_every_shape_are_compared_by_name():
    lin = torch.nn.Linear(8, 4)

    def several(x):
        return {"h": lin(x), "pair": (x * 2, x.sum(-1)), "loss": lin(x).sum()}

    result = check_batch_invariance(several, _rows(3, 8), sizes=(2,), locate=False)
    assert result.outputs == ["h", "pair[0]", "pair[1]"]  # the loss has no batch dimension: left out


# --- bad input ---------------------------------------------------------------------------------------------------
def test_an_output_without_a_batch_dimension_is_refused():
    with pytest.raises(BatchInvarianceError, match=r"no batch dimension.*returned output \(\)"):
        check_batch_invariance(lambda x: x.sum(), _rows(4, 3))


def test_a_batch_of_one_row_is_refused():
    with pytest.raises(BatchInvarianceError, match=r"the batch has 1 row \(\(1, 3\)\).*at least 2 rows"):
        check_batch_invariance(torch.nn.Linear(3, 3), _rows(1, 3))


def test_a_model_that_raises_at_a_size_is_named():
    def picky(x):
        if len(x) == 3:
            raise ValueError("three is a crowd")
        return x * 2

    with pytest.raises(BatchInvarianceError, match=r"raised ValueError on a batch of 3 rows \(\(3, 5\)\): three is "
                                                   r"a crowd\. Leave that size out"):
        check_batch_invariance(picky, _rows(4, 5), sizes=(2, 3))


def test_batches_whose_tensors_disagree_on_rows_are_refused():
    with pytest.raises(BatchInvarianceError, match=r"disagree on the number of rows \(batch\['a'\] \(4, 2\), "
                                                   r"batch\['b'\] \(3, 2\)\)"):
        check_batch_invariance(lambda a, b: a, {"a": _rows(4, 2), "b": _rows(3, 2)})
    with pytest.raises(BatchInvarianceError, match="batch is a str"):
        check_batch_invariance(lambda a: a, "text")
    with pytest.raises(BatchInvarianceError, match="sizes"):
        check_batch_invariance(lambda a: a, _rows(4, 2), sizes=(1,))


def test_assert_batch_invariant():
    lin = torch.nn.Linear(4096, 64)
    x = _rows(8, 4096)
    with pytest.raises(AssertionError, match="VARIANT"):
        torchrepro.assert_batch_invariant(lin, x, sizes=(2, 3), rows=[0], locate=False)
    with torchrepro.batch_invariant():
        assert torchrepro.assert_batch_invariant(lin, x, sizes=(2, 3), rows=[0]).invariant


# --- a tiny GPT-2 built from a config ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt2():
    model = tiny_gpt2()
    tok = word_tokenizer()
    ids = torch.stack([torch.tensor(tok(p)["input_ids"][:3]) for p in PROMPTS * 2])  # 8 rows of 3 tokens
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def test_tiny_gpt2_logits_are_variant_at_its_first_projection(gpt2):
    model, batch = gpt2
    result = check_batch_invariance(model, batch, sizes=(2, 8), positions=(0,))
    assert result.verdict == "variant" and result.outputs == ["logits"]
    op = result.first_op
    assert op is not None and op.op in ("aten.addmm", "aten.mm") and op.kind == "kernel"
    assert op.module.startswith("transformer.h.0.") and op.module.rsplit(".", 1)[-1] in (
        "c_attn", "c_proj", "c_fc"), op.describe()  # an attention or MLP projection (Conv1D: addmm on B*T rows)
    assert op.code and op.inputs_equal is True


def test_tiny_gpt2_is_invariant_under_the_fix(gpt2):
    model, batch = gpt2
    with torchrepro.batch_invariant():
        result = check_batch_invariance(model, batch, sizes=(2, 3, 8), positions=(0, -1))
    assert result.invariant, result.summary()


def test_generation_reports_tokens_and_logits_for_each_prompt(gpt2):
    from torchrepro.analysis.geninvariance import check_generation

    model, _ = gpt2
    result = check_generation(model, word_tokenizer(), PROMPTS, sizes=(2, 4), max_new_tokens=4, locate=False)
    assert [p.index for p in result.prompts] == [0, 1, 2, 3]
    assert all(len(p.contexts) == 2 and len(p.tokens) == 4 for p in result.prompts)
    assert not result.logits_invariant and result.verdict == "variant"  # tokens may agree; logits do not
    assert "greedy tokens agreed" in result.headline() or not result.tokens_invariant
    assert [what.split(":")[0] for what, _ in result.forwards] == ["the prefill", "a decode step"]
    assert result.forward is not None and result.forward.verdict == "variant"
    with torchrepro.batch_invariant():
        fixed = check_generation(model, word_tokenizer(), PROMPTS, sizes=(2, 4), max_new_tokens=4, locate=False)
    assert all(r.invariant for _, r in fixed.forwards), fixed.summary()
    padded = [c for p in fixed.prompts for c in p.contexts if c.padded]
    assert padded and fixed.invariant, fixed.summary()  # left-padded prompts too: the padding is left out of sums
    doc = fixed.to_json()
    assert doc["mode"] == "generate" and [f["invariant"] for f in doc["forward"]] == [True, True]


def test_generation_needs_two_prompts(gpt2):
    from torchrepro.analysis.geninvariance import check_generation

    with pytest.raises(BatchInvarianceError, match="1 prompt"):
        check_generation(gpt2[0], word_tokenizer(), PROMPTS[:1])
