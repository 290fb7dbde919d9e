"""Start training scripts as ``python SCRIPT ARGS`` would, each in a new process of its own, forked from this one
after it imported the libraries they all import (Lightning or transformers: seconds of CPU in every process).

    python preloaded.py MODULE [MODULE ...]

imports the modules, then reads one JSON request a line from stdin, ``{"name", "argv": [SCRIPT, ARG ...], "cwd",
"stdout", "stderr"}``, starts that run at once, and prints ``{"name", "rc"}`` (a line of JSON) when it has ended;
it exits when stdin closes and its runs have ended (tests/preloaded.py drives it).

Each run is a new process for the script: this process trained and drew nothing (torch's global generator is
checked to be as its seed left it), torch's, Python's and NumPy's global RNGs are seeded from the OS again as a
new process seeds them, the script runs as ``__main__`` with ``sys.argv`` and ``sys.path[0]`` as ``python SCRIPT``
sets them, in its own working directory, its stdout and stderr go to files of its own, and the interpreter's exit
handlers run at its end. The processes a script starts (DDP ranks, DataLoader workers) start as they always do.
What the runs share is this process's str hash seed: tests/preloaded.py gives runs that must not share it
(an interrupted run and its resumption) different preloaded processes.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import random
import runpy
import select
import sys
import traceback


def _run(request: dict) -> int:
    """In the forked child: what ``python SCRIPT ARGS`` does, in ``cwd``; the exit code."""
    import numpy as np
    import torch

    os.chdir(request["cwd"])
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        f = os.open(path, flags, 0o644)
        os.dup2(f, fd)
        os.close(f)
    random.seed()  # from the OS, as each new process seeds them
    np.random.seed()
    torch.seed()
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    return code


def _start(request: dict) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        code = _run(request)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def main(modules: list[str]) -> int:
    for name in modules:
        importlib.import_module(name)
    import torch

    unused = torch.Generator().manual_seed(torch.initial_seed())
    assert torch.equal(torch.get_rng_state(), unused.get_state()), \
        "importing the preloaded modules drew from torch's global generator"
    print(json.dumps({"ready": os.getpid()}), flush=True)
    running: dict[int, str] = {}
    pending, open_ = b"", True  # os.read, not sys.stdin: select cannot see lines that sys.stdin has buffered
    while open_ or running:
        if open_ and select.select([0], [], [], 0.1)[0]:
            data = os.read(0, 1 << 16)
            open_ = bool(data)
            pending += data
            while b"\n" in pending:
                line, _, pending = pending.partition(b"\n")
                if line.strip():
                    request = json.loads(line)
                    running[_start(request)] = request["name"]
        elif not open_:
            pid, status = os.wait()
            print(json.dumps({"name": running.pop(pid), "rc": os.waitstatus_to_exitcode(status)}), flush=True)
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if not pid:
                break
            print(json.dumps({"name": running.pop(pid), "rc": os.waitstatus_to_exitcode(status)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
