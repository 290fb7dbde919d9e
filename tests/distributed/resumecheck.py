"""``check --resume-at K`` of a torchrun command, run in this process (tests/inprocess.py): shared by the DDP and
FSDP2 resume tests."""

from __future__ import annotations

import json
from pathlib import Path

from tests.inprocess import torchrepro

K = 2  # the step the runs stop and resume at
LIMIT_S = 300


def resume_check(tmp_path: Path, *launch: str, args: tuple[str, ...] = (), json_out: bool = True,
                 ) -> tuple[int, dict, str, str]:
    """``check --resume-at K ARGS -- LAUNCH``; (exit code, the JSON document: stdout's, else check.json's, stdout,
    stderr)."""
    out = tmp_path / "out"
    p = torchrepro("check", "--resume-at", str(K), "--out", str(out), *(["--json"] if json_out else []), *args, "--",
                   *launch, timeout=LIMIT_S, cwd=tmp_path)
    if json_out:
        doc = json.loads(p.stdout)
    else:
        doc = json.loads((out / "check.json").read_text()) if (out / "check.json").is_file() else {}
    return p.returncode, doc, p.stdout, p.stderr


def restored(doc: dict) -> dict[str, bool | None]:
    return {r["what"]: r["restored"] for r in doc["restored"]}
