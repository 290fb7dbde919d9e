"""`torchrepro run --record DIR -- torchrun --nnodes 2 ...` on two simulated nodes (two torchrun agents on
127.0.0.1, gloo, one rank each), and `torchrepro diff` of such runs.

One recording of both nodes into a shared directory is made per module (the fixture ``shared``) and read by the
tests that only read it; the test that rewrites its manifest works on a copy."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.inprocess import torchrepro
from torchrepro._core.errors import RunDirError
from torchrepro.record.launcher import CommandError, parse_torchrun, parse_torchrun_command
from torchrepro.record.store import load_ranks

SCRIPT = str(Path(__file__).resolve().parents[1] / "scripts" / "ddp_train.py")
LIMIT_S = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def two_nodes(records: list[Path], *script_args: str, extra: tuple[list[str], list[str]] = ([], []),
              env: dict[str, str] | None = None):
    """`torchrepro run --record` on node 0 and node 1 at once; their (returncode, stdout + stderr)."""
    port = free_port()
    procs = []
    for rank, record in enumerate(records):
        cmd = [sys.executable, "-m", "torchrepro", "run", "--record", str(record), "--", "torchrun", "--nnodes", "2",
               "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port),
               "--nproc-per-node", "1", SCRIPT, "--timeout", "15", *script_args, *extra[rank]]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      env={**os.environ, **(env or {})}))
    results = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=LIMIT_S)
            results.append((p.returncode, out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`ddp_train.py --steps 3` recorded by both nodes into one directory (their shared file system)."""
    record = tmp_path_factory.mktemp("two_nodes") / "A"
    for rc, out in two_nodes([record, record], "--steps", "3"):
        assert rc == 0, out
    return record


def diff(*args: str) -> subprocess.CompletedProcess:
    """`diff --json` of recorded runs, in this process (tests/inprocess.py)."""
    return torchrepro("diff", "--json", *args, timeout=LIMIT_S)


def test_two_nodes_record_global_ranks_and_diff_compares_every_rank(shared, tmp_path):
    top, ranks = load_ranks(shared)
    assert top.manifest["ranks"] == ["rank0", "rank1"] and top.manifest["nodes"] == ["node0", "node1"]
    assert top.manifest["world_size"] == 2 and top.manifest["status"] == "ok"
    for node in (0, 1):
        manifest = json.loads((shared / f"node{node}" / "manifest.json").read_text())
        assert manifest["ranks"] == [f"rank{node}"] and manifest["node"] == node and manifest["nnodes"] == 2
    assert [r.manifest["steps"] for r in ranks] == [3, 3]
    p = diff("--out", str(tmp_path / "d1"), str(shared), str(shared))
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["verdict"] == "identical" and doc["nproc_per_node"] == 2 and doc["desync"] == [None, None]
    # the same command recorded into each node's own directory, rank 1 (node 1) perturbed at step 2
    b0, b1 = tmp_path / "B0", tmp_path / "B1"
    for rc, out in two_nodes([b0, b1], "--steps", "3", env={"DDP_TRAIN_PERTURB": "1:2"}):
        assert rc == 0, out
    assert sorted(p.name for p in b0.iterdir()) == ["manifest.json", "node0", "rank0"]
    assert sorted(p.name for p in b1.iterdir()) == ["manifest.json", "node1", "rank1"]
    p = diff("--out", str(tmp_path / "d2"), str(shared), f"{b0}{os.pathsep}{b1}")
    assert p.returncode == 1, p.stderr
    doc = json.loads(p.stdout)
    assert doc["verdict"] == "diverged" and [r["verdict"] for r in doc["ranks"]] == ["identical", "diverged"]
    assert doc["ranks"][1]["first_divergent_step"] == 2
    assert doc["desync"][0] is None and (doc["desync"][1]["step"], doc["desync"][1]["ranks"]) == (2, [1])
    p = diff("--out", str(tmp_path / "d3"), str(shared), str(b0))  # node 1's directory left out
    assert p.returncode == 2
    assert "is part of a run of 2 nodes (2 ranks): rank1 not found in it" in p.stdout
    assert f"pass every node's directory joined by '{os.pathsep}'" in p.stdout
    with pytest.raises(RunDirError, match="holds rank0, which"):
        load_ranks(f"{shared}{os.pathsep}{b0}")


def test_a_node_that_dies_gives_a_clear_error_on_the_other(tmp_path):
    shared = tmp_path / "A"
    (rc0, out0), (rc1, out1) = two_nodes([shared, shared], "--steps", "4", "--check-every", "1",
                                         extra=([], ["--exit-rank", "1", "--exit-step", "2"]))
    assert rc1 == 1 and "rank 1 exits early at step 2" in out1, out1  # torchrun's exit code for a failed rank
    assert rc0 == 1, out0
    # rank 0 waits for rank 1 in torchrepro's collective, which keeps its time limit and says what happened
    assert "check_consistency: the all-gather over ranks [0, 1]" in out0 and "Another rank has exited" in out0, out0
    assert "torchrepro run: node 0 of 2 failed: rank0 failed (exit code 1)." in out0
    assert "torchrepro run: node 1 of 2 failed: rank1 failed (exit code 3)." in out1
    node0 = json.loads((shared / "node0" / "manifest.json").read_text())
    node1 = json.loads((shared / "node1" / "manifest.json").read_text())
    assert node0["status"] == "failed" and node0["failed_rank"] == 0
    assert node1["rank_status"]["rank1"]["exit_code"] == 3
    top = json.loads((shared / "manifest.json").read_text())
    assert top["status"] == "failed" and top["ranks"] == ["rank0", "rank1"]


def test_torchrun_commands_of_several_nodes():
    spec = parse_torchrun(["torchrun", "--nnodes=2", "--node-rank=1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                           "head:29400", "--rdzv-id", "job7", "--nproc-per-node", "4", "train.py", "--lr", "1"])
    assert spec is not None and (spec.nnodes, spec.node_rank, spec.nproc_per_node, spec.static) == (2, 1, 4, False)
    assert spec.rendezvous == ("--nnodes=2", "--node-rank=1", "--rdzv-backend=c10d", "--rdzv-endpoint=head:29400",
                               "--rdzv-id=job7")
    assert spec.python_command == ["python", "train.py", "--lr", "1"]
    with pytest.raises(CommandError, match="needs a fixed number of nodes"):
        parse_torchrun(["torchrun", "--nnodes", "1:4", "train.py"])
    with pytest.raises(CommandError, match="--standalone starts a rendezvous on this machine only"):
        parse_torchrun(["torchrun", "--nnodes", "2", "--standalone", "train.py"])
    with pytest.raises(CommandError, match="record each node with `torchrepro run --record DIR"):
        parse_torchrun_command(["torchrun", "--nnodes", "2", "train.py"])  # check: one machine


def test_nodes_ending_together_write_the_run_manifest_in_turn(tmp_path, monkeypatch):
    """Node 0 merges the node manifests (only its own is there yet) and is slow to write; node 1 writes its own
    and merges both meanwhile. Node 0's write must not come last with the older merge (the CI failure of stop 30:
    the run's manifest listed node0 alone)."""
    import threading

    from torchrepro.record import launcher
    from torchrepro.record.store import write_manifest

    def fields(node: int) -> dict:
        return {"nnodes": 2, "node": node, "ranks": [f"rank{node}"], "status": "ok", "exit_code": 0,
                "failed_rank": None, "rank_status": {f"rank{node}": {"exit_code": 0, "status": "ok", "steps": 3}}}

    merged, real_merge = threading.Event(), launcher.merged_nodes_manifest

    def slow_merge(record, mine):
        doc = real_merge(record, mine)
        if mine["node"] == 0:
            merged.set()
            time.sleep(0.5)
        return doc

    monkeypatch.setattr(launcher, "merged_nodes_manifest", slow_merge)
    for node in (0, 1):
        (tmp_path / f"node{node}").mkdir()
    write_manifest(tmp_path / "node0", fields(0))
    node0 = threading.Thread(target=launcher.write_nodes_manifest, args=(tmp_path, fields(0)))
    node0.start()
    assert merged.wait(10)
    write_manifest(tmp_path / "node1", fields(1))
    launcher.write_nodes_manifest(tmp_path, fields(1), wait_s=10)
    node0.join(10)
    top = json.loads((tmp_path / "manifest.json").read_text())
    assert top["nodes"] == ["node0", "node1"] and top["ranks"] == ["rank0", "rank1"]
    assert not (tmp_path / ".torchrepro.lock").exists()


def test_a_stale_run_manifest_still_reads_every_node(shared, tmp_path):
    """A shared file system without working locks may still leave the older merge: readers list the nodes
    from the node manifests."""
    shared = Path(shutil.copytree(shared, tmp_path / "A", symlinks=True))  # the module's recording, rewritten here
    top = json.loads((shared / "manifest.json").read_text())
    (shared / "manifest.json").write_text(json.dumps({**top, "ranks": ["rank0"], "nodes": ["node0"]}))
    run, ranks = load_ranks(shared)
    assert run.manifest["nodes"] == ["node0", "node1"] and [r.path.name for r in ranks] == ["rank0", "rank1"]
