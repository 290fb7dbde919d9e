"""TR301 positions after characters that str.splitlines() treats as line breaks but Python does not:
U+2028 and U+2029 in strings, NEL (U+0085) in a comment, form feeds (U+000C) as whitespace."""

from torch.utils.data import DataLoader

SEP = "a b c"  # the string holds U+2028 and U+2029
a = "é"; loader_a = DataLoader(ds, shuffle=True)  # expect: TR301
# a comment with a NEL  in it
b = "é"; loader_b = DataLoader(ds, shuffle=True)  # expect: TR301

c = "é"; loader_c = DataLoader(ds, shuffle=True)  # expect: TR301
d = " "; loader_d = DataLoader(ds, shuffle=True)  # torchrepro: noqa: TR301  # ok: suppressed on its own line
e = "é"; loader_e = DataLoader(ds, shuffle=True)  # expect: TR301
