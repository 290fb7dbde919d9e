"""Exercise `torchrepro check --locate` on torch.compile'd code with CUDA (Triton kernels); needs a GPU.

The bundled example's compiled embedding backward becomes a Triton kernel with ``tl.atomic_add`` on CUDA, which
varies between runs like the C++ kernel with 2 threads on CPU. This script runs, on ``--device cuda``:

1. ``check --locate`` -> expects DIVERGED (compute, in compiled code) and the verdict ``compiled-kernel`` naming
   the embedding backward of ``transformer.wte`` at the example's TOKEN-EMBEDDING line;
2. ``check --deterministic`` -> expects IDENTICAL (inductor calls PyTorch's deterministic kernel instead).

It prints one line per expectation (ok / FAILED: why) and exits 1 if any failed, 2 without a GPU:

    python tools/compile_locate_cuda.py [--out DIR] [--vocab 512 --block-size 256 --batch 16]

Larger sizes than the CPU defaults make the atomic race show on a GPU (more colliding rows per block).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "compiled_embedding.py"


def _line_of(marker: str) -> int:
    return next(i for i, line in enumerate(EXAMPLE.read_text().splitlines(), start=1) if marker in line)


def _check(out: Path, flags: list[str], sizes: list[str]) -> dict:
    cmd = [sys.executable, "-m", "torchrepro", "check", "--json", "--out", str(out), *flags, "--", sys.executable,
           str(EXAMPLE), "--device", "cuda", *sizes]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if not p.stdout.strip():
        return {"verdict": "error", "error": p.stderr[-2000:]}
    return json.loads(p.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="output directory (default: a temporary one)")
    parser.add_argument("--vocab", default="512")
    parser.add_argument("--block-size", default="256")
    parser.add_argument("--batch", default="16")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("compile_locate_cuda: no CUDA device; nothing to exercise (the CPU path is tested by "
              "tests/analysis/test_compile.py)")
        return 2
    out = Path(args.out or tempfile.mkdtemp(prefix="torchrepro-compile-cuda-"))
    sizes = ["--vocab", args.vocab, "--block-size", args.block_size, "--batch", args.batch]
    failures = 0

    def expect(what: str, ok: bool, why: str) -> None:
        nonlocal failures
        failures += not ok
        print(f"{'ok' if ok else 'FAILED'}: {what}" + ("" if ok else f" ({why})"), flush=True)

    doc = _check(out / "locate", ["--locate"], sizes)
    expect("check diverges in compiled code", doc.get("verdict") == "diverged" and doc.get("cause") == "compute"
           and (doc.get("compiled") or {}).get("in_compiled_code") is True, json.dumps(
               {k: doc.get(k) for k in ("verdict", "cause", "compiled", "error")})[:2000])
    expect("gradient |Δ| reported", any(d.get("max_abs_delta") for d in doc.get("value_deltas", [])),
           str(doc.get("value_deltas")))
    loc = doc.get("locate") or {}
    op = loc.get("op") or {}
    expect("locate: compiled kernel of the embedding backward", loc.get("verdict") == "compiled-kernel"
           and op.get("original_aten") == "aten.embedding_dense_backward"
           and op.get("line") == _line_of("TOKEN-EMBEDDING"), json.dumps(loc)[:2000])
    print(f"   device {loc.get('device')}; measured {loc.get('measured')}; eager deterministic: "
          f"{loc.get('eager_deterministic')}")
    det = _check(out / "deterministic", ["--deterministic"], sizes)
    expect("--deterministic is identical", det.get("verdict") == "identical", str(det.get("verdict")))
    print(f"outputs in {out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
