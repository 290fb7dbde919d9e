"""Reproducibility across ranks (layer 2): rank-aware seeding, RNG synchronisation and consistency checks of
parameters, gradients and optimizer state. Imports ``control`` and ``_core``.
"""
