"""Small CIFAR-10 classifiers with GroupNorm or LayerNorm only: the source models of the paper's claims.

The paper's claims concern models without BatchNorm (ResNet-50-GN, ViT-B/16, ConvNeXt); no such model with
pretrained weights can be had offline, so these three are scaled down until each trains from scratch on a
CPU on the CIFAR-10 training JPEGs (``docs/source_models.md`` gives the times). Every model here expects
inputs already normalized with the CIFAR mean/std (``zerosiam.zoo.trained`` wraps them in ``Normalized``)
and ends in a ``head`` or ``fc`` Linear whose output *is* the model's output, which is how
``zerosiam.parts.split.find_head`` finds the classifier.
Written with ``torch.nn`` only, so the architectures are fully visible and depend on no other library.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

NUM_CLASSES = 10


# ---------------------------------------------------------------------------------------------- ResNet-GN
class GNBasicBlock(nn.Module):
    """He et al.'s basic block with GroupNorm in place of BatchNorm.

    The last GroupNorm of the residual branch starts with zero scale, so each block starts as the identity:
    without BatchNorm's statistics this is what lets a deep GN network train at a high learning rate from
    the first step (Goyal et al., 2017).
    """

    def __init__(self, in_planes: int, planes: int, stride: int, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.gn1 = nn.GroupNorm(groups, planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.gn2 = nn.GroupNorm(groups, planes)
        nn.init.zeros_(self.gn2.weight)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:  # option B: a learned 1×1 projection, normalized alike
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.GroupNorm(groups, planes)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.gn1(self.conv1(x)))
        out = self.gn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNetGN(nn.Module):
    """A CIFAR ResNet (3 stages at 32², 16², 8²) of depth 6n + 2, GroupNorm throughout, ``fc`` head."""

    rate_family: ClassVar[str] = "resnet50_gn"  # adaptation rates of the paper's ResNet-50-GN

    def __init__(
        self,
        depth: int = 26,
        widths: tuple[int, int, int] = (16, 32, 64),
        groups: int = 8,
        num_classes: int = NUM_CLASSES,
    ) -> None:
        super().__init__()
        if (depth - 2) % 6:
            raise ValueError(f"a CIFAR ResNet has depth 6n + 2, got {depth}")
        blocks = (depth - 2) // 6
        self.conv1 = nn.Conv2d(3, widths[0], 3, padding=1, bias=False)
        self.gn1 = nn.GroupNorm(groups, widths[0])
        stages, in_planes = [], widths[0]
        for index, planes in enumerate(widths):
            stride = 1 if index == 0 else 2
            layers = [
                GNBasicBlock(in_planes if i == 0 else planes, planes, stride if i == 0 else 1, groups)
                for i in range(blocks)
            ]
            stages.append(nn.Sequential(*layers))
            in_planes = planes
        self.layer1, self.layer2, self.layer3 = stages
        self.fc = nn.Linear(widths[-1], num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.gn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(x.mean((2, 3)))


# ---------------------------------------------------------------------------------------------- ViT-LN
class Attention(nn.Module):
    """Multi-head self-attention; ``scaled_dot_product_attention`` picks the fastest exact kernel."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by {heads} heads")
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        batch, tokens, dim = x.shape
        qkv = self.qkv(x).view(batch, tokens, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        return self.proj(out.transpose(1, 2).reshape(batch, tokens, dim))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class TransformerBlock(nn.Module):
    """Pre-norm transformer block (LayerNorm → attention, LayerNorm → MLP), as in ViT."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """A Vision Transformer for 32² images: 4×4 patches (64 tokens), learned positions, global average
    pooling of the tokens (no class token: on small data it trains faster and as well), final LayerNorm,
    ``head``."""

    rate_family: ClassVar[str] = "vit_small"  # adaptation rates of the paper's smallest ViT, ViT-S/16

    def __init__(
        self,
        image_size: int = 32,
        patch: int = 4,
        dim: int = 128,
        depth: int = 6,
        heads: int = 4,
        mlp_ratio: float = 2.0,
        num_classes: int = NUM_CLASSES,
    ) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.pos_embed = nn.Parameter(torch.zeros(1, (image_size // patch) ** 2, dim))
        self.blocks = nn.Sequential(*[TransformerBlock(dim, heads, mlp_ratio) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)

    def forward(self, x: Tensor) -> Tensor:
        tokens = self.patch_embed(x).flatten(2).transpose(1, 2) + self.pos_embed
        return self.head(self.norm(self.blocks(tokens)).mean(1))


# ---------------------------------------------------------------------------------------------- ConvNeXt-LN
class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an ``(N, C, H, W)`` map, computed channels-last like ConvNeXt's."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    """Depthwise k×k conv → LayerNorm (channels-last) → Linear 4× → GELU → Linear → layer scale, residual."""

    def __init__(self, dim: int, kernel: int, layer_scale: float) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel, padding=kernel // 2, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), layer_scale))

    def forward(self, x: Tensor) -> Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.pwconv2(F.gelu(self.pwconv1(self.norm(y)))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    """ConvNeXt for 32² images: a 2×2 patchify stem (16² maps; the 4×4 stem of ImageNet would leave 8²),
    three stages separated by LayerNorm + 2×2 stride-2 convs, global average pool, final LayerNorm, ``head``.
    """

    rate_family: ClassVar[str] = "convnext_tiny"  # adaptation rates of the paper's ConvNeXt-Tiny

    def __init__(
        self,
        dims: tuple[int, ...] = (48, 96, 192),
        depths: tuple[int, ...] = (2, 2, 6),
        kernel: int = 5,
        stem: int = 2,
        layer_scale: float = 1e-6,
        num_classes: int = NUM_CLASSES,
    ) -> None:
        super().__init__()
        if len(dims) != len(depths):
            raise ValueError("dims and depths must have the same length")
        self.stem = nn.Sequential(nn.Conv2d(3, dims[0], stem, stride=stem), LayerNorm2d(dims[0]))
        stages: list[nn.Module] = []
        for index, (dim, depth) in enumerate(zip(dims, depths, strict=True)):
            blocks: list[nn.Module] = [ConvNeXtBlock(dim, kernel, layer_scale) for _ in range(depth)]
            if index > 0:
                blocks.insert(
                    0, nn.Sequential(LayerNorm2d(dims[index - 1]), nn.Conv2d(dims[index - 1], dim, 2, 2))
                )
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.norm = nn.LayerNorm(dims[-1])
        self.head = nn.Linear(dims[-1], num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d | nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.norm(self.stages(self.stem(x)).mean((2, 3))))


# ---------------------------------------------------------------------------------------------- registry
ARCHITECTURES: dict[str, Callable[[], nn.Module]] = {
    "resnet26_gn": lambda: ResNetGN(depth=26, widths=(16, 32, 64), groups=8),
    "vit_tiny_ln": lambda: ViT(dim=128, depth=6, heads=4, mlp_ratio=2.0),
    "convnext_nano_ln": lambda: ConvNeXt(dims=(48, 96, 192), depths=(2, 2, 6), kernel=5),
}
"""The source models of the benchmark, by the names the zoo and ``zerosiam train-source`` use."""

TEST_ARCHITECTURES: dict[str, Callable[[], nn.Module]] = {
    "tiny_gn": lambda: ResNetGN(depth=8, widths=(8, 16, 16), groups=4),
}
"""Miniatures for the test suite and smoke runs: about ten thousand parameters, so an epoch on a few hundred
images is quick on any CPU."""


def build_architecture(name: str) -> nn.Module:
    """A freshly initialised model (draws from torch's global RNG: seed it first for reproducible weights)."""
    factory = ARCHITECTURES.get(name) or TEST_ARCHITECTURES.get(name)
    if factory is None:
        raise ValueError(f"unknown architecture {name!r}; available: {', '.join(ARCHITECTURES)}")
    return factory()
