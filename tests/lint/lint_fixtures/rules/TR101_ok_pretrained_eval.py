"""Near miss for TR101: pretrained models used for evaluation and greedy decoding draw nothing that matters:
loading overwrites the initial weights, and argmax decoding samples nothing."""

import timm
import torch
import torchvision
from torch import nn
from transformers import GPT2LMHeadModel, GPT2Tokenizer


class GPT(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.head = nn.Linear(n_embd, 50257)

    @classmethod
    def from_pretrained(cls, name):
        model = GPT(768)  # ok: initialised, then overwritten by the checkpoint
        model.load_state_dict(torch.load(name))
        return model

    def generate(self, idx, max_new_tokens, temperature=1.0, do_sample=False):
        for _ in range(max_new_tokens):
            probs = torch.softmax(self.head(idx) / temperature, dim=-1)
            if do_sample:
                idx_next = torch.multinomial(probs, num_samples=1)  # ok: not reached with do_sample=False
            else:
                idx_next = probs.argmax(dim=-1, keepdim=True)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx


def main():
    tokenizer = GPT2Tokenizer.from_pretrained("gpt2")
    hf_model = GPT2LMHeadModel.from_pretrained("gpt2")  # ok: every weight comes from the checkpoint
    hf_model.eval()
    ids = tokenizer("Hello, my dog is", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        greedy = hf_model.generate(ids, max_new_tokens=20, do_sample=False)  # ok: greedy decoding
        beams = hf_model.generate(ids, max_new_tokens=20, num_beams=4)  # ok: beam search samples nothing
    model = GPT.from_pretrained("gpt2.pt")
    model.eval()
    out = model.generate(ids, 20, do_sample=False)  # ok: argmax
    resnet = torchvision.models.resnet50(weights="IMAGENET1K_V2")  # ok: pretrained weights
    vit = timm.create_model("vit_base_patch16_224", pretrained=True)  # ok: pretrained, same head
    print(tokenizer.decode(greedy[0]), beams, out, resnet.eval(), vit.eval())


if __name__ == "__main__":
    main()
