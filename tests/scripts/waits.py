"""Writes its pid to the file named by argv[1] (atomically), then waits, before any training step."""

import os
import sys
import time

with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
