"""``check --parallel``: every run at once, compared step by step as they record.

Each run is launched from a thread of its own (the launches are the same as one after the other: same child
environment, same options); every run compares all runs with run 1 as they go
(:class:`~torchrepro.record.divergence.DivergenceWatch`) and all stop the same number of steps after the first
divergence. Nothing is done to the runs' threads: on CPU each run keeps the thread count it would have alone
(torch sizes its pools from the machine, not from its load), so numerics do not change because the runs share the
machine; they only take longer each. On a machine with a GPU per run, each run gets its own
(``CUDA_VISIBLE_DEVICES``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from .._core.errors import Interrupted
from .launcher import FORWARDED, RunResult, interrupt_all
from .outdir import check_run_dir, clear_run_dir, make_dir

Run = TypeVar("Run")  # a run as the loop prepared it (record.runs.PlannedRun)

GPU_PROC = Path("/proc/driver/nvidia/gpus")
CTRL_C_GRACE_S = 2.0  # after a Ctrl-C, the scripts (which got it from the terminal) get this long before SIGINT


def gpu_ids(environ: dict[str, str] | None = None, proc: Path = GPU_PROC) -> list[str]:
    """The GPUs the runs may use, without importing torch: ``CUDA_VISIBLE_DEVICES`` when set, else the NVIDIA
    driver's list (Linux).

    >>> gpu_ids({"CUDA_VISIBLE_DEVICES": "2,3"}), gpu_ids({"CUDA_VISIBLE_DEVICES": ""})
    (['2', '3'], [])
    """
    env = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in env:
        ids = [x.strip() for x in env["CUDA_VISIBLE_DEVICES"].split(",") if x.strip()]
        return [] if ids[:1] == ["-1"] else ids
    try:
        return [str(i) for i in range(len(list(proc.iterdir())))]
    except OSError:
        return []


def devices_for(n: int, environ: dict[str, str] | None = None, proc: Path = GPU_PROC) -> list[str] | None:
    """One GPU per run when there are at least ``n``; None otherwise (the runs see what they would alone).

    >>> devices_for(2, {"CUDA_VISIBLE_DEVICES": "0,1,2"}), devices_for(3, {"CUDA_VISIBLE_DEVICES": "0,1"})
    (['0', '1'], None)
    """
    ids = gpu_ids(environ, proc)
    return ids[:n] if len(ids) >= n else None


def run_parallel(dirs: list[Path], prepare: list[Callable[[Path, str | None], Run]],
                 launch_one: Callable[[int, Run, Path], RunResult]) -> list[RunResult]:
    """Launch a run into each of ``dirs`` at once (``prepare[k](dirs[k], device)`` gives run k its directory,
    working directory and GPU if each run gets one, ``launch_one(k, run, dirs[k])`` runs it, in a thread of its
    own); return their results in order. When this process got SIGINT, SIGTERM or SIGHUP, every run is stopped and
    Interrupted is raised once all have ended."""
    for run_dir in dirs:  # no run reads what an earlier check left in a directory beside it
        check_run_dir(run_dir, flag="--out")
        make_dir(run_dir, flag="--out", parents=True)
        clear_run_dir(run_dir)
    devices = devices_for(len(dirs))
    plans = [prepare[k](run_dir, None if devices is None else devices[k]) for k, run_dir in enumerate(dirs)]
    results: list[RunResult | None] = [None] * len(dirs)
    errors: list[BaseException | None] = [None] * len(dirs)

    def work(k: int) -> None:
        try:
            results[k] = launch_one(k, plans[k], dirs[k])
        except BaseException as exc:  # noqa: BLE001 - raised in the main thread below
            errors[k] = exc

    threads = [threading.Thread(target=work, args=(k,), name=f"torchrepro-run{k + 1}") for k in range(len(dirs))]
    with _forwarding():
        for t in threads:
            t.start()
        _join(threads)
    for exc in [e for e in errors if isinstance(e, Interrupted)] + [e for e in errors if e is not None]:
        raise exc
    return [r for r in results if r is not None]


@contextlib.contextmanager
def _forwarding() -> Iterator[None]:
    """SIGTERM/SIGHUP to this process stop every run (the launches' threads cannot install handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, lambda signum, frame: interrupt_all(signum)) for sig in FORWARDED}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _join(threads: list[threading.Thread]) -> None:
    """Wait for every thread; on Ctrl-C give the scripts CTRL_C_GRACE_S to end, then pass SIGINT on."""
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.2)
    except KeyboardInterrupt:
        interrupt_all(signal.SIGINT, forward=False)
        deadline = time.monotonic() + CTRL_C_GRACE_S
        while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
            time.sleep(0.05)
        interrupt_all(signal.SIGINT)
        for t in threads:
            t.join()
