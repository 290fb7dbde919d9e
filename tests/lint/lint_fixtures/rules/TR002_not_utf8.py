import torch

name = "café"  # expect: TR002
