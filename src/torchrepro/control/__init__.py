"""Make a run reproducible (layer 1): seeding every RNG, deterministic mode, RNG state save/restore, per-op
policy and the registry of nondeterministic ops. Imports only :mod:`torchrepro._core`.
"""
