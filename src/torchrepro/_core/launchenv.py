"""The process environment as it was when torchrepro was first imported, before seeding changed it."""

from __future__ import annotations

import os

LAUNCH_HASHSEED: str | None = os.environ.get("PYTHONHASHSEED")
