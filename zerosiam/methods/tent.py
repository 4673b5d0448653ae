"""Tent (Wang et al., ICLR 2021): minimize the entropy of the model's own predictions, moving only the
normalization layers' affine parameters, with BatchNorm normalizing by the test batch's statistics."""

from zerosiam.methods.recipe import Recipe

tent = Recipe(name="tent", objective="entropy", lr_family="tent")
