"""TR303: the order of a set becomes data."""

import random


def build_vocab(text, labels, a, b):
    words = text.split()
    vocab = {w: i for i, w in enumerate(set(words))}  # expect: TR303
    classes = list(set(labels))  # expect: TR303
    n = len(set(words))  # ok: a count
    ordered = sorted(set(words))  # ok: sorted
    common = set(a) & set(b)  # ok: set algebra
    present = "the" in set(words)  # ok: membership
    ids = list(set(range(10)))  # ok: ints keep their order
    seen = set()
    for w in words:
        seen.add(w)  # ok: filling a set
    itos = [w for w in seen]  # expect: TR303
    pick = random.choice(list({"cat", "dog", "emu"}))  # expect: TR303
    kept = list(set(labels))  # ok: sorted on the next line
    kept.sort()
    return vocab, classes, n, ordered, common, present, ids, itos, pick, kept


class Labels:
    def __init__(self, labels, configure):
        self.classes = list(set(labels))  # expect: TR303
        configure(kinds=frozenset({"a", "b"}))  # ok: a set passed on (perhaps only for membership)
        self.seen = {label: labels.count(label) for label in set(labels)}  # ok: a dict looked up by key


def stream(tags):
    for tag in set(tags):  # expect: TR303
        yield tag


def tally(tags):
    counts = {}
    for tag in set(tags):  # ok: the loop body does not depend on the order
        counts[tag] = tags.count(tag)
    return counts
