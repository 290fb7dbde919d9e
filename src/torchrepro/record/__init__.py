"""Observe a run (layer 3): the launcher that runs an unmodified script, the step recorder, the op tracer,
compiled-region capture, run directories, output directories, metrics and the working-directory audit.
Imports ``env``, ``distributed``, ``control`` and ``_core``.
"""
