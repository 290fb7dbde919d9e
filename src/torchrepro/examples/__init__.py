"""Example training scripts shipped in the package, so that ``torchrepro check`` can be tried right after
``pip install torchrepro``, without a script of one's own::

    torchrepro check -- python -m torchrepro.examples.scatter_gnn
    torchrepro check --deterministic -- python -m torchrepro.examples.scatter_gnn

They are plain scripts that import only torch (``examples/`` in the source tree holds the same ones).
"""
