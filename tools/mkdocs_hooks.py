"""MkDocs hooks (``hooks:`` in mkdocs.yml): the CLI reference page is generated from the argparse parser at
every build (see tools/gen_cli_docs.py), and the changelog page from CHANGELOG.md, so neither can drift from its
source and neither is committed under docs/."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CLI_PAGE = "reference/cli.md"
CHANGELOG_PAGE = "changelog.md"


def changelog_page(text: str, docs: Path = ROOT / "docs") -> str:
    """CHANGELOG.md as a page of the site: links into ``docs/`` point at the pages; a link to another file of the
    repository (``SECURITY.md``), which the site does not hold, keeps its text, as code.

    >>> changelog_page("See [check.md](docs/check.md#x) and [SECURITY.md](SECURITY.md), [web](https://a.b/).")
    'See [check.md](check.md#x) and `SECURITY.md`, [web](https://a.b/).'
    """
    def link(m: re.Match[str]) -> str:
        label, target = m.group(1), m.group(2)
        if re.match(r"[a-z]+://|#", target):
            return m.group(0)
        if target.startswith("docs/") and (docs / target[5:].split("#")[0]).is_file():
            return f"[{label}]({target[5:]})"
        return f"`{label}`"

    return re.sub(r"\[([^\]\n]+)\]\(([^)\s]+)\)", link, text)


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_cli_docs", ROOT / "tools" / "gen_cli_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    # This checkout's code, not whatever torchrepro the interpreter has installed (e.g. another tree, editable)
    src = str(ROOT / "src")
    if src not in sys.path:
        sys.path.insert(0, src)
    loaded = sys.modules.get("torchrepro")
    if loaded is not None and not str(Path(loaded.__file__ or "").resolve()).startswith(src):
        raise RuntimeError(f"torchrepro was imported from {loaded.__file__}, not from {src}")
    files.append(File.generated(config, CLI_PAGE, content=_generator().cli_reference()))
    files.append(File.generated(config, CHANGELOG_PAGE,
                                content=changelog_page((ROOT / "CHANGELOG.md").read_text(encoding="utf-8"))))
    return files
