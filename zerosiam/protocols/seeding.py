"""Every random draw of the protocols, seeded from ``SeedSequence([seed, purpose, ...])``.

A run has one seed, but it makes several independent draws (the stream order, the noise images, the
blind-spot sample, ...). Deriving each from ``seed + something`` lets two runs replay each other's draws:
the epochs protocol used to seed pass ``e`` with ``seed + e``, so run seed 1 pass 0 was run seed 0 pass 1.
Here each draw names its *purpose*, and the purpose is a separate word of the entropy, never added to the
seed, so ``(seed, purpose, index)`` tuples that differ anywhere give unrelated generators.

Two constraints decide the values:

* **Legacy draws keep their entropy.** The draws of the README's main job (``mild`` and ``label_shift``
  on a ``limit`` subset) must stay bit-identical to the results already published, which were drawn with
  ``default_rng(seed)`` and ``default_rng([seed, 1])``. ``default_rng(seed)`` is
  ``default_rng(SeedSequence([seed]))``, so those draws use the *empty* purpose (``rng(seed)``: the mild
  order, the label-shift class schedule and the ``limit`` subsample, which therefore share one entropy as
  they always did) and purpose ``LABEL_SHIFT_DRAWS = 1`` (the label-shift per-step class and member draws).
* **No purpose is 0.** ``SeedSequence`` pads its entropy with zeros, so ``[seed, 0]`` is the same
  generator as ``[seed]``; a zero purpose would replay the legacy draws. An index *after* a purpose may
  be 0 (``rng(seed, EPOCH_ORDER, 0)``), because that prefix belongs to the purpose alone.

| purpose | entropy | draw |
| --- | --- | --- |
| (none) | ``[seed]`` | ``mild`` order, label-shift class schedule, the ``limit`` subsample (legacy) |
| ``LABEL_SHIFT_DRAWS`` | ``[seed, 1]`` | label shift: the class of each step and the member drawn (legacy) |
| ``EPOCH_ORDER`` | ``[seed, 2, e]`` | the order of pass ``e`` of the epochs protocol |
| ``NOISE_IMAGES`` | ``[seed, 3]`` | the pure-noise images of the noise-prefix protocol |
| ``BLIND_SPOT_DRAWS`` | ``[seed, 4]`` | the blind-spot stream's sample of the source model's mistakes |
| ``MIXED_ORDER`` | ``[seed, 5]`` | the shuffle of the mixed protocol's domains |
| ``CLEAN_SUBSET`` | ``[seed, 7]`` | the clean in-distribution images some methods get (EATA's Fisher) |
| ``CONTINUAL_ORDER`` | ``[seed, 8, d]`` | the order of domain ``d`` of the continual stream |
| ``GRADUAL_DRAWS`` | ``[seed, 9, c, s]`` | gradual: corruption ``c``'s images at severity ``s`` |
| ``CCC_DRAWS`` | ``[seed, 10]``, ``[seed, 10, 1]`` | CCC's chain of pairs; its images at each point |
| ``CCC_CALIBRATION`` | ``[0, 11]`` | the clean images every CCC walk is calibrated on |
"""

from __future__ import annotations

import numpy as np

LABEL_SHIFT_DRAWS = 1
EPOCH_ORDER = 2
NOISE_IMAGES = 3
BLIND_SPOT_DRAWS = 4
MIXED_ORDER = 5
# 6 was the Dirichlet stream's (removed); a new purpose takes the next free number, 12
CLEAN_SUBSET = 7
CONTINUAL_ORDER = 8
GRADUAL_DRAWS = 9
CCC_DRAWS = 10
CCC_CALIBRATION = 11
PURPOSES = {
    "LABEL_SHIFT_DRAWS": LABEL_SHIFT_DRAWS,
    "EPOCH_ORDER": EPOCH_ORDER,
    "NOISE_IMAGES": NOISE_IMAGES,
    "BLIND_SPOT_DRAWS": BLIND_SPOT_DRAWS,
    "MIXED_ORDER": MIXED_ORDER,
    "CLEAN_SUBSET": CLEAN_SUBSET,
    "CONTINUAL_ORDER": CONTINUAL_ORDER,
    "GRADUAL_DRAWS": GRADUAL_DRAWS,
    "CCC_DRAWS": CCC_DRAWS,
    "CCC_CALIBRATION": CCC_CALIBRATION,
}


def check_seed(seed: int) -> int:
    """``seed`` as a Python int, after checking that it is a non-negative integer (bools refused)."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def rng(seed: int, *purpose: int) -> np.random.Generator:
    """The generator of the draw ``purpose`` (a constant of this module, then any indices) of run ``seed``.

    ``rng(seed)`` is ``np.random.default_rng(seed)`` and ``rng(seed, LABEL_SHIFT_DRAWS)`` is
    ``np.random.default_rng([seed, 1])``: the legacy draws keep their streams (see the module docstring).
    """
    words = [check_seed(seed), *(int(p) for p in purpose)]
    if any(p < 0 for p in words[1:]):
        raise ValueError(f"purpose words must be non-negative integers, got {purpose!r}")
    return np.random.default_rng(np.random.SeedSequence(words))
