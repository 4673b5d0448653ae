"""NoAdapt: the source model as it is, BatchNorm with its running statistics; the reference row."""

from zerosiam.methods.recipe import Recipe

noadapt = Recipe(name="noadapt", adapts=False)
