"""Wait until the file READY exists, then run SCRIPT as ``python SCRIPT ARG ...`` would.

    python transformers_when_ready.py READY SCRIPT [ARG ...]

For tests/integrations/test_transformers.py: its refused resumes (hf_errors.py) run forked from a process that
imported transformers (tests/preloaded.py), beside the runs whose checkpoints they resume; the test writes READY
once those runs have ended and the damaged copies of their checkpoints are made.
"""

import os
import runpy
import sys
import time

ready, script = sys.argv[1:3]
deadline = time.monotonic() + 900
while not os.path.exists(ready):
    if time.monotonic() > deadline:
        sys.exit(f"{ready} did not appear within 900 s")
    time.sleep(0.1)
sys.argv = sys.argv[2:]
sys.path[0] = os.path.dirname(os.path.abspath(script))
runpy.run_path(script, run_name="__main__")
