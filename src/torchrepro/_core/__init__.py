"""The private foundation (layer 0): errors, atomic file writes, safe readers of untrusted JSON, tensor
fingerprints, torch-version shims, table formatting, module naming and the OpenMP team. Imports nothing else
from torchrepro.
"""
