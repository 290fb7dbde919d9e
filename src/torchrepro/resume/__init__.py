"""Save and resume training bit-for-bit (layer 2): checkpoints with every RNG and the data position, the
resumable DataLoader and worker seeding, and :func:`~torchrepro.verify_resume`. Imports ``control`` and ``_core``.
"""
