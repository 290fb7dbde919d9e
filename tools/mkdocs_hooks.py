"""MkDocs hooks (``hooks:`` in mkdocs.yml): the CLI reference page is generated from the argparse parser at
every build (see tools/gen_cli_docs.py), so it cannot drift from the code and is never committed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CLI_PAGE = "reference/cli.md"


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
    return files
