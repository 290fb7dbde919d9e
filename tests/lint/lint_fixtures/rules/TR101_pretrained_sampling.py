"""TR101: a pretrained model that samples its output (`do_sample=True`) draws from torch's generator, which
is never seeded."""

from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    tokenizer = AutoTokenizer.from_pretrained("gpt2")
    model = AutoModelForCausalLM.from_pretrained("gpt2")  # ok: loading draws nothing that matters
    model.eval()
    ids = tokenizer("Once upon a time", return_tensors="pt")["input_ids"]
    greedy = model.generate(ids, max_new_tokens=20)  # ok: the default is greedy decoding
    sampled = model.generate(ids, max_new_tokens=20, do_sample=True, top_k=50)  # expect: TR101
    print(tokenizer.decode(greedy[0]), tokenizer.decode(sampled[0]))


if __name__ == "__main__":
    main()
