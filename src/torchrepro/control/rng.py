"""Capture, restore, save and load every RNG state.

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
import binascii
import contextlib
import copy
import hashlib
import json
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from .._core.compat import np
from .._core.errors import DeviceMismatchError, MissingGeneratorError, StateFileError
from .._core.io import atomic_write_bytes
from .._core.naming import renamed
from .._core.readjson import read_bytes

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


def _unb64(s: Any, field: str) -> torch.Tensor:
    """Decode a base64 state; ValueError naming ``field`` when it is not non-empty base64 text."""
    if not isinstance(s, str):
        raise ValueError(f"field {field!r} is a {type(s).__name__}, expected base64 text")
    try:
        raw = base64.b64decode(s, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"field {field!r} is not valid base64 ({exc})") from None
    if not raw:
        raise ValueError(f"field {field!r} is empty, expected a generator state")
    return torch.tensor(list(raw), dtype=torch.uint8)


# --- validation: everything is checked before any state is set ------------------------------------------
_WORD = 2**32  # MT19937 words are 32-bit
_MT_WORDS = 624
_NUMPY_FIELDS = ("name", "key", "pos", "has_gauss", "cached_gaussian")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_words(words: Any, field: str) -> list[int]:
    """The 624 32-bit words of an MT19937 state; ValueError naming ``field`` and the first bad word."""
    if not isinstance(words, (list, tuple)) or len(words) != _MT_WORDS:
        got = f"{len(words)} words" if isinstance(words, (list, tuple)) else f"a {type(words).__name__}"
        raise ValueError(f"field {field!r} has {got}, expected {_MT_WORDS}")
    for i, w in enumerate(words):
        if not _is_int(w) or not 0 <= w < _WORD:
            raise ValueError(f"field {field!r} word {i} is {w!r}, expected an integer in [0, 2**32)")
    return list(words)


def _check_index(value: Any, field: str) -> int:
    if not _is_int(value) or not 0 <= value <= _MT_WORDS:
        raise ValueError(f"field {field!r} is {value!r}, expected an integer in [0, {_MT_WORDS}]")
    return cast(int, value)


def _python_state(value: Any) -> tuple[int, tuple[int, ...], float | None]:
    """Python ``random``'s state ``(3, 625 ints, gauss_next)`` from its JSON form, fully checked."""
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise ValueError(f"field 'python' is {type(value).__name__} {str(value)[:40]}, expected "
                         "[3, [625 integers], gauss_next]")
    version, internal, gauss = value
    if version != 3 or not _is_int(version):
        raise ValueError(f"field 'python' has version {version!r}, expected 3")
    if not isinstance(internal, (list, tuple)) or len(internal) != _MT_WORDS + 1:
        got = f"{len(internal)} words" if isinstance(internal, (list, tuple)) else f"a {type(internal).__name__}"
        raise ValueError(f"field 'python' state has {got}, expected {_MT_WORDS + 1}")
    words = _check_words(internal[:_MT_WORDS], "python")
    pos = _check_index(internal[_MT_WORDS], "python position")
    if gauss is not None and not _is_number(gauss):
        raise ValueError(f"field 'python' gauss_next is {gauss!r}, expected null or a number")
    return 3, (*words, pos), None if gauss is None else float(gauss)


def _numpy_state(value: Any) -> dict[str, Any] | None:
    """NumPy's global (legacy MT19937) state from its JSON form, fully checked; None stays None."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"field 'numpy' is a {type(value).__name__}, expected null or an object with "
                         f"{', '.join(_NUMPY_FIELDS)}")
    missing = [f for f in _NUMPY_FIELDS if f not in value]
    if missing:
        raise ValueError(f"field 'numpy' lacks {', '.join(missing)}")
    if value["name"] != "MT19937":
        raise ValueError(f"field 'numpy.name' is {value['name']!r}, expected 'MT19937' (the bit generator of "
                         "NumPy's global RNG)")
    key = _check_words(value["key"], "numpy.key")
    pos = _check_index(value["pos"], "numpy.pos")
    if value["has_gauss"] not in (0, 1) or not _is_int(value["has_gauss"]):
        raise ValueError(f"field 'numpy.has_gauss' is {value['has_gauss']!r}, expected 0 or 1")
    if not _is_number(value["cached_gaussian"]):
        raise ValueError(f"field 'numpy.cached_gaussian' is {value['cached_gaussian']!r}, expected a number")
    return {"name": "MT19937", "key": key, "pos": pos, "has_gauss": value["has_gauss"],
            "cached_gaussian": float(value["cached_gaussian"])}


def _check_size(state: Any, expected: int, field: str) -> None:
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.numel() != expected:
        got = f"{state.numel()} bytes" if isinstance(state, torch.Tensor) else f"a {type(state).__name__}"
        raise ValueError(f"field {field!r} has {got}, expected {expected} bytes")


def _cuda_device_count() -> int:
    """CUDA devices whose RNG this process can use, initialising CUDA if nothing has yet.

    0 without CUDA, in a fork of a process that had initialised CUDA, or when CUDA fails to start: in each case
    nothing in this process can draw from (and so advance) a CUDA RNG.
    """
    if not torch.cuda.is_available() or getattr(torch.cuda, "_is_in_bad_fork", lambda: False)():
        return 0
    try:
        torch.cuda.init()  # runs seeds queued before initialisation, so the states read next include them
    except RuntimeError:
        return 0
    return torch.cuda.device_count()


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
        if "__ndarray__" in obj and np is not None:
            return np.asarray(obj["data"], dtype=obj["__ndarray__"])
        return {k: _from_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_from_jsonable(v) for v in obj]
    return obj


_RECREATE = "Re-create it with torchrepro.save_rng_state() (or the checkpoint with save_checkpoint())."


def _generator_entry(name: Any, entry: Any) -> dict[str, Any]:
    """One named generator's saved state from its JSON form, checked as far as possible without the generator."""
    field_name = f"generators.{name}"
    if not isinstance(entry, Mapping) or "kind" not in entry or "state" not in entry:
        raise ValueError(f"field {field_name!r} is {str(entry)[:60]}, expected an object with kind and state")
    if entry["kind"] == "torch":
        return {"kind": "torch", "state": _unb64(entry["state"], f"{field_name}.state")}
    if entry["kind"] == "numpy":
        if not isinstance(entry["state"], Mapping):
            raise ValueError(f"field '{field_name}.state' is a {type(entry['state']).__name__}, expected the "
                             "object of a numpy bit_generator.state")
        return {"kind": "numpy", "state": dict(entry["state"])}
    raise ValueError(f"field '{field_name}.kind' is {entry['kind']!r}, expected 'torch' or 'numpy'")


@dataclass
class RNGState:
    """Every RNG state of this process: Python, NumPy global, torch CPU, each CUDA device, named generators.

    ``capture()`` takes it, ``restore()`` puts it back. ``to_json()``/``from_dict()`` give the JSON-able
    form used by :func:`save_rng_state` and checkpoints.

    When CUDA is available, ``capture()`` includes every CUDA device even if nothing has used CUDA yet: it then
    initialises CUDA (a one-off start-up cost per process; the generators' states live on the host), because a
    state taken before the first CUDA use must still put back the CUDA RNG that this first use advances. In a
    process forked after its parent initialised CUDA (where CUDA cannot be used at all) CUDA is left out.
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
        cuda = list(torch.cuda.get_rng_state_all()) if _cuda_device_count() else []
        return cls(python=random.getstate(), numpy=np_state, torch_cpu=torch.get_rng_state(),
                   cuda=cuda, generators=gens)

    def check(self, generators: Mapping[str, Generator] | None = None, *, source: str = "RNGState") -> None:
        """Raise exactly what :meth:`restore` would raise, without changing any state."""
        self._validate({**_registry, **(generators or {})}, source)

    def _validate(self, gens: Mapping[str, Generator], source: str) -> tuple[Any, dict[str, Any] | None]:
        """Check every part against this process; return the Python and NumPy states ready to set."""
        try:
            python, numpy_state = _python_state(self.python), _numpy_state(self.numpy)
            _check_size(self.torch_cpu, torch.get_rng_state().numel(), "torch_cpu")
        except ValueError as exc:
            raise StateFileError(source, f"is not a valid RNG state ({exc}).", _RECREATE) from None
        if numpy_state is not None and np is None:
            raise StateFileError(source, "contains a NumPy RNG state but NumPy is not installed.",
                                 "Install numpy (pip install numpy) to restore it.")
        have = _cuda_device_count() if self.cuda else 0
        if len(self.cuda) > have:
            raise DeviceMismatchError(
                source, f"was captured with {len(self.cuda)} CUDA device(s) but this process has {have}.",
                "Restore it on a machine with as many GPUs, or limit the capture with CUDA_VISIBLE_DEVICES.",
            )
        for i, s in enumerate(self.cuda):
            try:
                _check_size(s, torch.cuda.get_rng_state(i).numel(), f"cuda[{i}]")
            except ValueError as exc:
                raise StateFileError(source, f"is not a valid RNG state ({exc}).", _RECREATE) from None
        for name, entry in self.generators.items():
            if name not in gens:
                raise MissingGeneratorError(
                    f"{source}: the state includes generator {name!r}, which was neither passed nor "
                    f"registered; pass generators={{{name!r}: gen}} or call register_generator({name!r}, gen)."
                )
            kind = _kind_of(gens[name], name)
            if kind != entry["kind"]:
                raise StateFileError(source, f"generator {name!r} was saved as a {entry['kind']} generator "
                                     f"but a {kind} generator was given.")
            self._check_generator_state(name, entry["state"], gens[name], source)
        return python, numpy_state

    @staticmethod
    def _check_generator_state(name: str, state: Any, gen: Generator, source: str) -> None:
        if isinstance(gen, torch.Generator):
            try:
                _check_size(state, gen.get_state().numel(), f"generators.{name}.state")
            except ValueError as exc:
                raise StateFileError(source, f"is not a valid RNG state ({exc}; the generator given is on "
                                     f"{gen.device}).", _RECREATE) from None
            return
        scratch = copy.deepcopy(gen.bit_generator)  # try the state on a copy: the real one stays untouched
        try:
            scratch.state = _from_jsonable(state)
        except Exception as exc:  # numpy raises TypeError, ValueError, KeyError or OverflowError here
            raise StateFileError(source, f"is not a valid RNG state (field 'generators.{name}.state' does not fit "
                                 f"the {type(scratch).__name__} bit generator given: {type(exc).__name__}: {exc}).",
                                 _RECREATE) from None

    def restore(self, generators: Mapping[str, Generator] | None = None, *, source: str = "RNGState") -> None:
        """Put every captured state back. Checks everything first, so a failure restores nothing."""
        gens = {**_registry, **(generators or {})}
        python, numpy_state = self._validate(gens, source)
        random.setstate(python)
        s: Any
        if numpy_state is not None:
            s = numpy_state
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
    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (no pickle needed to store or read it)."""
        version, internal, gauss = self.python
        gens = {
            name: {"kind": e["kind"], "state": _b64(e["state"]) if e["kind"] == "torch" else e["state"]}
            for name, e in self.generators.items()
        }
        return {"python": [version, list(internal), gauss], "numpy": self.numpy,
                "torch_cpu": _b64(self.torch_cpu), "cuda": [_b64(s) for s in self.cuda], "generators": gens}
    to_dict = renamed("to_json", "to_dict")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "RNG state") -> RNGState:
        """Rebuild from :meth:`to_json`; raises :class:`StateFileError` naming ``source`` and the bad field."""
        try:
            return parse_state(d)
        except ValueError as exc:
            raise StateFileError(source, f"is not a valid RNG state ({exc}).", _RECREATE) from None


def parse_state(d: Any) -> RNGState:
    """:meth:`RNGState.from_dict` without a source: raises ``ValueError`` naming the bad field."""
    if not isinstance(d, Mapping):
        raise ValueError(f"it is a {type(d).__name__}, expected an object")
    missing = [k for k in ("python", "numpy", "torch_cpu", "cuda", "generators") if k not in d]
    if missing:
        raise ValueError(f"field(s) {', '.join(missing)} missing")
    python, numpy_state = _python_state(d["python"]), _numpy_state(d["numpy"])
    torch_cpu = _unb64(d["torch_cpu"], "torch_cpu")
    _check_size(torch_cpu, torch.get_rng_state().numel(), "torch_cpu")
    if not isinstance(d["cuda"], list):
        raise ValueError(f"field 'cuda' is a {type(d['cuda']).__name__}, expected a list")
    cuda = [_unb64(s, f"cuda[{i}]") for i, s in enumerate(d["cuda"])]
    if not isinstance(d["generators"], Mapping):
        raise ValueError(f"field 'generators' is a {type(d['generators']).__name__}, expected an object mapping "
                         "generator names to states")
    gens = {name: _generator_entry(name, e) for name, e in d["generators"].items()}
    return RNGState(python=python, numpy=numpy_state, torch_cpu=torch_cpu, cuda=cuda, generators=gens)


def _digest(state: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(state, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def save_rng_state(path: str | Path, state: RNGState | None = None) -> RNGState:
    """Write ``state`` (default: a fresh capture) to ``path`` atomically as versioned JSON; return it."""
    state = state or RNGState.capture()
    payload = state.to_json()
    doc = {"format": FORMAT, "version": VERSION, "sha256": _digest(payload), "state": payload}
    atomic_write_bytes(path, json.dumps(doc).encode())
    return state


def read_rng_state(path: str | Path) -> RNGState:
    """Read and validate a file written by :func:`save_rng_state` without restoring it."""
    path = Path(path)
    if path.is_dir():
        raise StateFileError(path, "is a directory, not an RNG state file.",
                             "Pass the path of a file written by save_rng_state().")
    # Untrusted input: a regular file only (a FIFO would block, /dev/zero never end), of bounded size.
    raw = read_bytes(path, error=StateFileError, action="Check the path, or create it with save_rng_state().")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StateFileError(path, f"is not a torchrepro RNG state file (not valid JSON: {exc}); it may be "
                             "truncated or of another format.", "Re-create it with save_rng_state().") from None
    except (RecursionError, ValueError) as exc:  # nested too deeply; an integer of more digits than int() reads
        why = "it is nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(";")[0]
        raise StateFileError(path, f"is not a torchrepro RNG state file (its JSON cannot be read: {why}).",
                             "Re-create it with save_rng_state().") from None
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
