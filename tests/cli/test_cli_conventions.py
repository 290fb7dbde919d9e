"""The command line's conventions: every command's --help has a description and examples (which parse), a mistyped
command or option gets "did you mean", and the bash/zsh completion scripts complete the argparse tree for real
(sourced in a real shell, its completion function called as the shell calls it)."""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torchrepro import __version__ as torchrepro_version
from torchrepro.cli import NAMES, build_parser, long_options, main
from torchrepro.cli._usage import SUMMARIES

ROOT = Path(__file__).resolve().parents[2]


def _subparsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(path, parser, one-line help) of every subcommand, nested ones (env diff) included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield (*path, name), sub, helps.get(name)
                yield from _subparsers(sub, (*path, name))


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return build_parser()


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def _examples(text: str) -> list[str]:
    """The example command lines of a help text (the indented lines under "Examples:")."""
    lines = text.split("Examples:\n", 1)[1].splitlines() if "Examples:\n" in text else []
    return [line.strip() for line in lines if line.startswith("  torchrepro ")]


def test_every_command_is_listed_and_has_a_one_line_help(parser):
    commands = [path for path, _, _ in _subparsers(parser) if len(path) == 1]
    assert [name for (name,) in commands] == NAMES  # NAMES (known without importing) matches what the modules add
    for path, _, summary in _subparsers(parser):
        assert summary and "\n" not in summary, path


def test_every_command_help_has_a_description_and_examples(parser, capsys):
    for path, sub, _ in _subparsers(parser):
        text = _help(list(path), capsys)
        assert sub.description, f"torchrepro {' '.join(path)} has no description"
        assert re.sub(r"\s", "", sub.description) in re.sub(r"\s", "", text), path  # wrapped, maybe at a hyphen
        examples = _examples(text)
        assert examples, f"torchrepro {' '.join(path)} --help shows no example"
        # each example is kept on its own line as written (not wrapped into the text around it)
        for line in sub.epilog.splitlines():
            if line.startswith("  torchrepro "):
                assert line in text.splitlines(), (path, line)
    assert _examples(_help([], capsys))  # the top level too


def test_every_example_parses(parser, capsys):
    """An example whose option was renamed or dropped would fail here (parsed only: nothing runs)."""
    texts = [parser.epilog or ""] + [sub.epilog or "" for _, sub, _ in _subparsers(parser)]
    examples = [line for text in texts for line in _examples(text)]
    assert len(examples) >= 2 * len(NAMES)
    for line in examples:
        words = shlex.split(line, comments=True)[1:]
        words = words[:words.index(">")] if ">" in words else words  # `... > file`: the shell's redirection
        try:
            build_parser().parse_args(words)
        except SystemExit as exc:  # `torchrepro check --help`
            assert exc.code == 0 and "--help" in words, line
    capsys.readouterr()


def test_mistyped_command_gets_did_you_mean(capsys):
    assert main(["chek"]) == 2
    assert capsys.readouterr().err == ("torchrepro: unknown command 'chek'. Did you mean 'check'? "
                                       "(torchrepro --help lists the commands)\n")
    assert main(["lnt", "--json", "src"]) == 2
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert (doc["verdict"], doc["exit_code"], doc["schema"]) == ("error", 2, "torchrepro.cli/1")
    assert doc["error"] == err.strip() == ("torchrepro: unknown command 'lnt'. Did you mean 'lint'? "
                                           "(torchrepro --help lists the commands)")


def test_unknown_command_without_a_close_one_lists_the_commands(capsys):
    assert main(["train.py"]) == 2
    assert capsys.readouterr().err == (
        f"torchrepro: unknown command 'train.py'; expected one of: {', '.join(NAMES)}. To check a script, name the "
        "command first: torchrepro check -- python train.py.\n")


def test_mistyped_command_does_not_import_the_commands():
    """A typo is answered from the names alone: no command module, so no torch (a fresh process)."""
    code = ("import sys; from torchrepro.cli import main; rc = main(['chek']); "
            "print(rc, sorted(m for m in sys.modules if m.endswith('_cmd')), 'torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert p.stdout.strip() == "2 [] False", p.stderr
    assert "Did you mean 'check'?" in p.stderr


def test_help_and_version_list_the_commands_without_importing_them():
    """`torchrepro --help`, `--version` and a bare `torchrepro` name every command from its summary: no command
    module, so no torch (0.1 s instead of 2 s, a fresh process); the help is the full parser's, word for word."""
    code = ("import contextlib, io, sys; from torchrepro.cli import main\n"
            "for argv in (['--version'], ['--help'], []):\n"
            "    out = io.StringIO()\n"
            "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(out), \\\n"
            "            contextlib.redirect_stderr(out):\n"
            "        main(argv)\n"
            "    print(repr(out.getvalue()))\n"
            "print(sorted(m for m in sys.modules if m.endswith('_cmd')), 'torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    version, help_text, bare, modules = p.stdout.strip().splitlines()
    assert modules == "[] False", p.stderr
    assert ast.literal_eval(version) == f"torchrepro {torchrepro_version}\n"
    assert ast.literal_eval(help_text) == ast.literal_eval(bare) == build_parser().format_help()


def test_each_commands_help_line_is_its_summary():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert {c.dest: c.help for c in sub._choices_actions} == SUMMARIES
    assert list(SUMMARIES) == NAMES


@pytest.mark.parametrize(("argv", "said"), [
    (["lint", "--selekt", "TR1", "x.py"], "torchrepro lint: error: unrecognized arguments: --selekt; "
                                          "did you mean --select?"),
    (["check", "--max-stepz", "3", "--", "python", "t.py"], "torchrepro check: error: unrecognized arguments: "
                                                            "--max-stepz; did you mean --max-steps?"),
    (["env", "diff", "a", "b", "--jsn"], "torchrepro env diff: error: unrecognized arguments: --jsn; "
                                         "did you mean --json?"),
    (["rule", "--xyz"], "torchrepro rule: error: unrecognized arguments: --xyz"),  # nothing close: no guess
])
def test_mistyped_option_gets_did_you_mean(argv, said, capsys):
    assert main(argv) == 2
    assert capsys.readouterr().err == said + "\n"


def test_parsed_arguments_keep_no_trace_of_the_suggestions(parser):
    """The subcommand's parser, noted on the namespace while parsing (to know its options), is taken off it."""
    args = parser.parse_args(["env", "diff", "a", "b"])
    assert sorted(vars(args)) == ["a", "b", "command", "env_action", "handler", "html", "include_host", "json",
                                  "output"]


# --- shell completion -------------------------------------------------------------------------------------------


def _script(shell: str, directory: Path, name: str) -> Path:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["completion", shell]) == 0
    path = directory / name
    path.write_text(out.getvalue())
    return path


@pytest.fixture(scope="module")
def bash_script(tmp_path_factory) -> Path:
    return _script("bash", tmp_path_factory.mktemp("bash"), "torchrepro.bash")


def _bash_complete(script: Path, lines: list[str]) -> list[list[str]]:
    """The candidates bash's completion function gives for each command line (the cursor at its end), as bash
    calls it: COMP_WORDS split as bash splits them (``=`` is a word of its own), COMP_CWORD the last word."""
    calls = []
    for line in lines:
        words = shlex.split(line.replace("=", " = ")) + ([""] if line.endswith(" ") else [])
        calls.append(f"COMP_WORDS=({' '.join(shlex.quote(w) for w in words)}); COMP_CWORD={len(words) - 1}; "
                     "COMPREPLY=(); _torchrepro; echo \"${COMPREPLY[*]}\"")
    p = subprocess.run(["bash", "--norc", "--noprofile", "-c", f"source {shlex.quote(str(script))}\n"
                        + "\n".join(calls)], capture_output=True, text=True)
    assert p.returncode == 0 and not p.stderr, p.stderr
    return [line.split() for line in p.stdout.splitlines()]


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_completes_commands_options_and_values(bash_script):
    cases = {
        "torchrepro ch": ["check"],
        "torchrepro ": NAMES,
        "torchrepro --v": ["--version"],
        "torchrepro check --max-s": ["--max-steps"],
        "torchrepro check --runs 3 --loc": ["--locate", "--locate-steps"],  # 3 is --runs' value, not the script
        "torchrepro scan --device ": ["cpu", "cuda"],
        "torchrepro scan --device=c": ["cpu", "cuda"],
        "torchrepro lint --format j": ["json"],
        "torchrepro env d": ["diff"],
        "torchrepro env diff a b --j": ["--json"],
        "torchrepro completion ": ["bash", "zsh"],
        "torchrepro check -- python train.py --ma": [],  # the script's words: file names (complete -o default)
        "torchrepro check python train.py --r": [],
        "torchrepro check --out ": [],  # a value without a fixed set: file names
    }
    assert dict(zip(cases, _bash_complete(bash_script, list(cases)))) == cases
    p = subprocess.run(["bash", "--norc", "-c", f"source {shlex.quote(str(bash_script))}; complete -p torchrepro"],
                       capture_output=True, text=True)
    assert p.stdout.strip() == "complete -o default -F _torchrepro torchrepro"


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_completes_every_option_of_every_command(bash_script, parser):
    """What bash offers after ``--`` is exactly each (sub)command's long options, as argparse has them."""
    paths = [path for path, _, _ in _subparsers(parser)]
    offered = _bash_complete(bash_script, ["torchrepro " + " ".join(path) + " --" for path in paths])
    subs = [sub for _, sub, _ in _subparsers(parser)]
    for path, sub, options in zip(paths, subs, offered):
        assert options == long_options(sub), path


@pytest.fixture(scope="module")
def zsh_script(tmp_path_factory) -> Path:
    return _script("zsh", tmp_path_factory.mktemp("zsh"), "_torchrepro")  # the name an $fpath file must have


# zsh's completion builtins work only inside a completion widget (an interactive line editor): these stand-ins
# print what the completion function asks for, so that the function itself runs in a plain `zsh -c`.
_ZSH_STUBS = """
compadd() { [[ $1 == -a ]] && print -r -- "${(j: :)${(P)2}}"; }
compset() { : }
_files() { print -r -- _files; }
"""


def _zsh_complete(script: Path, lines: list[str], *, autoload: bool) -> list[str]:
    """What the zsh completion function offers for each command line (``words``/``CURRENT`` as zsh sets them)."""
    where = shlex.quote(str(script.parent))
    load = (f"fpath=({where} $fpath); autoload -Uz compinit; compinit -u -D" if autoload else
            f"autoload -Uz compinit; compinit -u -D; source {where}/_torchrepro")
    load += "; print -r -- registered=$_comps[torchrepro]"
    calls = []
    for line in lines:
        words = shlex.split(line) + ([""] if line.endswith(" ") else [])
        calls.append(f"words=({' '.join(shlex.quote(w) for w in words)}); CURRENT={len(words)}; _torchrepro")
    p = subprocess.run(["zsh", "-f", "-c", "\n".join([load, _ZSH_STUBS, *calls])], capture_output=True, text=True)
    assert p.returncode == 0 and not p.stderr, p.stderr
    return p.stdout.splitlines()


ZSH_CASES = {
    "torchrepro ch": "check",
    "torchrepro check --max-s": "--max-steps",
    "torchrepro check --runs 3 --loc": "--locate --locate-steps",
    "torchrepro scan --device ": "cpu cuda",
    "torchrepro scan --device=c": "cpu cuda",
    "torchrepro env diff a b --j": "--json",
    "torchrepro check -- python train.py --ma": "_files",
    "torchrepro check python train.py --r": "_files",  # the script's option, not check's --runs
    "torchrepro check --out ": "_files",
}


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_completes_from_an_fpath_file(zsh_script):
    """The script as a file ``_torchrepro`` in $fpath: compinit registers it (#compdef) and zsh autoloads it."""
    out = _zsh_complete(zsh_script, list(ZSH_CASES), autoload=True)
    assert out == ["registered=_torchrepro", *ZSH_CASES.values()]


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_completes_when_sourced(zsh_script):
    """The script sourced from ~/.zshrc after compinit: it registers itself with compdef."""
    out = _zsh_complete(zsh_script, ["torchrepro ", "torchrepro lint --format j"], autoload=False)
    assert out == ["registered=_torchrepro", " ".join(NAMES), "json"]


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_completes_in_its_line_editor(zsh_script):
    """The real thing: an interactive zsh in a pseudo-terminal (zpty), TAB pressed, the completed line run (a
    `torchrepro` function prints its arguments). Each line has one completion, so TAB completes it in full."""
    lines = {"torchrepro ch": "check", "torchrepro check --max-s": "check --max-steps",
             "torchrepro scan --device cu": "scan --device cuda", "torchrepro lint --format=j": "lint --format=json",
             "torchrepro env di": "env diff"}
    typed = "\n".join(f"zpty -w -n z {shlex.quote(line + chr(9) + chr(10))}" for line in lines)
    setup = (f"PS1='> '; fpath=({zsh_script.parent} $fpath); autoload -Uz compinit; compinit -u -D; "
             "torchrepro() { print -r -- \"ARGS: $*\"; }")
    driver = "\n".join(["zmodload zsh/zpty", "zpty z 'zsh -f -i'", f"zpty -w z {shlex.quote(setup)}", typed,
                        "zpty -w z 'print DONE\"\"-MARK'", "zpty -r z out '*DONE-MARK*'",
                        "print -r -- ${out//$'\\r'/}", "zpty -d z"])
    p = subprocess.run(["zsh", "-f", "-c", driver], capture_output=True, text=True, timeout=120)
    ran = [line.removeprefix("ARGS: ") for line in p.stdout.splitlines() if line.startswith("ARGS: ")]
    assert ran == list(lines.values()), p.stdout + p.stderr
