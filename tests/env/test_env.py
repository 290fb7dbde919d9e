"""The environment fingerprint (`torchrepro.environment`, `torchrepro env`) and its risk-ranked diff (`env diff`)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torchrepro
from torchrepro._core.errors import EnvFileError
from torchrepro._core.table import printable
from torchrepro.analysis.envdiff import BENIGN, BREAKS, MAY, RANK_TABLE, RANKS, diff_environments, rank_of
from torchrepro.cli import main
from torchrepro.cli._checkrun import EnvironmentDifferences
from torchrepro.control.determinism import current_config
from torchrepro.env.info import ENV_VARS, NOT_AVAILABLE, SCHEMA, Environment, environment

SECTIONS = {"schema", "torchrepro", "torch", "device_kind", "python", "platform", "torch_build", "cuda",
            "accelerators", "cpu", "config", "threads", "determinism", "precision", "backends", "env", "packages",
            "git"}


@pytest.fixture(scope="module")
def env_doc() -> dict:
    return environment().to_json()


# --- the fingerprint ------------------------------------------------------------------------------------
def test_fingerprint_has_every_field(env_doc):
    assert set(env_doc) == SECTIONS and env_doc["schema"] == SCHEMA
    assert env_doc["torch"] == torch.__version__ and env_doc["torchrepro"] == torchrepro.__version__
    assert set(env_doc["python"]) == {"version", "implementation", "hash_randomization"}
    assert set(env_doc["torch_build"]) == {"git_version", "debug", "cuda", "hip"}
    assert env_doc["torch_build"]["git_version"] == torch.version.git_version
    assert set(env_doc["cuda"]) == {"available", "runtime", "driver", "cudnn", "cublas", "nccl", "device_count"}
    assert set(env_doc["cpu"]) == {"model", "count", "affinity", "capability", "features"}
    assert env_doc["cpu"]["capability"] == torch.backends.cpu.get_cpu_capability()
    assert {"mkl", "onednn", "openmp", "build", "parallel_backend", "mkl_available"} <= set(env_doc["config"])
    assert env_doc["threads"] == {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()}
    assert env_doc["determinism"] == current_config().to_json()
    assert {"cuda_matmul_allow_tf32", "cudnn_allow_tf32", "float32_matmul_precision"} <= set(env_doc["precision"])
    assert {"cudnn_enabled", "sdpa_flash", "sdpa_mem_efficient", "sdpa_math", "sdpa_cudnn"} <= set(env_doc["backends"])
    assert set(ENV_VARS) <= set(env_doc["env"])
    assert env_doc["packages"]["torch"] == torch.__version__ and "torchrepro" in env_doc["packages"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only fingerprint")
def test_cuda_parts_say_not_available_without_a_gpu(env_doc):
    assert env_doc["device_kind"] == "cpu" and env_doc["accelerators"] == []
    cuda = env_doc["cuda"]
    assert cuda["available"] is False and cuda["device_count"] == 0
    for key in ("driver", "cudnn", "nccl"):
        assert cuda[key] == NOT_AVAILABLE, key
    if torch.version.cuda is None:
        assert cuda["runtime"] == cuda["cublas"] == env_doc["torch_build"]["cuda"] == NOT_AVAILABLE


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="CPU features are read from /proc/cpuinfo")
def test_cpu_features_follow_proc_cpuinfo(env_doc):
    flags: set[str] = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.split(":")[0].strip() in ("flags", "Features"):
            flags = set(line.split(":", 1)[1].split())
            break
    features = env_doc["cpu"]["features"]
    assert features and all(features[f] == (f in flags) for f in features)


def test_json_round_trip(env_doc):
    text = json.dumps(env_doc)
    again = Environment.from_json(json.loads(text))
    assert again.to_json() == env_doc and json.dumps(again.to_json()) == text
    with_host = environment(include_host=True)
    assert Environment.from_json(json.loads(json.dumps(with_host.to_json()))) == with_host


def test_live_flags_and_threads_are_read():
    threads, precision = torch.get_num_threads(), torch.get_float32_matmul_precision()
    try:
        torch.set_num_threads(1)
        torch.set_float32_matmul_precision("high")
        with torchrepro.deterministic(warn_only=True):
            torch.backends.cudnn.benchmark = True
            env = environment()
    finally:
        torch.set_num_threads(threads)
        torch.set_float32_matmul_precision(precision)
    assert env.threads["intra_op"] == 1 and env.precision["float32_matmul_precision"] == "high"
    assert env.determinism["use_deterministic_algorithms"] and env.determinism["warn_only"]
    assert env.determinism["cudnn_benchmark"] and env.env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_variables_by_family_are_recorded(monkeypatch):
    monkeypatch.setenv("NCCL_ALGO", "Tree")
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("UNRELATED_SECRET", "x")
    env = environment().env
    assert env["NCCL_ALGO"] == "Tree" and env["NVTE_FUSED_ATTN"] == "0" and env["OMP_NUM_THREADS"] == "3"
    assert "UNRELATED_SECRET" not in env


def test_no_host_or_user_name_unless_asked(monkeypatch, tmp_path):
    user, host = "zelda-user-4711", "build-host-4711.example"
    home = tmp_path / "home" / user
    home.mkdir(parents=True)
    monkeypatch.setattr("getpass.getuser", lambda: user)
    monkeypatch.setattr("socket.gethostname", lambda: host)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("NCCL_DEBUG_FILE", f"{home}/nccl.log")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", f"/tmp/torchinductor_{user}")
    monkeypatch.setenv("NCCL_COMM_ID", f"{host}:29500")
    monkeypatch.chdir(home)
    text = json.dumps(environment().to_json())
    assert "4711" not in text and str(tmp_path) not in text
    env = environment().env
    assert env["NCCL_DEBUG_FILE"] == "~/nccl.log" and env["TORCHINDUCTOR_CACHE_DIR"] == "/tmp/torchinductor_<user>"
    assert env["NCCL_COMM_ID"] == "<host>:29500"
    full = environment(include_host=True).to_json()
    assert full["host"] == {"hostname": host, "user": user, "home": str(home), "cwd": str(home),
                            "python_executable": full["host"]["python_executable"]}
    assert full["env"]["NCCL_DEBUG_FILE"] == f"{home}/nccl.log"


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_commit_and_digest_of_uncommitted_changes(tmp_path):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "train.py").write_text("print(1)\n")
    subprocess.run([*git, "add", "train.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    clean = environment(git_dir=repo / "pkg").git
    assert clean == {"checkout": True, "commit": head, "dirty": False, "changed_files": 0, "changes_sha256": None}
    (repo / "train.py").write_text("print(2)\n")
    first = environment(git_dir=repo).git
    (repo / "train.py").write_text("print(3)\n")
    second = environment(git_dir=repo).git
    (repo / "notes.txt").write_text("new file")
    third = environment(git_dir=repo).git
    assert first["dirty"] and first["changed_files"] == 1 and third["changed_files"] == 2
    digests = {first["changes_sha256"], second["changes_sha256"], third["changes_sha256"]}
    assert len(digests) == 3 and None not in digests
    assert environment(git_dir=tmp_path).git == {"checkout": False}


# --- the rank table and the diff ------------------------------------------------------------------------
def test_rank_table_is_data_with_reasons():
    assert RANK_TABLE[-1].pattern == "*"
    for rule in RANK_TABLE:
        assert rule.rank in RANKS and len(rule.reason) > 10, rule
    assert rank_of("packages.torch").rank == BREAKS and rank_of("packages.tqdm").rank == BENIGN


def _with(doc: dict, path: str, value) -> dict:
    out = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node = out
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
    return out


@pytest.mark.parametrize("path, value, rank, short", [
    ("torch", "2.12.0", BREAKS, "torch {a} → 2.12.0"),
    ("threads.intra_op", 7, BREAKS, "intra-op threads {a} → 7"),
    ("determinism.use_deterministic_algorithms", True, BREAKS, "determinism.use_deterministic_algorithms on"),
    ("precision.float32_matmul_precision", "medium", BREAKS, "precision.float32_matmul_precision {a} → medium"),
    ("cpu.features.avx512f", "flip", BREAKS, "AVX-512 {flip}"),
    ("env.OMP_NUM_THREADS", "4", BREAKS, "OMP_NUM_THREADS {a} → 4"),
    ("env.NCCL_ALGO", "Ring", BREAKS, "NCCL_ALGO {a} → Ring"),
    ("cuda.cudnn", "90100", BREAKS, "cuda.cudnn {a} → 90100"),
    ("packages.numpy", "0.0.1", MAY, "packages.numpy {a} → 0.0.1"),
    ("config.onednn", "v9.9", MAY, "config.onednn {a} → v9.9"),
    ("python.version", "3.99.0", MAY, "python.version {a} → 3.99.0"),
    ("packages.rich", "0.0.1", BENIGN, "packages.rich {a} → 0.0.1"),
    ("env.CUDA_LAUNCH_BLOCKING", "1", BENIGN, "CUDA_LAUNCH_BLOCKING {a} → 1"),
    ("env.NCCL_DEBUG", "INFO", BENIGN, "NCCL_DEBUG {a} → INFO"),
    ("platform.release", "0.0-test", BENIGN, "platform.release {a} → 0.0-test"),
])
def test_a_synthetic_change_lands_in_its_rank(env_doc, path, value, rank, short):
    base = _with(env_doc, "cpu.features", {"avx512f": True}) if path.startswith("cpu.features") else env_doc
    base = _with(base, "packages.numpy", "2.0.0") if path == "packages.numpy" else base
    base = _with(base, "packages.rich", "13.0.0") if path == "packages.rich" else base
    # the rows of the CUDA stack rank as such where CUDA can run (on two CPU-only sides they are benign)
    base = _with(base, "cuda.available", True) if path.startswith(("env.NCCL_", "cuda.")) else base
    old = base
    for part in path.split("."):
        old = old.get(part) if isinstance(old, dict) else None
    new = (not old) if value == "flip" else value
    diff = diff_environments(base, _with(base, path, new))
    assert [(c.key, c.rank) for c in diff.changes] == [(path, rank)]
    fmt = {None: "unset", True: "on", False: "off"}
    a = fmt.get(old, old) if not isinstance(old, int) or isinstance(old, bool) else old
    assert diff.changes[0].short() == short.format(a=a, flip="on" if new else "off")
    assert diff.exit_code == (1 if rank == BREAKS else 0)


def test_diff_with_itself_is_empty(env_doc):
    diff = diff_environments(env_doc, copy.deepcopy(env_doc))
    assert diff.changes == [] and diff.exit_code == 0 and diff.to_json()["verdict"] == "same"


def test_diff_environments_takes_environments_documents_and_files(env_doc, tmp_path):
    env = Environment.from_json(env_doc)
    path = tmp_path / "env.json"
    path.write_text(json.dumps(env_doc))
    for a, b in ((env, env_doc), (env_doc, env), (str(path), env), (env, path)):
        assert diff_environments(a, b).changes == []
    with pytest.raises(TypeError, match=r"a is of type int; expected a torchrepro.Environment"):
        diff_environments(3, env)  # type: ignore[arg-type]


def test_reading_tf32_never_fails_after_the_new_api_is_used():
    """torch >= 2.9 raises on cudnn.allow_tf32 once fp32_precision was set (a 'mix of the legacy and new APIs')."""
    code = ("import torch, torchrepro\n"
            "if hasattr(torch.backends.cudnn, 'conv'):\n"
            "    torch.backends.cudnn.conv.fp32_precision = 'ieee'\n"
            "    torch.backends.cudnn.rnn.fp32_precision = 'ieee'\n"
            "p = torchrepro.environment().precision\n"
            "print(p['cudnn_allow_tf32'], p['cuda_matmul_allow_tf32'])\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["False", "False"]


def test_the_seed_is_one_difference_not_four(env_doc):
    def launched(seed: int) -> dict:
        doc = _with(_with(env_doc, "env.PYTHONHASHSEED", str(seed)), "env.TORCHREPRO_SEED", str(seed))
        return doc | {"launch": {"seed": seed, "pythonhashseed": str(seed), "deterministic": False, "command": "x"}}

    diff = diff_environments(launched(1), launched(2))
    assert [(c.key, c.a, c.b, c.rank) for c in diff.changes] == [("launch.seed", 1, 2, BREAKS)]
    # A hash seed the launcher did not derive from the seed is its own difference.
    odd = _with(launched(2), "env.PYTHONHASHSEED", "77")
    assert [c.key for c in diff_environments(launched(1), odd).changes] == ["env.PYTHONHASHSEED", "launch.seed"]
    # The torch version is one difference, though the fingerprint holds it twice (torch and packages.torch).
    newer = _with(_with(env_doc, "torch", "9.9.9"), "packages.torch", "9.9.9")
    assert [c.key for c in diff_environments(env_doc, newer).changes] == ["torch"]
    # Launch options are compared only when both sides have them.
    assert diff_environments(env_doc, launched(1)).changes[0].key == "env.PYTHONHASHSEED"


def test_package_added_and_removed(env_doc):
    b = copy.deepcopy(env_doc)
    b["packages"]["scipy"] = "1.0.0"
    b["packages"].pop("torchrepro")
    diff = diff_environments(env_doc, b)
    rows = {c.key: (c.only_in, c.rank) for c in diff.changes}
    assert rows == {"packages.scipy": ("b", MAY), "packages.torchrepro": ("a", BENIGN)}
    assert diff.of_rank(MAY)[0].values() == "absent → 1.0.0"


# --- the command line -----------------------------------------------------------------------------------
def _write(path: Path, doc) -> str:
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return str(path)


def test_env_text_and_output_file(tmp_path, capsys):
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert f"torch                {torch.__version__}"[:5] in out and "threads.intra_op" in out
    assert "packages" in out and "(--json lists all)" in out
    if not torch.cuda.is_available():
        assert any(line.split() == ["cuda.driver", "not", "available"] for line in out.splitlines())
    target = tmp_path / "env.json"
    assert main(["env", "-o", str(target)]) == 0
    written = capsys.readouterr()
    assert written.err.strip() == f"torchrepro: wrote the environment to {target}"
    assert written.out == ""  # as its help says: instead of the table
    assert Environment.from_json(json.loads(target.read_text())).torch == torch.__version__
    assert main(["env", "--include-host", "--json"]) == 0
    assert "hostname" in json.loads(capsys.readouterr().out)["host"]
    assert main(["env", "-o", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_env_diff_exit_codes_and_json(tmp_path, capsys, env_doc):
    a = _write(tmp_path / "a.json", env_doc)
    assert main(["env", "diff", a, a]) == 0
    assert "none (versions, hardware" in capsys.readouterr().out
    benign = _write(tmp_path / "benign.json", _with(env_doc, "platform.release", "0.0-test"))
    assert main(["env", "diff", a, benign]) == 0
    capsys.readouterr()
    threads = _write(tmp_path / "threads.json", _with(env_doc, "threads.intra_op", 99))
    assert main(["env", "diff", a, threads, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "torchrepro.env-diff/1" and doc["verdict"] == "breaks-bitwise" and doc["exit_code"] == 1
    assert doc["counts"] == {BREAKS: 1, MAY: 0, BENIGN: 0}
    assert doc["changes"] == [{"key": "threads.intra_op", "a": env_doc["threads"]["intra_op"], "b": 99,
                               "only_in": None, "rank": BREAKS, "reason": rank_of("threads.intra_op").reason}]
    assert main(["env", "--json", "diff", a, threads]) == 1  # --json before the action works too
    assert json.loads(capsys.readouterr().out)["counts"][BREAKS] == 1
    assert main(["env", "diff", a, threads]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"Environment differences ({a} → {threads}): can break bitwise equality 1\n")
    assert "  Can break bitwise equality:\n    threads.intra_op  " in out


def test_env_diff_bad_inputs(tmp_path, capsys, env_doc):
    good = _write(tmp_path / "good.json", env_doc)
    partial = {k: v for k, v in env_doc.items() if k != "cuda"} | {"threads": 3}
    (tmp_path / "empty").mkdir()
    cases = [
        (str(tmp_path / "missing.json"), "missing.json: does not exist. Pass an environment file"),
        (_write(tmp_path / "text.json", "hello"), "text.json: is not valid JSON (Expecting value"),
        (_write(tmp_path / "cut.json", json.dumps(env_doc)[:200]), "cut.json: is not valid JSON ("),
        (_write(tmp_path / "list.json", [1]), "list.json: holds a JSON list, expected an object with schema "
                                              "'torchrepro.env/1'."),
        (_write(tmp_path / "other.json", {"schema": "torchrepro.env/9"}),
         "other.json: has schema 'torchrepro.env/9'; expected 'torchrepro.env/1'"),
        (_write(tmp_path / "noschema.json", {"torch": "2.1"}), "noschema.json: has no 'schema' field"),
        (_write(tmp_path / "partial.json", partial), "partial.json: is not a complete environment ('cuda' is "
                                                     "missing; 'threads' is a int, expected a dict)"),
        (str(tmp_path / "empty"), "empty: has no manifest.json"),
    ]
    for bad, message in cases:
        assert main(["env", "diff", good, bad]) == 2, bad
        err = capsys.readouterr().err
        assert err.startswith(f"torchrepro: error: {tmp_path}/") and message in err, err
    assert main(["env", "diff", cases[0][0], good, "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "torchrepro.env-diff/1" and doc["verdict"] == "error" and doc["exit_code"] == 2
    assert "does not exist" in doc["error"]


def test_run_without_a_fingerprint_is_named(tmp_path, env_doc):
    run = tmp_path / "old"
    run.mkdir()
    (run / "trace.jsonl").write_text("")
    manifest = {"format": "torchrepro.run", "version": 1, "trace_records": 0, "environment": {"torch": "2.1.0"}}
    (run / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(EnvFileError, match="has no environment in the 'torchrepro.env/1' format"):
        torchrepro.analysis.envdiff.load_environment(run)
    manifest["environment"] = {"schema": SCHEMA}
    (run / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(EnvFileError, match=r"\(its 'environment'\): is not a complete environment"):
        torchrepro.analysis.envdiff.load_environment(run / "manifest.json")
    manifest["environment"] = env_doc
    (run / "manifest.json").write_text(json.dumps(manifest))
    assert torchrepro.analysis.envdiff.load_environment(run)["launch"] == {"seed": None, "deterministic": None,
                                                                  "pythonhashseed": None, "command": None}


def test_env_command_leaves_out_user_and_home(tmp_path):
    """The real command, in a fresh process whose user name and home are known markers."""
    user = "zelda-user-4711"
    home = tmp_path / user
    home.mkdir()
    env = {**os.environ, "USER": user, "LOGNAME": user, "HOME": str(home), "NCCL_DEBUG_FILE": f"{home}/nccl.log",
           "TORCHINDUCTOR_CACHE_DIR": f"/tmp/torchinductor_{user}"}
    p = subprocess.run([sys.executable, "-m", "torchrepro", "env", "--json"], capture_output=True, text=True,
                       timeout=120, cwd=home, env=env)
    assert p.returncode == 0, p.stderr
    assert "4711" not in p.stdout and str(tmp_path) not in p.stdout
    assert json.loads(p.stdout)["env"]["NCCL_DEBUG_FILE"] == "~/nccl.log"


# --- recorded strings are printed escaped ------------------------------------------------------------------------
EVIL = "\x1b[31mred\x1b[0m\u202eevil\n"
EVIL_SHOWN = "\\x1b[31mred\\x1b[0m\\u202eevil\\n"


@pytest.mark.parametrize("text, shown", [
    (EVIL, EVIL_SHOWN), ("tab\there\r", "tab\\there\\r"), ("\u2066iso\u2069 \u200f", "\\u2066iso\\u2069 \\u200f"),
    ("bad\udcffbyte\x7f\x85", "bad\\udcffbyte\\x7f\\x85"), ("line\u2028sep", "line\\u2028sep"),
    ("café 2.13.0 ✓ 日本", "café 2.13.0 ✓ 日本"), ("", ""),
])
def test_printable_escapes_control_and_bidi_characters(text, shown):
    assert printable(text) == shown


def test_env_prints_recorded_values_escaped(monkeypatch, capsys):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", EVIL)
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out
    assert [line.split()[1] for line in out.splitlines() if line.startswith("env.CUBLAS_WORKSPACE_CONFIG ")] == [
        EVIL_SHOWN]


def test_env_diff_and_check_print_recorded_values_escaped(tmp_path, capsys, env_doc):
    # a side that can use CUDA: there CUBLAS_WORKSPACE_CONFIG can break bitwise equality (exit 1)
    plain = _with(_with(env_doc, "env.CUBLAS_WORKSPACE_CONFIG", None), "cuda.available", True)
    a = _write(tmp_path / "a.json", plain)
    evil_doc = _with(_with(plain, "env.CUBLAS_WORKSPACE_CONFIG", EVIL), "env.OMP_\x1b[2JNUM_THREADS", "1\u202e")
    b = _write(tmp_path / "b.json", evil_doc)
    assert main(["env", "diff", a, b]) == 1
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out
    assert f"    env.CUBLAS_WORKSPACE_CONFIG  unset → {EVIL_SHOWN}" in out
    assert "    env.OMP_\\x1b[2JNUM_THREADS" in out and "unset → 1\\u202e" in out
    # check prints the same differences of its runs' environments
    diff = diff_environments(plain, evil_doc, label_a="run 1", label_b="run 2")
    text = EnvironmentDifferences(diff).render("identical")
    assert f"env.CUBLAS_WORKSPACE_CONFIG  unset → {EVIL_SHOWN}" in text and "\x1b" not in text
    shorts = [c.short() for c in diff.changes if c.key.startswith("env.")]  # in the verdict notes
    assert sorted(shorts) == [f"CUBLAS_WORKSPACE_CONFIG unset → {EVIL_SHOWN}",
                              "OMP_\\x1b[2JNUM_THREADS unset → 1\\u202e"]


def test_a_torch_without_an_sdpa_switch_records_it_as_not_available(monkeypatch):
    """torch 2.1 has no torch.backends.cuda.cudnn_sdp_enabled (2.2+): reading it failed every fingerprint."""
    monkeypatch.delattr(torch.backends.cuda, "cudnn_sdp_enabled", raising=False)
    env = environment()
    assert env.backends["sdpa_cudnn"] == NOT_AVAILABLE and env.backends["sdpa_math"] is True


def test_a_torch_mps_module_without_is_available_is_no_accelerator(monkeypatch):
    """torch 2.1's torch.mps has no is_available(): reading it failed every fingerprint."""
    from torchrepro.env import info

    monkeypatch.delattr(torch.mps, "is_available", raising=False)
    assert info.device_kind() == ("cuda" if torch.cuda.is_available() else "cpu")
