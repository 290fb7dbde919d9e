"""The reproducibility audit: each checklist item judged on synthetic facts, on this process, and on scripts."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import torchrepro
from torchrepro._core.errors import RunDirError
from torchrepro.cli import main
from torchrepro.env.audit import ADVICE, CHECKS, INFO, OK, THREAT, Facts, audit_recorded, evaluate
from torchrepro.env.info import NOT_AVAILABLE, environment

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.fixture(scope="module")
def base_env() -> dict:
    """This machine's fingerprint with a clean CPU setting: deterministic, no TF32, no variables set."""
    doc = environment().to_json()
    doc["determinism"].update(use_deterministic_algorithms=True, warn_only=False, cudnn_benchmark=False)
    doc["precision"].update(cuda_matmul_allow_tf32=False, float32_matmul_precision="highest")
    doc["env"] = {k: None for k in doc["env"]}
    doc["cuda"].update(available=False, device_count=0)
    doc["torch_build"]["cuda"] = NOT_AVAILABLE
    return doc


def judge(env: dict, *, probe: dict | None = None, launch_env: dict | None = None, seed: int | None = None,
          context: str = "script") -> dict:
    """{item id: (severity, state)} for the given facts."""
    facts = Facts(env=env, context=context, probe=probe if probe is not None else {},
                  launch_env={"PYTHONHASHSEED": "0"} if launch_env is None else launch_env, launch_seed=seed)
    return {item.id: (item.severity, item.state) for item in evaluate(facts)}


def changed(env: dict, section: str, **values) -> dict:
    out = copy.deepcopy(env)
    out[section].update(values)
    return out


SEEDED = {"seeding_calls": [{"function": "torch.manual_seed", "seed": 0}]}


def test_a_clean_setting_has_no_findings(base_env):
    result = judge(base_env, probe=SEEDED)
    assert [k for k, (sev, _) in result.items() if sev in (ADVICE, THREAT)] == []
    assert list(result) == [c.id for c in CHECKS]
    assert result["rng-seeds"] == (OK, "seeded before the first step by torch.manual_seed")
    assert result["hardware"][0] == INFO


def test_a_rows_title_states_the_finding_not_the_goal(base_env):
    """A THREAT row titled 'deterministic algorithms on' read as the opposite of what was found."""
    off = changed(base_env, "determinism", use_deterministic_algorithms=False, cudnn_benchmark=True)
    facts = Facts(env=off, context="script", probe={}, launch_env={}, launch_seed=None)
    titles = {item.id: (item.severity, item.title) for item in evaluate(facts)}
    assert titles["deterministic-mode"] == (THREAT, "deterministic algorithms off (or warn-only)")
    assert titles["cudnn-benchmark"] == (THREAT, "cuDNN autotuning on")
    assert titles["pythonhashseed"] == (THREAT, "PYTHONHASHSEED not fixed at launch")
    assert titles["rng-seeds"] == (THREAT, "random-number generators not seeded")
    clean = {item.id: item.title for item in evaluate(Facts(env=base_env, context="script", probe=SEEDED,
                                                            launch_env={"PYTHONHASHSEED": "0"}))}
    assert clean["deterministic-mode"] == "deterministic algorithms on"
    never_a_finding = {"mixed-precision", "hardware"}  # info at most
    assert [c.id for c in CHECKS if not c.problem] == sorted(never_a_finding, key=[c.id for c in CHECKS].index)


def test_seeds(base_env):
    assert judge(base_env)["rng-seeds"] == (THREAT, (
        "no seeding call before the first step (random.seed, numpy.random.seed, torch.manual_seed, "
        "torchrepro.seed_everything): initial weights, shuffling and dropout differ in every run"))
    assert judge(base_env, seed=7)["rng-seeds"] == (OK, "seeded before the first step by torchrepro --seed 7")
    live = judge(base_env, context="process")["rng-seeds"]
    assert live[0] == INFO and "not visible in a running process" in live[1]


@pytest.mark.parametrize("launched, severity", [({}, THREAT), ({"PYTHONHASHSEED": "random"}, THREAT),
                                                ({"PYTHONHASHSEED": "0"}, OK), ({"PYTHONHASHSEED": "42"}, OK)])
def test_pythonhashseed_at_launch(base_env, launched, severity):
    sev, state = judge(base_env, probe=SEEDED, launch_env=launched)["pythonhashseed"]
    assert sev == severity
    if severity == THREAT:
        assert state.startswith(f"PYTHONHASHSEED is {'unset' if not launched else repr('random')} where the script "
                                "is launched: each run hashes str differently")


@pytest.mark.parametrize("loader, probe_seed, severity", [
    ({"num_workers": 0, "worker_init_fn": None, "generator": False, "shuffle": True}, False, THREAT),
    ({"num_workers": 2, "worker_init_fn": None, "generator": False, "shuffle": False}, False, THREAT),
    ({"num_workers": 2, "worker_init_fn": "seed_worker", "generator": True, "shuffle": True}, False, OK),
    ({"num_workers": 0, "worker_init_fn": None, "generator": False, "shuffle": True}, True, OK),
    ({"num_workers": 0, "worker_init_fn": None, "generator": False, "shuffle": False}, False, OK),
])
def test_dataloaders(base_env, loader, probe_seed, severity):
    probe = {"dataloaders": [loader], **(SEEDED if probe_seed else {})}
    assert judge(base_env, probe=probe)["dataloader-workers"][0] == severity


def test_deterministic_mode_and_cudnn_benchmark(base_env):
    off = judge(changed(base_env, "determinism", use_deterministic_algorithms=False), probe=SEEDED)
    assert off["deterministic-mode"][0] == THREAT and off["deterministic-mode"][1].startswith("off:")
    warn = judge(changed(base_env, "determinism", warn_only=True), probe=SEEDED)["deterministic-mode"]
    assert warn[0] == THREAT and "warn_only=True" in warn[1]
    bench = judge(changed(base_env, "determinism", cudnn_benchmark=True), probe=SEEDED)["cudnn-benchmark"]
    assert bench == (THREAT, "torch.backends.cudnn.benchmark = True: cuDNN times several convolution algorithms "
                     "and keeps the fastest, which can differ from run to run (no effect without a GPU, but the "
                     "same script autotunes on one)")


def test_cublas_workspace_config(base_env):
    cuda_build = copy.deepcopy(base_env)
    cuda_build["torch_build"]["cuda"] = "12.4"
    old = changed(cuda_build, "cuda") | {"torch": "2.9.1+cu124"}
    assert judge(old, probe=SEEDED)["cublas-workspace"] == (THREAT, (
        "unset, and torch 2.9.1+cu124 needs it for deterministic cuBLAS matmuls (deterministic mode raises an "
        "error for them without it)"))
    new = cuda_build | {"torch": "2.13.0+cu130"}
    assert judge(new, probe=SEEDED)["cublas-workspace"] == (OK, "unset; not needed by torch 2.13.0+cu130")
    assert judge(base_env, probe=SEEDED)["cublas-workspace"] == (OK, "not needed: this torch has no CUDA")
    bad = changed(old, "env", CUBLAS_WORKSPACE_CONFIG="4096:8")
    assert judge(bad, probe=SEEDED)["cublas-workspace"] == (THREAT, "CUBLAS_WORKSPACE_CONFIG='4096:8' is not a "
                                                            "valid value")
    good = changed(old, "env", CUBLAS_WORKSPACE_CONFIG=":4096:8")
    assert judge(good, probe=SEEDED)["cublas-workspace"][0] == OK
    late = SEEDED | {"cublas_at_start": None, "cublas_sets": [{"value": ":4096:8", "cuda_initialized": True}]}
    assert judge(good, probe=late)["cublas-workspace"] == (THREAT, (
        "set by the script to ':4096:8' after CUDA had started: cuBLAS may already have made its workspaces and "
        "then ignores it"))
    early = SEEDED | {"cublas_at_start": None, "cublas_sets": [{"value": ":4096:8", "cuda_initialized": False}]}
    assert judge(good, probe=early)["cublas-workspace"][0] == OK


def test_cuda_launch_blocking_is_advice_not_a_threat(base_env):
    result = judge(changed(base_env, "env", CUDA_LAUNCH_BLOCKING="1"), probe=SEEDED)
    assert result["cuda-launch-blocking"] == (ADVICE, "CUDA_LAUNCH_BLOCKING=1: every kernel launch waits for the "
                                              "GPU, which is slow and does not make results deterministic")
    items = evaluate(Facts(env=changed(base_env, "env", CUDA_LAUNCH_BLOCKING="1"), context="script", probe=SEEDED,
                           launch_env={"PYTHONHASHSEED": "0"}))
    item = next(i for i in items if i.id == "cuda-launch-blocking")
    assert item.finding and not item.threatens and item.fix.startswith("Unset CUDA_LAUNCH_BLOCKING")


def test_nccl(base_env):
    assert judge(base_env, probe=SEEDED)["nccl"] == (OK, "no multi-GPU communication on this machine")
    pinned = judge(changed(base_env, "env", NCCL_ALGO="Tree", NCCL_PROTO="LL"), probe=SEEDED)["nccl"]
    assert pinned == (ADVICE, "NCCL_ALGO=Tree, NCCL_PROTO=LL: these change the order in which all-reduce adds "
                      "gradients, so runs with other values (or none) give other bits")
    fake = judge(changed(base_env, "env", NCCL_DETERMINISTIC="1"), probe=SEEDED)["nccl"]
    assert fake == (ADVICE, "NCCL_DETERMINISTIC is set, but it is not an NCCL variable and has no effect")
    many = judge(changed(base_env, "cuda", device_count=8), probe=SEEDED)["nccl"]
    assert many[0] == INFO and many[1].startswith("8 GPUs and NCCL chooses its algorithm")


def test_tf32_and_mixed_precision(base_env):
    tf32 = judge(changed(base_env, "precision", cuda_matmul_allow_tf32=True), probe=SEEDED)["tf32"]
    assert tf32[0] == THREAT and tf32[1].startswith("torch.backends.cuda.matmul.allow_tf32 = True: float32")
    high = judge(changed(base_env, "precision", float32_matmul_precision="high"), probe=SEEDED)["tf32"]
    assert high[0] == THREAT and high[1].startswith("float32_matmul_precision = 'high':")
    cudnn_default = changed(base_env, "precision", cudnn_allow_tf32=True)
    assert judge(cudnn_default, probe=SEEDED)["tf32"][0] == OK  # no GPU: cuDNN's TF32 default does nothing
    on_gpu = changed(cudnn_default, "cuda", available=True)
    assert judge(on_gpu, probe=SEEDED)["tf32"] == (THREAT, (
        "torch.backends.cudnn.allow_tf32 = True (torch's default): float32 matmuls/convolutions round inputs to "
        "TF32 (10-bit mantissa) on Ampere and newer GPUs, so results differ from FP32 and between GPU generations"))
    amp = SEEDED | {"autocast": [{"device": "cuda", "dtype": "float16", "enabled": True}], "grad_scalers": 1}
    assert judge(base_env, probe=amp)["mixed-precision"][0] == INFO
    assert judge(base_env, probe=amp)["mixed-precision"][1].startswith("autocast(float16) on cuda, GradScaler:")


# --- this process ---------------------------------------------------------------------------------------
def test_audit_of_this_process_follows_its_flags():
    before = {i.id: i for i in torchrepro.audit().items}
    with torchrepro.deterministic():
        during = {i.id: i for i in torchrepro.audit().items}
    after = {i.id: i for i in torchrepro.audit().items}
    assert list(during) == [c.id for c in CHECKS]
    assert during["deterministic-mode"].severity == OK
    assert before["deterministic-mode"].severity == after["deterministic-mode"].severity == THREAT
    assert before["dataloader-workers"].severity == INFO  # not visible in a running process


def test_audit_command_json_and_exit_code(capsys):
    code = main(["audit", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "torchrepro.audit/1" and doc["context"] == "process"
    assert code == doc["exit_code"] == (1 if doc["findings"] else 0)
    assert [i["id"] for i in doc["items"]] == [c.id for c in CHECKS]
    assert all(set(i) == {"id", "area", "title", "severity", "threatens_reproducibility", "finding", "state", "fix"}
               for i in doc["items"])


# --- scripts, through the launcher ----------------------------------------------------------------------
def audit_script(script: str, tmp_path: Path, args: tuple[str, ...] = (), **env: str) -> tuple[int, dict, str]:
    p = subprocess.run([sys.executable, "-m", "torchrepro", "audit", "--json", "--", "python", str(SCRIPTS / script),
                        *args], capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**os.environ, **env})
    return p.returncode, json.loads(p.stdout), p.stderr


def test_audit_of_a_script_that_autotunes_and_never_seeds(tmp_path):
    code, doc, err = audit_script("audit_benchmark_unseeded.py", tmp_path)
    assert code == 1, err
    items = {i["id"]: i for i in doc["items"]}
    assert doc["context"] == "script" and doc["command"][-1].endswith("audit_benchmark_unseeded.py")
    assert items["cudnn-benchmark"]["severity"] == THREAT and items["cudnn-benchmark"]["threatens_reproducibility"]
    assert items["rng-seeds"]["severity"] == THREAT and items["rng-seeds"]["fix"].startswith(
        "Call torchrepro.seed_everything(SEED)")
    assert items["dataloader-workers"]["state"].startswith("1 DataLoader(s): #1: shuffled, 0 workers, generator no")
    assert "trained" not in err  # stopped at its first step


def test_audit_of_a_script_that_does_everything(tmp_path):
    code, doc, err = audit_script("audit_clean.py", tmp_path, PYTHONHASHSEED="0")
    assert code == 0, (err, [i for i in doc["items"] if i["finding"]])
    items = {i["id"]: i for i in doc["items"]}
    assert items["rng-seeds"]["state"].startswith("seeded before the first step by numpy.random.seed, random.seed, "
                                                  "torch.")
    assert items["dataloader-workers"]["state"] == ("1 DataLoader(s): #1: shuffled, 0 workers, generator yes, "
                                                    "worker_init_fn seed_worker")
    assert items["mixed-precision"]["state"].startswith("autocast(bfloat16) on cpu:")
    assert items["cublas-workspace"]["severity"] == OK


def test_audit_of_a_failing_script_is_an_error(tmp_path):
    p = subprocess.run([sys.executable, "-m", "torchrepro", "audit", "--", "python", str(SCRIPTS / "fails.py")],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 2
    assert "failed with exit code 1 before it could be audited" in p.stderr


def test_audit_of_a_script_that_ends_in_os_exit(tmp_path):
    code, doc, err = audit_script("os_exit.py", tmp_path, args=("0",), PYTHONHASHSEED="0")
    assert code == 1, err  # deterministic mode is off
    items = {i["id"]: i for i in doc["items"]}
    assert items["rng-seeds"]["state"] == ("seeded before the first step by torch.cuda.manual_seed_all, "
                                           "torch.manual_seed")
    assert doc["notes"] == ["The script ended before its first training step; it was audited at its end."]


def test_a_recorded_manifest_without_environment_is_a_clear_error():
    with pytest.raises(RunDirError, match=r"^run/manifest.json: has no 'environment' \(the script ended before "
                                          r"torchrepro could record it"):
        audit_recorded({"command": ["python", "t.py"], "steps": 0}, launch_env={}, source="run/manifest.json")


def test_audit_interrupted_does_not_name_the_directory_it_removed(tmp_path):
    pidfile, tmp = tmp_path / "pid", tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "torchrepro", "audit", "--", "python", str(SCRIPTS / "waits.py"),
                             str(pidfile)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp)})
    deadline = time.monotonic() + 120
    while not pidfile.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    assert stderr.endswith(f"torchrepro: interrupted by SIGTERM: stopped the script `python {SCRIPTS / 'waits.py'} "
                           f"{pidfile}` before it could be audited; nothing was kept.\n"), stderr
    assert list(tmp.iterdir()) == []  # its temporary recording is gone, and no message names it


def test_audit_prints_recorded_values_escaped(monkeypatch, capsys):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "\x1b[31mred\x1b[0m\u202e")
    main(["audit"])
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out
    assert "\\x1b[31mred\\x1b[0m\\u202e" in out
