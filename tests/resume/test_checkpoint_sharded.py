"""save_checkpoint / load_checkpoint and sharded training (FSDP2: DTensor parameters and optimizer state): each rank
saves its own shards with their layouts and loads them back bit for bit; a file that does not hold this rank's
shards of the model passed (another rank's, another mesh, unsharded) is refused by name before anything is restored.

A one-rank process group (gloo, in this process) is enough to make FSDP2's DTensors; another rank's file is made by
rewriting the coordinate in a saved file's layouts."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

import torchrepro
from torchrepro._core.errors import CheckpointError
from torchrepro.resume.checkpoint import FORMAT, VERSION, ShardedStateError


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[object]:
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    finally:
        dist.destroy_process_group()


def sharded(mesh: object) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    model = net()
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def train_step(model: nn.Module, opt: torch.optim.Optimizer, seed: int = 1) -> None:
    opt.zero_grad()
    model(torch.randn(3, 4, generator=torch.Generator().manual_seed(seed))).sum().backward()
    opt.step()


def local(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.to_local().clone() for k, v in model.state_dict().items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_ranks_shards_save_and_load_bit_for_bit_with_their_layouts(tmp_path, mesh):
    model = sharded(mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for seed in (1, 2):
        train_step(model, opt, seed)
    path = torchrepro.save_checkpoint(tmp_path / "rank0.pt", model=model, optimizer=opt, step=2)
    saved = torch.load(path, weights_only=True)
    assert saved["layouts"]["model.0.weight"] == {
        "placements": ["Shard(0)"], "mesh_shape": [1], "mesh_dim_names": ["dp"], "coordinate": [0],
        "mesh_id": saved["layouts"]["model.0.weight"]["mesh_id"], "shape": [8, 4]}
    assert sorted(saved["layouts"]) == sorted(
        [f"model.{p}" for p in ("0.weight", "0.bias", "2.weight", "2.bias")]
        + [f"optimizer.state.{i}.{k}" for i in range(4) for k in ("exp_avg", "exp_avg_sq")])
    train_step(model, opt, 3)  # the uninterrupted run's step 3
    expected = local(model)

    other = sharded(mesh)  # the restarted process: built again, loaded, step 3
    other_opt = torch.optim.AdamW(other.parameters(), lr=1e-2)
    assert torchrepro.load_checkpoint(path, model=other, optimizer=other_opt)["step"] == 2
    assert type(other_opt.state[other[0].weight]["exp_avg"]).__name__ == "DTensor"
    train_step(other, other_opt, 3)
    assert same(local(other), expected)


def test_another_ranks_file_is_refused_by_name_and_changes_nothing(tmp_path, mesh):
    """Rank 0's file loaded on rank 1 (one file for every rank): its shards are rank 0's. Made here by rewriting the
    saved coordinate, as rank 1 would read it."""
    model = sharded(mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train_step(model, opt)
    path = torchrepro.save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=opt, step=1)
    data = torch.load(path, weights_only=True)
    for lay in data["layouts"].values():
        lay["coordinate"] = [1]
    torch.save(data, path)
    train_step(model, opt, 2)
    before, rng = local(model), torch.get_rng_state()
    with pytest.raises(ShardedStateError) as info:
        torchrepro.load_checkpoint(path, model=model, optimizer=opt)
    message = str(info.value)
    assert message.startswith(f"{path}: does not hold this rank's shards of the model passed; nothing was restored. "
                              "4 problem(s):\n  - model.0.bias: Shard(0) on mesh (dp=1) at (1,), global shape [8] in "
                              "the checkpoint, Shard(0) on mesh (dp=1) at (0,), global shape [8] in the model (another "
                              "rank's shard)\n"), message
    assert "Load each rank's own file (saved by that rank: rank{R}.pt) on the same device mesh" in message
    assert "dcp.save(" in message and "get_state_dict(model, optimizer)" in message  # to reshard: DCP
    assert isinstance(info.value, CheckpointError)  # caught where checkpoint errors are
    assert same(local(model), before) and torch.equal(rng, torch.get_rng_state())


def test_an_unsharded_checkpoint_into_a_sharded_model_is_refused_and_changes_nothing(tmp_path, mesh):
    """Before, the optimizer state was loaded, then the model failed with "aten.copy_.default got mixed
    torch.Tensor and DTensor" (the model may be partly overwritten)."""
    plain = net()  # an unsharded run's checkpoint, of the same model and optimizer
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    train_step(plain, plain_opt)
    path = torchrepro.save_checkpoint(tmp_path / "plain.pt", model=plain, optimizer=plain_opt, step=1)
    model = sharded(mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train_step(model, opt, 2)
    before, state = local(model), {k: v.to_local().clone() for k, v in opt.state[model[0].weight].items()
                                   if k != "step"}
    with pytest.raises(ShardedStateError) as info:
        torchrepro.load_checkpoint(path, model=model, optimizer=opt)
    assert ("\n  - model.0.weight: a plain tensor in the checkpoint, Shard(0) on mesh (dp=1) at (0,), global shape "
            "[8, 4] in the model\n") in str(info.value)
    assert same(local(model), before)
    assert same({k: v.to_local() for k, v in opt.state[model[0].weight].items() if k != "step"}, state)


def test_a_sharded_checkpoint_into_an_unsharded_model_is_refused(tmp_path, mesh):
    model = sharded(mesh)
    path = torchrepro.save_checkpoint(tmp_path / "rank0.pt", model=model, step=0)
    plain = net()
    with pytest.raises(ShardedStateError, match=r"\n  - model\.0\.weight: Shard\(0\) on mesh \(dp=1\) at \(0,\), "
                       r"global shape \[8, 4\] in the checkpoint, a plain tensor in the model\n"):
        torchrepro.load_checkpoint(path, model=plain)


def test_dtensors_saved_without_their_layouts_are_refused(tmp_path, mesh):
    """torch.save of an FSDP2 state dict in torchrepro's format (torch 2.13's safe loader reads DTensors): which
    rank's shards it holds is unknown."""
    path = torchrepro.save_checkpoint(tmp_path / "pickled.pt", model=sharded(mesh), step=0)
    data = torch.load(path, weights_only=True)
    del data["layouts"]
    assert (data["format"], data["version"]) == (FORMAT, VERSION)
    torch.save(data, path)
    with pytest.raises(ShardedStateError, match=r"- model\.0\.weight: a DTensor saved without its layout \(not by this "
                       r"torchrepro's save_checkpoint\): which shard it holds is unknown"):
        torchrepro.load_checkpoint(path, model=sharded(mesh))


def test_an_unsharded_model_in_a_process_group_saves_no_layouts(tmp_path, mesh):
    """Only DTensors have layouts: a plain model under torch.distributed (DDP's) saves and loads as before."""
    model = net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train_step(model, opt)
    path = torchrepro.save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=opt, step=1)
    assert "layouts" not in torch.load(path, weights_only=True)
    other = net()
    assert torchrepro.load_checkpoint(path, model=other)["step"] == 1
    assert same(dict(model.state_dict()), dict(other.state_dict()))


def test_a_ranks_file_reads_in_a_process_that_has_not_imported_dtensors(tmp_path, mesh):
    """torch's safe loader reads DTensors only once torch.distributed.tensor is imported; read_checkpoint imports it
    then (before, the file was called "corrupt, truncated, or holds objects that are not safe to load")."""
    path = torchrepro.save_checkpoint(tmp_path / "rank0.pt", model=sharded(mesh), step=0)
    code = ("import sys, torch; from torchrepro.resume.checkpoint import read_checkpoint; "
            "assert 'torch.distributed.tensor' not in sys.modules; data = read_checkpoint(sys.argv[1]); "
            "print(type(data['model']['0.weight']).__name__, data['layouts']['model.0.weight']['coordinate'])")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, "DTensor [0]"), done.stderr[-2000:]
