"""Explain runs (layer 4): step-by-step comparison and verdicts, op-level localisation (eager and compiled),
rank comparison, scans, environment diffs and plots. Imports ``record`` and everything below it.
"""
