"""ZeroSiam (ICLR 2026): asymmetric entropy minimization in one forward pass.

The feature z = f(x) is computed once. The target branch is the model's own logits u_r = g(z); the online
branch passes z through a predictor h, initialised to the identity, u_o = g(h(z)). The loss is

    H(p_o) + α · D(p_o ‖ sg[p_r]),   D = symmetric KL, α = 1,

minimized over the norm parameters and h. The prediction returned is the target branch. Because a
constant one-hot output still pays the alignment term once h has left the identity, collapsed solutions
are not minima, and h absorbs the shortcuts that would otherwise inflate the logits.
"""

from zerosiam.methods.recipe import Asymmetry
from zerosiam.methods.tent import tent

zerosiam = tent.with_(
    name="zerosiam",
    asymmetry=Asymmetry(predictor="identity", divergence="skl", alpha=1.0, stop_gradient=True),
    lr_family="zerosiam",
    double_lr_at_bs1=True,
)


def with_zerosiam(recipe):
    """``<recipe>+zerosiam``: keep the recipe's selection and weighting, add the predictor and alignment
    (the paper's EATA+ZeroSiam and DeYO+ZeroSiam)."""
    return recipe.with_(name=f"{recipe.name}+zerosiam", asymmetry=zerosiam.asymmetry, lr_family="zerosiam")
