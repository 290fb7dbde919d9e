"""The environment of a run (layer 2): its fingerprint (versions, flags, hardware, environment variables) and
the reproducibility checklist (``audit``). Imports ``control`` and ``_core``; its *diff* is analysis.
"""
