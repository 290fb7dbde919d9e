"""``torchrepro invariance``: does a request get the same answer alone as inside a batch?

Two ways in: a local causal language model (``--hf DIR --prompts FILE``: greedy generation of each prompt alone
and batched, then the forward pass row by row) or any model (``MODULE:FUNCTION --input FILE.pt``: the function,
importable as ``python -c`` would import it, returns the model; the file holds its batch). The model runs in this
process; nothing is downloaded. The verdict goes out as every verdict does (terminal, ``--json``,
``invariance.json`` and ``report.html`` in ``--out``). Exit codes: 0 invariant, 1 variant (or rows mixed, or
run-to-run noise), 2 usage or input error.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from pathlib import Path
from typing import Any

from .._core.errors import BatchInvarianceError
from ._options import add_json_option, positive_int
from ._usage import SUMMARIES

JSON_NAME = "invariance.json"


def _int_list(text: str, *, minimum: int | None = None) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or (minimum is not None and min(values) < minimum):
        floor = f" of {minimum} or more" if minimum is not None else ""
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers{floor}, got {text!r}")
    return values


def sizes_arg(text: str) -> list[int]:
    return _int_list(text, minimum=2)


def positions_arg(text: str) -> list[int]:
    return _int_list(text)


def rows_arg(text: str) -> list[int]:
    return _int_list(text, minimum=0)


EXAMPLES = """\
Examples:
  torchrepro invariance --hf ./my-model --prompts prompts.txt
  torchrepro invariance --hf ./my-model --prompts prompts.txt --batch-invariant   # the same under the fix
  torchrepro invariance mymodels:build --input batch.pt --sizes 2,8"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "invariance", help=SUMMARIES["invariance"],
        usage="torchrepro invariance (--hf DIR --prompts FILE [--max-new-tokens N] | MODULE:FUNCTION --input "
              "FILE.pt [--rows LIST] [--positions LIST]) [--sizes LIST] [--runs N] [--no-locate] "
              "[--batch-invariant] [--out DIR] [--json]",
        description="Run each row alone and inside batches of other sizes and positions (each context twice, so "
                    "run-to-run noise is told apart), compare its outputs bitwise, and name the first op whose row "
                    "output depends on the batch, with its module and source line. With --hf: greedy generation "
                    "of each prompt alone and batched (tokens and logits), then the forward pass. Exit codes: 0 "
                    "invariant, 1 variant, 2 usage or input error.",
        epilog=EXAMPLES)
    p.add_argument("target", nargs="?", metavar="MODULE:FUNCTION",
                   help="a function returning the model (imported as `python -c` would: the current directory "
                        "first); it is called as a model is: model(x), model(**dict), model(*tuple)")
    p.add_argument("--input", metavar="FILE.pt", help="with MODULE:FUNCTION: the batch, saved with torch.save (a "
                                                      "tensor, or a dict/tuple of tensors with the rows in dim 0)")
    p.add_argument("--hf", metavar="DIR", help="a local Hugging Face causal language model directory with its "
                                               "tokenizer (save_pretrained); nothing is downloaded")
    p.add_argument("--prompts", metavar="FILE", help="with --hf: the prompts, one per line (at least 2)")
    p.add_argument("--max-new-tokens", type=positive_int, default=16, metavar="N",
                   help="with --hf: tokens generated per prompt (default 16)")
    p.add_argument("--sizes", type=sizes_arg, metavar="LIST",
                   help="batch sizes to try besides 1 (default 2,3,4,8,16,32; with --hf 2,4,8)")
    p.add_argument("--positions", type=positions_arg, metavar="LIST",
                   help="positions of the row in each batch, negative from the end (default 0,-1: first, last)")
    p.add_argument("--rows", type=rows_arg, metavar="LIST", help="the rows of the input to check (default: all)")
    p.add_argument("--runs", type=positive_int, default=2, metavar="N",
                   help="runs of each context (default 2: a second run tells run-to-run noise apart)")
    p.add_argument("--no-locate", action="store_true", help="do not trace the first variant context op by op")
    p.add_argument("--batch-invariant", action="store_true",
                   help="run everything inside torchrepro.batch_invariant() (the fix): it should then say INVARIANT")
    p.add_argument("--out", metavar="DIR",
                   help="output directory (default: a new torchrepro-runs/invariance-TIMESTAMP-PID)")
    add_json_option(p)
    p.set_defaults(handler=run)


def _load_factory(target: str) -> Any:
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise BatchInvarianceError(f"expected MODULE:FUNCTION (e.g. mymodels:build), got {target!r}")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -c` imports
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise BatchInvarianceError(f"could not import {module_name!r} ({type(exc).__name__}: {exc}); run it from "
                                   "the directory that `python -c 'import " + module_name + "'` works in.") from exc
    try:
        factory = getattr(module, attr)
    except AttributeError:
        raise BatchInvarianceError(f"{module_name} has no attribute {attr!r}; expected a function that returns the "
                                   "model.") from None
    if not callable(factory):
        raise BatchInvarianceError(f"{target} is a {type(factory).__name__}, not a function returning the model.")
    try:
        return factory()
    except Exception as exc:
        raise BatchInvarianceError(f"{target}() raised {type(exc).__name__}: {exc}") from exc


def _load_input(path: str) -> Any:
    import torch

    file = Path(path)
    if not file.is_file():
        raise BatchInvarianceError(f"--input {path}: no such file; save the batch with torch.save(batch, "
                                   f"{path!r}) (a tensor, or a dict or tuple of tensors with the rows in dim 0).")
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise BatchInvarianceError(f"--input {path} could not be read by torch.load (weights_only=True): "
                                   f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from exc


def load_causal_lm(directory: str) -> tuple[Any, Any]:
    """A local ``transformers`` causal language model and its tokenizer (offline: nothing is downloaded)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    path = Path(directory)
    if not (path / "config.json").is_file():
        raise BatchInvarianceError(f"--hf {directory}: no config.json there; expected a directory written by "
                                   "model.save_pretrained() and tokenizer.save_pretrained().")
    try:
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise BatchInvarianceError(f"--hf needs transformers ({exc}); pip install transformers") from exc
    with contextlib.suppress(Exception):
        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:
        raise BatchInvarianceError(f"--hf {directory}: no usable tokenizer ({type(exc).__name__}: "
                                   f"{str(exc).splitlines()[0]}); save it there with tokenizer.save_pretrained()."
                                   ) from exc
    try:
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    except Exception as exc:
        raise BatchInvarianceError(f"--hf {directory}: the model could not be loaded as a causal language model "
                                   f"({type(exc).__name__}: {str(exc).splitlines()[0]}).") from exc
    return model.eval(), tokenizer


def _prompts(path: str) -> list[str]:
    file = Path(path)
    if not file.is_file():
        raise BatchInvarianceError(f"--prompts {path}: no such file; expected a text file with one prompt per line.")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BatchInvarianceError(f"--prompts {path} could not be read as UTF-8 text: {exc}") from exc
    prompts = [line.rstrip("\r") for line in text.split("\n") if line.strip()]
    if len(prompts) < 2:
        raise BatchInvarianceError(f"--prompts {path} holds {len(prompts)} prompt(s); batch invariance compares a "
                                   "prompt alone with the same prompt among others: give at least 2, one per line.")
    return prompts


def _check(args: argparse.Namespace) -> Any:
    if args.hf and args.target:
        raise BatchInvarianceError("give either --hf DIR --prompts FILE or MODULE:FUNCTION --input FILE.pt, not both")
    if args.hf:
        if not args.prompts:
            raise BatchInvarianceError("--hf DIR needs --prompts FILE (one prompt per line)")
        from ..analysis.geninvariance import DEFAULT_SIZES as GENERATION_SIZES
        from ..analysis.geninvariance import check_generation

        prompts = _prompts(args.prompts)
        model, tokenizer = load_causal_lm(args.hf)
        return check_generation(model, tokenizer, prompts, sizes=args.sizes or GENERATION_SIZES,
                                max_new_tokens=args.max_new_tokens, runs=args.runs, locate=not args.no_locate,
                                name=f"{args.hf} ({type(model).__name__})")
    if not args.target:
        raise BatchInvarianceError("nothing to check: give MODULE:FUNCTION --input FILE.pt, or --hf DIR --prompts "
                                   "FILE")
    if not args.input:
        raise BatchInvarianceError(f"{args.target} needs --input FILE.pt: the batch to check, saved with torch.save")
    from ..analysis.invariance import DEFAULT_POSITIONS, DEFAULT_SIZES, check_batch_invariance

    batch = _load_input(args.input)
    fn = _load_factory(args.target)
    if not callable(fn):
        raise BatchInvarianceError(f"{args.target}() returned a {type(fn).__name__}, not a model or function")
    return check_batch_invariance(fn, batch, sizes=args.sizes or DEFAULT_SIZES,
                                  positions=args.positions or DEFAULT_POSITIONS, rows=args.rows, runs=args.runs,
                                  locate=not args.no_locate)


def run(args: argparse.Namespace) -> int:
    from ..record.outdir import lock_dir
    from ._checkrun import output_dir
    from ._html.reports import invariance_report
    from ._output import Verdict, emit

    if (args.prompts or args.max_new_tokens != 16) and not args.hf:
        raise BatchInvarianceError("--prompts and --max-new-tokens go with --hf DIR")
    if args.hf and (args.input or args.rows or args.positions):
        raise BatchInvarianceError("--input, --rows and --positions go with MODULE:FUNCTION, not with --hf")
    out = output_dir(args.out, "invariance")
    with lock_dir(out):
        if args.batch_invariant:
            from ..nn.invariant import batch_invariant

            with batch_invariant():
                result = _check(args)
        else:
            result = _check(args)
        from . import _argv

        doc = result.to_json() | {"command": ["torchrepro", *_argv], "out": str(out)}
        text = result.summary()
        verdict = Verdict(doc, 0 if result.invariant else 1, JSON_NAME, summary=lambda plot: text,
                          report=lambda d, summary: invariance_report(d, summary))
        return emit(verdict, out, as_json=args.json)
