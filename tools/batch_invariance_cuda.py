"""Check batch invariance on a GPU with the same checker and locator as on CPU; needs CUDA (prepared, not yet run).

cuBLAS picks its GEMM kernel (tile sizes, split-K) by shape, so a row's result can depend on the batch on a GPU as
on a CPU. This script runs ``torchrepro.check_batch_invariance`` on ``--device cuda`` for:

1. a 4096-wide Linear in float32 and bfloat16, rows alone against batches of 2, 3, 7, 64 and 256;
2. a tiny GPT-2 built from a config (random weights, nothing downloaded), 3 and 16 tokens per row;
3. with ``--hf DIR --prompts FILE``: a local causal language model's greedy generation, as
   ``torchrepro invariance --hf`` runs it, on the GPU.

It prints each verdict with the first batch-variant op and exits 0 (it reports what the GPU does: there is no
expected answer; ``torchrepro.batch_invariant()`` replaces CPU kernels only, so it is not used here), 2 without
a GPU:

    python tools/batch_invariance_cuda.py [--sizes 2,3,7,64,256] [--hf DIR --prompts FILE]

To check a model served with a batch-invariant mode, run its forward under that mode in the same process (for
example the kernels of ``batch_invariant_ops`` that vLLM's ``VLLM_BATCH_INVARIANT=1`` and SGLang's
``--enable-deterministic-inference`` build on) and pass it to ``check_batch_invariance``; see docs/invariance.md.
"""

from __future__ import annotations

import argparse
import sys


def _sizes(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=_sizes, default=[2, 3, 7, 64, 256], help="batch sizes besides 1")
    parser.add_argument("--device", default="cuda", help="the device (default cuda; cpu runs the same checks here)")
    parser.add_argument("--hf", metavar="DIR", help="a local causal language model directory (save_pretrained)")
    parser.add_argument("--prompts", metavar="FILE", help="with --hf: one prompt per line")
    args = parser.parse_args(argv)
    import torch

    import torchrepro

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("batch_invariance_cuda: no CUDA device here; run it on a machine with a GPU.", file=sys.stderr)
        return 2
    dev = torch.device(args.device)
    if dev.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        lin = torch.nn.Linear(4096, 4096).to(dev, dtype)
        x = torch.randn(max(args.sizes), 4096, generator=g).to(dev, dtype)
        result = torchrepro.check_batch_invariance(lin, x, sizes=args.sizes, rows=[0], positions=(0, -1))
        print(f"\n== Linear(4096, 4096) {dtype} ==\n{result.summary()}")

    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=1000, n_positions=64, bos_token_id=0,
                        eos_token_id=0)
    gpt = GPT2LMHeadModel(config).eval().to(dev)
    for tokens in (3, 16):
        ids = torch.randint(0, 1000, (8, tokens), generator=g).to(dev)
        result = torchrepro.check_batch_invariance(gpt, {"input_ids": ids, "use_cache": False},
                                                   sizes=[s for s in args.sizes if s <= 64], positions=(0, -1))
        print(f"\n== tiny GPT-2, {tokens} tokens per row ==\n{result.summary()}")

    if args.hf:
        if not args.prompts:
            print("batch_invariance_cuda: --hf needs --prompts FILE", file=sys.stderr)
            return 2
        from torchrepro.analysis.geninvariance import check_generation
        from torchrepro.cli.invariance_cmd import _prompts, load_causal_lm

        model, tokenizer = load_causal_lm(args.hf)
        result = check_generation(model.to(dev), tokenizer, _prompts(args.prompts), name=args.hf)
        print(f"\n== {args.hf} ==\n{result.summary()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
