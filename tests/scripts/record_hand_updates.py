"""Regression by hand (no torch.optim, unseeded): each backward() is a step; loops until it converges."""
import torch

w = torch.randn(3, requires_grad=True)
x = torch.randn(64, 3)
y = x @ torch.tensor([1.0, -2.0, 0.5])
steps = 0
for _ in range(200):
    loss = ((x @ w - y) ** 2).mean()
    loss.backward()
    with torch.no_grad():
        w -= 0.01 * w.grad
        w.grad.zero_()
    steps += 1
print("loop finished after", steps, "steps")
