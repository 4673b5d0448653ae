"""SAR (Niu et al., ICLR 2023): sharpness-aware and reliable entropy minimization.

Three changes to Tent keep it from collapsing in the wild (mixed shifts, batch size 1, label shift):
  1. reliable samples only: drop samples with entropy ≥ E0 = 0.4·ln C, whose gradients are noisy;
  2. a flat minimum: a SAM step (ρ = 0.05), the second pass again restricted to reliable samples;
  3. model recovery: an exponential moving average of the second pass's loss; when it falls below 0.2
     the model has collapsed to confident nonsense and is reset to the source weights.
It moves the normalization parameters except those of the last stage and the final norm, which carry
the most class-specific information and are the first to degrade.

On language models (the paper's §4.2) the samples are the first generated tokens and E0 = 0.4 nats; the
recovery is off there, as in the paper's runs, and ``ema_below`` turns it on.
"""

from __future__ import annotations

from zerosiam.methods.tent import tent
from zerosiam.parts.norms import WithoutLastStage
from zerosiam.parts.recovery import ema_below
from zerosiam.parts.sam import SAM
from zerosiam.parts.selection import entropy_below

sar = tent.with_(
    name="sar",
    select=[entropy_below(0.4)],  # methods.md: SAR E0 = 0.4·ln C
    step=SAM(rho=0.05),  # methods.md: SAR code, ρ = 0.05
    recover=ema_below(0.2),  # methods.md: SAR, ema < 0.2 → reset
    params=WithoutLastStage(),
    lr_family="tent",  # methods.md: learning rates as Tent's
    double_lr_at_bs1=True,  # methods.md: SAR's code doubles them at batch size 1
)

sar_text = tent.with_(
    name="sar",
    select=[entropy_below(nats=0.4)],  # paper appendix: E0 = 0.4 on language
    step=SAM(rho=0.05),  # methods.md: SAR code, ρ = 0.05
)
