"""Training without a torch.optim optimizer; accumulates into a 1-D tensor with index_put_(accumulate=True),
which varies run to run on CPU with 2 threads (tests/analysis/test_scan.py asserts the line)."""
import torch

torch.manual_seed(0)
torch.set_num_threads(2)
w = torch.randn(16, requires_grad=True)
idx = torch.randint(0, 8, (64,))
for step in range(3):
    vals = torch.randn(64)
    hist = torch.zeros(8).index_put_((idx,), vals, accumulate=True)  # line 11
    loss = (w[:8] * hist).sum() + w.square().sum()
    loss.backward()
    with torch.no_grad():
        w -= 0.1 * w.grad
        w.grad = None
    if step >= 1:
        raise SystemExit("scan should have stopped the script after its first backward()")
