"""`torchrepro invariance`: a local tiny GPT-2 with its word-level tokenizer (--hf DIR --prompts FILE) and a model
factory (MODULE:FUNCTION --input FILE.pt), in text and --json, with invariance.json and report.html; the fix
(--batch-invariant) verified; bad input refused with exit 2 and what was received."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from tests.analysis.tinylm import save_tiny_lm
from torchrepro.cli import main

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # many small ops; the shared fixture puts the count back


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("tiny-gpt2"))


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


def test_hf_model_is_variant_then_invariant_under_the_fix(lm_dir, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["invariance", "--hf", str(lm_dir), "--prompts", str(lm_dir / "prompts.txt"), "--sizes", "2,4",
                 "--max-new-tokens", "3", "--out", str(out), "--json"])
    doc = _json(capsys)
    assert code == 1 and doc["exit_code"] == 1 and doc["verdict"] == "variant" and doc["mode"] == "generate"
    assert len(doc["prompts"]) == 4 and all(len(p["contexts"]) == 2 for p in doc["prompts"])
    assert all("first_divergent_token" in c and "logprob_deltas" in c for p in doc["prompts"] for c in p["contexts"])
    assert doc["logits_invariant"] is False
    first = next(f for f in doc["forward"] if not f["invariant"])["first_op"]
    assert first["op"] in ("aten.addmm", "aten.mm") and first["module"].startswith(("transformer.h.0.", "lm_head"))
    assert "torchrepro.batch_invariant()" in doc["fix"]
    assert json.loads((out / "invariance.json").read_text())["verdict"] == "variant"
    page = (out / "report.html").read_text()
    assert "torchrepro invariance" in page and "First batch-variant op" in page and doc["report"] == str(
        out / "report.html")

    code = main(["invariance", "--hf", str(lm_dir), "--prompts", str(lm_dir / "prompts.txt"), "--sizes", "2,4",
                 "--max-new-tokens", "3", "--out", str(out), "--batch-invariant"])
    text = capsys.readouterr().out
    assert "inside torchrepro.batch_invariant()" in text
    fixed = json.loads((out / "invariance.json").read_text())
    assert [f["invariant"] for f in fixed["forward"]] == [True, True] and fixed["batch_invariant"] is True
    assert code == 0 and fixed["invariant"] and text.startswith("torchrepro invariance: INVARIANT")
    assert any(c["padded"] for p in fixed["prompts"] for c in p["contexts"])


FACTORY = textwrap.dedent("""
    import torch

    def wide():
        torch.manual_seed(0)
        return torch.nn.Linear(4096, 256)

    def mixes():
        return torch.nn.Sequential(torch.nn.Conv1d(3, 3, 3), torch.nn.BatchNorm1d(3)).train()

    def total():
        return lambda x: x.sum()

    def picky():
        def f(x):
            if len(x) == 4:
                raise RuntimeError("no batches of four")
            return x
        return f
""")


@pytest.fixture
def factory(tmp_path, monkeypatch):
    (tmp_path / "mymodels.py").write_text(FACTORY)
    torch.save(torch.randn(6, 4096, generator=torch.Generator().manual_seed(0)), tmp_path / "wide.pt")
    torch.save(torch.randn(6, 3, 8, generator=torch.Generator().manual_seed(0)), tmp_path / "conv.pt")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_factory_text_output_and_the_fix(factory, capsys):
    args = ["invariance", "mymodels:wide", "--input", "wide.pt", "--sizes", "2,3", "--rows", "0,5", "--out", "o"]
    assert main(args) == 1
    text = capsys.readouterr().out
    assert text.startswith("torchrepro invariance: VARIANT")
    assert "First batch-variant op: aten.addmm in `Linear`" in text and "Fix: run the model inside" in text
    assert "Report: o/report.html" in text
    assert main([*args, "--batch-invariant"]) == 0
    assert capsys.readouterr().out.startswith("torchrepro invariance: INVARIANT")


def test_factory_with_batchnorm_in_training_mode_is_row_mixing(factory, capsys):
    assert main(["invariance", "mymodels:mixes", "--input", "conv.pt", "--sizes", "2", "--out", "o", "--json"]) == 1
    doc = _json(capsys)
    assert doc["verdict"] == "row-mixing" and "model.eval()" in doc["fix"]


@pytest.mark.parametrize("args,message", [
    (["mymodels:total", "--input", "wide.pt"], "output has no batch dimension: for a batch of 1 row(s) it returned "
                                                "output ()"),
    (["mymodels:picky", "--input", "wide.pt", "--sizes", "2,4"], "raised RuntimeError on a batch of 4 rows ((4, "
                                                                  "4096)): no batches of four"),
    (["mymodels:wide", "--input", "missing.pt"], "--input missing.pt: no such file"),
    (["mymodels:wide"], "mymodels:wide needs --input FILE.pt"),
    (["nosuchmodule:f", "--input", "wide.pt"], "could not import 'nosuchmodule'"),
    (["mymodels", "--input", "wide.pt"], "expected MODULE:FUNCTION"),
    ([], "nothing to check"),
    (["--hf", "."], "--hf DIR needs --prompts FILE"),
])
def test_bad_input_exits_2_naming_what_was_received(factory, capsys, args, message):
    assert main(["invariance", *args, "--out", "o", "--json"]) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    doc = json.loads(captured.out)
    assert doc["verdict"] == "error" and doc["exit_code"] == 2 and message in doc["error"]


def test_hf_bad_input(lm_dir, tmp_path, capsys):
    one = tmp_path / "one.txt"
    one.write_text("the cat sat\n\n")
    assert main(["invariance", "--hf", str(lm_dir), "--prompts", str(one), "--out", str(tmp_path / "o")]) == 2
    assert "holds 1 prompt(s)" in capsys.readouterr().err
    assert main(["invariance", "--hf", str(tmp_path), "--prompts", str(lm_dir / "prompts.txt"),
                 "--out", str(tmp_path / "o")]) == 2
    assert "no config.json there" in capsys.readouterr().err
    assert main(["invariance", "--sizes", "1,2", "--hf", str(lm_dir)]) == 2
    assert "of 2 or more, got '1,2'" in capsys.readouterr().err
