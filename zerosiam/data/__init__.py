"""Data: the dataset readers (``zerosiam.data.sources``), below the corruptions and the protocols."""
