"""Entry point of the fresh processes that verify_resume starts: ``python -m torchrepro._resume_child CFG``."""

import json
import sys

from torchrepro.resume import run_child

if __name__ == "__main__":
    run_child(json.loads(sys.argv[1]))
