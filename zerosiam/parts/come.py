"""COME's objective: the entropy of a subjective opinion, a conservative replacement for entropy.

Softmax entropy can always be lowered by inflating the logits, which is how entropy minimization
becomes over-confident and collapses. COME reads the exponentiated logits as Dirichlet evidence and
adds an uncertainty mass K: beliefs ``b_k = exp(u_k)/S`` and uncertainty ``v = K/S`` with
``S = Σ exp(u_k) + K`` (K = C). It minimizes the entropy of the C + 1 values ``[b, v]`` with the
gradient blocked through the logit norm, so the only way down is to change the logits' direction.

Computed in log space (``logsumexp``) so that large logits do not overflow; the 1e-7 inside the log is
the authors'. It is registered as the objective ``"come"`` so any recipe can use it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from zerosiam.parts.losses import OBJECTIVES


def block_norm_gradient(logits: Tensor) -> Tensor:
    """``u / ‖u‖ · sg(‖u‖)``: the same values, but no gradient that changes the logit norm.

    The clamp only matters for all-zero logits, which stay zero instead of becoming 0/0.
    """
    norm = logits.norm(dim=-1, keepdim=True)
    return logits / norm.clamp_min(1e-12) * norm.detach()


def come_entropy(logits: Tensor, uncertainty_mass: float | None = None) -> Tensor:
    """Per-sample entropy of the opinion ``[b_1 … b_C, v]``; at most ln(C + 1).

    ``uncertainty_mass`` K defaults to the number of classes C (methods.md: COME, K = C).
    """
    u = block_norm_gradient(logits)
    mass = float(u.shape[-1]) if uncertainty_mass is None else float(uncertainty_mass)
    log_mass = torch.full_like(u[..., :1], math.log(mass))
    log_opinion = torch.cat([u, log_mass], dim=-1)
    log_opinion = log_opinion - torch.logsumexp(log_opinion, dim=-1, keepdim=True)
    opinion = log_opinion.exp()
    return -(opinion * torch.log(opinion + 1e-7)).sum(-1)


OBJECTIVES["come"] = come_entropy
