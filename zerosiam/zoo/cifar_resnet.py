"""The CIFAR-10 ResNets of He et al. (2016) with BatchNorm and option-A (zero-padding) shortcuts.

The layout and parameter names match the public checkpoints of akamaster/pytorch_resnet_cifar10 (the assets
``resnet20``, ``resnet32`` and ``resnet56``, ``docs/data.md``), so their state dicts load without renaming.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class _PadShortcut(nn.Module):
    """Option A: subsample by 2 and zero-pad the new channels; no parameters, as in the paper."""

    def __init__(self, extra_channels: int) -> None:
        super().__init__()
        self.pad = extra_channels // 2

    def forward(self, x: Tensor) -> Tensor:
        return F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad, self.pad))


class BasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        changes_shape = stride != 1 or in_planes != planes
        self.shortcut = _PadShortcut(planes - in_planes) if changes_shape else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet-(6n+2) for 32×32 inputs: three stages of n blocks with 16, 32 and 64 channels."""

    def __init__(self, depth: int, num_classes: int = 10) -> None:
        super().__init__()
        if (depth - 2) % 6:
            raise ValueError(f"CIFAR ResNet depth must be 6n+2, got {depth}")
        blocks = (depth - 2) // 6
        self.conv1 = nn.Conv2d(3, 16, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = self._stage(16, 16, blocks, stride=1)
        self.layer2 = self._stage(16, 32, blocks, stride=2)
        self.layer3 = self._stage(32, 64, blocks, stride=2)
        self.linear = nn.Linear(64, num_classes)

    @staticmethod
    def _stage(in_planes: int, planes: int, blocks: int, stride: int) -> nn.Sequential:
        layers = [BasicBlock(in_planes, planes, stride)]
        layers += [BasicBlock(planes, planes, 1) for _ in range(blocks - 1)]
        return nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.linear(out)
