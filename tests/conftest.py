from __future__ import annotations

import os
import random
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from torchrepro.control.determinism import apply_config, current_config

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

# `python` in the commands that tests pass to `torchrepro check -- python ...` is looked up on PATH: make it
# this interpreter, as an activated virtual environment would.
os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])


# --- one temporary directory for the session ----------------------------------------------------------------------
# Every process the suite starts writes its temporary files (pytest's tmp_path folders, torchrun's torchelastic_*,
# the pymp-* of DataLoader workers that their script leaves, the CLI's own) into one directory made here and removed
# at the end: a run of the suite leaves nothing in /tmp, except this directory when a test failed (kept to be
# read, and said so). Made by the process that runs the session (xdist's controller: its workers inherit TMPDIR).
# Torch's compile cache stays where it was (torchinductor_USER in the temporary directory the suite started with):
# cold, tests/analysis/test_compile.py costs 103 CPU s instead of 72.
_SESSION_TMP = pytest.StashKey[Path]()
_SESSION_FAILED = pytest.StashKey[bool]()


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or os.environ.get("TORCHREPRO_TESTS_TMPDIR"):
        return  # an xdist worker, or a pytest run inside the suite: the session's directory is already set
    import getpass
    import tempfile

    try:
        user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())  # as torch._inductor's default_cache_dir()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"torchinductor_{user}"))
    tmp = Path(tempfile.mkdtemp(prefix="torchrepro-tests-"))
    os.environ["TMPDIR"] = os.environ["TORCHREPRO_TESTS_TMPDIR"] = str(tmp)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    config.stash[_SESSION_TMP] = tmp


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_SESSION_FAILED] = exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)


def pytest_unconfigure(config: pytest.Config) -> None:
    tmp = config.stash.get(_SESSION_TMP, None)
    if tmp is None:
        return
    if config.stash.get(_SESSION_FAILED, False):
        print(f"\nthe session's temporary files are kept in {tmp} (a test failed)", file=sys.stderr)
        return
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)


def _modules_with_module_fixtures() -> set[str]:
    """The test modules (as in test ids) that define a module-scoped fixture: recorded runs, a check, a bisect."""
    return {path.relative_to(ROOT).as_posix() for path in (ROOT / "tests").rglob("test_*.py")
            if re.search(r"""scope\s*=\s*["']module["']""", path.read_text(encoding="utf-8"))}


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadgroup`` (``make test``): the tests of a module with a module-scoped fixture go to one worker,
    which builds the fixture once; every other test goes to whichever worker is free, one at a time. (``--dist
    load`` sends chunks of consecutive tests: a module split between the workers built its fixture on each, up to a
    minute of training runs. pytest-xdist's own loadgroup reads ``xdist_group`` marks into the test ids, which
    pytest 9's ids no longer take: without this hook it groups nothing.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    grouped = _modules_with_module_fixtures()

    class ModuleFixtureGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in grouped else super()._split_scope(nodeid)

    return ModuleFixtureGroups(config, log)


@pytest.fixture(autouse=True)
def _restore_global_state():
    """Every test leaves env vars, RNGs, determinism flags and torch's thread count as it found them."""
    env = dict(os.environ)
    threads = torch.get_num_threads()
    config = current_config()
    py, npy, tc = random.getstate(), np.random.get_state(), torch.get_rng_state()
    yield
    os.environ.clear()
    os.environ.update(env)
    apply_config(config)
    random.setstate(py)
    np.random.set_state(npy)
    torch.set_rng_state(tc)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def run_python(code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 300):
    """Run ``code`` in a fresh interpreter; return CompletedProcess (text)."""
    import subprocess

    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=str(ROOT))


# --- `--cpu-top N`: the N tests that cost the most CPU time -----------------------------------------------------------
# The suite is CPU-bound (two workers on two cores): a test's wall time depends on what ran beside it, its CPU time
# much less. Each phase's CPU time is this process's plus that of the processes it started and waited for (the
# training runs, torchrun and its ranks; not a process left running). Measured in the worker, added to the test's
# report (user_properties), summed and printed by the process that prints the summary.
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-top", type=int, default=0, metavar="N",
                     help="print the N tests that used the most CPU time (theirs and their child processes')")


def _cpu_seconds() -> float:
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


_CPU_START = pytest.StashKey[float]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if item.config.getoption("cpu_top"):
        item.stash[_CPU_START] = _cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Each phase's CPU time: from the end of the phase before (or the test's start) to its report."""
    if _CPU_START in item.stash:
        now = _cpu_seconds()
        item.user_properties.append((f"cpu_s_{call.when}", now - item.stash[_CPU_START]))
        item.stash[_CPU_START] = now
    yield


_cpu_by_test: dict[str, dict[str, float]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for key, value in report.user_properties:
        if isinstance(key, str) and key.startswith("cpu_s_"):
            _cpu_by_test.setdefault(report.nodeid, {})[key[6:]] = value


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    n = config.getoption("cpu_top")
    if not n or not _cpu_by_test:
        return
    totals = {test: sum(phases.values()) for test, phases in _cpu_by_test.items()}
    terminalreporter.section(f"{n} tests that used the most CPU time (theirs and their processes')")
    for test in sorted(totals, key=totals.get, reverse=True)[:n]:
        phases = _cpu_by_test[test]
        where = max(phases, key=phases.get)
        terminalreporter.write_line(f"{totals[test]:7.2f}s cpu  ({where} {phases[where]:.2f}s)  {test}")
    terminalreporter.write_line(f"{sum(totals.values()):.0f} CPU seconds in all, over {len(totals)} tests")
