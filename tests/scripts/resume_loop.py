"""A training loop with its own checkpoint and resume, for `torchrepro check --resume-at K` (tests/cli/
test_check_resume_at.py). It resumes bit for bit unless `--forget WHAT` leaves WHAT out of the resume:

- `optimizer`: the optimizer state (a fresh Adam after the restart);
- `rng`: torch's RNG state (dropout draws other numbers after the restart);
- `data`: the data position (the shuffled epoch starts again from its first batch).

`--protocol env` reads the environment variables instead of `torchrepro.resume_point()` (a loop that never saves:
check_resume_at_never_saves.py).
"""

import argparse
import os

import torch

import torchrepro

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=8)
p.add_argument("--forget", choices=["nothing", "optimizer", "rng", "data"], default="nothing")
p.add_argument("--workers", type=int, default=0)
p.add_argument("--protocol", choices=["helper", "env"], default="helper")
args = p.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Dropout(0.25), torch.nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
g = torch.Generator().manual_seed(1)
data = torch.utils.data.TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g))
loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True, num_workers=args.workers,
                                     generator=torch.Generator().manual_seed(2))
assert args.steps <= len(loader), "one epoch only"

if args.protocol == "helper":
    rp = torchrepro.resume_point()
    resume_from, checkpoint, due = rp.resume_from, rp.checkpoint, rp.due
else:
    resume_from, checkpoint = os.environ.get("TORCHREPRO_RESUME_FROM"), os.environ.get("TORCHREPRO_CHECKPOINT")
    stop_at = int(os.environ.get("TORCHREPRO_RESUME_AT", "0"))
    due = lambda: stop_at and step == stop_at  # noqa: E731

step, batches = 0, iter(loader)
if resume_from:
    ckpt = torch.load(resume_from)
    model.load_state_dict(ckpt["model"])
    if args.forget != "optimizer":
        opt.load_state_dict(ckpt["optimizer"])
    step = ckpt["step"]
    if args.forget != "data":
        for _ in range(step):  # the batches of this epoch the run already trained on
            next(batches)
    if args.forget != "rng":
        torch.set_rng_state(ckpt["rng"])

while step < args.steps:
    x, y = next(batches)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    if due():
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
                    "rng": torch.get_rng_state()}, checkpoint)
print("done", step)
