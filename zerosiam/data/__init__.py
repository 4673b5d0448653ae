"""Data: the asset registry, dataset readers, corruptions and the test streams."""
