"""A training script that fails during its first step."""
import torch

x = torch.randn(4, 3, requires_grad=True)
print("starting the step")
raise RuntimeError("shape mismatch in my_model.forward: expected 5 features, got 3")
