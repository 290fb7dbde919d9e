"""A tiny GPT-2 and a word-level tokenizer, built here (random weights, nothing downloaded), for the batch
invariance tests: ``tiny_gpt2()`` in memory, ``save_tiny_lm(dir)`` as ``save_pretrained`` writes it."""

from __future__ import annotations

from pathlib import Path

import torch

WORDS = ("the a cat dog sat on mat ran fast slow big small red blue green house tree sun moon star and of "
         "to in by near under over").split()
PROMPTS = ["the cat sat on the mat", "a big red dog ran fast", "the sun and the moon",
           "a small blue house near the tree"]  # 4 to 7 words: left padding in a batch


def tiny_gpt2(vocab_size: int = len(WORDS) + 3, seed: int = 0):
    """GPT-2 from a config: 2 layers, 256 wide, 4 heads; eval mode."""
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    transformers.logging.set_verbosity_error()
    torch.manual_seed(seed)
    config = GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=vocab_size, n_positions=64, bos_token_id=2,
                        eos_token_id=2, pad_token_id=0)
    return GPT2LMHeadModel(config).eval()


def word_tokenizer():
    """A word-level tokenizer (``tokenizers``) as a transformers fast tokenizer: [PAD] 0, [UNK] 1, [EOS] 2."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "[EOS]": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", eos_token="[EOS]",
                                   padding_side="left")


def save_tiny_lm(directory: Path) -> Path:
    """The model and tokenizer saved with ``save_pretrained`` into ``directory``, and ``prompts.txt`` beside."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    directory.mkdir(parents=True, exist_ok=True)
    tiny_gpt2().save_pretrained(directory)
    word_tokenizer().save_pretrained(directory)
    (directory / "prompts.txt").write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
    return directory
