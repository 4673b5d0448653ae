"""Streams over images, per protocol, built from a fake loader: no benchmark, zoo or corruption needed."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from zerosiam.protocols import build, streams
from zerosiam.protocols.build import build_stream

DOMAINS = ["fog", "snow", "frost"]


@dataclasses.dataclass(frozen=True)
class Spec:
    """The fields a stream depends on (``RunSpec`` has them too); the protocols only read them."""

    protocol: str = "mild"
    corruption: str = "fog"
    seed: int = 0
    batch_size: int = 64
    limit: int | None = None
    imbalance_ratio: float = math.inf
    stream_length: int | None = None
    noise: int = 1000
    epochs: int = 1
    target: float = 50.0


def load(name: str) -> tuple[np.ndarray, np.ndarray]:
    """50 random 4×4 images of 5 classes, different for every domain name."""
    images = np.random.default_rng(sum(map(ord, name))).integers(0, 256, (50, 4, 4, 3), dtype=np.uint8)
    return images, np.repeat(np.arange(5), 10)


def test_mild_stream_visits_every_image_once() -> None:
    stream = build_stream(Spec(seed=3), load)
    assert sorted(stream.rows[:, 1]) == list(range(50)) and stream.evaluated.all()
    assert not np.array_equal(stream.rows[:, 1], build_stream(Spec(seed=4), load).rows[:, 1])


def test_the_main_jobs_streams_are_the_legacy_draws() -> None:
    """``mild`` and ``label_shift`` on a ``limit`` subset: ``default_rng(seed)`` for the subset and the
    order, ``default_rng([seed, 1])`` for the label-shift draws, exactly as the published runs drew them."""
    seed, limit = 5, 30
    images, labels = load("fog")
    keep = np.sort(np.random.default_rng(seed).permutation(50)[:limit])
    mild = build_stream(Spec(seed=seed, limit=limit), load)
    np.testing.assert_array_equal(mild.domains[0][0], images[keep])
    np.testing.assert_array_equal(mild.rows[:, 1], np.random.default_rng(seed).permutation(limit))
    shifted = build_stream(Spec(protocol="label_shift", seed=seed, limit=limit), load)
    np.testing.assert_array_equal(
        shifted.rows[:, 1], streams.label_shift(labels[keep], math.inf, seed, limit)
    )


def test_label_shift_stream_is_class_ordered() -> None:
    stream = build_stream(Spec(protocol="label_shift"), load)
    labels = stream.domains[0][1][stream.rows[:, 1]]
    assert len(labels) == 50 and (np.diff(labels) != 0).sum() == 4  # five contiguous class runs


def test_mixed_stream_covers_every_domain_once() -> None:
    stream = build_stream(Spec(protocol="mixed", corruption="mixed"), load, mixed_domains=DOMAINS)
    assert stream.names == DOMAINS
    assert np.bincount(stream.rows[:, 0]).tolist() == [50] * 3
    with pytest.raises(ValueError, match="mixed_domains"):
        build_stream(Spec(protocol="mixed", corruption="mixed"), load)


def test_noise_prefix_and_epochs_evaluate_only_their_part() -> None:
    stream = build_stream(Spec(protocol="noise_prefix", noise=20), load)
    assert stream.evaluated.sum() == 50 and not stream.evaluated[:20].any()
    noise = stream.domains[0][0].astype(float)
    assert abs(noise.mean() - 127.5) < 3 and 55 < noise.std() < 64  # Gaussian, a little clipped
    stream = build_stream(Spec(protocol="epochs", epochs=3), load)
    assert len(stream.rows) == 150 and stream.evaluated.sum() == 50 and stream.evaluated[-50:].all()


def test_an_epochs_pass_is_not_another_seeds_pass() -> None:
    """Seeding pass ``e`` with ``seed + e`` made run seed 1's first pass run seed 0's second."""
    zero = build_stream(Spec(protocol="epochs", epochs=2, seed=0), load).rows[:, 1]
    one = build_stream(Spec(protocol="epochs", epochs=2, seed=1), load).rows[:, 1]
    assert not np.array_equal(one[:50], zero[50:])
    assert not np.array_equal(zero[:50], zero[50:])  # each pass is reshuffled
    assert not np.array_equal(zero[:50], build_stream(Spec(seed=0), load).rows[:, 1])


def test_pure_noise_is_seeded_apart_from_the_stream_order() -> None:
    noise = build.pure_noise(2, (4, 4, 3), seed=0)
    assert noise.dtype == np.uint8 and np.array_equal(noise, build.pure_noise(2, (4, 4, 3), seed=0))
    assert not np.array_equal(noise, build.pure_noise(2, (4, 4, 3), seed=1))


def test_bs1_protocols_stream_single_images() -> None:
    assert build_stream(Spec(protocol="bs1"), load).batch_size == 1
    assert build_stream(Spec(protocol="label_shift_bs1"), load).batch_size == 1


class Oracle(torch.nn.Module):
    """Right on the first 20 of the fake domain's 50 images, wrong on the rest (whatever their order)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        images, labels = load("fog")
        wanted = {img.tobytes(): int(lab) for img, lab in zip(images, labels, strict=True)}
        index = {img.tobytes(): i for i, img in enumerate(images)}
        logits = torch.zeros(len(x), 5)
        for row, image in enumerate(x.permute(0, 2, 3, 1).mul(255).round().to(torch.uint8).numpy()):
            key = image.tobytes()
            logits[row, wanted[key] if index[key] < 20 else (wanted[key] + 1) % 5] = 1.0
        return logits


def test_blind_spot_adapts_on_the_source_models_mistakes_only() -> None:
    stream = build_stream(Spec(protocol="blind_spot"), load, predict=Oracle())
    assert stream.batch_size == 1 and len(stream.rows) == 30 and not stream.evaluated.any()
    assert sorted(stream.rows[:, 1]) == list(range(20, 50))  # the 30 mistakes, each once
    assert sorted(stream.frozen_rows[:, 1]) == list(range(50))
    with pytest.raises(ValueError, match="source model"):
        build_stream(Spec(protocol="blind_spot"), load)


def test_the_blind_spot_takes_mistakes_found_before_and_checks_them() -> None:
    domain = load("fog")
    wrong = build.source_mistakes(Spec(protocol="blind_spot"), domain, Oracle())
    assert np.flatnonzero(wrong).tolist() == list(range(20, 50))  # in the domain's own order
    found = build_stream(Spec(protocol="blind_spot"), load, predict=Oracle())
    given = build_stream(Spec(protocol="blind_spot"), load, mistakes=lambda d: wrong.copy())
    np.testing.assert_array_equal(found.rows, given.rows)
    np.testing.assert_array_equal(found.frozen_rows, given.frozen_rows)
    with pytest.raises(ValueError, match="one bool per image"):
        build_stream(Spec(protocol="blind_spot"), load, mistakes=lambda d: wrong[:10])


def test_frozen_hits_and_gather_batch_follow_the_rows() -> None:
    stream = build_stream(Spec(protocol="mixed", corruption="mixed"), load, mixed_domains=DOMAINS)
    rows = stream.rows[:7]
    pixels, y = build.gather_batch(stream, rows)
    assert pixels.shape == (7, 4, 4, 3) and pixels.dtype == torch.uint8  # what travels to the device
    assert torch.equal(pixels[3], torch.from_numpy(stream.domains[rows[3][0]][0][rows[3][1]]))
    x, labels = build.to_device(pixels, y, torch.device("cpu"))
    assert x.shape == (7, 3, 4, 4) and x.dtype == torch.float32 and x.min() >= 0 and x.max() <= 1
    assert torch.equal(x, pixels.permute(0, 3, 1, 2).float() / 255) and torch.equal(labels, y)
    assert y.tolist() == [stream.domains[d][1][i] for d, i in rows]
    perfect = build.frozen_hits(
        lambda batch: torch.nn.functional.one_hot(torch.as_tensor(y), 5), stream, rows
    )
    assert perfect.tolist() == [True] * 7


def test_stacked_frozen_hits_score_each_streams_rows_as_it_alone() -> None:
    """Two streams scored in one pass of a stacked predictor: each gets what ``frozen_hits`` gives it."""
    one = build_stream(Spec(protocol="mixed", corruption="mixed"), load, mixed_domains=DOMAINS)
    two = build_stream(Spec(protocol="mixed", corruption="mixed", seed=1), load, mixed_domains=DOMAINS)
    rows = [one.rows[:130], two.rows[:130]]  # more than one frozen batch of 64 each

    def predict(x: torch.Tensor) -> torch.Tensor:  # a fixed rule of the pixels: "class" = mean's bucket
        return torch.nn.functional.one_hot((x.mean((1, 2, 3)) * 5).long().clamp(0, 4), 5).float()

    stacked = build.stacked_frozen_hits(predict, [one, two], rows)
    assert all(0 < hits.sum() < 130 for hits in stacked)  # hits and misses: a mix-up would show
    for stream, own, hits in zip([one, two], rows, stacked, strict=True):
        assert hits.tolist() == build.frozen_hits(predict, stream, own).tolist()
    with pytest.raises(ValueError, match=r"as many rows each, got \[7, 130\]"):
        build.stacked_frozen_hits(predict, [one, two], [one.rows[:7], two.rows[:130]])
