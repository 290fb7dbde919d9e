"""Shell completion scripts (bash, zsh) generated from an argparse tree: its subcommands, options and choices.

The script holds the tree as data (one ``case`` per table) and one completion function written in the shell
language that bash and zsh share, so both shells complete alike; each shell adds only its own wrapper. After
``--``, or once a command that runs a script has its script (``check python train.py ...``), the words are the
script's: the shell completes file names. Standard library only.

>>> import argparse
>>> parser = argparse.ArgumentParser(prog="tool")
>>> sub = parser.add_subparsers(dest="command")
>>> _ = sub.add_parser("check").add_argument("--max-steps", metavar="K")
>>> [level.path for level in levels(parser)]
['', 'check']
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Level:
    """What can be typed at one place of the tree: ``path`` is ``""`` (the program), ``"check"``, ``"env diff"``."""

    path: str
    subcommands: list[str]
    options: list[str]
    valued: list[str]  # the options that take a value (the next word is theirs)
    choices: dict[str, list[str]] = field(default_factory=dict)  # option ("" for positionals) -> its choices
    takes_command: bool = False  # a positional word starts the user's command (``check python train.py``)


def levels(parser: argparse.ArgumentParser, path: str = "") -> Iterator[Level]:
    """Every :class:`Level` of ``parser``'s tree, depth first, the program's first."""
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    children = {name: sub for action in subparsers for name, sub in action.choices.items()}
    options = [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS]
    choices = {s: [str(c) for c in a.choices] for a in options if a.choices is not None for s in a.option_strings}
    positional = [str(c) for a in parser._actions
                  if not a.option_strings and a.choices is not None and a not in subparsers for c in a.choices]
    if positional:
        choices[""] = positional
    yield Level(path=path, subcommands=list(children),
                options=[s for a in options for s in a.option_strings],
                valued=[s for a in options if a.nargs != 0 for s in a.option_strings],
                choices=choices,
                takes_command=bool(parser.get_default("accepts_command"))
                or any(a.nargs == argparse.REMAINDER for a in parser._actions))
    for name, child in children.items():
        yield from levels(child, f"{path} {name}".strip())


def _case(function: str, comment: str, rows: dict[str, list[str]]) -> str:
    """``function() { case "$1" in 'key') echo 'a b' ;; esac; }``: one table of the tree."""
    lines = [f"{function}() {{  # {comment}", '    case "$1" in']
    lines += [f"        {shlex.quote(key)}) echo {shlex.quote(' '.join(words))} ;;"
              for key, words in rows.items() if words]
    return "\n".join([*lines, "    esac", "}"])


def tables(prog: str, tree: list[Level]) -> str:
    """The shell functions that hold the tree (shared by bash and zsh)."""
    name = _function(prog)
    takes = " | ".join(shlex.quote(level.path) for level in tree if level.takes_command)
    return "\n\n".join([
        _case(f"{name}_subcommands", "$1: a command path ('', 'env') -> its subcommands",
              {level.path: level.subcommands for level in tree}),
        _case(f"{name}_options", "$1: a command path -> its options", {level.path: level.options for level in tree}),
        _case(f"{name}_valued", "$1: a command path -> the options that take a value",
              {level.path: level.valued for level in tree}),
        _case(f"{name}_choices", "$1: 'path|option' ('path|' for a positional) -> the values it accepts",
              {f"{level.path}|{option}": values for level in tree for option, values in level.choices.items()}),
        f"{name}_takes_command() {{  # $1: a command path whose positional words are the user's command\n"
        + (f'    case "$1" in {takes}) return 0 ;; esac\n' if takes else "") + "    return 1\n}",
    ])


_CANDIDATES = r"""
NAME_match() {  # $1: a prefix; the other arguments: words -> those that start with the prefix, one a line
    local prefix=$1 candidate
    shift
    for candidate in "$@"; do
        case $candidate in "$prefix"*) echo "$candidate" ;; esac
    done
}

NAME_candidates() {  # "$@": the words after PROG, the last one being completed -> the candidates, one a line
    local cmdpath='' word='' value_of=''  # (not `path`: zsh ties that name to $PATH)
    while [ $# -gt 1 ]; do
        word=$1
        shift
        if [ -n "$value_of" ]; then value_of=''; continue; fi
        case $word in
            --) return 0 ;;  # the user's command: file names
            --*=*) ;;
            -*) case " $(NAME_valued "$cmdpath") " in *" $word "*) value_of=$word ;; esac ;;
            *) case " $(NAME_subcommands "$cmdpath") " in
                   *" $word "*) cmdpath=${cmdpath:+$cmdpath }$word ;;
                   *) if NAME_takes_command "$cmdpath"; then return 0; fi ;;
               esac ;;
        esac
    done
    word=$1
    if [ -n "$value_of" ]; then
        NAME_match "$word" $(NAME_choices "$cmdpath|$value_of")
        return 0
    fi
    case $word in
        --*=*) NAME_match "${word#*=}" $(NAME_choices "$cmdpath|${word%%=*}") ;;
        -*) NAME_match "$word" $(NAME_options "$cmdpath") ;;
        *) NAME_match "$word" $(NAME_subcommands "$cmdpath") $(NAME_choices "$cmdpath|") ;;
    esac
}
"""

_BASH = r"""
NAME() {  # bash: COMP_WORDS splits `--option=value` at '=' (COMP_WORDBREAKS); join them back first
    local -a words=()
    local i word glue=0
    for ((i = 1; i <= COMP_CWORD; i++)); do
        word=${COMP_WORDS[i]}
        if ((glue)); then words[${#words[@]}-1]+=$word; glue=0; continue; fi
        if [[ $word == = && ${#words[@]} -gt 0 && ${words[${#words[@]}-1]} == --* ]]; then
            words[${#words[@]}-1]+='='
            glue=1
            continue
        fi
        words+=("$word")
    done
    COMPREPLY=($(NAME_candidates "${words[@]}"))  # none: file names (complete -o default)
}

complete -o default -F NAME PROG
"""

_ZSH = r"""
NAME() {
    local -a candidates
    candidates=(${(f)"$(NAME_candidates "${(@)words[2,CURRENT]}")"})
    [[ ${words[CURRENT]} == --*=* ]] && compset -P '*='
    if (( ${#candidates} )); then compadd -a candidates; else _files; fi
}

if [[ ${zsh_eval_context[-1]} == loadautofunc ]]; then
    NAME "$@"  # autoloaded from a file named _PROG in $fpath
else
    compdef NAME PROG  # sourced (after compinit)
fi
"""

_SHELLS = {"bash": _BASH, "zsh": _ZSH}
SHELLS = list(_SHELLS)


def _function(prog: str) -> str:
    return "_" + "".join(c if c.isalnum() else "_" for c in prog)


def completion_script(shell: str, parser: argparse.ArgumentParser, *, header: str = "") -> str:
    """The completion script of ``parser`` (its ``prog`` is the command completed) for ``shell``.

    >>> print(completion_script("bash", argparse.ArgumentParser(prog="tool")).splitlines()[-1])
    complete -o default -F _tool tool
    """
    if shell not in _SHELLS:
        raise ValueError(f"no completion for the shell {shell!r}; expected one of: {', '.join(SHELLS)}")
    prog, name = parser.prog, _function(parser.prog)
    first = "#compdef " + prog if shell == "zsh" else f"# bash completion for {prog}"
    body = "\n".join([tables(prog, list(levels(parser))), _CANDIDATES.replace("PROG", prog).replace("NAME", name),
                      _SHELLS[shell].strip("\n").replace("PROG", prog).replace("NAME", name)])
    return "\n".join([first, *(f"# {line}" for line in header.splitlines()), "", body]) + "\n"
