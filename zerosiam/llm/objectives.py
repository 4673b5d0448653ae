"""One small objective per method, on the logits of one adapted question.

Every entropy-based method on language models optimises the predictive distributions of the first k
generated tokens (k = 8 in the paper); each of those k positions is a "sample" for the per-sample
losses of ``zerosiam.parts`` and for the SAR/EATA entropy filters (E0 = 0.4 nats on language, not a
fraction of ln C). TLM instead minimises the perplexity of the prompt. An objective returns an
``Evaluation``: the loss (None when its filter kept nothing, so no update happens) and its mask.

The update rule is not the objective's business: SAR is the filtered entropy here plus the SAM
two-pass step of the loop (``LMMethod.sam_rho``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from zerosiam.parts.come import come_entropy
from zerosiam.parts.losses import entropy, symmetric_kl

E0_LANGUAGE = 0.4  # paper appendix: SAR/EATA on language use E0 = 0.4 (nats)
TLM_LOG_PERPLEXITY = 3.0  # TLM: perplexity threshold P0 = e^3
TLM_LAMBDA = 0.1


@dataclass
class View:
    """What an objective may look at for one question.

    ``target``/``online``: logits [k, V] at the first k generated positions (online is None without a
    predictor). ``prompt_logits``/``prompt_ids``: the full prompt's logits [L, V] and ids [L] (TLM).
    ``restrict``: a mask from the first SAM pass that the second pass must stay within.
    """

    target: Tensor | None = None
    online: Tensor | None = None
    prompt_logits: Tensor | None = None
    prompt_ids: Tensor | None = None
    restrict: Tensor | None = None


@dataclass
class Evaluation:
    """A loss (None: nothing selected, skip the update) and the per-position selection it used."""

    loss: Tensor | None
    mask: Tensor | None = None
    stats: dict[str, float] = field(default_factory=dict)


Objective = Callable[[View], Evaluation]


def _need(value: Tensor | None, what: str) -> Tensor:
    if value is None:
        raise ValueError(f"this objective needs {what}, which the view does not have")
    return value


def tent_loss(view: View) -> Evaluation:
    """Tent: mean entropy of the first k generated tokens' predictions."""
    return Evaluation(entropy(_need(view.target, "target logits")).mean())


def zerosiam_loss(view: View, alpha: float = 1.0) -> Evaluation:
    """ZeroSiam: H(p_o) + α·sKL(p_o ‖ sg[p_r]), averaged over the k positions."""
    online = _need(view.online, "online logits (a predictor)")
    target = _need(view.target, "target logits").detach()
    divergence = symmetric_kl(online, target)
    loss = entropy(online).mean() + alpha * divergence.mean()
    return Evaluation(loss, stats={"divergence": divergence.mean().item()})


def _reliable(view: View, e0: float) -> tuple[Tensor, Tensor]:
    """Per-position entropy and the mask H < E0, intersected with the first SAM pass's selection."""
    h = entropy(_need(view.target, "target logits"))
    mask = h.detach() < e0
    if view.restrict is not None:
        mask = mask & view.restrict
    return h, mask


def sar_loss(view: View, e0: float = E0_LANGUAGE) -> Evaluation:
    """SAR's reliable entropy: mean entropy over the positions with H < E0 (None when there are none)."""
    h, mask = _reliable(view, e0)
    loss = h[mask].mean() if mask.any() else None
    return Evaluation(loss, mask, {"selected": float(mask.sum())})


def eata_loss(view: View, e0: float = E0_LANGUAGE) -> Evaluation:
    """EATA without its Fisher term (as the paper runs it on language): H < E0, weighted by exp(E0 − H)."""
    h, mask = _reliable(view, e0)
    weight = torch.exp(e0 - h.detach())
    loss = (weight * h)[mask].mean() if mask.any() else None
    return Evaluation(loss, mask, {"selected": float(mask.sum())})


def come_loss(view: View) -> Evaluation:
    """COME on Tent: the opinion entropy with uncertainty mass K = vocabulary size (``parts.come``)."""
    target = _need(view.target, "target logits")
    return Evaluation(come_entropy(target, uncertainty_mass=target.shape[-1]).mean())


def prompt_nll(prompt_logits: Tensor, prompt_ids: Tensor) -> Tensor:
    """Mean next-token negative log-likelihood of the prompt (its log-perplexity)."""
    if prompt_ids.numel() < 2:
        raise ValueError("the prompt needs at least two tokens to have a perplexity")
    return F.cross_entropy(prompt_logits[:-1], prompt_ids[1:])


def tlm_loss(view: View, log_p0: float = TLM_LOG_PERPLEXITY, lam: float = TLM_LAMBDA) -> Evaluation:
    """TLM: input-perplexity minimisation, only for prompts with nll > ln P0, weighted λ·exp(nll − ln P0).

    The weight is detached (a per-sample coefficient, as EATA's), so the gradient is that of the NLL
    scaled by how surprising the prompt is.
    """
    nll = prompt_nll(_need(view.prompt_logits, "prompt logits"), _need(view.prompt_ids, "prompt ids"))
    stats = {"prompt_nll": nll.item()}
    if nll.item() <= log_p0:
        return Evaluation(None, torch.zeros(1, dtype=torch.bool), stats)
    weight = lam * torch.exp(nll.detach() - log_p0)
    return Evaluation(weight * nll, torch.ones(1, dtype=torch.bool), stats)


@dataclass(frozen=True)
class LMMethod:
    """A method = its objective + what it needs: the predictor, prompt logits, and the SAM step."""

    name: str
    objective: Objective | None
    uses_predictor: bool = False
    uses_prompt: bool = False
    sam_rho: float | None = None


METHODS: dict[str, LMMethod] = {
    "noadapt": LMMethod("noadapt", None),
    "tent": LMMethod("tent", tent_loss),
    "zerosiam": LMMethod("zerosiam", zerosiam_loss, uses_predictor=True),
    "sar": LMMethod("sar", sar_loss, sam_rho=0.05),
    "eata": LMMethod("eata", eata_loss),
    "come": LMMethod("come", come_loss),
    "tlm": LMMethod("tlm", tlm_loss, uses_prompt=True),
}


def get_method(name: str) -> LMMethod:
    try:
        return METHODS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown language-model method {name!r}; choose from {sorted(METHODS)}") from None
