"""Per-sample losses on logits: the entropy, the alignment divergences and the self-training objectives.

Every function takes logits whose last dimension is the class (or vocabulary) dimension and returns one
value per sample (the last dimension reduced), so that selection rules and weights can act per sample
before a recipe takes the mean. Working from logits with ``log_softmax`` keeps every term finite even
when a probability underflows to zero, which is exactly the regime a collapsing model reaches.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

PerSample = Callable[[Tensor], Tensor]
Divergence = Callable[[Tensor, Tensor], Tensor]


def entropy(logits: Tensor) -> Tensor:
    """Shannon entropy H(p) = -Σ p log p of softmax(logits), in nats."""
    log_p = logits.log_softmax(-1)
    return -(log_p.exp() * log_p).sum(-1)


def probability_entropy(probabilities: Tensor) -> Tensor:
    """The same for a distribution given as probabilities (a class histogram), in nats; a class of
    probability 0 adds 0, where going through a log of it would give NaN."""
    return -(probabilities * probabilities.clamp_min(1e-12).log()).sum(-1)


def _kl_from_logits(log_p: Tensor, log_q: Tensor) -> Tensor:
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def kl(online: Tensor, target: Tensor) -> Tensor:
    """KL(p_o ‖ p_r): penalizes the online branch for putting mass where the target has none."""
    return _kl_from_logits(online.log_softmax(-1), target.log_softmax(-1))


def reverse_kl(online: Tensor, target: Tensor) -> Tensor:
    """KL(p_r ‖ p_o): penalizes the online branch for missing a mode of the target."""
    return _kl_from_logits(target.log_softmax(-1), online.log_softmax(-1))


def symmetric_kl(online: Tensor, target: Tensor) -> Tensor:
    """KL(p_o‖p_r) + KL(p_r‖p_o), ZeroSiam's default: penalizes both under- and over-coverage."""
    log_o, log_r = online.log_softmax(-1), target.log_softmax(-1)
    return ((log_o.exp() - log_r.exp()) * (log_o - log_r)).sum(-1)


def jensen_shannon(online: Tensor, target: Tensor) -> Tensor:
    """JS divergence: the mean KL of each distribution to their average, bounded by ln 2."""
    log_o, log_r = online.log_softmax(-1), target.log_softmax(-1)
    log_m = torch.logaddexp(log_o, log_r) - torch.log(torch.tensor(2.0, dtype=log_o.dtype))
    return 0.5 * (_kl_from_logits(log_o, log_m) + _kl_from_logits(log_r, log_m))


def mse(online: Tensor, target: Tensor) -> Tensor:
    """Squared L2 distance between the two probability vectors."""
    return (online.softmax(-1) - target.softmax(-1)).pow(2).sum(-1)


DIVERGENCES: dict[str, Divergence] = {
    "skl": symmetric_kl,
    "kl": kl,
    "reverse_kl": reverse_kl,
    "js": jensen_shannon,
    "mse": mse,
}


def soft_likelihood_ratio(logits: Tensor) -> Tensor:
    """SLR (Mummadi et al.): -Σ p log(p / (1 - p)); unlike entropy its gradient does not vanish near one-hot.

    ``1 - p`` is clamped so that a saturated class stays finite.
    """
    log_p = logits.log_softmax(-1)
    p = log_p.exp()
    log_not_p = torch.log1p(-p.clamp(max=1 - 1e-6))
    return -(p * (log_p - log_not_p)).sum(-1)


def self_labelled_cross_entropy(logits: Tensor) -> Tensor:
    """Cross-entropy with the model's own argmax as the label (hard pseudo-labels)."""
    return F.cross_entropy(logits.flatten(0, -2), logits.argmax(-1).flatten(), reduction="none").view(
        logits.shape[:-1]
    )


def negative_squared_probability(logits: Tensor) -> Tensor:
    """-Σ p²: minimal when the prediction is one-hot, like entropy, but bounded gradients."""
    return -logits.softmax(-1).pow(2).sum(-1)


OBJECTIVES: dict[str, PerSample] = {
    "entropy": entropy,
    "slr": soft_likelihood_ratio,
    "ce": self_labelled_cross_entropy,
    "neg_p2": negative_squared_probability,
}


def resolve(table: dict[str, Callable], choice: str | Callable, kind: str) -> Callable:
    """Look up a loss by name, or pass a user's own callable through unchanged."""
    if callable(choice):
        return choice
    try:
        return table[choice]
    except KeyError:
        raise ValueError(
            f"unknown {kind} {choice!r}; choose one of {sorted(table)} or pass a callable"
        ) from None
