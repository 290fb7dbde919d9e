"""Capture, restore, save and load every RNG state (layer L1).

File format (``save_rng_state``): one UTF-8 JSON document, no pickle::

    {"format": "torchrepro.rng-state", "version": 1,
     "sha256": "<hex digest of the canonical JSON of 'state'>",
     "state": {"python": [version, [625 ints], gauss_next],
               "numpy": {"key": [624 ints], "pos": int, "has_gauss": int, "cached_gaussian": float} | null,
               "torch_cpu": "<base64 of torch.get_rng_state()>",
               "cuda": ["<base64 per device>", ...],
               "generators": {"name": {"kind": "torch", "state": "<base64>"}
                              | {"kind": "numpy", "state": <bit_generator.state>}}}}

Example:
    >>> import random, torchrepro
    >>> state = torchrepro.RNGState.capture()
    >>> a = random.random()
    >>> state.restore()
    >>> a == random.random()
    True
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ._compat import np
from ._io import atomic_write_bytes
from .errors import DeviceMismatchError, MissingGeneratorError, StateFileError

FORMAT = "torchrepro.rng-state"
VERSION = 1

Generator = Any  # torch.Generator or numpy.random.Generator
_registry: dict[str, Generator] = {}


def register_generator(name: str, generator: Generator) -> None:
    """Include ``generator`` (a ``torch.Generator`` or ``numpy.random.Generator``) in every capture."""
    _kind_of(generator, name)
    _registry[name] = generator


def unregister_generator(name: str) -> None:
    """Stop including the generator registered as ``name``."""
    _registry.pop(name, None)


def _kind_of(gen: Generator, name: str) -> str:
    if isinstance(gen, torch.Generator):
        return "torch"
    if np is not None and isinstance(gen, np.random.Generator):
        return "numpy"
    raise TypeError(
        f"generator {name!r} must be a torch.Generator or numpy.random.Generator, got {type(gen).__name__}"
    )


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(bytes(t.cpu().tolist())).decode()


def _unb64(s: str) -> torch.Tensor:
    return torch.tensor(list(base64.b64decode(s, validate=True)), dtype=torch.uint8)


def _jsonable(obj: Any) -> Any:
    """Numpy scalars/arrays in bit_generator.state → plain JSON values."""
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if np is not None and isinstance(obj, np.ndarray):
        return {"__ndarray__": obj.dtype.str, "data": obj.tolist()}
    if np is not None and isinstance(obj, np.generic):
        return obj.item()
    return obj


def _from_jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        if "__ndarray__" in obj:
            return np.asarray(obj["data"], dtype=obj["__ndarray__"])
        return {k: _from_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_from_jsonable(v) for v in obj]
    return obj


@dataclass
class RNGState:
    """Every RNG state of this process: Python, NumPy global, torch CPU, each CUDA device, named generators.

    ``capture()`` takes it, ``restore()`` puts it back. ``to_dict()``/``from_dict()`` give the JSON-able
    form used by :func:`save_rng_state` and checkpoints.
    """

    python: Any
    numpy: dict[str, Any] | None
    torch_cpu: torch.Tensor
    cuda: list[torch.Tensor] = field(default_factory=list)
    generators: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def capture(cls, generators: Mapping[str, Generator] | None = None) -> RNGState:
        """Take the current state of all sources, plus registered and given ``generators`` (by name)."""
        gens: dict[str, dict[str, Any]] = {}
        for name, gen in {**_registry, **(generators or {})}.items():
            kind = _kind_of(gen, name)
            state = gen.get_state().clone() if kind == "torch" else _jsonable(gen.bit_generator.state)
            gens[name] = {"kind": kind, "state": state}
        np_state = None
        if np is not None:
            key_name, key, pos, has_gauss, cached = np.random.get_state()
            np_state = {"name": key_name, "key": key.tolist(), "pos": int(pos),
                        "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
        cuda = []
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            cuda = [s.clone() for s in torch.cuda.get_rng_state_all()]
        return cls(python=random.getstate(), numpy=np_state, torch_cpu=torch.get_rng_state(),
                   cuda=cuda, generators=gens)

    def _check_restorable(self, generators: Mapping[str, Generator], source: str) -> None:
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if len(self.cuda) > have:
            raise DeviceMismatchError(
                source, f"was captured with {len(self.cuda)} CUDA device(s) but this process has {have}.",
                "Restore it on a machine with as many GPUs, or limit the capture with CUDA_VISIBLE_DEVICES.",
            )
        for name, entry in self.generators.items():
            if name not in generators:
                raise MissingGeneratorError(
                    f"{source}: the state includes generator {name!r}, which was neither passed nor "
                    f"registered; pass generators={{{name!r}: gen}} or call register_generator({name!r}, gen)."
                )
            kind = _kind_of(generators[name], name)
            if kind != entry["kind"]:
                raise StateFileError(source, f"generator {name!r} was saved as a {entry['kind']} generator "
                                     f"but a {kind} generator was given.")

    def restore(self, generators: Mapping[str, Generator] | None = None, *, source: str = "RNGState") -> None:
        """Put every captured state back. Checks everything first, so a failure restores nothing."""
        gens = {**_registry, **(generators or {})}
        self._check_restorable(gens, source)
        if self.numpy is not None and np is None:
            raise StateFileError(source, "contains a NumPy RNG state but NumPy is not installed.",
                                 "Install numpy (pip install numpy) to restore it.")
        random.setstate(self.python)
        if self.numpy is not None:
            s = self.numpy
            np.random.set_state((s["name"], np.asarray(s["key"], dtype=np.uint32), s["pos"],
                                 s["has_gauss"], s["cached_gaussian"]))
        torch.set_rng_state(self.torch_cpu)
        for i, s in enumerate(self.cuda):
            torch.cuda.set_rng_state(s, i)
        for name, entry in self.generators.items():
            gen = gens[name]
            if entry["kind"] == "torch":
                gen.set_state(entry["state"])
            else:
                gen.bit_generator.state = _from_jsonable(entry["state"])

    # --- serialisation -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (no pickle needed to store or read it)."""
        version, internal, gauss = self.python
        gens = {
            name: {"kind": e["kind"], "state": _b64(e["state"]) if e["kind"] == "torch" else e["state"]}
            for name, e in self.generators.items()
        }
        return {"python": [version, list(internal), gauss], "numpy": self.numpy,
                "torch_cpu": _b64(self.torch_cpu), "cuda": [_b64(s) for s in self.cuda], "generators": gens}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "RNG state") -> RNGState:
        """Rebuild from :meth:`to_dict`; raises :class:`StateFileError` naming ``source`` on bad content."""
        try:
            version, internal, gauss = d["python"]
            python = (int(version), tuple(int(x) for x in internal), gauss)
            if len(python[1]) != 625:
                raise ValueError(f"Python state has {len(python[1])} words, expected 625")
            numpy_state = d["numpy"]
            if numpy_state is not None and len(numpy_state["key"]) != 624:
                raise ValueError("NumPy state key must have 624 words")
            torch_cpu = _unb64(d["torch_cpu"])
            if torch_cpu.numel() != torch.get_rng_state().numel():
                raise ValueError(f"torch CPU state has {torch_cpu.numel()} bytes, expected "
                                 f"{torch.get_rng_state().numel()}")
            cuda = [_unb64(s) for s in d["cuda"]]
            gens = {}
            for name, e in d["generators"].items():
                if e["kind"] not in ("torch", "numpy"):
                    raise ValueError(f"generator {name!r} has unknown kind {e['kind']!r}")
                state = _unb64(e["state"]) if e["kind"] == "torch" else e["state"]
                gens[name] = {"kind": e["kind"], "state": state}
        except (KeyError, TypeError, ValueError) as exc:
            raise StateFileError(source, f"is not a valid RNG state ({type(exc).__name__}: {exc}).",
                                 "Re-create it with torchrepro.save_rng_state().") from None
        return cls(python=python, numpy=numpy_state, torch_cpu=torch_cpu, cuda=cuda, generators=gens)


def _digest(state: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(state, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def save_rng_state(path: str | Path, state: RNGState | None = None) -> RNGState:
    """Write ``state`` (default: a fresh capture) to ``path`` atomically as versioned JSON; return it."""
    state = state or RNGState.capture()
    payload = state.to_dict()
    doc = {"format": FORMAT, "version": VERSION, "sha256": _digest(payload), "state": payload}
    atomic_write_bytes(path, json.dumps(doc).encode())
    return state


def read_rng_state(path: str | Path) -> RNGState:
    """Read and validate a file written by :func:`save_rng_state` without restoring it."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise StateFileError(path, "does not exist.", "Check the path, or create it with save_rng_state().") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StateFileError(path, f"is not a torchrepro RNG state file (not valid JSON: {exc}); it may be "
                             "truncated or of another format.", "Re-create it with save_rng_state().") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise StateFileError(path, f"has format {got!r}, expected {FORMAT!r}.",
                             "Pass a file written by torchrepro.save_rng_state().")
    if doc.get("version") != VERSION:
        raise StateFileError(path, f"has format version {doc.get('version')!r}; this torchrepro reads version "
                             f"{VERSION}.", "Upgrade torchrepro or re-create the file.")
    payload = doc.get("state")
    if not isinstance(payload, dict) or _digest(payload) != doc.get("sha256"):
        raise StateFileError(path, "is corrupt: its content does not match its checksum.",
                             "Restore it from a backup or re-create it with save_rng_state().")
    return RNGState.from_dict(payload, source=str(path))


def load_rng_state(path: str | Path, generators: Mapping[str, Generator] | None = None) -> RNGState:
    """Read ``path`` and restore every state in it (all or nothing); return the state."""
    state = read_rng_state(path)
    state.restore(generators, source=str(path))
    return state


@contextlib.contextmanager
def isolate_rng(generators: Mapping[str, Generator] | None = None) -> Iterator[RNGState]:
    """Run a block without disturbing any RNG: every state is restored on exit, even on exceptions.

    >>> import torch
    >>> with isolate_rng():
    ...     _ = torch.rand(3)
    """
    state = RNGState.capture(generators)
    try:
        yield state
    finally:
        state.restore(generators)
