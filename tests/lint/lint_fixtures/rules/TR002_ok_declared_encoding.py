# -*- coding: latin-1 -*-
"""Near miss for TR002: Latin-1 bytes in a file that declares its encoding."""

name = "café"  # ok
