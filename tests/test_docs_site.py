"""The documentation site's generated references stay complete (the site itself: `make docs`, strict build).

* The CLI reference is generated from the argparse parser at every build (tools/gen_cli_docs.py through the MkDocs
  hook tools/mkdocs_hooks.py): every subcommand, sub-subcommand and option of the parser is on the page.
* The Python API page lists exactly ``torchrepro.__all__``.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import torchrepro
from torchrepro.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _parsers(parser: argparse.ArgumentParser, prog: str = "torchrepro"):
    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{prog} {name}")


def test_cli_reference_covers_every_command_and_option() -> None:
    parser = build_parser()
    page = _tool("gen_cli_docs").cli_reference(parser)
    headings = set(re.findall(r"^#+ `(torchrepro[^`]*)`$", page, flags=re.M))
    missing = []
    for prog, sub in _parsers(parser):
        if prog != "torchrepro" and prog not in headings:
            missing.append(f"section {prog}")
        for action in sub._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            for option in action.option_strings:
                if not re.search(rf"(`|, ){re.escape(option)}[ ,`]", page):
                    missing.append(f"{prog} {option}")
    assert not missing, missing
    assert "<!-- Generated" in page and page.endswith("\n")


def test_cli_reference_escapes_markdown_outside_code() -> None:
    text = _tool("gen_cli_docs")._text
    assert text("a <DIR> *x* `a <b> *c*`") == r"a &lt;DIR&gt; \*x\* `a <b> *c*`"


def test_api_page_lists_exactly_the_public_api() -> None:
    page = (ROOT / "docs" / "reference" / "api.md").read_text(encoding="utf-8")
    documented = re.findall(r"^::: torchrepro\.(\w+)$", page, flags=re.M)
    assert len(documented) == len(set(documented)), "a name is documented twice"
    public = set(torchrepro.__all__) - {"__version__"}
    assert set(documented) == public, {"not documented": sorted(public - set(documented)),
                                       "not public": sorted(set(documented) - public)}


def test_sphinx_roles_read_as_code() -> None:
    plain = _tool("griffe_roles").plain_roles
    assert plain("see :func:`seed_everything` and :class:`~torchrepro.RNGState`") == \
        "see `seed_everything` and `RNGState`"
