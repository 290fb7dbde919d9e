"""A real browser for the report tests: Debian's chromium, headless (``.ci/run`` installs it when missing)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium() -> str:
    """The browser's path; the test is skipped, saying why, only when none is installed."""
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no chromium to render the report (install it: `apt-get install -y chromium`; .ci/run does)")


def _run(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="torchrepro-chromium-") as profile:  # never the user's profile
        return subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                               "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "HOME": profile})


def dump_dom(page: Path) -> str:
    """The DOM after the page's scripts ran, as the browser serialises it."""
    p = _run("--virtual-time-budget=2000", "--dump-dom", page.resolve().as_uri())
    assert p.returncode == 0 and "<html" in p.stdout, p.stderr[-2000:]
    return p.stdout


def screenshot(page: Path, png: Path, *, width: int = 1200, height: int = 2000, dark: bool = False) -> Path:
    """A PNG of the page as a reader sees it (``dark``: with the system in dark mode)."""
    extra = ["--blink-settings=preferredColorScheme=0"] if dark else []
    p = _run(f"--window-size={width},{height}", f"--screenshot={png}", *extra, page.resolve().as_uri())
    assert p.returncode == 0 and png.exists(), p.stderr[-2000:]
    return png


def ink(png: Path) -> tuple[float, int]:
    """(share of pixels that differ from the background, number of distinct colours): 0 and 1 for a blank page."""
    import numpy as np
    from PIL import Image

    im = Image.open(png).convert("RGB")
    small = np.asarray(im.resize((im.width // 4, im.height // 4)), dtype=np.uint8).reshape(-1, 3)
    colours, counts = np.unique(small, axis=0, return_counts=True)
    return 1 - counts.max() / len(small), len(colours)


NETWORK = re.compile(r"""(?:src|href|action|srcset|poster|data)\s*=\s*["']?\s*(?:[a-z][a-z0-9+.-]*:|//)""", re.I)


def network_references(html: str) -> list[str]:
    """Everything in the page that would make a browser fetch from elsewhere (the SVG namespace is a name, not a
    reference, and is left out)."""
    found = [m.group(0) for m in NETWORK.finditer(html)]
    found += re.findall(r"url\(|@import|<link\b|<iframe\b|<img\b|<object\b|<embed\b|fetch\(|XMLHttpRequest", html)
    return found
