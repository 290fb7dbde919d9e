"""Reading and parsing source files, and resolving imports between the files of one project.

The linter follows a call into a helper defined in another file (``from utils import set_seed``) when that
file can be found the way Python would find it: beside the importing file, in its parent directories up to the
project root (the nearest directory with ``pyproject.toml``, ``setup.py``, ``setup.cfg`` or ``.git``), or in
the root's ``src/``. Files found this way are parsed once and cached; their problems are not reported.

A name that is also a third-party library's (``timm``, ``datasets``, ``transformers``) is the project's own
package when Python would import it from the project: from the script's directory (the importing file's, or
the one above its top-level package) or the project root. Only then is it the library, whose APIs are in
knowledge.py. Standard-library names are never looked for among the project's files.
"""

from __future__ import annotations

import ast
import os
import sys
import tokenize
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

from .module import ClassInfo, Module, Scope, source_lines
from .reading import MAX_SOURCE_BYTES, Unreadable, is_regular, read_regular

_ROOT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")
_STDLIB = frozenset(sys.stdlib_module_names)  # never looked for among the project's files
# Third-party packages whose APIs are in knowledge.py (or do not matter): the project's own package of the same
# name, when Python would import it from the project, comes first (see Project.is_own).
_LIBRARIES = frozenset({
    "torch", "numpy", "transformers", "lightning", "pytorch_lightning", "lightning_fabric", "accelerate",
    "torchvision", "torchaudio", "torchtext", "timm", "datasets", "tqdm", "wandb", "sklearn", "scipy", "pandas",
    "PIL", "cv2", "matplotlib", "tensorboard", "deepspeed", "trl", "peft", "evaluate", "hydra", "omegaconf",
    "yaml", "fire", "click", "typer", "monai", "mmengine", "keras", "torchrepro", "apex", "einops", "jax",
    "tensorflow", "sentencepiece", "tokenizers", "huggingface_hub", "safetensors", "rich", "absl",
})
_EXTERNAL = _STDLIB | _LIBRARIES
MAX_EXTRA_MODULES = 200  # project files read to follow imports, beyond the files being linted


def is_external(qual: str) -> bool:
    """Whether a qualified name belongs to the standard library or a known third-party package (whose APIs are
    in knowledge.py, or do not matter), unless the project has its own package of that name
    (:meth:`Project.is_own`)."""
    return qual.partition(".")[0] in _EXTERNAL


@dataclass(frozen=True)
class SourceProblem:
    """Why a file could not be analysed: its rule code, a message, and where (1-based line and column)."""

    code: str
    message: str
    line: int = 1
    column: int = 1


def read_module(path: Path, display: str) -> Module | SourceProblem:
    """Read and parse one file; a file that is not a readable regular file of at most :data:`MAX_SOURCE_BYTES`,
    is not UTF-8 text (or its declared encoding), contains null bytes or has a syntax error gives a
    :class:`SourceProblem` instead."""
    try:
        data = read_regular(path, MAX_SOURCE_BYTES)
    except Unreadable as exc:
        return SourceProblem("TR004", str(exc))
    nul = data.find(b"\x00")
    if nul >= 0:
        return SourceProblem("TR003", "the file contains a null byte, so Python cannot run it; it was not analysed",
                             *byte_position(data, nul))
    encoding = "utf-8"
    head = data[:400]
    if head.startswith(b"\xef\xbb\xbf") or b"coding" in head:
        try:
            encoding, _ = tokenize.detect_encoding(BytesIO(data).readline)
        except SyntaxError as exc:
            return SourceProblem("TR002", f"invalid encoding declaration: {exc.msg if hasattr(exc, 'msg') else exc}")
    try:
        text = data.decode(encoding)
    except (UnicodeDecodeError, LookupError) as exc:
        start = getattr(exc, "start", 0)
        what = f"byte 0x{data[start]:02x}" if isinstance(exc, UnicodeDecodeError) else f"encoding {encoding!r}"
        return SourceProblem("TR002", f"the file is not valid {encoding} text ({what}); it was not analysed",
                             *byte_position(data, start, encoding))
    if text.startswith("\ufeff"):
        text = text[1:]
    try:
        tree = ast.parse(text, filename=display)
        return Module(path, display, text, tree)
    except SyntaxError as exc:
        return SourceProblem("TR001", f"syntax error: {exc.msg}; the file was not analysed",
                             max(exc.lineno or 1, 1), max(exc.offset or 1, 1))
    except (RecursionError, MemoryError, ValueError) as exc:
        return SourceProblem("TR001", f"the file could not be parsed ({type(exc).__name__}: nested too deeply?); "
                                      "it was not analysed")


def byte_position(data: bytes, offset: int, encoding: str = "utf-8") -> tuple[int, int]:
    """The 1-based line and column of byte ``offset`` of ``data``: lines as Python counts them, columns in
    characters (the bytes before ``offset`` decoded, bad ones as one character each)."""
    try:
        before = data[:offset].decode(encoding, "replace")
    except LookupError:  # an unknown declared encoding
        before = data[:offset].decode("utf-8", "replace")
    lines = source_lines(before.removeprefix("\ufeff"))
    return len(lines), len(lines[-1]) + 1


class Project:
    """The files being linted plus the project files they import, parsed at most once each."""

    def __init__(self) -> None:
        self._modules: dict[Path, Module | None] = {}
        self._roots: dict[Path, Path | None] = {}
        self._found: dict[tuple[Path, tuple[str, ...]], Path | None] = {}
        self._closure: dict[Path, frozenset[Path]] = {}
        self._extra = 0
        self._keys: dict[Path, Path] = {}
        self._search: dict[Path, list[Path]] = {}
        self._library_search: dict[Path, list[Path]] = {}
        self._own: dict[tuple[int, str], bool] = {}
        self._resolved: dict[tuple[int, str], Module | Scope | ClassInfo | None] = {}
        self._bases_of: dict[int, list[ClassInfo | str]] = {}
        self._methods: dict[tuple[int, str], Scope | None] = {}
        self._derives: dict[tuple[int, frozenset[str]], bool] = {}

    def add(self, module: Module) -> None:
        self._modules[self._key(module.path)] = module

    def _key(self, path: Path) -> Path:
        key = self._keys.get(path)
        if key is None:
            key = self._keys[path] = _key(path)
        return key

    def module_at(self, path: Path) -> Module | None:
        """The parsed module at ``path`` (None if it cannot be parsed, or once :data:`MAX_EXTRA_MODULES` files
        beyond the linted ones have been read: analysis then treats further helpers as unknown)."""
        key = self._key(path)
        if key not in self._modules:
            if self._extra >= MAX_EXTRA_MODULES:
                return None
            self._extra += 1
            loaded = read_module(path, str(path))
            self._modules[key] = loaded if isinstance(loaded, Module) else None
        return self._modules[key]

    def root_of(self, directory: Path) -> Path | None:
        """The nearest directory at or above ``directory`` holding a project marker, or None."""
        if directory in self._roots:
            return self._roots[directory]
        found = None
        for candidate in (directory, *directory.parents):
            if any(os.path.exists(os.path.join(candidate, marker)) for marker in _ROOT_MARKERS):
                found = candidate
                break
        self._roots[directory] = found
        return found

    def _bases(self, importer: Path) -> list[Path]:
        here = importer.parent
        found = self._search.get(here)
        if found is not None:
            return found
        root = self.root_of(here)
        bases = [here]
        if root is not None:
            for parent in here.parents:
                if root not in parent.parents and parent != root:
                    break
                bases.append(parent)
            bases.append(root / "src")
        self._search[here] = bases
        return bases

    def _library_bases(self, importer: Path) -> list[Path]:
        """Where Python would find a package named like a library in this project: the script's directory (the
        importer's, or the one above its top-level package) and the project root."""
        here = importer.parent
        found = self._library_search.get(here)
        if found is None:
            top = here
            while is_regular(top / "__init__.py") and top.parent != top:
                top = top.parent
            root = self.root_of(here)
            found = self._library_search[here] = [top] if root is None or root == top else [top, root]
        return found

    def is_own(self, importer: Module, qual: str) -> bool:
        """Whether ``qual`` (``timm.create_model``, ``datasets.build_dataset``) names the project's own package,
        which shadows the library of that name for ``importer``."""
        top = qual.partition(".")[0]
        if top not in _LIBRARIES:
            return False
        key = (id(importer), top)
        found = self._own.get(key)
        if found is None:
            found = self._own[key] = self.find_file(importer, 0, (top,)) is not None
        return found

    def find_file(self, importer: Module, level: int, parts: tuple[str, ...]) -> Path | None:
        if level:
            base = importer.path.parent
            for _ in range(level - 1):
                base = base.parent
            bases = [base]
        elif parts[0] in _STDLIB:
            return None
        elif parts[0] in _LIBRARIES:
            bases = self._library_bases(importer.path)
        else:
            bases = self._bases(importer.path)
        for base in bases:
            key = (base, parts)
            if key not in self._found:
                stem = base.joinpath(*parts)
                candidate = stem.with_name(stem.name + ".py") if parts else None
                if candidate is not None and is_regular(candidate):
                    self._found[key] = candidate
                elif is_regular(stem / "__init__.py"):
                    self._found[key] = stem / "__init__.py"
                else:
                    self._found[key] = None
            if self._found[key] is not None:
                return self._found[key]
        return None

    def resolve(self, importer: Module, raw: str, depth: int = 0) -> Module | Scope | ClassInfo | None:
        """What an import path names among the project's files: a module, a function (its :class:`Scope`), a
        class, or a method (``pkg.mod.Class.method``); None when it is not a project file."""
        if depth > 4:
            return None
        memo_key = (id(importer), raw)
        if memo_key in self._resolved:
            return self._resolved[memo_key]
        self._resolved[memo_key] = None  # a cycle of re-exports resolves to nothing
        found = self._resolve(importer, raw, depth)
        self._resolved[memo_key] = found
        return found

    def _resolve(self, importer: Module, raw: str, depth: int) -> Module | Scope | ClassInfo | None:
        level = len(raw) - len(raw.lstrip("."))
        parts = tuple(p for p in raw[level:].split(".") if p)
        if not parts and not level:
            return None
        for k in range(len(parts), -1 if level else 0, -1):
            path = self.find_file(importer, level, parts[:k])
            if path is None:
                continue
            module = self.module_at(path)
            if module is None:
                return None
            return self._member(module, parts[k:], depth)
        return None

    def _member(self, module: Module, rest: tuple[str, ...], depth: int) -> Module | Scope | ClassInfo | None:
        if not rest:
            return module
        name = rest[0]
        top = module.top
        found: Module | Scope | ClassInfo | None = top.defs.get(name) or top.classes.get(name)
        if found is None and name in module.imports:
            found = self.resolve(module, module.imports[name], depth + 1)
        for attr in rest[1:]:
            if isinstance(found, ClassInfo):
                found = self.method(found, attr)
            elif isinstance(found, Module):
                found = self._member(found, (attr,), depth + 1)
            else:
                return None
        return found

    # -- classes -------------------------------------------------------------------------------------------------
    def bases(self, cls: ClassInfo) -> list[ClassInfo | str]:
        """The base classes of ``cls``: project classes, or qualified names of external ones."""
        if id(cls) in self._bases_of:
            return self._bases_of[id(cls)]
        out: list[ClassInfo | str] = []
        self._bases_of[id(cls)] = out
        module = cls.module
        for expr in cls.node.bases:
            resolved = self.resolve_expr(module, module.top, expr)
            if isinstance(resolved, ClassInfo):
                out.append(resolved)
            else:
                name = module.qual(expr)
                if name:
                    out.append(name)
        return out

    def resolve_expr(self, module: Module, scope: Scope, expr: ast.AST) -> Module | Scope | ClassInfo | None:
        """What a name or ``a.b`` expression refers to among project definitions, seen from ``scope``."""
        if expr.__class__ is ast.Name:
            local = scope.lookup_def(expr.id)
            if local is not None:
                return local
            raw = module.imports.get(expr.id)
            return self.resolve(module, raw) if raw else None
        if expr.__class__ is ast.Attribute:
            owner = self.resolve_expr(module, scope, expr.value)
            if isinstance(owner, Module):
                return self._member(owner, (expr.attr,), 0)
            if isinstance(owner, ClassInfo):
                return self.method(owner, expr.attr)
        return None

    def method(self, cls: ClassInfo, name: str, _seen: frozenset[int] = frozenset()) -> Scope | None:
        """``cls.name`` looked up through project base classes (None if defined only outside the project)."""
        if id(cls) in _seen:
            return None
        key = (id(cls), name)
        if key in self._methods:
            return self._methods[key]
        found = self._method(cls, name, _seen)
        self._methods[key] = found
        return found

    def _method(self, cls: ClassInfo, name: str, _seen: frozenset[int]) -> Scope | None:
        found = cls.methods.get(name)
        if found is not None:
            return found
        for base in self.bases(cls):
            if isinstance(base, ClassInfo):
                found = self.method(base, name, _seen | {id(cls)})
                if found is not None:
                    return found
        return None

    def derives_from(self, cls: ClassInfo, names: frozenset[str], _seen: frozenset[int] = frozenset()) -> bool:
        """Whether ``cls`` has one of the external classes ``names`` among its ancestors."""
        if id(cls) in _seen:
            return False
        key = (id(cls), names)
        if key not in self._derives:
            self._derives[key] = False  # while looking (a cycle of bases)
            self._derives[key] = self._derives_from(cls, names, _seen)
        return self._derives[key]

    def _derives_from(self, cls: ClassInfo, names: frozenset[str], _seen: frozenset[int]) -> bool:
        for base in self.bases(cls):
            if isinstance(base, ClassInfo):
                if self.derives_from(base, names, _seen | {id(cls)}):
                    return True
            elif base in names:
                return True
        return False

    # -- imports -------------------------------------------------------------------------------------------------
    def imported_files(self, module: Module) -> frozenset[Path]:
        """Every project file that ``module`` imports, directly or through other project files."""
        key = self._key(module.path)
        if key in self._closure:
            return self._closure[key]
        self._closure[key] = frozenset()
        seen: set[Path] = set()
        todo = [module]
        while todo and len(seen) < 2000:
            current = todo.pop()
            for raw in sorted(set(current.imports.values())):
                target = self.resolve(current, raw)
                target_module = target if isinstance(target, Module) else getattr(target, "module", None)
                if target_module is None:
                    continue
                path = self._key(target_module.path)
                if path not in seen and path != key:
                    seen.add(path)
                    todo.append(target_module)
        self._closure[key] = frozenset(seen)
        return self._closure[key]


def _key(path: Path) -> Path:
    try:
        return path.resolve()
    except OSError:
        return path.absolute()
