"""``torchrepro lint``: static checks for reproducibility pitfalls in training code.

Standard library only (``ast``): this subpackage imports nothing outside itself and the standard library, so
it runs without torch. (Importing ``torchrepro.lint`` still runs ``torchrepro/__init__.py`` first, which
imports torch; see docs/lint.md for what that costs and how the engine is used without it.)

>>> from torchrepro.lint import lint_source
>>> [d.code for d in lint_source("import torch\\nmodel = torch.nn.Linear(2, 2)\\n")]
['TR101']

Layout: :mod:`.engine` (files -> diagnostics, suppressions), :mod:`.config` (pyproject and selection),
:mod:`.files` (discovery, gitignore), :mod:`.globs` (gitignore patterns, matched as git matches them),
:mod:`.reading` (regular files only, size-limited, never blocking), :mod:`.module` and :mod:`.flow` (facts
about a module, and what a program does in order), :mod:`.knowledge` (library APIs as tables), :mod:`.rules`
(one module per family), :mod:`.formats` (text, json, github, sarif).
"""

from __future__ import annotations

from .config import ConfigError, LintConfig, load_config
from .engine import Engine, LintResult, lint_paths, lint_source
from .formats import FORMATS, JSON_SCHEMA, render
from .rule import Diagnostic, Rule
from .rules import RULES, get_rule

__all__ = [
    "FORMATS",
    "JSON_SCHEMA",
    "RULES",
    "ConfigError",
    "Diagnostic",
    "Engine",
    "LintConfig",
    "LintResult",
    "Rule",
    "get_rule",
    "lint_paths",
    "lint_source",
    "load_config",
    "render",
]
