"""One rank of a 2-process DDP run (gloo, CPU) of a script, started as ``torchrun --standalone --nproc-per-node N``
starts each of its ranks: the script runs as ``__main__`` with the environment variables torchrun gives a rank.

    python transformers_ddp_rank.py RANK WORLD_SIZE MASTER_PORT SCRIPT [ARG ...]

For tests/integrations/test_transformers.py, whose ranks run forked from processes that imported transformers
once (tests/preloaded.py) instead of each importing it again under torchrun (about 5 s of CPU a rank).
"""

import os
import runpy
import sys

rank, world, port, script = sys.argv[1:5]
os.environ.update({
    "RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": world, "LOCAL_WORLD_SIZE": world, "GROUP_RANK": "0",
    "GROUP_WORLD_SIZE": "1", "ROLE_RANK": rank, "ROLE_WORLD_SIZE": world, "ROLE_NAME": "default",
    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "OMP_NUM_THREADS": "1",
})
sys.argv = sys.argv[4:]
sys.path[0] = os.path.dirname(os.path.abspath(script))
runpy.run_path(script, run_name="__main__")
