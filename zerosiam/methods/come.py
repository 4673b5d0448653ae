"""COME (Zhang et al., ICLR 2025): conservatively minimizing entropy.

COME keeps a TTA method as it is and replaces its softmax entropy with the entropy of a subjective
opinion that carries an explicit uncertainty mass (``zerosiam.parts.come``): the objective cannot be
lowered by inflating the logits, so the model stays conservative on samples it is unsure of. As in the
paper's image experiments, COME here is DeYO with that entropy; as in COME's code, the entropy filter
and the weight measure the same opinion entropy that is minimized. On language models COME is Tent with
that entropy, its uncertainty mass the vocabulary size.
"""

from zerosiam.methods.deyo import deyo
from zerosiam.methods.tent import tent
from zerosiam.parts.come import come_entropy
from zerosiam.parts.selection import deyo_weight, entropy_below, plpd_above

come = deyo.with_(
    name="come",
    objective=come_entropy,
    select=[entropy_below(0.5, measure=come_entropy), plpd_above(0.2)],  # methods.md: DeYO's filters
    weight=deyo_weight(0.4, measure=come_entropy),  # methods.md: DeYO's weight
)

come_text = tent.with_(name="come", objective=come_entropy)
