"""Near miss for TR204: CUBLAS_WORKSPACE_CONFIG set before any CUDA work."""

import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # ok: before CUDA is used

import torch  # noqa: E402


def main():
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = torch.nn.Linear(4, 4).to(device)
    return model


if __name__ == "__main__":
    main()
