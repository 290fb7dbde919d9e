"""Near miss for TR003: an escaped null character in a string is fine."""

SEP = "\x00"  # ok
