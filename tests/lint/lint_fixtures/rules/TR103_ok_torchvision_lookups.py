"""Near miss for TR103: functions of torchvision.models that look names and weights up build no model, so
calling them before the seed draws nothing (the model itself is built after torch.manual_seed)."""

import argparse

import torch
import torchvision.models as models
from torchvision.models import ResNet50_Weights, get_model_weights, get_weight

ARCHS = sorted(name for name in models.list_models(module=models) if name.islower())  # ok: names, no model
DEFAULT_WEIGHTS = get_weight("ResNet50_Weights.IMAGENET1K_V2")  # ok: a weights entry
PREPROCESS = ResNet50_Weights.DEFAULT.transforms()  # ok: the preprocessing that goes with the weights

parser = argparse.ArgumentParser()
parser.add_argument("--arch", default="resnet18", choices=ARCHS)
parser.add_argument("--seed", type=int, default=0)


def main():
    args = parser.parse_args()
    enum = get_model_weights(args.arch)  # ok: the arch's weights enum
    builder = models.get_model_builder(args.arch)  # ok: the builder itself, not called here
    print(list(enum), builder.__name__, ResNet50_Weights.verify("DEFAULT"))  # ok: a lookup
    torch.manual_seed(args.seed)
    model = models.get_model(args.arch, weights=None)  # ok: built after the seed
    print(model, PREPROCESS, DEFAULT_WEIGHTS)


if __name__ == "__main__":
    main()
