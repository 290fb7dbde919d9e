"""Deprecated spellings of renamed methods (kept for one release).

Every class says "as a JSON-ready dict" as ``to_json()``; the older ``to_dict()``/``as_dict()`` still work and warn.

Example:
    >>> import warnings
    >>> class Point:
    ...     def to_json(self): return {"x": 1}
    ...     to_dict = renamed("to_json", "to_dict")
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     Point().to_dict(), caught[0].category.__name__
    ({'x': 1}, 'DeprecationWarning')
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

REMOVED_IN = "0.3"


def renamed(new: str, old: str) -> Callable[..., Any]:
    """A method ``old`` that warns and calls ``new`` (on the instance, or on the class for a classmethod)."""

    def alias(self: Any, *args: Any, **kwargs: Any) -> Any:
        owner = self if isinstance(self, type) else type(self)
        warnings.warn(f"{owner.__name__}.{old}() is deprecated, use {owner.__name__}.{new}() (the old name goes in "
                      f"torchrepro {REMOVED_IN})", DeprecationWarning, stacklevel=2)
        return getattr(self, new)(*args, **kwargs)

    alias.__name__ = old
    alias.__doc__ = f"Deprecated: use :meth:`{new}`."
    return alias
