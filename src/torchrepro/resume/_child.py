"""Entry point of the fresh processes that verify_resume starts: ``python -m torchrepro.resume._child CFG``."""

import json
import sys

from torchrepro.resume.verify import ResumeContractError, run_child

if __name__ == "__main__":
    try:
        run_child(json.loads(sys.argv[1]))
    except ResumeContractError as exc:  # the caller's build/step: one clear line, no traceback of ours
        print(exc, file=sys.stderr)
        sys.exit(2)
