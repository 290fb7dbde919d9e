"""The private foundation (layer 0): errors, atomic file writes, safe readers of untrusted JSON, tensor
fingerprints, torch-version shims, table formatting, module naming, the OpenMP team, and the rows of the registry of
nondeterministic ops as plain data (``nondet_ops``, standard library only: the linter reads it too). Imports nothing
else from torchrepro.
"""
