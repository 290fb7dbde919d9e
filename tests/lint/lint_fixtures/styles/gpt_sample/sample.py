"""Sample continuations of a prompt from pretrained GPT-2 (style of minGPT's generate demo and nanoGPT's sample.py).

Sampling draws from torch's global generator, and nothing seeds it: every run prints other samples. (--seed is
parsed but never used.)
"""

import argparse

import torch
from transformers import GPT2Tokenizer

from model import GPT

parser = argparse.ArgumentParser(description="sample from pretrained GPT-2")
parser.add_argument("--model-type", default="gpt2")
parser.add_argument("--prompt", default="Andrej Karpathy, the")
parser.add_argument("--num-samples", type=int, default=10)
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--top-k", type=int, default=40)
parser.add_argument("--temperature", type=float, default=0.8)
parser.add_argument("--seed", type=int, default=3407)
parser.add_argument("--compile", action="store_true")
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")


def generate(model, tokenizer, prompt, num_samples, steps, top_k, temperature, device):
    encoded = tokenizer(prompt, return_tensors="pt").to(device)
    x = encoded["input_ids"].expand(num_samples, -1)
    y = model.generate(x, max_new_tokens=steps, temperature=temperature, do_sample=True,  # expect[sampling]: TR101
                       top_k=top_k)
    for i in range(num_samples):
        print("-" * 80)
        print(tokenizer.decode(y[i].cpu().squeeze()))


def main():
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True  # ok: TF32 changes precision, not run-to-run results
    model = GPT.from_pretrained(args.model_type)  # also: TR101
    model.to(args.device)
    model.eval()
    if args.compile:
        model = torch.compile(model)  # ok: the default mode does not pick kernels by timing
    tokenizer = GPT2Tokenizer.from_pretrained(args.model_type)  # ok: a tokenizer, no weights
    generate(model, tokenizer, args.prompt, args.num_samples, args.steps, args.top_k,  # expect[sampling]: TR101
             args.temperature, args.device)


if __name__ == "__main__":
    main()
