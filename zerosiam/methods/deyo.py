"""DeYO (Lee et al., ICLR 2024): destroy your object.

Entropy says how confident a prediction is, not whether it rests on the object's shape; a model can be
confidently right for the wrong (texture, background) reasons, and learning from those samples spreads
the error. DeYO destroys the shape by shuffling the image's 4×4 patches and measures how much the
predicted class's probability drops (PLPD). It learns only from samples that are confident
(H < 0.5·ln C) and shape-dependent (PLPD > 0.2), weighted by exp(−(H − 0.4·ln C)) + exp(PLPD), and
moves SAR's parameters (the norms outside the last stage) at Tent's learning rates.
"""

from zerosiam.methods.tent import tent
from zerosiam.parts.norms import WithoutLastStage
from zerosiam.parts.selection import deyo_weight, entropy_below, plpd_above

deyo = tent.with_(
    name="deyo",
    select=[entropy_below(0.5), plpd_above(0.2)],  # methods.md: DeYO filter 0.5·ln C, τ = 0.2
    weight=deyo_weight(0.4),  # methods.md: DeYO weight margin 0.4·ln C
    params=WithoutLastStage(),  # methods.md: parameters as SAR's
    lr_family="tent",  # methods.md: learning rates as SAR's, i.e. Tent's
    double_lr_at_bs1=True,  # methods.md: "as SAR's", whose code doubles them at batch size 1
)
