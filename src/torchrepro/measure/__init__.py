"""Measure nondeterminism and its cost (layer 5): repeated calls of a model or function, run-to-run
statistics, and the models ``torchrepro bench`` times. Imports ``analysis`` and everything below it.
"""
