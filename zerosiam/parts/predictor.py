"""ZeroSiam's predictor h: the module inserted between the feature z and the classifier head.

The default is a bias-free d×d linear map initialised to the identity, so that at the first step the
online branch g(h(z)) equals the target branch g(z) and adaptation starts exactly from the source model
(a "warm start"). The paper's ablations swap it for a fixed random map or a small MLP; saving a
collapsed model needs a learned one started at a random map.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from zerosiam.parts.streams import StackedLinear


class IdentityLinear(nn.Linear):
    """Bias-free linear layer that starts as the identity and is learned."""

    def __init__(self, dim: int) -> None:
        super().__init__(dim, dim, bias=False)
        with torch.no_grad():
            self.weight.copy_(torch.eye(dim))


class RandomLinear(nn.Linear):
    """The learned predictor started away from the identity, at I + scale·W, W ~ N(0, I).

    The paper's appendix needs it to save a collapsed model: an identity start leaves the collapsed
    solution a fixed point of the alignment, a random start does not.
    """

    def __init__(self, dim: int, scale: float = 0.1, seed: int = 0) -> None:
        super().__init__(dim, dim, bias=False)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            self.weight.copy_(torch.eye(dim) + scale * torch.randn(dim, dim, generator=generator))


class FixedRandomLinear(RandomLinear):
    """The ablation's fixed random predictor I + scale·W, W ~ N(0, I); never trained.

    It shows that asymmetry alone, without learning h, already resists collapse.
    """

    def __init__(self, dim: int, scale: float = 0.1, seed: int = 0) -> None:
        super().__init__(dim, scale, seed)
        self.weight.requires_grad_(False)


class MLPPredictor(nn.Module):
    """The ablation's deeper predictor FC-ReLU-FC.

    Both layers start as the identity; on a feature after ReLU (non-negative, as in CNNs) the whole
    map is then the identity, and elsewhere it is the closest a ReLU network gets to it.
    """

    def __init__(self, dim: int, hidden: int | None = None) -> None:
        super().__init__()
        hidden = hidden or dim
        self.fc1 = nn.Linear(dim, hidden, bias=False)
        self.fc2 = nn.Linear(hidden, dim, bias=False)
        with torch.no_grad():
            self.fc1.weight.copy_(torch.eye(hidden, dim))
            self.fc2.weight.copy_(torch.eye(dim, hidden))

    def forward(self, z: Tensor) -> Tensor:
        return self.fc2(torch.relu(self.fc1(z)))


PREDICTORS = {
    "identity": IdentityLinear,
    "random": FixedRandomLinear,
    "random_learned": RandomLinear,
    "mlp": MLPPredictor,
}


def build_predictor(kind: str, dim: int) -> nn.Module:
    """Make a predictor for feature size ``dim`` by its name in ``PREDICTORS``."""
    try:
        return PREDICTORS[kind](dim)
    except KeyError:
        raise ValueError(f"unknown predictor {kind!r}; choose one of {sorted(PREDICTORS)}") from None


def identity_drift(predictor: nn.Module) -> Tensor | float:
    """‖θ_h − I‖_F, the paper's measure of how far the predictor has moved, as a tensor on h's device
    (read back with the other diagnostics), one per stream for stacked predictors; NaN when h is not a
    square linear map."""
    if not isinstance(predictor, (nn.Linear, StackedLinear)):
        return float("nan")
    weight = predictor.weight.detach()
    if weight.shape[-1] != weight.shape[-2]:
        return float("nan")
    identity = torch.eye(weight.shape[-1], dtype=weight.dtype, device=weight.device)
    return torch.linalg.matrix_norm(weight - identity)
