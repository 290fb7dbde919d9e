"""ResNet-18/34 with basic blocks, registered as resnet18 and resnet34."""

import torch
import torch.nn as nn

from ._registry import register_model


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)  # expect: TR203
        self.bn1 = nn.BatchNorm2d(planes)
        self.act1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)  # also: TR203
        self.bn2 = nn.BatchNorm2d(planes)
        self.act2 = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False),  # also: TR203
                nn.BatchNorm2d(planes),
            )

    def forward(self, x):
        shortcut = x if self.downsample is None else self.downsample(x)
        x = self.act1(self.bn1(self.conv1(x)))
        x = self.bn2(self.conv2(x))
        return self.act2(x + shortcut)


class ResNet(nn.Module):
    def __init__(self, layers, num_classes=1000, in_chans=3, drop_rate=0.0):
        super().__init__()
        self.drop_rate = drop_rate
        self.conv1 = nn.Conv2d(in_chans, 64, 7, stride=2, padding=3, bias=False)  # expect: TR203
        self.bn1 = nn.BatchNorm2d(64)
        self.act1 = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)  # ok: 2-D max pooling is deterministic
        stages = []
        inplanes = 64
        for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512), layers)):
            stride = 1 if i == 0 else 2
            stage = [BasicBlock(inplanes, planes, stride)]
            stage += [BasicBlock(planes, planes) for _ in range(1, blocks)]
            stages.append(nn.Sequential(*stage))
            inplanes = planes
        self.stages = nn.Sequential(*stages)
        # a 1x1 output: each input gets one gradient write, yet deterministic mode refuses its backward
        self.global_pool = nn.AdaptiveAvgPool2d(1)  # also: TR203
        self.fc = nn.Linear(512, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.maxpool(self.act1(self.bn1(self.conv1(x))))
        x = self.stages(x)
        x = torch.flatten(self.global_pool(x), 1)
        if self.drop_rate:
            x = nn.functional.dropout(x, p=self.drop_rate, training=self.training)
        return self.fc(x)


def _create_resnet(layers, pretrained=False, url="", **kwargs):
    model = ResNet(layers, **kwargs)
    if pretrained and url:
        state_dict = torch.hub.load_state_dict_from_url(url, map_location="cpu")
        model.load_state_dict(state_dict)
    return model


@register_model
def resnet18(pretrained=False, **kwargs):
    return _create_resnet((2, 2, 2, 2), pretrained=pretrained, **kwargs)


@register_model
def resnet34(pretrained=False, **kwargs):
    return _create_resnet((3, 4, 6, 3), pretrained=pretrained, **kwargs)
