"""Finding the models of a process without scanning its heap: the registry of modules (``_core/livemodules``) and
``discover_models`` on it, with names as the heap scan gave them."""

from __future__ import annotations

import copy
import gc
import io
import json

import torch
from torch import nn

from tests.conftest import run_python
from torchrepro._core.livemodules import ModuleRegistry
from torchrepro._core.modules import named_roots


def _noted(registry: ModuleRegistry, *mods: nn.Module) -> list[bool]:
    alive = registry.modules()
    return [any(m is a for a in alive) for m in mods]


def test_modules_made_copied_and_loaded_are_noted_oldest_first():
    before = nn.Linear(1, 1)
    with ModuleRegistry() as registry:
        made = nn.Sequential(nn.Linear(2, 2))
        copied = copy.deepcopy(made)  # __new__ + __setstate__, no __init__
        buf = io.BytesIO()
        torch.save(nn.Conv2d(1, 1, 1), buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)  # unpickled: __setstate__
        assert _noted(registry, before, made, made[0], copied, copied[0], loaded) == [True] * 6
        order = {id(m): i for i, m in enumerate(registry.modules())}
        assert order[id(before)] < order[id(made[0])] < order[id(made)] < order[id(copied)] < order[id(loaded)]


def test_a_dead_module_is_forgotten_and_uninstall_puts_torch_back():
    init, setstate = nn.Module.__init__, nn.Module.__setstate__
    with ModuleRegistry() as registry:
        assert nn.Module.__init__ is not init and nn.Module.__setstate__ is not setstate
        gone = nn.Linear(2, 2)
        key = id(gone)
        del gone
        gc.collect()
        assert key not in {id(m) for m in registry.modules()}
        assert key not in registry._refs  # the entry itself is gone, not only its referent
        kept = nn.Linear(2, 2)
    assert nn.Module.__init__ is init and nn.Module.__setstate__ is setstate
    assert registry.modules() == [] and not registry.active
    later = nn.Linear(2, 2)  # made after uninstall: not noted
    assert _noted(registry, kept, later) == [False, False]


def test_registries_stacked_both_note_and_the_covered_one_notes_nothing_once_off():
    init, setstate = nn.Module.__init__, nn.Module.__setstate__
    outer, inner = ModuleRegistry().install(), ModuleRegistry().install()
    try:
        m = nn.Linear(2, 2)
        assert _noted(outer, m) == [True] and _noted(inner, m) == [True]
        outer.uninstall()  # covered by inner's wrapper (as by torch._dynamo's): it stays in the chain, inert
        assert nn.Module.__init__ is not init
        n = nn.Linear(2, 2)
        assert _noted(inner, n) == [True] and outer.modules() == []
        inner.uninstall()  # puts back what it covered: outer's inert wrapper, which passes construction through
        assert nn.Linear(3, 3).weight.shape == (3, 3) and outer.modules() == [] and inner.modules() == []
    finally:
        inner.uninstall()
        nn.Module.__init__, nn.Module.__setstate__ = init, setstate  # type: ignore[method-assign]


def test_roots_are_named_by_class_then_size_then_order():
    body = nn.Linear(4, 4)
    wrapped = nn.Sequential(body)  # body made first, wrapped later: still not a root
    big, small, twin = nn.Linear(8, 8), nn.Linear(2, 2), nn.Linear(8, 8)
    named = named_roots([body, nn.ReLU(), small, twin, wrapped, big])
    assert list(named) == ["Linear", "Linear2", "Linear3", "Sequential"]
    assert [named["Linear"], named["Linear2"], named["Linear3"]] == [twin, big, small]  # ties: list order
    assert named["Sequential"] is wrapped
    assert named_roots([wrapped, body]) == {"": wrapped}  # one root: its parameters keep their own names
    deep = nn.Sequential(nn.Sequential(body))  # the middle one not among mods (made without being noted)
    assert named_roots([deep, body]) == {"": deep}  # body is still below deep


# A fresh process: a model made before torchrepro is imported, then the names of discovery, of the op tracer and
# of the old heap scan (kept verbatim here as the reference), and no heap scan per discovery or tracer start.
SCRIPT = r'''
import copy, gc, json, sys
import torch
from torch import nn

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(2, 2, 1)

    def forward(self, x):
        return self.conv1(x)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer1 = nn.Sequential(Block(), Block())
        self.out = nn.Linear(2, 2)

    def forward(self, x):
        return self.out(self.layer1(x).mean((2, 3)))

def old_discover_models():  # discover_models() before the registry, verbatim
    mods = [o for o in gc.get_objects() if issubclass(type(o), nn.Module)]
    inner = set()
    for m in mods:
        for sub in m.modules():
            if sub is not m:
                inner.add(id(sub))
    roots = [m for m in mods if id(m) not in inner and any(True for _ in m.parameters())]
    if len(roots) == 1:
        return {"": roots[0]}
    roots.sort(key=lambda m: (type(m).__name__, -sum(p.numel() for p in m.parameters())))
    named = {}
    for m in roots:
        base = type(m).__name__
        name, i = base, 1
        while name in named:
            i += 1
            name = f"{base}{i}"
        named[name] = m
    return named

net = Net()  # before torchrepro is imported
assert "torchrepro" not in sys.modules
import torchrepro
from torchrepro._core.modules import discover_models

out = {}
x = torch.ones(1, 2, 3, 3)
with torchrepro.trace_ops() as t:  # no model given: the first discovery (the registry's one scan)
    net(x)
out["one_root"] = [{n: m is net for n, m in found.items()} for found in (discover_models(), old_discover_models())]
out["one_root_modules"] = sorted({op["module"] for op in t.ops})

scans = []
real = gc.get_objects
gc.get_objects = lambda *a: scans.append(1) or real(*a)
head = nn.Linear(3, 3)  # made after: noted by construction
ema = copy.deepcopy(net)  # a copy: noted by __setstate__
with torchrepro.trace_ops() as t:
    ema(x)
    head(torch.ones(3))
found = discover_models()
gc.get_objects = real
out["scans_after_first"] = len(scans)
old = old_discover_models()
out["roots"] = sorted(found)
out["scan_roots"] = sorted(old)
out["same_as_scan"] = {n: old[n] is m for n, m in found.items() if n in old}
out["net_is_older"] = [found["Net"] is net, found["Net2"] is ema]
out["modules"] = sorted({op["module"] for op in t.ops})
print(json.dumps(out, sort_keys=True))
'''


def test_names_in_a_fresh_process_match_the_heap_scan_without_scanning_again():
    p = run_python(SCRIPT)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    # one root: the empty prefix, found though it was made before torchrepro was imported, as the scan found it
    assert out["one_root"] == [{"": True}, {"": True}]
    # ops run in the root's own forward (the mean) are named by its class, as the tracer always named the root
    assert out["one_root_modules"] == ["Net", "layer1.0.conv1", "layer1.1.conv1", "out"]
    assert out["scans_after_first"] == 0  # a tracer's start and a discovery: no heap scan
    assert out["roots"] == out["scan_roots"] == ["Linear", "Net", "Net2"]
    # the roots the scan finds, under the same names; Net and Net2 (same class, same size) are a tie: the older
    # is Net (the scan's order there follows the garbage collector's generations)
    assert out["same_as_scan"]["Linear"] is True and set(out["same_as_scan"]) == {"Linear", "Net", "Net2"}
    assert out["net_is_older"] == [True, True]
    # "" is torch.ones, outside any forward
    assert out["modules"] == ["", "Linear", "Net2", "Net2.layer1.0.conv1", "Net2.layer1.1.conv1", "Net2.out"]


def test_torch_compile_imported_after_the_registry_traces_torchs_own_module_init():
    """Imported after the registry, torch's compiler must still trace ``nn.Module.__init__`` as torch's own: a
    module made inside a ``fullgraph=True`` function compiles (the registry's wrapper made it fail)."""
    p = run_python("import sys, torch\nfrom torch import nn\nfrom torchrepro._core.modules import discover_models\n"
                   "discover_models()\nassert 'torch._dynamo' not in sys.modules\n"
                   "f = torch.compile(lambda v: nn.ReLU()(v).sum(), backend='eager', fullgraph=True)\n"
                   "print(f(torch.tensor([-1.0, 2.0, 3.0])).item())")
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().splitlines()[-1] == "5.0"
