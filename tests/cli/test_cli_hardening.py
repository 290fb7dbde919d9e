"""The command line and launcher never lose user data, never orphan the script, and always say what happened."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.inprocess import torchrepro as in_process
from torchrepro._core.errors import OutputDirError
from torchrepro._core.io import atomic_write_json
from torchrepro.record.outdir import lock_dir, unique_dir

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
TORCHREPRO = [sys.executable, "-m", "torchrepro"]
# the scripts these tests record update their parameters by hand: torch.optim's first use imports torch._dynamo
# (~1 s of CPU per run), and no test here is about the optimizer
MANUAL_SGD = str(SCRIPTS / "manual_sgd.py")
FOREVER, FOREVER_RANKS = str(SCRIPTS / "forever.py"), str(SCRIPTS / "forever_ranks.py")


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
        timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m torchrepro ARGS`, a process of its own: for the tests of that process (signals, a killed parent)
    and of what `run` passes through from the script to its own stdout (the script inherits torchrepro's stdout)."""
    return subprocess.run([*TORCHREPRO, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=cwd)


def cmd(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
        timeout: float = 300) -> subprocess.CompletedProcess:
    """`torchrepro ARGS` run by this process (tests/inprocess.py): what the command says and writes, without the ~2 s
    of CPU of a new interpreter; the scripts it records are processes of their own as always."""
    return in_process(*args, env=env, cwd=cwd, timeout=timeout)


def seen(stdout: str) -> dict:
    """What tests/scripts/show_env.py printed."""
    line = next(x for x in stdout.splitlines() if x.startswith("SEEN "))
    return json.loads(line[5:])


# --- output directories: only torchrepro's own output is replaced ------------------------------------------
def test_check_out_never_deletes_a_users_folder(tmp_path):
    out = tmp_path / "out"
    (out / "run1").mkdir(parents=True)
    (out / "run1" / "important.txt").write_text("my notes")
    p = cmd("check", "--out", str(out), "--", "python", MANUAL_SGD)
    assert p.returncode == 2
    assert "is not a torchrepro run directory" in p.stderr and "important.txt" in p.stderr
    assert (out / "run1" / "important.txt").read_text() == "my notes"
    assert not (out / "run2").exists()


def test_check_out_refuses_foreign_files_and_locate_folder(tmp_path):
    out = tmp_path / "out"
    (out / "locate" / "run1").mkdir(parents=True)
    (out / "locate" / "run1" / "data.csv").write_text("1,2")
    p = cmd("check", "--out", str(out), "--", "python", MANUAL_SGD)
    assert p.returncode == 2 and "data.csv" in p.stderr
    assert (out / "locate" / "run1" / "data.csv").exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "thesis.tex").write_text("x")
    p = cmd("check", "--out", str(other), "--", "python", MANUAL_SGD)
    assert p.returncode == 2 and "holds files that torchrepro did not write (['thesis.tex'])" in p.stderr
    assert sorted(x.name for x in other.iterdir()) == ["thesis.tex"]


def test_check_replaces_its_own_earlier_output(tmp_path):
    out = tmp_path / "out"
    for _ in range(2):
        p = cmd("check", "--json", "--out", str(out), "--", "python", MANUAL_SGD)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["verdict"] == "identical"


def test_record_refuses_a_users_folder(tmp_path):
    rec = tmp_path / "rec"
    rec.mkdir()
    (rec / "keep.txt").write_text("mine")
    p = cmd("run", "--record", str(rec), "--", "python", MANUAL_SGD)
    assert p.returncode == 2 and "is not a torchrepro run directory" in p.stderr
    assert (rec / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("flag", ["--out", "--record"])
def test_output_path_that_is_a_file_or_under_a_file(tmp_path, flag):
    command = "check" if flag == "--out" else "run"
    afile = tmp_path / "afile"
    afile.write_text("x")
    p = cmd(command, flag, str(afile), "--", "python", MANUAL_SGD)
    assert p.returncode == 2 and f"{flag} {afile}: exists and is not a directory" in p.stderr
    under = afile / "deeper" / "out"
    p = cmd(command, flag, str(under), "--", "python", MANUAL_SGD)
    assert p.returncode == 2 and f"{afile} is a file, not a directory" in p.stderr
    assert "Traceback" not in p.stderr and afile.read_text() == "x"


def test_record_creates_missing_parents_as_watch_does(tmp_path):
    """README's `torchrepro run --record runs/a` works in a fresh directory, as `watch(run_dir="runs/a")` does."""
    p = cmd("run", "--record", "runs/a", "--", sys.executable, MANUAL_SGD, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "runs" / "a" / "manifest.json").is_file()


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write into a read-only directory")
def test_unwritable_output_directory(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        p = cmd("check", "--out", str(ro / "out"), "--", "python", MANUAL_SGD)
        assert p.returncode == 2 and "cannot create the directory" in p.stderr
    finally:
        ro.chmod(0o700)


def test_locked_directory_is_refused_naming_the_holder(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with lock_dir(out, what="torchrepro check --out busy"):
        p = cmd("check", "--out", str(out), "--", "python", MANUAL_SGD)
        assert p.returncode == 2
        assert f"is in use by another torchrepro command (pid {os.getpid()}, `torchrepro check --out busy`" \
            in p.stderr
        with pytest.raises(OutputDirError, match="is in use"), lock_dir(out):
            pass
    with lock_dir(out):  # released at the end of the block
        pass


def test_default_output_directories_are_unique(tmp_path):
    made = {unique_dir(tmp_path, "check") for _ in range(5)}
    assert len(made) == 5 and all(p.is_dir() and str(os.getpid()) in p.name for p in made)


def test_two_checks_on_one_out_do_not_destroy_each_other(tmp_path):
    out = tmp_path / "out"
    command = ["check", "--json", "--out", str(out), "--", "python", MANUAL_SGD]
    # one check is a process of its own, the other runs in this process meanwhile (a process fewer to start)
    proc = subprocess.Popen([*TORCHREPRO, *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        mine = cmd(*command)
    finally:
        stdout, stderr = proc.communicate(timeout=300)
    results = [(proc.returncode, stdout, stderr), (mine.returncode, mine.stdout, mine.stderr)]
    codes = sorted(rc for rc, _, _ in results)
    assert codes in ([0, 0], [0, 2]), results  # the second one either came after the first or was refused
    for rc, stdout, _ in results:
        doc = json.loads(stdout)
        if rc == 0:
            assert doc["verdict"] == "identical" and doc["steps"] == [4, 4]
        else:
            assert doc["verdict"] == "error" and "is in use by another torchrepro command" in doc["error"]


# --- signals: the script never outlives torchrepro ---------------------------------------------------------
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (not yet reaped by its parent) is dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the script did not start"
        time.sleep(0.1)
    return int(path.read_text())


def _gone(pid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _alive(pid)


def _signals_as_in_a_terminal() -> None:
    """In the torchrepro process, before exec: the signals the test sends take their default action.

    A test suite started as a background job of a non-interactive shell (`make test &`, some CI runners) inherits
    SIGINT ignored, and Python installs no KeyboardInterrupt handler for an ignored SIGINT: torchrepro would then
    (rightly, as the script itself would) never see the signal, and the test waited out its timeout.
    """
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


@pytest.mark.parametrize("command, sig", [("check", signal.SIGTERM), ("run", signal.SIGHUP),
                                          ("run", signal.SIGINT)])
def test_signal_stops_the_script_and_exits_128_plus_signal(tmp_path, command, sig):
    pidfile, out = tmp_path / "child.pid", tmp_path / "out"
    flag = "--out" if command == "check" else "--record"
    proc = subprocess.Popen([*TORCHREPRO, command, flag, str(out), "--", "python", FOREVER,
                             str(pidfile)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_signals_as_in_a_terminal)
    try:
        child = _wait_for(pidfile, proc)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:  # a failed test must not leave torchrepro and the endless script behind, loading the machine
        if proc.poll() is None:
            proc.terminate()  # torchrepro passes it on to the script
            proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, stderr
    assert _gone(child), "the training script outlived torchrepro"
    assert f"interrupted by {signal.Signals(sig).name}" in stderr
    run_dir = out / "run1" if command == "check" else out
    assert str(run_dir) in stderr  # where the partial output is
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and manifest["interrupted_by"] == signal.Signals(sig).name


def test_script_dies_with_a_killed_parent(tmp_path):
    pidfile = tmp_path / "child.pid"
    proc = subprocess.Popen([*TORCHREPRO, "run", "--", "python", FOREVER, str(pidfile)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    child = _wait_for(pidfile, proc)
    proc.kill()  # SIGKILL: nothing can be forwarded; the child's parent-death signal ends it
    proc.wait()
    assert _gone(child), "the training script outlived a SIGKILLed torchrepro"


def _wait_for_ranks(pid_dir: Path, proc: subprocess.Popen, nproc: int, timeout: float = 120) -> list[int]:
    """The pids of every rank of ``forever_ranks.py`` and of torchrun (their parent), once all ranks run."""
    files = [pid_dir / f"rank{r}.json" for r in range(nproc)]
    deadline = time.monotonic() + timeout
    while not all(f.exists() for f in files):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.1)
    docs = [json.loads(f.read_text()) for f in files]
    assert len({d["parent"] for d in docs}) == 1 and docs[0]["parent"] != proc.pid  # torchrun between us
    return [d["pid"] for d in docs] + [docs[0]["parent"]]


def test_torchrun_and_every_rank_die_with_a_killed_parent(tmp_path):
    proc = subprocess.Popen([*TORCHREPRO, "check", "--out", str(tmp_path / "out"), "--nproc-per-node", "2", "--",
                             "python", FOREVER_RANKS, str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids = _wait_for_ranks(tmp_path, proc, 2)
    proc.kill()  # SIGKILL: torchrun and the ranks (its children, in their own session) must follow
    proc.wait()
    alive = [pid for pid in pids if not _gone(pid)]
    assert not alive, f"outlived a SIGKILLed torchrepro: {alive} of ranks+torchrun {pids}"


def test_sigterm_on_the_torchrun_path_stops_every_rank_and_exits_143(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen([*TORCHREPRO, "check", "--out", str(out), "--", "torchrun", "--nproc-per-node", "2",
                             FOREVER_RANKS, str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids = _wait_for_ranks(tmp_path, proc, 2)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    alive = [pid for pid in pids if not _gone(pid)]
    assert not alive, f"outlived torchrepro: {alive} of ranks+torchrun {pids}"
    assert "interrupted by SIGTERM" in stderr and str(out / "run1") in stderr
    manifest = json.loads((out / "run1" / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and manifest["interrupted_by"] == "SIGTERM"


def test_check_of_a_script_that_ends_in_os_exit(tmp_path):
    out = tmp_path / "out"
    p = cmd("check", "--out", str(out), "--", "python", str(SCRIPTS / "os_exit.py"), "2")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith(f"torchrepro: IDENTICAL - 2 runs of `python {SCRIPTS / 'os_exit.py'} 2`, 2 steps "
                               "each; every recorded loss"), p.stdout
    assert "Environment: not compared" not in p.stdout and "older torchrepro" not in p.stdout
    manifest = json.loads((out / "run1" / "manifest.json").read_text())
    assert manifest["environment"]["schema"] == "torchrepro.env/1" and manifest["fingerprint_algorithm"]
    assert (manifest["steps"], manifest["backward_calls"], manifest["child_exit_code"]) == (2, 2, 0)


# --- the command line -------------------------------------------------------------------------------------
def test_pythonhashseed_is_overridden_and_said(tmp_path):
    p = cli("run", "--", "python", str(SCRIPTS / "show_env.py"), env={"PYTHONHASHSEED": "random"})
    assert p.returncode == 0, p.stderr
    assert seen(p.stdout)["hashseed"] == "0"
    assert "PYTHONHASHSEED=random in your environment was replaced by PYTHONHASHSEED=0" in p.stderr
    p = cli("run", "--seed", "7", "--", "python", str(SCRIPTS / "show_env.py"), env={"PYTHONHASHSEED": "7"})
    assert seen(p.stdout)["hashseed"] == "7" and "PYTHONHASHSEED" not in p.stderr


def test_everything_after_the_script_belongs_to_the_script(tmp_path):
    p = cli("run", "python", str(SCRIPTS / "show_env.py"), "--lr", "0.1", "--runs", "3", "--json", "--", "x")
    assert p.returncode == 0, p.stderr
    assert seen(p.stdout)["argv"] == [str(SCRIPTS / "show_env.py"), "--lr", "0.1", "--runs", "3", "--json", "--",
                                      "x"]
    assert not p.stdout.lstrip().startswith("{")  # --json went to the script, not to torchrepro
    p = cmd("check", "--out", str(tmp_path / "o"), "python", str(SCRIPTS / "show_env.py"), "--runs", "1")
    assert p.returncode == 0, p.stderr  # --runs 1 is the script's; torchrepro ran its default 2 runs
    assert "run 2/2 ok" in p.stderr
    assert seen((tmp_path / "o" / "run1" / "stdout.txt").read_text())["argv"][1:] == ["--runs", "1"]


def test_script_without_interpreter_and_python_c(tmp_path):
    script = tmp_path / "python_train.py"  # starts with "python" but is a script, not an interpreter
    script.write_text((SCRIPTS / "show_env.py").read_text())
    p = cli("run", "--", str(script), "a")
    assert p.returncode == 0, p.stderr
    assert seen(p.stdout) | {"hashseed": None} == {"executable": sys.executable, "argv": [str(script), "a"],
                                                   "hashseed": None}
    code = "import sys, torch; w = torch.ones(2, requires_grad=True); w.sum().backward(); print('ARGV', sys.argv)"
    p = cli("run", "--record", str(tmp_path / "rec"), "--", "python", "-c", code, "x", "--y")
    assert p.returncode == 0, p.stderr
    assert "ARGV ['-c', 'x', '--y']" in p.stdout
    assert json.loads((tmp_path / "rec" / "manifest.json").read_text())["steps"] == 1


def _venv_without_torchrepro(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, capture_output=True)
    return where / "bin" / "python"


def test_named_interpreter_is_used_or_refused(tmp_path):
    bare = _venv_without_torchrepro(tmp_path / "bare")
    p = cmd("check", "--json", "--out", str(tmp_path / "o"), "--", str(bare), str(SCRIPTS / "show_env.py"))
    assert p.returncode == 2
    doc = json.loads(p.stdout)
    assert doc["verdict"] == "error" and doc["exit_code"] == 2
    # torchrepro, or with PYTHONPATH pointing at a checkout only torch, is what the bare interpreter lacks
    finds = subprocess.run([str(bare), "-c", "import importlib.util as u; print(bool(u.find_spec('torchrepro')))"],
                           capture_output=True, text=True, timeout=120).stdout.strip() == "True"
    missing = "torch" if finds else "torchrepro"
    assert f"{missing} is not installed for the interpreter in your command ({bare})" in doc["error"]
    assert f"{bare} -m pip install {missing}" in doc["error"]
    assert "Fix the script" not in doc["error"]
    p = cmd("run", "--", str(tmp_path / "nowhere" / "python3"), str(SCRIPTS / "show_env.py"))
    assert p.returncode == 2 and "was not found (no such executable file)" in p.stderr
    # An interpreter of another environment that can import torchrepro is the one that runs the script.
    other = _venv_without_torchrepro(tmp_path / "other")
    site = next((tmp_path / "other" / "lib").glob("python3*/site-packages"))
    (site / "outer.pth").write_text("\n".join(p for p in sys.path if p.endswith("site-packages") or
                                              p.endswith("src")) + "\n")
    p = cli("run", "--", str(other), str(SCRIPTS / "show_env.py"))
    assert p.returncode == 0, p.stderr
    assert seen(p.stdout)["executable"] == str(other)


def test_runs_1_is_refused_before_anything_runs(tmp_path):
    p = cmd("check", "--runs", "1", "--out", str(tmp_path / "o"), "--", "python", MANUAL_SGD)
    assert p.returncode == 2 and "needs at least 2" in p.stderr and "torchrepro diff" in p.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args, message", [
    (["check", "--json", "--runs", "1", "--", "python", "x.py"], "needs at least 2"),
    (["check", "--json", "--bogus", "--", "python", "x.py"], "unrecognized arguments: --bogus"),
    (["check", "--json", "--", "bash", "x.sh"], "torchrepro records Python training scripts"),
    (["run", "--json", "--", "python", "missing.py"], "script 'missing.py' does not exist"),
    (["diff", "--json", "nope1", "nope2"], "nope1: is not a directory"),
])
def test_json_error_document_for_every_failure(tmp_path, args, message):
    p = cmd(*args, cwd=tmp_path)
    assert p.returncode == 2
    doc = json.loads(p.stdout)  # exactly one JSON document
    assert doc["verdict"] == "error" and doc["exit_code"] == 2 and message in doc["error"]


def test_atomic_writes_respect_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_json(tmp_path / "a.json", {"x": 1})
        assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644
        os.umask(0o027)
        atomic_write_json(tmp_path / "b.json", {"x": 1})
        assert stat.S_IMODE((tmp_path / "b.json").stat().st_mode) == 0o640
    finally:
        os.umask(old)


def test_a_compiled_locate_rerun_directory_is_torchrepro_output(tmp_path):
    """`check --locate` on compiled code leaves compiled_graphs.json in its re-runs: a later check may replace them."""
    from torchrepro.record.outdir import check_run_dir

    run = tmp_path / "run1"
    run.mkdir()
    for name in ("manifest.json", "trace.jsonl", "compiled_graphs.json", "stdout.txt", "stderr.txt"):
        (run / name).write_text("{}")
    check_run_dir(run, flag="--out")  # does not raise


# --- the child's quick exit keeps what a script does at exit --------------------------------------------------
EXIT_WORK = '''
import atexit, sys
import torch
out = sys.argv[1]
log = open(out + "/unclosed.txt", "w")          # never closed: flushed when shutdown frees it
log.write("buffered line\\n")


class Cycle:
    def __init__(self):
        self.me = self                          # a reference cycle: only the garbage collector frees it

    def __del__(self, _open=open):
        with _open(out + "/finalizer.txt", "w") as f:
            f.write("finalized\\n")


keep = Cycle()                                  # alive until shutdown clears this module
atexit.register(lambda: open(out + "/atexit.txt", "w").write("atexit ran\\n"))
w = torch.nn.Parameter(torch.ones(3))
opt = torch.optim.SGD([w], lr=0.1)
for _ in range(2):
    opt.zero_grad()
    (w * w).sum().backward()
    opt.step()
'''


def test_recorded_run_keeps_the_scripts_exit_work(tmp_path):
    """The launcher freezes the import-time heap before the script runs (shutdown collections cost ~0.4 s less);
    what plain `python` does at exit must still happen: atexit handlers, unclosed files flushed, and the
    finalizer of an object in a reference cycle that stays alive until shutdown."""
    script = tmp_path / "exit_work.py"
    script.write_text(EXIT_WORK)
    out = tmp_path / "files"
    out.mkdir()
    p = cli("run", "--record", str(tmp_path / "rec"), "--", "python", str(script), str(out))
    assert p.returncode == 0, p.stderr
    assert (out / "unclosed.txt").read_text() == "buffered line\n"
    assert (out / "atexit.txt").read_text() == "atexit ran\n"
    assert (out / "finalizer.txt").read_text() == "finalized\n"


# --- torchrepro's own failures are never blamed on the script ----------------------------------------------
def test_a_script_using_the_new_tf32_api_is_recorded(tmp_path):
    """envinfo read cudnn.allow_tf32, which raises once the script set fp32_precision (torch >= 2.9)."""
    p = cmd("run", "--record", str(tmp_path / "rec"), "--", sys.executable,
            str(SCRIPTS / "new_tf32_api.py"))
    assert p.returncode == 0, p.stderr
    manifest = json.loads((tmp_path / "rec" / "manifest.json").read_text())
    assert manifest["environment"]["precision"]["cuda_matmul_allow_tf32"] is False


@pytest.mark.parametrize("command", ["run", "check"])
def test_a_failure_in_torchrepros_child_code_is_an_internal_error(tmp_path, command):
    flag = "--record" if command == "run" else "--out"
    p = cmd(command, flag, str(tmp_path / "out"), "--", sys.executable,
            str(SCRIPTS / "breaks_torchrepro.py"))
    assert p.returncode == 3, p.stderr
    assert "a bug in torchrepro, not in your script" in p.stderr and "summary failed on purpose" in p.stderr
    assert "Fix the script" not in p.stderr
