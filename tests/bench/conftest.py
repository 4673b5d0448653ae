"""Fixtures of the benchmark tests: small fake corrupted domains and a LayerNorm model sized for them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zerosiam.bench import datasets as bench_datasets
from zerosiam.bench import execution as execution_module
from zerosiam.bench import runner


def fake_load(dataset: str, corruption: str, severity: int, cache=None, progress=False):
    """50 random 4×4 images of 5 classes, different for every (corruption, severity)."""
    seed = sum(map(ord, corruption)) + severity
    images = np.random.default_rng(seed).integers(0, 256, (50, 4, 4, 3), dtype=np.uint8)
    return images, np.repeat(np.arange(5), 10)


@pytest.fixture
def fake_domains(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Replace data loading by small labelled arrays: 50 images of 5 classes per corruption, with a cache
    of their own (what runs keep there, the blind spot's mistakes, is of these fake images)."""
    monkeypatch.setenv("ZEROSIAM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(runner, "load_corrupted", fake_load)
    monkeypatch.setattr(execution_module, "load_corrupted", fake_load)
    monkeypatch.setattr(bench_datasets, "load_corrupted", fake_load)


class TinyLN(torch.nn.Module):
    """A LayerNorm classifier for the fake 4×4 images."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.norm = torch.nn.LayerNorm(48)
        self.fc = torch.nn.Linear(48, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(x.flatten(1)))


@pytest.fixture
def tiny_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner.zerosiam, "load_model", lambda name: TinyLN())
