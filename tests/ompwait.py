"""How the processes a test starts wait for OpenMP work.

tests/conftest.py sets ``OMP_WAIT_POLICY=PASSIVE`` for every process the tests start: an idle OpenMP thread sleeps
instead of spinning, which leaves the two cores to the other worker's runs. A sleeping thread takes a moment to wake
for the next parallel region, so the races of small kernels (a compiled embedding's backward, a scatter of a few
thousand rows) show less often. Tests whose verdict needs such a race start their runs inside
:func:`default_omp_wait`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def default_omp_wait() -> Iterator[None]:
    """Processes started inside wait for OpenMP work as OpenMP does by default (spinning a little first)."""
    saved = os.environ.pop("OMP_WAIT_POLICY", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["OMP_WAIT_POLICY"] = saved
