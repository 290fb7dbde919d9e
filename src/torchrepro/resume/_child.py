"""Entry point of the fresh processes that verify_resume starts: ``python -m torchrepro.resume._child CFG``."""

import json
import sys

from torchrepro.resume.verify import run_child

if __name__ == "__main__":
    run_child(json.loads(sys.argv[1]))
