"""What counts as a sign that code runs on CUDA (``torchrepro.lint.devices.cuda_use``), which TR203 asks before it
reports an op that is nondeterministic on CUDA only."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from torchrepro.lint.devices import cuda_use
from torchrepro.lint.module import Module


def _use(source: str) -> str:
    text = textwrap.dedent(source)
    return cuda_use(Module(Path("m.py"), "m.py", text, ast.parse(text)))


CUDA = [
    "model = Net().cuda()",
    "x = x.cuda(args.gpu, non_blocking=True)",
    "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')",
    "device = 'cuda:0' if use_gpu else 'cpu'",
    "x = x.to(f'cuda:{rank}')",
    "model.to(device='cuda')",
    "device = torch.device(args.device)",
    "model.to(args.device)",
    "model.to(rank)",
    "parser.add_argument('--device', default='cuda')",
    "torch.cuda.set_device(local_rank)",
    "n = torch.cuda.device_count()",
    "scaler = torch.cuda.amp.GradScaler()",
    "Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor",
    "from torch.cuda.amp import autocast\nwith autocast():\n    pass",
    "device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else 'cpu'",
    "torch.backends.cudnn.benchmark = True",
    "dist.init_process_group(backend='nccl')",
    "model = torch.nn.DataParallel(model)",
    "model = DDP(model, device_ids=[gpu])",
    "trainer = L.Trainer(max_epochs=3)",
    "trainer = pl.Trainer(accelerator='gpu', devices=2)",
    "args = TrainingArguments(output_dir='out')",
    "accelerator = Accelerator()",
]
NOT_CUDA = [
    "model = Net()",
    "device = torch.device('cpu')\nmodel.to(device)",
    "out = torch.zeros(4, device=x.device)",
    "if torch.cuda.is_available():\n    torch.cuda.manual_seed_all(seed)",
    "x = x.to(torch.float16)",
    "model.to(device)",
    "trainer = L.Trainer(accelerator='cpu')",
    "args = TrainingArguments(output_dir='out', use_cpu=True)",
    "accelerator = Accelerator(cpu=True)",
    "torch.backends.cudnn.deterministic = True",
    'def f():\n    """Runs on cuda."""\n    "cuda"',
    "parser.add_argument('--cuda', action='store_true', help='use cuda')",
]
IMPORTS = ("import torch\nimport torch.distributed as dist\nimport lightning as L\nimport pytorch_lightning as pl\n"
           "from torch.nn.parallel import DistributedDataParallel as DDP\nfrom transformers import TrainingArguments\n"
           "from accelerate import Accelerator\n")


@pytest.mark.parametrize("code", CUDA)
def test_signs_of_cuda(code: str) -> None:
    assert _use(IMPORTS + code)


@pytest.mark.parametrize("code", NOT_CUDA)
def test_not_signs_of_cuda(code: str) -> None:
    assert _use(IMPORTS + code) == ""


def test_the_first_sign_is_named() -> None:
    assert _use("import torch\nx = 1\nmodel = Net().cuda()\ny = torch.device('cuda')\n") == "line 3 (.cuda())"
