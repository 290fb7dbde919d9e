"""Batch invariance of a causal language model's greedy generation: the same prompt, alone and batched.

For each prompt, :func:`check_generation` runs greedy ``generate`` alone and inside batches of other prompts
(left padding, as a server pads), twice per context, and reports both levels: the generated tokens (the first
that differs, or none) and the logits behind them (bitwise, max |Δ|, and the |Δ| of the log-probability of each
token generated alone, up to the first divergence). Tokens that agree do not make a model batch invariant: a
logit that moved by 1e-7 flips a token as soon as two candidates are that close. Then the model's forward pass
is checked with :func:`~torchrepro.analysis.invariance.check_batch_invariance` on rows of one length (no padding),
which names the first batch-variant op: the prefill (the prompts cut to the shortest) and a decode step (each
prompt with the tokens it generated alone, the last one decoded with the cache: one row per sequence in the matrix
products, attention over the cache).

Needs a model with ``generate`` (``transformers``) and its tokenizer; nothing is downloaded here (the command
loads a local directory).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .._core.errors import BatchInvarianceError
from .._core.table import render_table
from .invariance import (
    DEFAULT_POSITIONS,
    SCHEMA,
    BatchInvarianceResult,
    _first_line,
    _num,
    check_batch_invariance,
    closing,
    fix_for,
)
from .tensordelta import tensor_delta

DEFAULT_SIZES = (2, 4, 8)
DEFAULT_NEW_TOKENS = 16


@dataclass
class PromptContext:
    """One prompt inside one batch: how its generation compares with the prompt alone."""

    size: int
    position: int
    first_divergent: int | None  # index of the first generated token that differs (None: all the same)
    compared: int  # tokens compared (up to the shorter generation)
    logits_equal: bool  # bitwise, at every step up to the first divergent token (included)
    max_logit_abs: float
    logprob_deltas: list[float]  # |Δ log p| of the token generated alone, per step up to the first divergence
    steady: bool = True  # the batch gave the same tokens and logits on every run
    padded: bool = False  # the prompt was left-padded in this batch (a longer prompt shared it)

    @property
    def status(self) -> str:
        if not self.steady:
            return "nondeterministic"
        return "invariant" if self.first_divergent is None and self.logits_equal else "variant"

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "position": self.position, "first_divergent_token": self.first_divergent,
                "tokens_compared": self.compared, "logits_bitwise_equal": self.logits_equal,
                "max_logit_abs": self.max_logit_abs, "logprob_deltas": self.logprob_deltas,
                "steady": self.steady, "padded": self.padded, "status": self.status}


@dataclass
class PromptResult:
    index: int
    prompt: str
    tokens: list[int]  # generated alone
    text: str
    contexts: list[PromptContext] = field(default_factory=list)
    steady: bool = True  # alone, the same on every run

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "prompt": self.prompt, "tokens": self.tokens, "text": self.text,
                "steady": self.steady, "contexts": [c.to_json() for c in self.contexts]}


@dataclass
class GenerationResult:
    """What :func:`check_generation` found: per prompt and batch, tokens and logits; ``forwards``: the forward
    passes checked row by row (the prefill, a decode step), each with its first variant op; ``forward``: the first
    of them that is not invariant (else the last)."""

    prompts: list[PromptResult]
    sizes: list[int]
    max_new_tokens: int
    runs: int
    forwards: list[tuple[str, BatchInvarianceResult]] = field(default_factory=list)
    under_fix: bool = False
    model: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def forward(self) -> BatchInvarianceResult | None:
        found = [r for _, r in self.forwards]
        return next((r for r in found if not r.invariant), found[-1] if found else None)

    @property
    def tokens_invariant(self) -> bool:
        return all(c.first_divergent is None for p in self.prompts for c in p.contexts)

    @property
    def logits_invariant(self) -> bool:
        return all(c.logits_equal for p in self.prompts for c in p.contexts)

    @property
    def nondeterministic(self) -> bool:
        return any(not p.steady or not all(c.steady for c in p.contexts) for p in self.prompts)

    @property
    def verdict(self) -> str:
        if self.nondeterministic or any(r.verdict == "nondeterministic" for _, r in self.forwards):
            return "nondeterministic"
        forward_ok = all(r.invariant for _, r in self.forwards)
        return "invariant" if self.tokens_invariant and self.logits_invariant and forward_ok else "variant"

    @property
    def invariant(self) -> bool:
        return self.verdict == "invariant"

    def headline(self) -> str:
        if self.verdict == "nondeterministic":
            what = "NONDETERMINISTIC - the same batch generated other tokens or logits on a second run"
        elif self.invariant:
            what = "INVARIANT - every prompt gets the same tokens and bitwise the same logits alone and batched"
        elif self.tokens_invariant:
            what = ("VARIANT - a prompt's logits depend on the batch it is in (the greedy tokens agreed this time: "
                    "a near tie flips them)")
        else:
            what = "VARIANT - a prompt generates other tokens depending on the batch it is in"
        return f"torchrepro invariance: {what}"

    def table(self) -> str:
        rows = []
        for p in self.prompts:
            for c in p.contexts:
                div = "-" if c.first_divergent is None else str(c.first_divergent)
                rows.append([str(p.index), str(c.size), str(c.position) + (" (padded)" if c.padded else ""),
                             "same" if c.first_divergent is None else "differ", div,
                             "equal" if c.logits_equal else "differ", _num(c.max_logit_abs),
                             _num(max(c.logprob_deltas, default=0.0)), c.status])
        return render_table(["prompt", "batch", "position", "tokens", "first divergent", "logits bitwise",
                             "max |Δ logit|", "max |Δ logprob|", "status"], rows, right={0, 1, 2, 4, 6, 7})

    def fix(self) -> str | None:
        if self.invariant:
            return None
        if self.forward is not None and not self.forward.invariant:
            return fix_for(self.forward)
        variant = [c for p in self.prompts for c in p.contexts if c.status == "variant"]
        if variant and all(c.padded for c in variant):
            if not self.under_fix:
                return ("the forward passes on rows of one length are invariant, and only prompts that were padded "
                        "differ: padding lengthens the attention's sums (over masked positions), and so changes their "
                        "order. Run the model inside `with torchrepro.batch_invariant(): ...`, which leaves the keys "
                        "that left padding masks out of those sums, then check again under it.")
            return ("only prompts that were padded differ, even inside torchrepro.batch_invariant(), which leaves "
                    "out the leading keys that an attention mask hides (left padding): this padding is of another "
                    "kind (right padding, a per-head mask). Serve without padding (as vLLM and SGLang do: each "
                    "sequence in its own slot) or pad every batch to one fixed length.")
        return ("the forward passes on rows of one length are invariant but the generations differ: look at what "
                "differs between the contexts above (padding, the cache, a sampling setting).")

    def summary(self) -> str:
        lines = [self.headline(),
                 f"{self.model + ': ' if self.model else ''}{len(self.prompts)} prompts, greedy, up to "
                 f"{self.max_new_tokens} new tokens, alone and in batches of {', '.join(map(str, self.sizes))} "
                 f"(left padding); each context run {self.runs} times"
                 + (" -- inside torchrepro.batch_invariant()" if self.under_fix else ""), ""]
        lines += [f"  prompt {p.index}: {p.prompt!r} -> {p.text!r}" for p in self.prompts]
        lines += ["", "Generation (each prompt against itself alone):", self.table()]
        for what, fwd in self.forwards:
            lines += ["", f"{what[0].upper()}{what[1:]}, row by row: {fwd.verdict.upper()}"]
            body = fwd.summary().split("\n")
            lines += [line for line in body[3:] if not line.startswith("Fix: ")]
            while lines and not lines[-1].strip():
                lines.pop()
        return closing(lines, self.notes, self.fix())

    def __str__(self) -> str:
        return self.summary()

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "mode": "generate", "verdict": self.verdict, "invariant": self.invariant,
                "tokens_invariant": self.tokens_invariant, "logits_invariant": self.logits_invariant,
                "model": self.model, "sizes": self.sizes, "max_new_tokens": self.max_new_tokens, "runs": self.runs,
                "batch_invariant": self.under_fix, "prompts": [p.to_json() for p in self.prompts],
                "forward": [{"what": what, **r.to_json()} for what, r in self.forwards],
                "fix": self.fix(), "notes": self.notes}



def _cut(tokens: torch.Tensor, eos: int | None) -> torch.Tensor:
    """Generated tokens up to and including the first end-of-sequence token (a batch pads after it)."""
    if eos is not None:
        hits = (tokens == eos).nonzero()
        if len(hits):
            return tokens[: int(hits[0, 0]) + 1]
    return tokens


class _Generator:
    def __init__(self, model: Any, tokenizer: Any, max_new_tokens: int) -> None:
        self.model, self.tok, self.max_new_tokens = model, tokenizer, max_new_tokens
        self.eos = getattr(tokenizer, "eos_token_id", None)

    def __call__(self, texts: Sequence[str]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per text: (generated tokens, logits per step (steps, vocab))."""
        enc = self.tok(list(texts), return_tensors="pt", padding=True)
        device = getattr(self.model, "device", None)
        if device is not None:
            enc = {k: v.to(device) for k, v in enc.items()}
        try:
            with torch.no_grad():
                out = self.model.generate(**enc, max_new_tokens=self.max_new_tokens, do_sample=False, num_beams=1,
                                          output_logits=True, return_dict_in_generate=True,
                                          pad_token_id=self.tok.pad_token_id)
        except Exception as exc:
            raise BatchInvarianceError(
                f"generate raised {type(exc).__name__} on a batch of {len(texts)} prompt(s) (input_ids "
                f"{tuple(enc['input_ids'].shape)}): {_first_line(exc)}. Leave that "
                "batch size out (--sizes) or fix the model.") from exc
        start = enc["input_ids"].shape[1]
        logits = torch.stack([step.detach() for step in out.logits], dim=1)
        return [((tokens := _cut(out.sequences[i, start:], self.eos)), logits[i, : len(tokens)])
                for i in range(len(texts))]


def _compare(alone: tuple[torch.Tensor, torch.Tensor], batched: tuple[torch.Tensor, torch.Tensor], size: int,
             position: int) -> PromptContext:
    ta, la = alone
    tb, lb = batched
    n = min(len(ta), len(tb))
    diverge = next((k for k in range(n) if int(ta[k]) != int(tb[k])), None)
    if diverge is None and len(ta) != len(tb):
        diverge = n
    last = n if diverge is None else min(diverge + 1, n)  # the divergent step's logits are still comparable
    equal, max_abs, deltas = True, 0.0, []
    for k in range(last):
        d = tensor_delta(la[k], lb[k])
        if d is None or not d.equal:
            equal = False
            max_abs = max(max_abs, d.max_abs if d is not None else float("inf"))
        pa = torch.log_softmax(la[k].double(), -1)[int(ta[k])]
        pb = torch.log_softmax(lb[k].double(), -1)[int(ta[k])]
        deltas.append(float((pa - pb).abs()))
    return PromptContext(size, position, diverge, n, equal, max_abs, deltas)


def _same_generation(a: list[tuple[torch.Tensor, torch.Tensor]], b: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
    return all(torch.equal(x[0], y[0]) and x[1].shape == y[1].shape and bool(tensor_delta(x[1], y[1]).equal)  # type: ignore[union-attr]
               for x, y in zip(a, b))


class _DecodeStep:
    """A causal language model's last decode step as a function of a batch: all but the last token prefilled into
    the cache, the last one decoded; returns its logits."""

    def __init__(self, model: Any) -> None:
        import inspect

        self.model = model
        try:  # transformers 5 names the cache `cache`; earlier versions `past_key_values`
            params = inspect.signature(model.forward).parameters
        except (TypeError, ValueError):
            params = {}  # type: ignore[assignment]
        self.cache_arg = "cache" if "cache" in params else "past_key_values"

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        first = self.model(input_ids=input_ids[:, :-1], attention_mask=attention_mask[:, :-1], use_cache=True)
        cache = getattr(first, "cache", None) or getattr(first, "past_key_values", None)
        out = self.model(input_ids=input_ids[:, -1:], attention_mask=attention_mask, use_cache=True,
                         **{self.cache_arg: cache})
        return out.logits  # type: ignore[no-any-return]


def check_generation(model: Any, tokenizer: Any, prompts: Sequence[str], *, sizes: Iterable[int] = DEFAULT_SIZES,
                     max_new_tokens: int = DEFAULT_NEW_TOKENS, runs: int = 2, locate: bool = True,
                     name: str = "") -> GenerationResult:
    """Greedy generation of each prompt alone and inside batches of the other prompts (see the module docs).

    ``tokenizer`` pads on the left (set here when it pads on the right; a missing pad token is taken from the end
    of sequence token). At least 2 prompts: the others fill the batches (repeated for batches larger than the
    number of prompts).
    """
    prompts = list(prompts)
    if len(prompts) < 2:
        raise BatchInvarianceError(
            f"{len(prompts)} prompt(s) given; batch invariance compares a prompt alone with the same prompt among "
            "others, taken from the prompts: give at least 2 (one per line).")
    sizes_l = sorted({int(s) for s in sizes if int(s) > 1})
    if not sizes_l:
        raise BatchInvarianceError(f"sizes {list(sizes)} hold no batch size of 2 or more.")
    if getattr(tokenizer, "pad_token_id", None) is None:
        if getattr(tokenizer, "eos_token", None) is None:
            raise BatchInvarianceError("the tokenizer has no pad token and no end-of-sequence token, so prompts of "
                                       "different lengths cannot be batched: give it a pad token (tokenizer."
                                       "pad_token = ...) and save it again.")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    lengths = [len(tokenizer(p)["input_ids"]) for p in prompts]
    empty = [i for i, n in enumerate(lengths) if n == 0]
    if empty:
        raise BatchInvarianceError(f"prompt(s) {empty} tokenize to no token at all; remove empty prompts.")
    gen = _Generator(model, tokenizer, max_new_tokens)
    from ..nn.invariant import active

    results = []
    cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # each prompt's generation alone
    for i, p in enumerate(prompts):
        first = gen([p])
        steady = all(_same_generation(first, gen([p])) for _ in range(runs - 1))
        cache[i] = first[0]
        tokens = first[0][0].tolist()
        results.append(PromptResult(i, p, tokens, tokenizer.decode(tokens), steady=steady))
    n = len(prompts)
    for size in sizes_l:
        seen: set[int] = set()
        for start in range(0, n, size):
            members = [(start + k) % n for k in range(size)]
            texts = [prompts[m] for m in members]
            out = gen(texts)
            steady = all(_same_generation(out, gen(texts)) for _ in range(runs - 1))
            for pos, m in enumerate(members):
                if m in seen:
                    continue
                seen.add(m)
                ctx = _compare(cache[m], out[pos], size, pos)
                ctx.steady = steady
                ctx.padded = lengths[m] < max(lengths[k] for k in members)
                results[m].contexts.append(ctx)
    shortest = min(lengths)
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    prompt_ids = [enc["input_ids"][i, enc["input_ids"].shape[1] - lengths[i]:] for i in range(n)]
    # The prompts cut to the shortest one (the prefill's shapes, no padding), then one decode step: each prompt
    # with the tokens it generated alone, cut to the shortest such sequence, all but the last token prefilled into
    # the cache and the last one decoded (a decode step's matrix products have one row per sequence, and its
    # attention reads the cache).
    sequences = [torch.cat([prompt_ids[i], cache[i][0].to(prompt_ids[i].device)]) for i in range(n)]
    total = min(len(t) for t in sequences)
    checks: list[tuple[str, Any, torch.Tensor]] = [
        (f"the prefill: the prompts cut to their first {shortest} token(s)", None,
         torch.stack([t[:shortest] for t in prompt_ids]))]
    if total >= 2:
        checks.append((f"a decode step: each prompt with the tokens it generated alone, cut to {total} tokens, the "
                       "last one decoded with the cache", _DecodeStep(model),
                       torch.stack([t[:total] for t in sequences])))
    device = getattr(model, "device", None)
    forwards = []
    for what, step, ids in checks:
        if device is not None:
            ids = ids.to(device)
        batch: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if step is None:
            batch["use_cache"] = False
        forwards.append((what, check_batch_invariance(step or model, batch, sizes=sizes_l,
                                                      positions=DEFAULT_POSITIONS, runs=runs, locate=locate,
                                                      model=model)))
    return GenerationResult(results, sizes_l, max_new_tokens, runs, forwards, under_fix=active(),
                            model=name)
