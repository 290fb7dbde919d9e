"""The torchrepro pytest plugin: one session seed, a seed per test, and the ``reproducible`` marker.

Registered through the ``pytest11`` entry point, so its option, fixture and marker exist in every pytest session of
an environment where torchrepro is installed -- but it reseeds nothing unless the project asks for it: per-test
seeding is **opt-in**, so installing torchrepro never changes the random numbers of another project's tests.

* Switch per-test seeding on with ``--torchrepro-seed N`` on the command line, or for a project with
  ``torchrepro_seed = N`` in its pytest configuration (``[tool.pytest.ini_options]``, ``pytest.ini``, ...).
  ``TORCHREPRO_SEED`` then overrides the ini value (not the command line). The header says that it is on, with
  which seed and from where; when it is off the plugin prints nothing and seeds nothing.
* Each test gets ``derive_seed(N, "pytest", node id)``: Python ``random``, NumPy's global RNG (when NumPy is
  imported), torch's CPU generator and every accelerator's are seeded with it before the test's fixtures are set
  up, and again just before the test body unless a fixture has seeded torch itself (``torch.initial_seed()``
  changed), so fixtures that draw random numbers (also session fixtures created by whichever test comes first)
  do not make the body's numbers depend on test order. Environment variables are left alone: processes a test
  starts are not affected.
* The ``torchrepro_seed`` fixture is the test's seed (to seed a ``torch.Generator`` of the test's own); it works
  whether seeding is on or not (with session seed ``TORCHREPRO_SEED``, else 0, when it is off).
* ``@pytest.mark.reproducible(runs=2)`` runs the test body ``runs`` times from the same RNG state and fails unless
  what it returns (tensors, numbers, or structures of them; modules and optimizers by their ``state_dict()``,
  other objects by their attributes) is bitwise equal every time; ``atol=``/``rtol=`` allow a tolerance (see
  ``torchrepro.TOLERANCES``). A returned object with nothing to compare (``object()``, a function) fails the test
  with a message saying what to return instead. The marker is a per-test opt-in and works whether per-test
  seeding is on or not.
"""

from __future__ import annotations

import inspect
import random
import sys
from typing import Any

import pytest

from ..control._seeds import derive_seed, seed_from_env, validate_seed  # no torch: pytest starts fast

DEFAULT_SEED = 0
INI = "torchrepro_seed"
_SESSION = pytest.StashKey[tuple[int, str]]()
_ACTIVE = pytest.StashKey[bool]()
_TEST_SEED = pytest.StashKey[int]()


def _seed_option(text: str, *, what: str = "--torchrepro-seed") -> int:
    try:
        return validate_seed(int(text), what=what)
    except ValueError as exc:
        raise pytest.UsageError(str(exc) if "must be" in str(exc) else
                                f"{what} must be an integer in [0, 4294967295], got {text!r}") from None


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("torchrepro", "torchrepro: per-test seeds and reproducibility checks")
    group.addoption("--torchrepro-seed", metavar="N", type=_seed_option, default=None,
                    help="switch per-test seeding on: each test's seed is derived from session seed N (off unless "
                         f"this or the ini option {INI} is given)")
    parser.addini(INI, default=None,
                  help="switch per-test seeding on for this project, from this session seed (TORCHREPRO_SEED "
                       "overrides it; --torchrepro-seed overrides both)")


def _session_seed(config: pytest.Config) -> tuple[int, str, bool]:
    """(seed, where it came from, whether per-test seeding is on)."""
    seed = config.getoption("torchrepro_seed", None)
    if seed is not None:
        return seed, "--torchrepro-seed", True
    try:
        from_env = seed_from_env()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    ini = config.getini(INI)
    if ini not in (None, "", []):
        if from_env is not None:
            return from_env, "TORCHREPRO_SEED", True
        return _seed_option(str(ini).strip(), what=f"the ini option {INI}"), f"ini option {INI}", True
    return (from_env, "TORCHREPRO_SEED", False) if from_env is not None else (DEFAULT_SEED, "default", False)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "reproducible(runs=2, atol=0, rtol=0): run the test body `runs` times from the same seed and "
                   "fail unless the tensors it returns are bitwise equal (or within atol/rtol)")
    seed, source, active = _session_seed(config)
    config.stash[_SESSION] = (seed, source)
    config.stash[_ACTIVE] = active


def pytest_report_header(config: pytest.Config) -> str | None:
    if not config.stash.get(_ACTIVE, False):
        return None  # off: nothing seeded, nothing said
    seed, source = config.stash[_SESSION]
    return (f"torchrepro: per-test seeding on, seed {seed} ({source}); each test is seeded with derive_seed({seed}, "
            f"'pytest', node id); repeat with --torchrepro-seed {seed}")


def seed_for(config: pytest.Config, nodeid: str) -> int:
    """The seed of the test with ``nodeid`` in this session."""
    return derive_seed(config.stash[_SESSION][0], "pytest", nodeid)


def _seed_all(seed: int) -> None:
    """Seed Python, NumPy (if imported) and torch (if imported): CPU and every accelerator. No env vars."""
    random.seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed)
    torch = sys.modules.get("torch")
    if torch is not None:
        from .._core import compat as _compat

        torch.manual_seed(seed)  # CUDA's generators too (lazily, without starting CUDA)
        for name, mod in _compat.accelerator_modules().items():
            if name != "cuda" and hasattr(mod, "manual_seed"):
                mod.manual_seed(seed)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if not item.config.stash.get(_ACTIVE, False):
        return
    seed = item.stash[_TEST_SEED] = seed_for(item.config, item.nodeid)
    _seed_all(seed)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    seed = item.stash.get(_TEST_SEED, None)
    torch = sys.modules.get("torch")
    if seed is not None and (torch is None or torch.initial_seed() == seed):
        _seed_all(seed)  # undo what fixtures drew, unless one of them seeded torch on purpose


@pytest.fixture
def torchrepro_seed(request: pytest.FixtureRequest) -> int:
    """This test's seed (derived from the session seed and the test's node id)."""
    return seed_for(request.config, request.node.nodeid)


def _marker_options(marker: pytest.Mark) -> tuple[int, float, float]:
    runs = marker.args[0] if len(marker.args) == 1 else marker.kwargs.get("runs", 2)
    atol, rtol = marker.kwargs.get("atol", 0.0), marker.kwargs.get("rtol", 0.0)
    wrong = (len(marker.args) > 1 or (marker.args and "runs" in marker.kwargs)
             or set(marker.kwargs) - {"runs", "atol", "rtol"} or isinstance(runs, bool) or not isinstance(runs, int)
             or runs < 2 or not all(isinstance(x, (int, float)) and x >= 0 for x in (atol, rtol)))
    if wrong:
        pytest.fail(f"@pytest.mark.reproducible takes runs (an integer >= 2), atol and rtol (numbers >= 0); got "
                    f"args {marker.args}, kwargs {marker.kwargs}", pytrace=False)
    return runs, float(atol), float(rtol)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    marker = pyfuncitem.get_closest_marker("reproducible")
    if marker is None:
        return None
    runs, atol, rtol = _marker_options(marker)
    from ..measure.assertdet import (  # only tests with the marker need them
        UncomparableResultError,
        find_nondeterminism,
    )
    function = pyfuncitem.obj
    if inspect.iscoroutinefunction(function):
        pytest.fail("@pytest.mark.reproducible does not support async tests", pytrace=False)
    kwargs = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    returned: list[Any] = []

    def body() -> Any:
        returned.append(function(**kwargs))
        return returned[-1]

    try:
        message = find_nondeterminism(body, runs=runs, atol=atol, rtol=rtol, what=f"test {pyfuncitem.name}")
    except UncomparableResultError as exc:  # what the test returned holds nothing to compare: say so, no verdict
        pytest.fail(str(exc), pytrace=False)
    if all(r is None for r in returned):
        pytest.fail(f"@pytest.mark.reproducible: {pyfuncitem.name} returned nothing, so there is nothing to compare; "
                    "return the tensors (or a tuple/dict of them) that must come out the same in every run.",
                    pytrace=False)
    if message is not None:
        seed = pyfuncitem.stash.get(_TEST_SEED, None)
        where = (f"test seed {seed}; session seed {pyfuncitem.config.stash[_SESSION][0]}" if seed is not None else
                 "per-test seeding off: --torchrepro-seed N seeds each test")
        pytest.fail(f"{message}\n({where})", pytrace=False)
    return True
