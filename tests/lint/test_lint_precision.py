"""Precision of ``torchrepro lint`` on whole programs: the bundled examples give exactly the known findings,
realistic training scripts that are seeded correctly give none, and breaking one of them gives the finding
that names the break (so "none" is not vacuous)."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchrepro.lint import LintConfig, lint_paths

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "lint" / "lint_fixtures" / "real"


def _found(result) -> list[tuple[str, int, int, str]]:
    return [(d.path, d.line, d.column, d.code) for d in result.diagnostics]


def test_bundled_examples_lint_as_expected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    result = lint_paths(["examples"], LintConfig(base=ROOT))
    assert result.files == ["examples/cnn_train.py", "examples/compiled_embedding.py", "examples/demo.py",
                            "examples/scatter_gnn.py",
                            "examples/unseeded_augmentation.py", "examples/unseeded_init.py"]
    assert _found(result) == [
        # cnn_train.py: seeded, and its convolutions and adaptive pooling (nondeterministic on CUDA only) never run
        # on CUDA, since nothing in it uses CUDA
        # the scatter-add the example is about (index_put_(accumulate=True): nondeterministic on CPU with 2+ threads)
        ("examples/scatter_gnn.py", 23, 11, "TR203"),
        # the unseeded augmentation generator the example is about, and a shuffle from the global generator
        ("examples/unseeded_augmentation.py", 21, 20, "TR104"),
        ("examples/unseeded_augmentation.py", 34, 14, "TR301"),
        # the forgotten seed the example is about: the first layer's weights
        ("examples/unseeded_init.py", 19, 27, "TR101"),
    ]
    messages = {d.code: d.message for d in result.diagnostics}
    assert "nn.Linear" in messages["TR101"] and "np.random.default_rng()" in messages["TR104"]


def test_realistic_scripts_seeded_correctly_have_no_findings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REAL)
    result = lint_paths(["."], LintConfig(base=REAL, select=("ALL",)))
    assert len(result.files) == 11
    assert _found(result) == []


# (script, text removed from it, findings that must then appear)
BREAKS = [
    ("hf_glue_style.py", "    set_seed(training_args.seed)\n",
     [("hf_glue_style.py", 56, "TR103"), ("hf_glue_style.py", 72, "TR103")]),
    # one finding per cause and class: conv2 (line 17) is named in the finding at conv1
    ("mnist_style.py", "    torch.backends.cudnn.deterministic = True\n", [("mnist_style.py", 16, "TR203")]),
    # the validation split comes from the augmented training set (random crops in its workers); the test
    # loader's workers run ToTensor only, which draws nothing
    ("lightning_style.py", ", workers=True", [("lightning_style.py", 71, "TR302")]),
    # the three convolutions are one finding (naming lines 22 and 23), the adaptive pooling another cause
    ("lightning_style.py", " deterministic=True,",
     [("lightning_style.py", 21, "TR203"), ("lightning_style.py", 24, "TR203")]),
    ("imagenet_style.py", "        train_sampler.set_epoch(epoch)\n", [("imagenet_style.py", 121, "TR401")]),
    # the seed in main() does not reach the processes mp.spawn starts
    ("imagenet_style.py", "them).\n    torch.manual_seed(args.seed)\n", [("imagenet_style.py", 87, "TR106")]),
    # nor do deterministic mode and cuDNN's flag: the finding is on the function the processes run
    ("imagenet_style.py", "main() do not reach a process that mp.spawn starts.\n    cudnn.deterministic = True\n"
                          "    cudnn.benchmark = False\n    torch.use_deterministic_algorithms(True)\n",
     [("imagenet_style.py", 74, "TR207")]),
    ("word_lm_style.py", "    torch.manual_seed(args.seed)\n", [("word_lm_style.py", 89, "TR101")]),
    # the cuDNN LSTM: neither deterministic mode nor CUBLAS_WORKSPACE_CONFIG is left
    ("word_lm_style.py", "    torch.use_deterministic_algorithms(True)\n", [("word_lm_style.py", 47, "TR203")]),
    ("project/train.py", "    make_reproducible(args.seed)\n",
     [("project/model.py", 14, "TR203"), ("project/train.py", 23, "TR101")]),
]


@pytest.mark.parametrize(("script", "removed", "expected"), BREAKS, ids=[f"{b[0]}-{i}" for i, b in enumerate(BREAKS)])
def test_breaking_a_realistic_script_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str,
                                               removed: str, expected: list[tuple[str, int, str]]) -> None:
    copy = tmp_path / "real"
    for path in REAL.rglob("*.py"):
        target = copy / path.relative_to(REAL)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text())
    (tmp_path / "pyproject.toml").write_text("")  # the project root, as in a real checkout
    broken = copy / script
    text = broken.read_text()
    assert removed in text
    broken.write_text(text.replace(removed, "\n" if removed.endswith("\n") else "", 1))
    monkeypatch.chdir(copy)
    result = lint_paths(["."], LintConfig(base=copy, select=("ALL",)))
    assert [(d.path, d.line, d.code) for d in result.diagnostics] == expected
    if script == "lightning_style.py" and expected[0][2] == "TR203":
        assert "nn.Conv2d (and 2 more in class LitResNet: lines 22, 23): " in result.diagnostics[0].message


def test_library_module_linted_alone_finds_the_program_that_imports_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Linting only model.py (as pre-commit does for a changed file): the project's train.py, found by scanning
    the project, enables deterministic mode through its helper package, so the scatter-add is covered."""
    monkeypatch.chdir(REAL / "project")
    assert _found(lint_paths(["model.py"], LintConfig(base=REAL))) == []


def test_library_module_without_a_deterministic_program_is_flagged(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "gnn.py").write_text((REAL / "project" / "model.py").read_text())
    (tmp_path / "train.py").write_text("import torch\nfrom gnn import GNN\n\nif __name__ == '__main__':\n"
                                       "    torch.manual_seed(0)\n    GNN(8).cuda()\n")
    monkeypatch.chdir(tmp_path)
    result = lint_paths(["gnn.py"], LintConfig(base=tmp_path))
    assert _found(result) == [("gnn.py", 14, 15, "TR203")]
    assert "no linted program importing it" in result.diagnostics[0].message


def test_library_module_linted_alone_is_judged_by_the_device_of_the_program_that_imports_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Convolutions are nondeterministic on CUDA only: linting model.py alone, the program that imports it (found
    by scanning the project) decides, through the helper module where it picks its device."""
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "model.py").write_text("from torch import nn\n\n\nclass Net(nn.Module):\n    def __init__(self):\n"
                                       "        super().__init__()\n        self.conv = nn.Conv2d(1, 8, 3)\n")
    (tmp_path / "devices.py").write_text("import torch\n\n\ndef pick():\n    return torch.device('cpu')\n")
    (tmp_path / "train.py").write_text("import torch\nfrom model import Net\nfrom devices import pick\n\n"
                                       "if __name__ == '__main__':\n    torch.manual_seed(0)\n    Net().to(pick())\n")
    monkeypatch.chdir(tmp_path)
    assert _found(lint_paths(["model.py"], LintConfig(base=tmp_path))) == []
    (tmp_path / "devices.py").write_text("import torch\n\n\ndef pick():\n"
                                         "    return torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n")
    result = lint_paths(["model.py"], LintConfig(base=tmp_path))
    assert _found(result) == [("model.py", 7, 21, "TR203")]
    assert "no linted program importing it" in result.diagnostics[0].message
