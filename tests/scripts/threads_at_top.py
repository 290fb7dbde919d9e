"""Sets its thread count in the environment before it imports torch, as data-loading scripts often do, then trains
the scatter-add GNN of examples/scatter_gnn.py (nondeterministic with 2+ CPU threads, deterministic with one).

``threads_at_top.py VAR=VALUE [--after]``: ``os.environ[VAR] = VALUE`` before ``import torch`` (with ``--after``:
after it, where torch no longer reads it). Prints ``threads N at the start`` (torch.get_num_threads()), then
the example's losses.
"""
import os
import sys

var, _, value = sys.argv[1].partition("=")
if "--after" not in sys.argv:
    os.environ[var] = value

import torch  # noqa: E402 - the point of the script: the environment is set first

if "--after" in sys.argv:
    os.environ[var] = value
print(f"threads {torch.get_num_threads()} at the start", flush=True)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import scatter_gnn  # noqa: E402 - imports torch once more: after --after's setting

sys.argv = [sys.argv[0], "--steps", "3"]
scatter_gnn.main()
