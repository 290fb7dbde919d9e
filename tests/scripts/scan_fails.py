"""A training script that fails in its first step: under deterministic mode, put_ raises on CPU."""
import torch

torch.use_deterministic_algorithms(True)
x = torch.zeros(8)
print("starting the step")
x.put_(torch.tensor([1, 1]), torch.tensor([1.0, 2.0]))  # line 7
