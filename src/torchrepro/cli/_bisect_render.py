"""Text of ``torchrepro bisect``: the first bad commit, the commits tested, and the op and line it changed."""

from __future__ import annotations

from typing import Any

from ._compare_locate_render import render_compare_locate

_MARK = {"good": "good", "bad": "BAD", "skip": "skip", None: "-"}


def _commit(c: dict[str, Any]) -> str:
    return f"{c['sha'][:12]} {c['subject']!r}"


def _one_line(text: str, limit: int) -> str:
    """``text`` on one line (a reason may hold newlines: they would break the table), at most ``limit`` long."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3].rstrip() + "..."


def _tested_line(i: int, c: dict[str, Any], tested: dict[str, dict[str, Any]]) -> str:
    t = tested.get(c["sha"], {})
    how = ""
    if t.get("compare"):
        step = t["compare"].get("first_divergent_step")
        how = t["compare"]["verdict"] + (f" from step {step}" if step is not None else "")
        renamed = t["compare"].get("renamed") or {}
        if renamed:
            first_new, first_old = next(iter(renamed.items()))
            how += (f" ({len(renamed)} parameter(s) renamed since good, compared by position: {first_new} was "
                    f"{first_old}" + (", ..." if len(renamed) > 1 else "") + ")")
        how = _one_line(how, 160)
    elif t.get("reason"):
        how = _one_line(t["reason"], 100)
    elif i == 0:
        how = "the reference"
    return f"  {i:>3}  {_MARK[c.get('verdict')]:<4}  {_commit(c)[:70]:<70}  {how}"


def _diff_lines(diff: dict[str, Any] | None) -> list[str]:
    if not diff:
        return []
    if diff.get("touched"):
        lines = ["Commit diff: the commit changes the line named above:"]
        for t in diff["touches"]:
            sign = "+" if t["change"] == "added" else "-"
            lines.append(f"  {t['checkout']:<6}  {t['file']}:{t['line']}  {sign} {t['text'].strip()}")
        return lines
    files = ", ".join(f"{p} (+{f['added']} -{f['removed']})" for p, f in list(diff.get("files", {}).items())[:6])
    return [f"Commit diff: the line named above is not in the commit's diff (it changes {files or 'no file'}): the "
            "change acts through code the localization does not name (a value, a default, an import)."]


def render_bisect(doc: dict[str, Any]) -> str:
    """The text summary of ``torchrepro bisect``."""
    tol = doc["tolerance"]
    how = "bitwise" if tol.get("bitwise") else "within the tolerance"
    head = {
        "found": lambda: f"torchrepro: FOUND - the first commit whose run differs from good's ({how}): "
                         f"{_commit(doc['first_bad_commit'])}",
        "ambiguous": lambda: "torchrepro: AMBIGUOUS - the first commit whose run differs is one of "
                             + ", ".join(_commit(c) for c in doc["candidates"])
                             + " (the others were skipped: the command failed there, or its run was not comparable "
                               "with good's)",
        "none-differs": lambda: f"torchrepro: NONE DIFFERS - the run at bad {_commit(doc['bad'])} agrees with good's "
                                f"({how}); no commit in between changes it",
    }[doc["verdict"]]()
    lines = [head, f"  {doc['recordings']} recording(s) for {doc['commits']} commit(s) after good "
                   f"{_commit(doc['good'])}; command `{doc['command']}`", "",
             "Commits (oldest first; - = not tested):"]
    tested = {t["sha"]: t for t in doc["tested"]}
    lines += [_tested_line(i, c, tested) for i, c in enumerate(doc["chain"])]
    first = doc.get("first_bad_commit")
    step = ((first or {}).get("compare") or {}).get("first_divergent_step")
    if step is not None:
        lines += ["", f"First divergent step against good: {step}"]
    located = doc.get("locate")
    if located is not None:
        compared = located.get("compared") or {}
        what = ", ".join(compared.get("diverged_first") or [])
        parent = (first or {}).get("parent") or {}
        lines += ["", f"Between the parent {str(parent.get('sha', '?'))[:12]} (A) and the commit (B): "
                      f"{compared.get('verdict')} from step {compared.get('first_divergent_step')} ({what})"]
        lines.append(render_compare_locate(located).lstrip("\n"))
        lines += [""] + _diff_lines(located.get("diff"))
    lines.append(f"Runs:  {doc['out']}")
    return "\n".join(lines)
