"""Data: the dataset readers (``zerosiam.data.sources``) and their images made model input
(``zerosiam.data.tensors``), below the corruptions and the protocols."""
