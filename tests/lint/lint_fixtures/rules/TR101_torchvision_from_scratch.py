"""TR101: a torchvision model that is built from scratch unless --pretrained is given: with `weights=None` (the
default run here) its initial weights are drawn from torch's unseeded generator."""

import argparse

import torchvision.models as models
from torchvision.models import ResNet50_Weights, get_weight

parser = argparse.ArgumentParser()
parser.add_argument("--arch", default="resnet18", choices=models.list_models())  # ok: names, no model
parser.add_argument("--pretrained", action="store_true")


def main():
    args = parser.parse_args()
    backbone = models.resnet50(weights=ResNet50_Weights.DEFAULT)  # ok: every weight from the checkpoint
    named = models.get_model("resnet50", weights="IMAGENET1K_V2")  # ok: pretrained
    chosen = get_weight("ResNet50_Weights.IMAGENET1K_V1")
    other = models.resnet50(weights=chosen)  # ok: a weights entry, through a name
    model = models.get_model(args.arch, weights="DEFAULT" if args.pretrained else None)  # expect: TR101
    print(backbone, named, other, model)


if __name__ == "__main__":
    main()
