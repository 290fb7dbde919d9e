import sys

print("about to fail", file=sys.stderr)
raise RuntimeError("user script exploded: bad config value")
