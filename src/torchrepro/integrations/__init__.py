"""Where torchrepro meets other tools (layer 6): the pytest plugin, and trainer callbacks. May import every
layer below.
"""
