"""One mechanism for global patches: what torchrepro replaces in other modules (``torch.autograd.backward``,
``builtins.__import__``, a DataLoader iterator's ``__next__``, ``torch.jit.script``), hooks it registers, and
finders it puts on ``sys.meta_path`` are installed through a :class:`Patches` and removed together, in reverse
order, by :meth:`Patches.undo` (or on leaving its ``with`` block).

An attribute is put back only while it is still the one installed: code that replaced it again after us (another
tool, a user's own patch) keeps its own.

Example:
    >>> import types
    >>> mod = types.SimpleNamespace(f=lambda: "original")
    >>> with Patches() as patches:
    ...     original = patches.wrap(mod, "f", lambda f: lambda: "wrapped " + f())
    ...     mod.f()
    'wrapped original'
    >>> mod.f()
    'original'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Patches:
    """Global replacements, hooks and finders installed together and undone together (see the module docs)."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def set(self, owner: Any, name: str, value: Any) -> Any:
        """Replace ``owner.name`` with ``value``; return what it was."""
        original = getattr(owner, name)
        setattr(owner, name, value)

        def undo() -> None:
            if getattr(owner, name, None) is value:  # still ours: put the original back
                setattr(owner, name, original)

        self._undo.append(undo)
        return original

    def wrap(self, owner: Any, name: str, make: Callable[[Any], Any]) -> Any:
        """Replace ``owner.name`` with ``make(original)``; return the original."""
        return self.set(owner, name, make(getattr(owner, name)))

    def hook(self, handle: Any) -> Any:
        """Keep a hook's removable ``handle`` (``register_*_hook``'s result) to remove it on :meth:`undo`."""
        self._undo.append(handle.remove)
        return handle

    def insert(self, items: list[Any], index: int, item: Any) -> Any:
        """Insert ``item`` into the list ``items`` (``sys.meta_path``); it is taken out on :meth:`undo`."""
        items.insert(index, item)

        def undo() -> None:
            if item in items:
                items.remove(item)

        self._undo.append(undo)
        return item

    def undo(self) -> None:
        """Remove everything installed, last first (safe to call twice)."""
        while self._undo:
            self._undo.pop()()

    @property
    def active(self) -> bool:
        return bool(self._undo)

    def __enter__(self) -> Patches:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()
