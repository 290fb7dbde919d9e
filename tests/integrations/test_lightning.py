"""ReproducibleCallback with real Lightning on CPU: a mid-epoch save + fit(ckpt_path=...) continues bit for bit.

Every training whose digest is compared runs in a new process (tests/scripts/lightning_train.py: 2 workers with
augmentation from torch/NumPy/random, dropout, Adam + StepLR, validation every 4 batches), all of them started by
one module-scoped fixture (the savers at once, each resumer as soon as its saver is done), forked from processes
that imported Lightning once (tests/preloaded.py). The error cases
resume those checkpoints in this process: they fail before the first training step.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import torchrepro
from tests.preloaded import pipeline

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "lightning_train.py"
SRC = str(Path(torchrepro.__file__).resolve().parents[1])  # the torchrepro under test, for the child processes
HAVE_LIGHTNING = importlib.util.find_spec("lightning") is not None
needs_lightning = pytest.mark.skipif(not HAVE_LIGHTNING, reason="needs lightning (pip install torchrepro[lightning])")
NOT_RESUMABLE = "your dataloader is not resumable"  # Lightning's warning on a mid-epoch resume of a plain loader
TWO = ["--samples", "24", "--second", "8"]  # two train loaders: 6 and 2 batches of 4


@dataclass
class Run:
    rc: int
    stdout: str
    stderr: str

    def lines(self, tag: str) -> dict[int, str]:
        """rank -> the rest of the ``TAG rank=R ...`` line."""
        found = {}
        for line in self.stdout.splitlines():
            if line.startswith(f"{tag} rank="):
                rank, _, rest = line[len(tag) + 6:].partition(" ")
                found[int(rank)] = rest
        return found

    def digests(self) -> dict[int, str]:
        assert self.rc == 0, self.stderr[-3000:]
        return self.lines("DIGEST")

    def losses(self, rank: int = 0) -> dict[int, str]:
        """step -> loss (float.hex) of ``rank``."""
        pairs = (item.split(":") for item in self.lines("LOSSES")[rank].split())
        return {int(step): loss for step, loss in pairs}


def _pipeline(pairs: dict[str, tuple[list[str], list[str]]], cwd: Path, timeout: float = 900) -> dict[str, Run]:
    """Every pair (saver args, resumer args): all savers at once, each resumer as soon as its saver is done. Each
    run is a new process, forked from one that imported Lightning (tests/preloaded.py): importing it took most of
    each run's CPU time."""
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    ended = pipeline({name: [str(SCRIPT), *saver] for name, (saver, _) in pairs.items()},
                     {f"{name}_resumed": (name, [str(SCRIPT), *resumer]) for name, (_, resumer) in pairs.items()},
                     modules=["lightning.pytorch"], env=env, cwd=cwd, logs=cwd / "logs", timeout=timeout)
    return {name: Run(e.rc, e.stdout, e.stderr) for name, e in ended.items()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Run]:
    """Straight runs of 8 steps (saving at step 4, in the middle of the second epoch: the epoch's order and worker
    seeds must not depend on the RNG state when it starts), the issue's 4 steps + save after fit, and their
    resumptions to 8 steps: without the callback, with it, and with it under 2-rank DDP (gloo, Lightning's
    launcher: every rank is a fresh process)."""
    if not HAVE_LIGHTNING:
        pytest.skip("needs lightning")
    d = tmp_path_factory.mktemp("lightning")
    cb = ["--callback"]
    runs = _pipeline({
        "plain": (["--save-at", "4", "--ckpt", "plain.ckpt"], ["--resume", "plain.ckpt"]),
        "cb": (["--save-at", "4", "--ckpt", "cb.ckpt", *cb], ["--resume", "cb.ckpt", *cb]),
        "cb_end": (["--steps", "4", "--save-end", "end.ckpt", *cb], ["--resume", "end.ckpt", *cb]),
        "ddp": (["--save-at", "4", "--ckpt", "ddp.ckpt", "--devices", "2", "--samples", "24", *cb],
                ["--resume", "ddp.ckpt", "--devices", "2", "--samples", "24", *cb]),
        # two train loaders of 6 and 2 batches (a dict: Lightning's max_size_cycle cycles the short one), saved
        # from on_train_batch_end at the end of the short loader's second pass (4) and in its middle (3); and
        # CombinedLoader(mode="max_size"), where the short one is exhausted at the save (4) and gives None after
        **{name: ([*two, "--save-at", at, "--ckpt", f"{name}.ckpt"], [*two, "--resume", f"{name}.ckpt"])
           for name, at, two in [("two", "4", [*cb, *TWO]), ("two_mid", "3", [*cb, *TWO]),
                                 ("two_max", "4", [*cb, *TWO, "--mode", "max_size"])]},
    }, d)
    for name, run in sorted(runs.items()):  # shown with pytest -s
        print(f"{name}: rc={run.rc} " + " ".join(f"rank{r}={h[:16]}" for r, h in sorted(run.lines('DIGEST').items())))
    return {**runs, "dir": d}


def _after(losses: dict[int, str], step: int) -> dict[int, str]:
    return {s: v for s, v in losses.items() if s > step}


@needs_lightning
def test_without_the_callback_a_mid_epoch_resume_diverges(runs):
    """The problem is real: Lightning restarts the epoch's iterator (new order, new worker seeds, shifted RNG)."""
    straight, resumed = runs["plain"], runs["plain_resumed"]
    assert straight.digests()[0] != resumed.digests()[0]
    assert _after(straight.losses(), 4) != resumed.losses()
    assert NOT_RESUMABLE in resumed.stderr


@needs_lightning
def test_with_the_callback_a_mid_epoch_resume_is_bitwise(runs):
    straight, resumed = runs["cb"], runs["cb_resumed"]
    assert straight.digests()[0] == resumed.digests()[0]
    assert sorted(resumed.losses()) == [5, 6, 7, 8]
    assert _after(straight.losses(), 4) == resumed.losses()  # every step: same batch, same dropout, same LR
    assert NOT_RESUMABLE not in resumed.stderr  # the wrapped loader is stateful to Lightning


@needs_lightning
def test_the_issue_scenario_stop_after_4_steps_save_then_fit_to_8(runs):
    """fit(max_steps=4) + trainer.save_checkpoint + fit(ckpt_path=..., max_steps=8) == 8 steps straight."""
    assert runs["cb_end"].losses() == {s: v for s, v in runs["cb"].losses().items() if s <= 4}
    assert runs["cb_end_resumed"].digests()[0] == runs["cb"].digests()[0]
    assert runs["cb_end_resumed"].losses() == _after(runs["cb"].losses(), 4)


@needs_lightning
def test_under_ddp_each_rank_resumes_its_shard_bitwise(runs):
    straight, resumed = runs["ddp"], runs["ddp_resumed"]
    assert sorted(straight.digests()) == sorted(resumed.digests()) == [0, 1]
    assert straight.digests() == resumed.digests()
    for rank in (0, 1):
        assert _after(straight.losses(rank), 4) == resumed.losses(rank)
    assert straight.losses(0) != straight.losses(1)  # the ranks saw different shards


@needs_lightning
@pytest.mark.parametrize("name", ["two", "two_mid", "two_max"])
def test_two_train_loaders_saved_from_on_train_batch_end_resume_bitwise(runs, name):
    """Each loader's position is its own (the short one is cycled, or exhausted, mid-epoch): they were refused as
    "saved in the middle of a training step", comparing the short loader's position with Lightning's batch count."""
    straight, resumed = runs[name], runs[f"{name}_resumed"]
    at = 3 if name == "two_mid" else 4
    assert straight.digests()[0] == resumed.digests()[0]  # both ran to the end (rc 0), with the same weights
    assert sorted(straight.losses()) == list(range(1, 9))  # 8 steps: the epoch of 6 batches ends at step 6
    assert sorted(resumed.losses()) == list(range(at + 1, 9))
    assert _after(straight.losses(), at) == resumed.losses()
    assert NOT_RESUMABLE not in resumed.stderr


# --- loud errors: resumed in this process, they fail before the first training step ------------------------------
def _train(args: list[str]):
    spec = importlib.util.spec_from_file_location("lightning_train", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main([*args, "--workers", "0"])


@needs_lightning
def test_a_checkpoint_saved_without_the_callback_is_refused(runs):
    from torchrepro.integrations.lightning import ResumeMismatchError

    ckpt = runs["dir"] / "plain.ckpt"
    with pytest.raises(ResumeMismatchError, match="holds no ReproducibleCallback state") as info:
        _train(["--resume", str(ckpt), "--callback"])
    assert str(ckpt) in str(info.value) and "saved without" in str(info.value)
    assert "remove ReproducibleCallback" in str(info.value)


@needs_lightning
def test_another_batch_size_and_seed_are_each_named(runs):
    from torchrepro.integrations.lightning import ResumeMismatchError

    with pytest.raises(ResumeMismatchError) as info:
        _train(["--resume", str(runs["dir"] / "cb.ckpt"), "--callback", "--batch-size", "8", "--callback-seed", "1"])
    msg = str(info.value)
    assert "seed: saved 0, this run 1" in msg
    assert "batch_size: saved 4, this run 8" in msg and "batches_per_epoch: saved 3, this run 2" in msg
    assert "num_workers: saved 2, this run 0" in msg  # each worker has its own RNG stream
    assert "Resume with the settings of the run that saved it" in msg


@needs_lightning
def test_another_world_size_is_named(runs):
    from torchrepro.integrations.lightning import ResumeMismatchError

    with pytest.raises(ResumeMismatchError, match="world size: saved 2, this run 1"):
        _train(["--resume", str(runs["dir"] / "ddp.ckpt"), "--callback", "--samples", "24"])


@needs_lightning
def test_a_damaged_callback_state_is_refused(runs, tmp_path):
    from torchrepro.integrations.lightning import ResumeMismatchError

    ckpt = torch.load(runs["dir"] / "cb.ckpt", weights_only=False)
    ckpt["callbacks"]["ReproducibleCallback"]["format"] = "something.else"
    torch.save(ckpt, tmp_path / "edited.ckpt")
    with pytest.raises(ResumeMismatchError, match="has format 'something.else', expected 'torchrepro.lightning'"):
        _train(["--resume", str(tmp_path / "edited.ckpt"), "--callback"])


@needs_lightning
@pytest.mark.parametrize(("edit", "message"), [
    (lambda c: c["callbacks"]["ReproducibleCallback"].update(rng=["garbage"]),
     "holds damaged RNG states in its ReproducibleCallback state (is not a valid RNG state"),
    (lambda c: c["loops"]["fit_loop"]["state_dict"]["combined_loader"][0].update(batches_consumed=50),
     "is damaged or was written by another version: train dataloader 0 consumed 50 batches of an epoch of 3"),
    (lambda c: c["callbacks"]["ReproducibleCallback"].update(data="garbage"),
     "its ReproducibleCallback data field is not one list of 1 data fingerprint(s) per rank for 1 rank(s)"),
    (lambda c: c["callbacks"]["ReproducibleCallback"]["data"][0][0].update(digest=7),
     "its ReproducibleCallback data fingerprint of train dataloader 0 on rank 0 has a digest that is not 32 hex"),
])
def test_damaged_rng_states_and_positions_are_refused_as_damaged(runs, tmp_path, edit, message):
    """Refused before the first step with ResumeMismatchError (a CheckpointError), saying to use an intact
    checkpoint; they were a StateFileError, and a position past the epoch's end trained on silently."""
    from torchrepro.integrations.lightning import ResumeMismatchError

    ckpt = torch.load(runs["dir"] / "cb.ckpt", weights_only=False)
    edit(ckpt)
    torch.save(ckpt, tmp_path / "edited.ckpt")
    with pytest.raises(ResumeMismatchError) as info:
        _train(["--resume", str(tmp_path / "edited.ckpt"), "--callback"])
    assert message in str(info.value) and "Resume from an intact checkpoint" in str(info.value)


@needs_lightning
def test_gradient_accumulation_changed_or_cut_is_refused(runs, tmp_path):
    from torchrepro.integrations.lightning import ResumeMismatchError

    with pytest.raises(ResumeMismatchError, match="accumulate_grad_batches: saved 1, this run 2"):
        _train(["--resume", str(runs["dir"] / "cb.ckpt"), "--callback", "--accumulate", "2"])
    # saved after the 3rd batch of 6, between the optimizer steps of accumulate_grad_batches=2: the gradient of
    # batch 3 is not in the checkpoint (it resumed silently to other weights)
    ckpt = str(tmp_path / "mid.ckpt")
    accumulate = ["--callback", "--accumulate", "2", "--samples", "24", "--steps", "3"]
    _train(["--save-at", "1", "--ckpt", ckpt, *accumulate])
    with pytest.raises(ResumeMismatchError, match=r"was saved after batch 3 of epoch 0, in the middle of a gradient "
                       r"accumulation \(accumulate_grad_batches=2\): the gradients of the last 1 batch"):
        _train(["--resume", ckpt, *accumulate])


@needs_lightning
def test_a_resume_on_other_data_of_the_same_length_is_refused(runs):
    """Same length, batch size and sampler: only the samples differ (they trained on silently). The samples
    spread over the dataset (first, last, between) are fingerprinted at the save and at the resume."""
    from torchrepro.integrations.lightning import ResumeMismatchError

    with pytest.raises(ResumeMismatchError) as info:
        _train(["--resume", str(runs["dir"] / "cb.ckpt"), "--callback", "--data-seed", "99"])
    msg = str(info.value)
    assert ("train dataloader 0 data: samples 0, 4, 7, 11 of its dataset differ from the saving run's (fingerprint "
            "saved ") in msg
    assert "dataset_len" not in msg and "batch_size" not in msg  # nothing else differs but the workers
    assert ("Resume with the data the checkpoint was trained on (the same samples and transforms); to train these "
            "weights on other data, load them without ckpt_path") in msg
    # the same data in another object (and the same length) is accepted: only the workers differ
    with pytest.raises(ResumeMismatchError) as info:
        _train(["--resume", str(runs["dir"] / "cb.ckpt"), "--callback"])
    assert " data: " not in str(info.value) and "num_workers: saved 2, this run 0" in str(info.value)


@needs_lightning
@pytest.mark.parametrize("loaders", [[], TWO], ids=["one-loader", "two-loaders"])
def test_a_checkpoint_saved_in_the_middle_of_a_training_step_is_refused(tmp_path, loaders):
    """Saved from on_train_batch_start of batch 3: Lightning resumes after batch 2, the loaders had given 3."""
    from torchrepro.integrations.lightning import ResumeMismatchError

    ckpt = str(tmp_path / "mid-step.ckpt")
    _train(["--callback", *loaders, "--steps", "3", "--save-at", "2", "--save-hook", "on_train_batch_start",
            "--ckpt", ckpt])
    with pytest.raises(ResumeMismatchError, match=r"was saved after batch 3 of epoch 0 had been fetched, but Lightning "
                       r"resumes after batch 2: the checkpoint was saved in the middle of a training step\. Save from "
                       "on_train_batch_end"):
        _train(["--callback", *loaders, "--steps", "6", "--resume", ckpt])


@needs_lightning
def test_a_truncated_or_missing_checkpoint_fails_in_lightning(runs, tmp_path):
    data = (runs["dir"] / "cb.ckpt").read_bytes()
    (tmp_path / "cut.ckpt").write_bytes(data[: len(data) // 2])
    with pytest.raises((RuntimeError, OSError, EOFError)):  # torch.load's error (OSError EINVAL on torch 2.13)
        _train(["--resume", str(tmp_path / "cut.ckpt"), "--callback"])
    with pytest.raises(FileNotFoundError):
        _train(["--resume", str(tmp_path / "absent.ckpt"), "--callback"])


@needs_lightning
def test_resuming_a_callback_checkpoint_without_the_callback_fails_in_lightning(runs):
    with pytest.raises(RuntimeError, match="0 stateful loaders, but found 1 states"):
        _train(["--resume", str(runs["dir"] / "cb.ckpt")])


# --- no Trainer --------------------------------------------------------------------------------------------------
def test_import_needs_lightning_falls_back_to_pytorch_lightning_and_torchrepro_never_imports_it():
    """lightning.pytorch first, pytorch_lightning (here a stand-in module) next, else an ImportError naming the
    extra; `import torchrepro` and `torchrepro.integrations` import neither."""
    code = """
import sys, types, torchrepro, torchrepro.integrations
assert not any(m.split('.')[0] in ('lightning', 'pytorch_lightning') for m in sys.modules), 'imported lightning'
sys.modules['lightning'] = None
fake = types.ModuleType('pytorch_lightning')
fake.Callback, fake.__version__ = type('Callback', (), {}), '1.9'
sys.modules['pytorch_lightning'] = fake
from torchrepro.integrations.lightning import ReproducibleCallback
assert issubclass(ReproducibleCallback, fake.Callback)
del sys.modules['torchrepro.integrations.lightning']
sys.modules['pytorch_lightning'] = None
try:
    import torchrepro.integrations.lightning
except ImportError as exc:
    print('ImportError:', exc)
"""
    env = {**os.environ, "PYTHONPATH": SRC}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("ImportError:") and "pip install torchrepro[lightning]" in p.stdout, p.stdout


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(4))


def _trainer() -> SimpleNamespace:
    return SimpleNamespace(training=True, global_rank=0, current_epoch=0)


@needs_lightning
@pytest.mark.parametrize("make, reason", [
    (lambda: torch.utils.data.DataLoader(Stream()), "iterable-style"),
    (lambda: torch.utils.data.DataLoader(range(8), num_workers=1, persistent_workers=True), "persistent_workers"),
    (lambda: torch.utils.data.DataLoader(range(8), sampler=[3, 1, 2]), "list has neither a `generator`"),
    (lambda: [1, 2, 3], "not a torch.utils.data.DataLoader"),
])
def test_loaders_it_cannot_resume_exactly_are_refused(make, reason):
    from torchrepro.integrations.lightning import ReproducibleCallback

    cb = ReproducibleCallback(seed=0)
    with pytest.raises(TypeError, match="cannot make this train dataloader resumable") as info:
        cb._process(_trainer(), make())
    assert reason in str(info.value)


@needs_lightning
def test_the_wrapped_loader_continues_where_its_state_says_and_is_still_the_loader():
    from torchrepro.integrations.lightning import ReproducibleCallback

    def wrapped():
        cb = ReproducibleCallback(seed=3)
        return cb._process(_trainer(), torch.utils.data.DataLoader(range(12), batch_size=2, shuffle=True))

    a = wrapped()
    it = iter(a)
    first = [next(it).tolist() for _ in range(3)]
    state = a.state_dict()
    rest = [b.tolist() for b in it] + [b.tolist() for b in a]  # the rest of epoch 0, then epoch 1
    assert state["epoch"] == 0 and state["batches_consumed"] == 3 and state["batch_size"] == 2
    b = wrapped()
    b.load_state_dict(state)
    assert b.replay(epoch_over=False) == 3
    assert [x.tolist() for x in b] + [x.tolist() for x in b] == rest
    assert sorted(sum(first + rest[:3], [])) == list(range(12))
    assert b.dataset == range(12) and len(b) == 6
    b.worker_init_fn = print  # set on the DataLoader itself (Lightning's seeding of workers does this)
    assert b.loader.worker_init_fn is print


@needs_lightning
def test_a_position_at_the_end_of_an_epoch_replays_nothing_and_continues_with_the_next_epoch():
    from torchrepro.integrations.lightning import ReproducibleCallback

    def wrapped():
        return ReproducibleCallback(seed=5)._process(_trainer(), torch.utils.data.DataLoader(range(8), batch_size=4,
                                                                                             shuffle=True))

    a = wrapped()
    epoch0 = [x.tolist() for x in a]
    state = a.state_dict()
    epoch1 = [x.tolist() for x in a]
    assert (state["epoch"], state["batches_consumed"]) == (0, 2) and epoch0 != epoch1
    b = wrapped()
    b.load_state_dict(state)
    assert b.replay(epoch_over=True) == 0
    assert [x.tolist() for x in b] == epoch1 and b.state_dict()["epoch"] == 1


class Noisy(torch.utils.data.Dataset):
    """Augmentation drawn from torch's global RNG: the same samples under the same seeds."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i):
        return torch.full((2,), float(i)) + torch.rand(2)


class Urandom(Noisy):
    def __getitem__(self, i):
        return torch.frombuffer(bytearray(os.urandom(8)), dtype=torch.uint8)


class Keyed(Noisy):
    def __getitem__(self, key):
        return {"a": 1}[key]


@needs_lightning
def test_the_data_fingerprint_draws_nothing_and_says_why_it_has_no_digest():
    """Read under fixed seeds with every RNG put back (training draws what it would without it); a dataset with
    randomness from elsewhere, or one it cannot index by position, has no digest, and says why."""
    from torchrepro.integrations.lightning import ReproducibleCallback, _data_fingerprint

    before = torch.random.get_rng_state()
    noisy = _data_fingerprint(Noisy(), [0, 7])
    assert torch.equal(torch.random.get_rng_state(), before)
    assert noisy == _data_fingerprint(Noisy(), [0, 7]) and len(noisy["digest"]) == 32 and noisy["note"] is None
    assert noisy["digest"] != _data_fingerprint(Noisy(), [0, 6])["digest"]
    loose = _data_fingerprint(Urandom(), [0, 7])
    assert loose["digest"] is None and "samples 0, 7 differ between two reads under the same seeds" in loose["note"]
    keyed = _data_fingerprint(Keyed(), [0])
    assert keyed["digest"] is None and "samples 0 could not be read and digested (KeyError: 0)" in keyed["note"]
    assert ReproducibleCallback(seed=0, data_samples=0).data_samples == 0
    with pytest.raises(ValueError, match=r"data_samples=...\) takes a non-negative integer .*got -1"):
        ReproducibleCallback(seed=0, data_samples=-1)
