"""The slow imports a prestarted run of `check` makes before its turn (record/warmimport.py): run 1 names an import
only when the script had changed neither the environment nor sys.path before it; a waiting run makes only the
imports so named, and stops waiting for them when its gate opens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchrepro.record.outdir import WARM
from torchrepro.record.warmimport import EnvReplay, _listed, warm_imports


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=cwd,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    return p


WATCHED = """
    import os, sys
    from pathlib import Path
    import torch
    from torchrepro.record.warmimport import ImportWatch
    assert "torch._dynamo" not in sys.modules
    watch = ImportWatch(Path("."), path_entry=None).install()
    {before}
    torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)  # imports torch._dynamo
    assert "torch._dynamo" in sys.modules and watch not in sys.meta_path
"""


def test_run_1_names_the_import_of_torch_dynamo_made_by_an_optimizer(tmp_path):
    run_python(WATCHED.format(before="pass"), tmp_path)
    assert json.loads((tmp_path / WARM).read_text()) == {"modules": ["torch._dynamo"]}


@pytest.mark.parametrize("before", ['os.environ["TORCHINDUCTOR_CACHE_DIR"] = "/tmp/mine"',
                                    'os.environ.pop("HOME", None)', 'sys.path.append("/tmp/lib")',
                                    'sys.path.insert(0, "/tmp/lib")'])
def test_run_1_names_nothing_when_the_script_changed_the_environment_or_sys_path_first(tmp_path, before):
    run_python(WATCHED.format(before=before), tmp_path)
    assert not (tmp_path / WARM).exists()


def test_only_known_modules_are_read_from_the_file(tmp_path):
    path = tmp_path / WARM
    path.write_text(json.dumps({"modules": ["os", "torch._dynamo", "evil"]}))
    assert _listed(path) == ["torch._dynamo"]
    for damaged in ("", "{", "[]", '{"modules": "torch._dynamo"}', '{"modules": [1]}'):
        path.write_text(damaged)
        assert _listed(path) == []
    assert _listed(tmp_path / "missing.json") == []


def test_a_waiting_run_stops_waiting_when_its_gate_opens_and_imports_nothing(tmp_path):
    read, write = os.pipe()
    try:
        os.write(write, b"g")
        assert warm_imports(tmp_path / WARM, read, path_entry=None) is None
        assert os.read(read, 1) == b"g"  # the gate byte is left for the launcher to read
    finally:
        os.close(read)
        os.close(write)


def test_a_waiting_run_makes_the_named_import_with_the_scripts_search_path(tmp_path):
    (tmp_path / WARM).write_text(json.dumps({"modules": ["torch._dynamo"]}))
    p = run_python(f"""
        import os, sys
        from pathlib import Path
        import torch
        from torchrepro.record.warmimport import warm_imports
        read, write = os.pipe()
        before = list(sys.path)
        seen = []
        class Spy:
            def find_spec(self, name, path, target=None):
                if name == "torch._dynamo":
                    seen.append(sys.path[0])
        sys.meta_path.insert(0, Spy())
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        replay = warm_imports(Path({str(tmp_path / WARM)!r}), read, path_entry="/the/script/dir")
        assert sys.path == before, "sys.path restored"
        print(replay.modules, seen, "torch._dynamo" in sys.modules)
        print(os.environ.get("TORCHINDUCTOR_CACHE_DIR"))  # put back: the script starts without it
        replay.install()
        import json  # not the module: nothing changes
        print(os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
        import torch._dynamo  # the script's own import: the variable comes back
        print(os.environ.get("TORCHINDUCTOR_CACHE_DIR") == replay.changes["TORCHINDUCTOR_CACHE_DIR"][1] != None)
    """, tmp_path)
    assert p.stdout.splitlines() == ["['torch._dynamo'] ['/the/script/dir'] True", "None", "None", "True"]


def test_the_replay_leaves_a_variable_the_script_set_meanwhile(monkeypatch):
    monkeypatch.setenv("TR_WARM_A", "mine")
    monkeypatch.delenv("TR_WARM_B", raising=False)
    replay = EnvReplay(["json"], {"TR_WARM_A": (None, "x"), "TR_WARM_B": (None, "y")}).install()
    try:
        import json  # noqa: F401
    finally:
        replay.uninstall()
    assert replay.done
    assert os.environ["TR_WARM_A"] == "mine" and os.environ["TR_WARM_B"] == "y"
    monkeypatch.delenv("TR_WARM_B")


def test_importing_torch_dynamo_draws_no_random_number():
    """Run 1 imports it after the script seeded, a prestarted run before: that is the same only while the import
    draws from no generator (a torch version that did would make the preimport visible)."""
    p = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import random, sys
        import numpy as np
        import torch
        assert "torch._dynamo" not in sys.modules
        random.seed(1); np.random.seed(1); torch.manual_seed(1)
        import torch._dynamo
        print(random.random(), np.random.rand(), torch.rand(1).item())
        random.seed(1); np.random.seed(1); torch.manual_seed(1)
        print(random.random(), np.random.rand(), torch.rand(1).item())
    """)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    first, second = p.stdout.splitlines()
    assert first == second
