"""A Griffe extension for the API reference (mkdocs.yml): the docstrings' Sphinx roles (:func:`seed_everything`,
:class:`~torchrepro.RNGState`) become inline code, as the rest of their reST-style markup already reads."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|data|mod|attr|exc|obj|const):`~?([^`]+)`")


def plain_roles(text: str) -> str:
    """``:func:`a.b``` -> ```a.b```; ``:class:`~a.B``` -> ```B``` (the tilde keeps the last name, as in Sphinx)."""
    return _ROLE.sub(lambda m: "`" + (m.group(1).rsplit(".", 1)[-1] if m.group(0).count("~") else m.group(1)) + "`",
                     text)


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain_roles(obj.docstring.value)
