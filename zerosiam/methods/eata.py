"""EATA (Niu et al., ICML 2022): efficient anti-forgetting test-time adaptation.

Tent with three changes. It learns only from reliable samples (entropy below E0 = 0.4·ln C) that are not
redundant (a prediction nearly orthogonal to the moving average of recent predictions, |cos| < ε: 0.05
for ImageNet's 1,000 classes, 0.4 for fewer, see ``redundancy_epsilon``), so
fewer backward passes are spent and each carries new information. Each kept sample is weighted by
exp(E0 − H): the more confident, the more it counts. And a Fisher-weighted penalty, estimated on clean
in-distribution data the user supplies, holds the parameters that matter for clean data near their
source values so the model does not forget. ETA is EATA without that penalty (no clean data needed).

    adapter = zerosiam.adapt(model, "eata", clean_data=clean_loader)   # or zerosiam.adapt(model, "eta")

On language models the paper runs EATA without the Fisher term and the redundancy filter: the first
generated tokens with entropy below E0 = 0.4 nats, weighted by exp(E0 − H).
"""

from zerosiam.methods.tent import tent
from zerosiam.parts.fisher import fisher
from zerosiam.parts.selection import entropy_below, exp_margin, not_redundant

eta = tent.with_(
    name="eta",
    select=[entropy_below(0.4), not_redundant()],  # methods.md: EATA E0 = 0.4·ln C, ε by C
    weight=exp_margin(0.4),  # methods.md: EATA w = exp(E0 − H)
    lr_family="tent",  # methods.md: learning rates as Tent's
)

eata = eta.with_(name="eata", regularizer=fisher(weight=2000.0))  # methods.md: EATA β = 2000

eata_text = tent.with_(
    name="eata",
    select=[entropy_below(nats=0.4)],  # paper appendix: E0 = 0.4 on language
    weight=exp_margin(nats=0.4),
)
