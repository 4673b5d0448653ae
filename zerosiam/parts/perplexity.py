"""TLM's parts: minimise the perplexity of the prompt, only when the prompt is surprising.

TLM (Hu et al., ICML 2025) adapts a language model on what it is asked rather than on what it answers:
it lowers the negative log-likelihood of the prompt's tokens, but only for prompts whose log-perplexity
exceeds ln P0 (P0 = e³), weighted by λ·exp(nll − ln P0) so that the more surprising a prompt, the more
it counts. A sample is a whole prompt: its logits are ``[positions, vocabulary]`` (each position
predicting the next prompt token) and its objective the mean next-token NLL over them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from zerosiam.parts.contract import Batch

TLM_LOG_PERPLEXITY = 3.0  # TLM: perplexity threshold P0 = e^3
TLM_LAMBDA = 0.1  # TLM: weight λ


def prompt_nll(batch: Batch) -> Tensor:
    """Each prompt's mean next-token negative log-likelihood (its log-perplexity), one value per sample."""
    batch.require("text", "TLM's prompt perplexity")
    if batch.tokens is None or batch.tokens.shape[-1] < 1:
        raise ValueError("the prompt needs at least two tokens to have a perplexity")
    if "prompt_nll" not in batch.cache:
        pairs = zip(batch.logits, batch.tokens, strict=True)
        batch.cache["prompt_nll"] = torch.stack([F.cross_entropy(logits, tokens) for logits, tokens in pairs])
    return batch.cache["prompt_nll"]


@dataclass(frozen=True)
class PromptNLL:
    """The objective: the prompt's log-perplexity (a language model feeds it the prompt's positions)."""

    positions: Literal["generated", "prompt"] = "prompt"
    modalities = ("text",)

    def per_sample(self, batch: Batch) -> Tensor:
        return prompt_nll(batch)


@dataclass(frozen=True)
class PerplexityAbove:
    """Keep the prompts whose log-perplexity exceeds ln P0."""

    log_p0: float = TLM_LOG_PERPLEXITY

    def __call__(self, batch: Batch) -> Tensor:
        return prompt_nll(batch).detach() > self.log_p0


@dataclass(frozen=True)
class PerplexityWeight:
    """TLM's weight λ·exp(nll − ln P0): the more surprising a prompt, the more it counts."""

    log_p0: float = TLM_LOG_PERPLEXITY
    lam: float = TLM_LAMBDA

    def __call__(self, batch: Batch) -> Tensor:
        return self.lam * torch.exp(prompt_nll(batch).detach() - self.log_p0)
