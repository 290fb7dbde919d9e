"""ReproducibleCallback: a transformers.Trainer resumed mid-epoch, with 2 DataLoader workers whose dataset and
collator draw random numbers, ends bitwise where the uninterrupted run ends; a resume that cannot is refused.

Every training runs in a new process (tests/scripts/hf_train.py); the runs are shared through module fixtures
and run two at a time, forked from processes that imported transformers once (tests/preloaded.py); so do the
resumes that must be refused, and the ranks of the DDP test, which is marked ``slow`` (``-m "not slow"`` leaves it
out).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("transformers")

from tests.preloaded import pipeline  # noqa: E402
from torchrepro._core.errors import CheckpointError  # noqa: E402
from torchrepro.integrations.transformers import (  # noqa: E402
    ReproducibleCallback,
    _replay_plan,
    _WorkerStreams,
    config_differences,
    read_state,
    skipped_batches,
    state_file_name,
    write_state,
)

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPTS = ROOT / "tests" / "scripts"
RESUMED = ["--save-steps", "100"]  # a resumed run saves nothing


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}


def _stdout(what: str, rc: int, stdout: str, stderr: str) -> str:
    assert rc in (0, 3), f"{what} failed:\n{stdout[-2000:]}\n{stderr[-4000:]}"
    return stdout


def _parse(options: tuple[str, ...], stdout: str) -> dict:
    """The RESULT of hf_train.py, or ``{"error": ...}`` when train() raised (each test says which it expects)."""
    line = [ln for ln in stdout.splitlines() if ln.startswith(("RESULT ", "ERROR "))][-1]
    kind, _, doc = line.partition(" ")
    return json.loads(doc) if kind == "RESULT" else {"error": f"hf_train.py {' '.join(options)}: {doc}"}


def _result(runs: dict[str, dict], name: str) -> dict:
    assert "error" not in runs[name], runs[name].get("error")
    return runs[name]


def _pipeline(first: dict[str, tuple[str, ...]], then: dict[str, tuple[str, tuple[str, ...]]], logs: Path,
              on_end=None, others: dict[str, tuple[str, list[str]]] | None = None) -> dict[str, dict | str]:
    """hf_train.py with each of ``first``'s options and, when the run it names has ended, ``then``'s; two at a time.
    ``others`` (name -> (the run it waits for, argv)) run other scripts of tests/scripts there, their stdout is
    returned as it is. Each run is a new process, forked from one that imported transformers (tests/preloaded.py)."""
    script = str(SCRIPTS / "hf_train.py")
    others = others or {}
    ended = pipeline({name: [script, *options] for name, options in first.items()},
                     {**{name: (after, [script, *options]) for name, (after, options) in then.items()}, **others},
                     modules=["transformers"], env=_env(), cwd=SCRIPTS, logs=logs, parallel=2, on_end=on_end)
    options = {**first, **{name: options for name, (_, options) in then.items()}}
    return {name: _stdout(" ".join(others[name][1]), e.rc, e.stdout, e.stderr) if name in others else
            _parse(options[name], _stdout(f"hf_train.py {' '.join(options[name])}", e.rc, e.stdout, e.stderr))
            for name, e in ended.items()}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hf")


@pytest.fixture(scope="module")
def _trained(root: Path) -> dict[str, dict | str]:
    """Uninterrupted runs and their resumes: without the callback, and with it (by path, by True, elsewhere); and
    the resumes that must be refused (hf_errors.py: its stdout, under "errors"), forked from the same process that
    imported transformers, once the runs whose checkpoints they resume have ended."""
    native, straight, global_rng = root / "native", root / "straight", root / "global"
    ready, done = root / "errors.ready", set()

    def ended(name: str) -> None:
        if name == "straight":
            shutil.copytree(straight / "checkpoint-7", root / "by_true" / "checkpoint-7")
            (root / "by_true" / "checkpoint-7" / "rng_state.pth").unlink()  # so only the callback restores the RNGs
        done.add(name)
        if name in ("native", "straight") and {"native", "straight"} <= done:
            _damage(root)
            ready.write_text("")  # transformers_when_ready.py starts hf_errors.py

    # "errors" waits for "global", the last of the first runs to start (two at a time), then for `ready`
    errors = [str(SCRIPTS / "transformers_when_ready.py"), str(ready), str(SCRIPTS / "hf_errors.py"),
              *(f"{name}={' '.join(options)}" for name, options in _error_scenarios(root).items())]
    return _pipeline({
        "native": ("--out", str(native), "--save-steps", "4"),
        "straight": ("--out", str(straight), "--callback", "--save-steps", "1"),
        "global": ("--out", str(global_rng), "--callback", "--save-steps", "7", "--global-rng-sampler"),
    }, {
        "native_resumed": ("native", ("--out", str(native), "--resume", str(native / "checkpoint-4"), *RESUMED)),
        # checkpoint-3: mid-epoch 0, 3 batches trained, so each worker carries the other's stream
        "by_path": ("straight", ("--out", str(straight), "--callback", "--resume", str(straight / "checkpoint-3"),
                                 *RESUMED)),
        # checkpoint-7: mid-epoch 1 (5 batches an epoch), without Trainer's rng_state.pth
        "by_true": ("straight", ("--out", str(root / "by_true"), "--callback", "--resume", "true", *RESUMED)),
        # outside output_dir, named through callback.resume_from(); the sampler draws from the global RNG
        "global_resumed": ("global", ("--out", str(root / "elsewhere"), "--callback", "--global-rng-sampler",
                                      "--resume-from", str(global_rng / "checkpoint-7"), *RESUMED)),
    }, root / "logs", on_end=ended, others={"errors": ("global", errors)})


@pytest.fixture(scope="module")
def runs(_trained: dict[str, dict | str]) -> dict[str, dict]:
    return {name: run for name, run in _trained.items() if name != "errors"}


def test_native_resume_differs_after_the_checkpoint(runs: dict[str, dict]) -> None:
    straight, resumed = _result(runs, "native"), _result(runs, "native_resumed")
    assert resumed["step"] == straight["step"] == 8
    assert resumed["losses"][:4] == straight["losses"][:4]  # the first 4 steps are the saving run's own log
    assert resumed["losses"][4] != straight["losses"][4]  # step 5: the workers' augmentation differs
    assert resumed["digest"] != straight["digest"]


@pytest.mark.parametrize("resumed", ["by_path", "by_true"])
def test_callback_resume_is_bitwise(runs: dict[str, dict], resumed: str) -> None:
    got, want = _result(runs, resumed), _result(runs, "straight")
    assert got["step"] == 8
    assert got["losses"] == want["losses"]
    assert got["digest"] == want["digest"]


def test_callback_resume_from_outside_output_dir_with_a_global_rng_sampler(runs: dict[str, dict]) -> None:
    got, want = _result(runs, "global_resumed"), _result(runs, "global")
    assert got["losses"] == want["losses"]
    assert got["digest"] == want["digest"]


def test_each_checkpoint_holds_the_position_it_was_saved_at(runs: dict[str, dict], root: Path) -> None:
    mid = read_state(root / "straight" / "checkpoint-3" / state_file_name(0))
    assert (mid.global_step, mid.epoch, mid.batches) == (3, 0, 3)
    end = read_state(root / "straight" / "checkpoint-5" / state_file_name(0))
    assert (end.global_step, end.epoch, end.batches) == (5, 1, 0)  # the end of epoch 0 is the start of epoch 1
    assert mid.config["num_workers"] == 2 and mid.config["per_device_train_batch_size"] == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ddp(root: Path) -> dict[str, list[dict]]:
    """2-rank DDP (gloo, CPU): straight, and resumed from checkpoint-3 (mid-epoch on each rank). Each rank is a new
    process started as torchrun --standalone --nproc-per-node 2 starts it (tests/scripts/transformers_ddp_rank.py
    sets its environment), forked from one that imported transformers (tests/preloaded.py): torchrun's ranks
    each imported it again."""
    out, data = root / "ddp", ["--dataset-len", "20"]  # 5 batches an epoch on each rank
    ports = {"straight": _free_port(), "resumed": _free_port()}  # the resumed ranks never meet the straight ones

    def ranks(run: str, *options: str) -> dict[str, list[str]]:
        return {f"{run}{rank}": [str(SCRIPTS / "transformers_ddp_rank.py"), str(rank), "2", str(ports[run]),
                                 str(SCRIPTS / "hf_train.py"), "--out", str(out), "--callback", *data, *options]
                for rank in (0, 1)}

    straight = ranks("straight", "--save-steps", "3")
    # each resumed rank starts when its straight rank has ended: both trained past step 3 together, so
    # checkpoint-3 is complete
    resumed = {name: (name.replace("resumed", "straight"), argv)
               for name, argv in ranks("resumed", "--resume", str(out / "checkpoint-3"), *RESUMED).items()}
    ended = pipeline(straight, resumed, modules=["transformers"], env={**_env(), "OMP_NUM_THREADS": "1"},
                     cwd=SCRIPTS, logs=root / "ddp-logs", parallel=0)

    def results(run: str) -> list[dict]:
        found = []
        for rank in (0, 1):
            e = ended[f"{run}{rank}"]
            stdout = _stdout(f"{run} rank {rank}", e.rc, e.stdout, e.stderr)
            found += [json.loads(ln.partition(" ")[2]) for ln in stdout.splitlines() if ln.startswith("RESULT ")]
        return found

    return {"straight": results("straight"), "resumed": results("resumed")}


@pytest.mark.slow
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_ddp_each_rank_resumes_its_shard_bitwise(ddp: dict[str, list[dict]], root: Path) -> None:
    assert len(ddp["straight"]) == len(ddp["resumed"]) == 2, ddp
    assert ddp["straight"][0]["digest"] == ddp["straight"][1]["digest"]  # replicas agree
    assert [r["digest"] for r in ddp["resumed"]] == [r["digest"] for r in ddp["straight"]]
    assert ddp["resumed"][0]["losses"] == ddp["straight"][0]["losses"]
    for rank in (0, 1):
        saved = read_state(root / "ddp" / "checkpoint-3" / state_file_name(rank))
        assert (saved.config["rank"], saved.config["world_size"], saved.batches) == (rank, 2, 3)


# --- resumes that must be refused ------------------------------------------------------------------------
ERRORS = {
    "no_state": ["torchrepro_state_rank0.json", "saved without ReproducibleCallback", "remove the callback"],
    "batch_size": ["another configuration", "per_device_train_batch_size: saved 2, now 3"],
    "seed": ["another configuration", "seed: saved 0, now 1"],
    "dataset_len": ["dataset_len: saved 10, now 12"],
    "corrupt": ["torchrepro_state_rank0.json: is corrupt", "Nothing was restored"],
    "truncated": ["is not valid JSON", "Nothing was restored"],
    "outside": ["cannot tell which checkpoint", "callback.resume_from(PATH)"],
    "mixed": ["belongs to another checkpoint"],
    "no_optimizer": ["optimizer and scheduler state that Trainer did not restore as saved"],
}


def _bad(root: Path) -> dict[str, Path]:
    return {name: root / "bad" / name for name in ("corrupt", "truncated", "mixed", "no_optimizer")}


def _damage(root: Path) -> None:
    """The damaged copies of straight/checkpoint-4 that _error_scenarios resume."""
    straight, ckpt = root / "straight", root / "straight" / "checkpoint-4"
    bad = _bad(root)
    for path in bad.values():
        shutil.copytree(ckpt, path)
    state = bad["corrupt"] / state_file_name(0)
    state.write_text(state.read_text().replace('"batches": 4', '"batches": 3'))
    state = bad["truncated"] / state_file_name(0)
    state.write_bytes(state.read_bytes()[:-100])
    shutil.copy(straight / "checkpoint-3" / state_file_name(0), bad["mixed"] / state_file_name(0))
    (bad["no_optimizer"] / "optimizer.pt").unlink()


def _error_scenarios(root: Path) -> dict[str, list[str]]:
    """hf_train.py's options of each resume of ERRORS."""
    straight, ckpt = root / "straight", root / "straight" / "checkpoint-4"
    resume = ["--callback", "--resume", str(ckpt), *RESUMED]
    return {
        "no_state": ["--out", str(root / "native"), "--callback", "--resume", str(root / "native" / "checkpoint-4"),
                     *RESUMED],
        "batch_size": ["--out", str(straight), *resume, "--batch-size", "3"],
        "seed": ["--out", str(straight), *resume, "--seed", "1"],
        "dataset_len": ["--out", str(straight), *resume, "--dataset-len", "12"],
        "outside": ["--out", str(root / "e_outside"), *resume],
        **{name: ["--out", str(root / f"e_{name}"), "--callback", "--resume-from", str(path), *RESUMED]
           for name, path in _bad(root).items()},
    }


@pytest.fixture(scope="module")
def errors(_trained: dict[str, dict | str], root: Path) -> dict[str, dict]:
    """What hf_errors.py printed for each resume of _error_scenarios (run by _trained)."""
    scenarios = _error_scenarios(root)
    found = {}
    for line in _trained["errors"].splitlines():
        name, _, rest = line.partition(" ")
        if name in scenarios:
            kind, _, doc = rest.partition(" ")
            found[name] = {"kind": kind, **(json.loads(doc) if doc else {})}
    return found


@pytest.mark.parametrize("scenario", sorted(ERRORS))
def test_a_resume_that_cannot_be_exact_is_refused(errors: dict[str, dict], scenario: str) -> None:
    got = errors[scenario]
    assert got["kind"] == "ERROR", f"{scenario}: the resume was not refused: {got}"
    assert got["type"] == "CheckpointError"
    for text in ERRORS[scenario]:
        assert text in got["message"], f"{scenario}: {text!r} not in {got['message']!r}"


# --- the parts, in this process ----------------------------------------------------------------------------
class _Draws(torch.utils.data.Dataset):
    """Each item draws from the worker's torch RNG, so it depends on what the worker loaded before."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.rand(1) + i


def _collate(samples: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(samples) + torch.rand(1)


def _epoch(start: int, batches: list[list[int]]) -> list[torch.Tensor]:
    """Batches ``start``.. of an epoch of ``batches`` through 2 workers seeded (and replaying) as the callback does."""
    plan = _replay_plan([tuple(b) for b in batches[:start]], start, 2)
    init = _WorkerStreams(None, seed=7, epoch=0, rank=0, start=start, num_workers=2, replay=plan,
                          collate_fn=_collate)
    loader = torch.utils.data.DataLoader(_Draws(), batch_sampler=batches[start:], num_workers=2,
                                         collate_fn=_collate, worker_init_fn=init)
    return list(loader)


@pytest.mark.parametrize("start", [3, 4])
def test_replayed_workers_continue_their_streams(start: int) -> None:
    batches = [[i, i + 1] for i in range(0, 12, 2)]
    full = _epoch(0, batches)
    assert [torch.equal(a, b) for a, b in zip(_epoch(start, batches), full[start:])] == [True] * (6 - start)
    no_replay = _WorkerStreams(None, 7, 0, 0, start, 2, (), _collate)
    loader = torch.utils.data.DataLoader(_Draws(), batch_sampler=batches[start:], num_workers=2,
                                         collate_fn=_collate, worker_init_fn=no_replay)
    assert not torch.equal(next(iter(loader)), full[start])  # without the replay the stream starts over


def test_skipped_batches_leave_every_rng_alone() -> None:
    loader = torch.utils.data.DataLoader(range(10), batch_size=3, shuffle=True)
    before = torch.get_rng_state()
    skipped = skipped_batches(loader, 0, 2)
    assert torch.equal(torch.get_rng_state(), before)
    assert [tuple(b.tolist()) for b in list(loader)[:2]] == skipped


def test_config_differences_name_each_setting() -> None:
    saved = {"per_device_train_batch_size": 4, "world_size": 2, "seed": 0}
    assert config_differences(saved, {**saved, "world_size": 1, "seed": 3}) == [
        "world_size: saved 2, now 1", "seed: saved 0, now 3"]
    assert config_differences(saved, dict(saved)) == []


def test_read_state_refuses_a_document_of_another_kind(tmp_path: Path) -> None:
    path = tmp_path / state_file_name(0)
    write_state(path, {"config": {}})
    with pytest.raises(CheckpointError, match="is incomplete: it lacks position"):
        read_state(path)
    path.write_text(json.dumps({"format": "something else", "version": 1, "sha256": "", "state": {}}))
    with pytest.raises(CheckpointError, match="is not a torchrepro Trainer state"):
        read_state(path)


def _args(**overrides: object) -> SimpleNamespace:
    """The TrainingArguments fields the callback reads."""
    fields = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 1, "world_size": 1, "seed": 0,
              "data_seed": None, "dataloader_drop_last": False, "process_index": 0, "output_dir": "out",
              "save_only_model": False, "ignore_data_skip": False}
    return SimpleNamespace(**{**fields, **overrides})


def test_resume_from_without_resuming_is_refused() -> None:
    callback = ReproducibleCallback()
    callback.resume_from("elsewhere/checkpoint-4")
    loader = torch.utils.data.DataLoader(range(10), batch_size=2)
    with pytest.raises(ValueError, match="resume_from.*Trainer starts from step 0"):
        callback.on_train_begin(_args(), SimpleNamespace(global_step=0), None, train_dataloader=loader)


@pytest.mark.parametrize(("setting", "message"), [
    ({"persistent_workers": True}, "dataloader_persistent_workers=True"),
    ({"in_order": False}, "dataloader_in_order=False"),
])
def test_settings_that_cannot_resume_exactly_are_refused_at_the_start(setting: dict, message: str) -> None:
    loader = torch.utils.data.DataLoader(range(10), batch_size=2, num_workers=1, **setting)
    with pytest.raises(ValueError, match=message):
        ReproducibleCallback().on_train_begin(_args(), SimpleNamespace(global_step=0), None, train_dataloader=loader)
    with pytest.raises(ValueError, match="save_only_model=True"):
        ReproducibleCallback().on_train_begin(_args(save_only_model=True), SimpleNamespace(global_step=0), None,
                                              train_dataloader=torch.utils.data.DataLoader(range(4)))


def test_the_module_needs_transformers_and_torchrepro_does_not_import_it() -> None:
    code = (
        "import sys\n"
        "import torchrepro, torchrepro.integrations\n"
        "assert 'transformers' not in sys.modules, 'import torchrepro imported transformers'\n"
        "sys.modules['transformers'] = None\n"
        "try:\n"
        "    import torchrepro.integrations.transformers\n"
        "except ImportError as exc:\n"
        "    print('IMPORT-ERROR', exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "IMPORT-ERROR" in proc.stdout and "pip install torchrepro[transformers]" in proc.stdout


def test_damaged_rng_states_are_a_checkpoint_error(runs: dict[str, dict], root: Path, tmp_path: Path) -> None:
    """A checksum-valid state whose RNG entry is garbage: CheckpointError with the checkpoint's advice (it was a
    StateFileError, which `except CheckpointError` did not catch, advising torchrepro.save_rng_state())."""
    saved = json.loads((root / "straight" / "checkpoint-3" / state_file_name(0)).read_text())["state"]
    path = tmp_path / state_file_name(0)
    write_state(path, {**saved, "rng": {"junk": 1}})
    with pytest.raises(CheckpointError, match=r"holds damaged RNG states \(") as info:
        read_state(path)
    assert "Use another checkpoint" in str(info.value) and "save_rng_state" not in str(info.value)


@pytest.mark.parametrize("kind", ["fifo", "devzero", "dangling", "directory"])
def test_a_state_file_that_is_not_a_regular_file_is_named_and_never_opened(tmp_path: Path, kind: str) -> None:
    """A FIFO (opening it would block), a symlink to /dev/zero (reading it would never end), a dangling symlink or
    a directory where the state file should be: what was found, what was expected, what to do. Before the fix:
    "has no torchrepro state torchrepro_state_rank0.json (it holds torchrepro_state_rank0.json: saved by another
    number of processes)"."""
    directory = tmp_path / "checkpoint-4"
    directory.mkdir()
    path = directory / state_file_name(0)
    found = {"fifo": "is a FIFO (named pipe)",
             "devzero": "is a symbolic link to /dev/zero, which is a character device",
             "dangling": f"is a symbolic link to {tmp_path / 'gone'}, which does not exist",
             "directory": "is a directory"}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "devzero":
        path.symlink_to("/dev/zero")
    elif kind == "dangling":
        path.symlink_to(tmp_path / "gone")
    else:
        path.mkdir()
    with pytest.raises(CheckpointError) as info:
        ReproducibleCallback()._locate(_args(), SimpleNamespace(global_step=4), str(directory))
    message = str(info.value)
    assert message.startswith(f"{path}: {found}, expected a regular file: the JSON state ReproducibleCallback "
                              "writes into each checkpoint Trainer saves."), message
    assert "another number of processes" not in message
    assert "Remove it and resume from a checkpoint saved with ReproducibleCallback" in message
