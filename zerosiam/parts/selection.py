"""Which samples a step learns from, and how much each one counts.

The baselines differ from Tent mostly here. SAR, EATA and DeYO drop high-entropy samples (their
gradients are noisy and push towards collapse); EATA also drops samples whose prediction repeats what
recent batches predicted (redundant gradients); DeYO drops samples whose prediction survives shuffling
the image's patches (the model was not looking at the object's shape). EATA and DeYO weight the kept
samples by how confident, and DeYO by how shape-dependent, they are.

Rules return a boolean mask over the batch; weights return one detached factor per sample. Entropy
thresholds are given as a fraction of ln C, the entropy of the uniform prediction, as the image papers
do, or in nats (``nats=``), as the paper's language-model runs do (E0 = 0.4 nats over a vocabulary).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from zerosiam.parts.hostsync import kept_in_place, none_yet
from zerosiam.parts.losses import OBJECTIVES, PerSample, resolve

if TYPE_CHECKING:
    from zerosiam.parts.contract import Batch


@dataclass(frozen=True)
class Margin:
    """An entropy threshold E0: ``value · ln C`` nats, or ``value`` nats as given when ``in_nats``."""

    value: float
    in_nats: bool = False

    def nats(self, num_classes: int) -> float:
        return self.value if self.in_nats else self.value * math.log(num_classes)


def _margin(fraction: float | None, nats: float | None) -> Margin:
    if (fraction is None) == (nats is None):
        raise ValueError(
            f"give an entropy threshold as a fraction of ln C or in nats, once: {fraction}, {nats}"
        )
    return Margin(nats, in_nats=True) if nats is not None else Margin(fraction)


def uncertainty(batch: Batch, measure: str | PerSample = "entropy") -> Tensor:
    """The detached per-sample uncertainty that thresholds and weights compare: the softmax entropy by
    default, or another objective (COME's code filters and weights with its own entropy)."""
    if measure == "entropy":
        return batch.entropy
    key = f"uncertainty:{measure if isinstance(measure, str) else id(measure)}"
    if key not in batch.cache:
        batch.cache[key] = resolve(OBJECTIVES, measure, "measure")(batch.logits).detach()
    return batch.cache[key]


SECOND_VIEW = """A part marked ``second_view`` forwards a second, patch-shuffled view of the batch (DeYO's
PLPD): its patch orders are drawn on the host at each step (a captured step draws them before each
replay, ``GradientLearner.drawn``), and it runs the model outside the forward's autocast (its frozen
weights must stay float32)."""


# --- sample selection -----------------------------------------------------------------------------


@dataclass(frozen=True)
class EntropyBelow:
    """Keep the reliable samples, ``H_i < E0`` (SAR, EATA: 0.4·ln C; DeYO: 0.5·ln C; language: 0.4 nats)."""

    margin: Margin
    measure: str | PerSample = "entropy"

    def __call__(self, batch: Batch) -> Tensor:
        return uncertainty(batch, self.measure) < self.margin.nats(batch.logits.shape[-1])


def entropy_below(
    fraction: float | None = None, measure: str | PerSample = "entropy", *, nats: float | None = None
) -> EntropyBelow:
    return EntropyBelow(_margin(fraction, nats), measure)


def redundancy_epsilon(num_classes: int) -> float:
    """EATA's ε for ``num_classes`` classes: the authors' 0.05 for ImageNet's 1,000, 0.4 below that.

    ε = 0.05 only makes sense with many classes: with C classes a confident prediction has
    ``|cos(m, p)| ≈ m_k/‖m‖``, about ``1/√C`` for a balanced running mean, which is 0.03 for ImageNet
    but 0.3 for CIFAR-10, so with 0.05 no CIFAR-10 sample ever passes. The EATA paper publishes no
    CIFAR-10 value; a CIFAR-100-C script in the style of its authors' code sets ε = 0.4, so fewer than
    1,000 classes take 0.4 (a project choice, docs/methods.md).
    """
    return 0.05 if num_classes >= 1000 else 0.4


class NotRedundant:
    """EATA's redundancy filter: keep samples whose probabilities are nearly orthogonal to the moving
    average ``m`` of recent kept predictions, ``|cos(m, p_i)| < ε``; keep all before ``m`` exists.
    ``epsilon=None`` takes ε from the number of classes (``redundancy_epsilon``).

    ``m`` follows the samples finally kept (``observe`` is told the recipe's final mask), starting at
    their mean and then ``m ← momentum·m + (1 − momentum)·mean p``; a batch that keeps nothing leaves
    ``m`` unchanged.
    """

    def __init__(self, epsilon: float | None = None, momentum: float = 0.9) -> None:  # methods.md: EATA
        self.epsilon = epsilon
        self.momentum = momentum
        self.mean: Tensor | None = None

    def __call__(self, batch: Batch) -> Tensor:
        if self.mean is None:
            return torch.ones(batch.logits.shape[0], dtype=torch.bool, device=batch.logits.device)
        probabilities = batch.logits.detach().softmax(-1)
        epsilon = self.epsilon if self.epsilon is not None else redundancy_epsilon(probabilities.shape[-1])
        # each stream against its own mean (one row per stream when stacked); a stream with none yet
        # (a NaN row) keeps all
        cosine = F.cosine_similarity(batch.layout.rows(probabilities), self.mean.unsqueeze(-2), dim=-1)
        return (self.mean.isnan().any(-1, keepdim=True) | (cosine.abs() < epsilon)).flatten()

    state_in_place = True  # a captured step can replay it (``zerosiam.parts.hostsync.kept_in_place``)

    def observe(self, batch: Batch, mask: Tensor) -> None:
        probabilities = batch.logits.detach().softmax(-1)
        followed = batch.layout.follow_kept(self.mean, probabilities, mask, self.momentum)
        self.mean = kept_in_place(self.mean, followed)

    def reset(self) -> None:
        self.mean = none_yet(self.mean)

    def state_dict(self) -> dict[str, Any]:
        return {"mean": None if self.mean is None else self.mean.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state["mean"]
        self.mean = none_yet(self.mean) if saved is None else kept_in_place(self.mean, saved.clone())


def not_redundant(epsilon: float | None = None) -> NotRedundant:  # methods.md: EATA ε by class count
    return NotRedundant(epsilon)


def shuffle_patches(x: Tensor, grid: int = 4, permutation: Tensor | None = None) -> Tensor:
    """DeYO's object-destroying view: cut each image into ``grid × grid`` patches and reorder them.

    ``permutation`` (B × grid²) fixes the new order of each image's patches; by default every sample
    gets a fresh random one, drawn from the CPU's generator whatever the device: a GPU's generator draws
    other numbers from the same seed, and a run of one spec on a GPU would then see other patch orders
    than on a CPU, a difference far larger than rounding (the ConvNeXt's DeYO at 300×: 21.9 on a CPU,
    52.9 on an H200; ``docs/RESULTS.md``, "One spec, several numbers"). Images whose sides are not
    multiples of ``grid`` are resized down to the nearest multiple and back, as DeYO's code does.
    """
    if x.ndim != 4:
        raise ValueError(f"patch shuffling needs images (B, C, H, W), got shape {tuple(x.shape)}")
    size = x.shape[-2:]
    fitted = (size[0] // grid * grid, size[1] // grid * grid)
    if fitted != tuple(size):
        x = F.interpolate(x, size=fitted, mode="bilinear", align_corners=False)
    b, c, h, w = x.shape
    ph, pw = h // grid, w // grid
    patches = x.reshape(b, c, grid, ph, grid, pw).permute(0, 2, 4, 1, 3, 5).reshape(b, grid * grid, c, ph, pw)
    if permutation is None:
        permutation = patch_orders(b, grid)
    patches = patches[torch.arange(b, device=x.device).unsqueeze(-1), permutation.to(x.device)]
    shuffled = patches.reshape(b, grid, grid, c, ph, pw).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)
    if fitted != tuple(size):
        shuffled = F.interpolate(shuffled, size=size, mode="bilinear", align_corners=False)
    return shuffled


def patch_orders(rows: int, grid: int) -> Tensor:
    """A fresh order of the ``grid²`` patches for each of ``rows`` images, drawn from the CPU's generator."""
    return torch.rand(rows, grid * grid).argsort(-1)


def plpd(batch: Batch, grid: int = 4, permutation: Tensor | None = None) -> Tensor:
    """DeYO's pseudo-label probability difference ``p_ŷ(x) − p_ŷ(x')``, ``ŷ = argmax p(x)``.

    ``x'`` is the patch-shuffled view, forwarded without gradient and, as in DeYO's code, only for the
    samples the earlier rules kept (``batch.kept``); the others get NaN, which no threshold passes.
    Both probabilities come from the model's own output (the target branch under ZeroSiam), so the
    two views are compared like with like. Computed once per forward and shared through ``batch.cache``.
    """
    batch.require("image", "DeYO's PLPD (a patch-shuffled second view)")
    if "plpd" in batch.cache:
        return batch.cache["plpd"]
    kept = batch.kept if batch.kept is not None else torch.ones_like(batch.entropy, dtype=torch.bool)
    if not batch.layout.reads_device:  # the fixed-shape path: every row through the second view
        if permutation is None:  # drawn by the learner: a captured step draws them before each replay
            rows = batch.x.shape[0]
            permutation = batch.learner.drawn("patch_orders", lambda: patch_orders(rows, grid))
        drop = _probability_drop(batch, batch.x, batch.target, grid, permutation)
        difference = torch.where(kept, drop, math.nan)
    else:
        difference = torch.full_like(batch.entropy, float("nan"))
        if kept.any():
            seen = batch.layout.forwarded(kept)
            chosen = permutation[seen] if permutation is not None else None
            difference[seen] = _probability_drop(batch, batch.x[seen], batch.target[seen], grid, chosen)
            difference[~kept] = math.nan
    batch.cache["plpd"] = difference
    return difference


def _probability_drop(
    batch: Batch, x: Tensor, target: Tensor, grid: int, permutation: Tensor | None
) -> Tensor:
    """``p_ŷ(x) − p_ŷ(x')`` for the rows given: their prediction's probability, and the same class's once
    the patches of ``x`` are shuffled (forwarded without gradient)."""
    probabilities = target.detach().softmax(-1)
    label = probabilities.argmax(-1, keepdim=True)
    with torch.no_grad():
        shuffled = batch.learner.model(shuffle_patches(x, grid, permutation)).softmax(-1)
    return (probabilities.gather(-1, label) - shuffled.gather(-1, label)).squeeze(-1)


@dataclass(frozen=True)
class PLPDAbove:
    """Keep samples whose prediction collapses once the object's shape is destroyed: PLPD > τ."""

    threshold: float
    grid: int = 4  # methods.md: DeYO's 4×4 patch grid
    modalities = ("image",)
    second_view = True  # SECOND_VIEW

    def __call__(self, batch: Batch) -> Tensor:
        return plpd(batch, self.grid) > self.threshold


def plpd_above(threshold: float = 0.2) -> PLPDAbove:  # methods.md: DeYO τ = 0.2
    return PLPDAbove(threshold)


# --- sample weights -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExpMargin:
    """EATA's weight ``exp(E0 − H_i)``: the more confident a kept sample, the more it counts."""

    margin: Margin = Margin(0.4)  # methods.md: EATA E0 = 0.4·ln C
    measure: str | PerSample = "entropy"

    def __call__(self, batch: Batch) -> Tensor:
        return torch.exp(self.margin.nats(batch.logits.shape[-1]) - uncertainty(batch, self.measure))


def exp_margin(
    fraction: float | None = None, measure: str | PerSample = "entropy", *, nats: float | None = None
) -> ExpMargin:
    if fraction is None and nats is None:
        fraction = 0.4  # methods.md: EATA E0 = 0.4·ln C
    return ExpMargin(_margin(fraction, nats), measure)


@dataclass(frozen=True)
class DeYOWeight:
    """DeYO's weight ``exp(−(H_i − E0)) + exp(PLPD_i)``: confident and shape-dependent samples count more.

    A sample without a PLPD (dropped before the second view) gets only the entropy term; its weight is
    never used, but it must stay finite so that no NaN reaches the gradient through the product.
    """

    margin: Margin = Margin(0.4)  # methods.md: DeYO E0 = 0.4·ln C for the weight (0.5·ln C for the filter)
    measure: str | PerSample = "entropy"
    modalities = ("image",)
    second_view = True  # SECOND_VIEW, through the PLPD

    def __call__(self, batch: Batch) -> Tensor:
        confidence = torch.exp(self.margin.nats(batch.logits.shape[-1]) - uncertainty(batch, self.measure))
        return confidence + torch.exp(plpd(batch)).nan_to_num(0.0)


def deyo_weight(fraction: float = 0.4, measure: str | PerSample = "entropy") -> DeYOWeight:
    return DeYOWeight(Margin(fraction), measure)
