"""Stacked streams: B streams adapted in one forward give what B adapters, one per stream, give."""

from __future__ import annotations

import copy

import pytest
import torch

import zerosiam
from zerosiam.parts.predictor import identity_drift
from zerosiam.parts.recovery import ema_below
from zerosiam.parts.streams import StreamNorms

STREAMS = 3


def _streams_of_batches(steps: int = 6, per_stream: int = 2) -> torch.Tensor:
    """``[steps, STREAMS, per_stream, 3, 8, 8]`` images: each stream its own data."""
    return torch.rand(steps, STREAMS, per_stream, 3, 8, 8, generator=torch.Generator().manual_seed(3))


EATA_CLEAN = {"clean_data": [torch.rand(4, 3, 8, 8, generator=torch.Generator().manual_seed(5))]}
METHODS = [
    ("noadapt", {}),
    ("tent", {}),
    ("zerosiam", {}),
    ("zerosiam", {"predictor": "random_learned"}),
    ("sar", {}),
    ("sar", {"recover": ema_below(0.6)}),  # a floor this high resets some streams, at their own times
    ("eta", {}),
    ("eata", EATA_CLEAN),
    ("deyo", {}),
    ("come", {}),
    ("deyo+zerosiam", {}),
    ("eata+zerosiam", EATA_CLEAN),
]


@pytest.mark.parametrize("method, options", METHODS, ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("per_stream", [1, 2])
def test_stacked_streams_adapt_as_separate_adapters(confident_gn, method, options, per_stream):
    data = _streams_of_batches(steps=8, per_stream=per_stream)
    rates = {"lr": 0.1, "predictor_lr": 0.1}
    alone = [zerosiam.adapt(copy.deepcopy(confident_gn), method, **rates, **options) for _ in range(STREAMS)]
    stacked = zerosiam.adapt(confident_gn, method, **rates, streams=STREAMS, **options)
    for batch in data:
        expected = torch.cat([adapter(batch[s]) for s, adapter in enumerate(alone)])
        torch.testing.assert_close(stacked(batch.flatten(0, 1)), expected, rtol=1e-4, atol=1e-5)
    for s, adapter in enumerate(alone):
        mine, theirs = stacked.stream_history(s), adapter.history
        assert [row.keys() for row in mine] == [row.keys() for row in theirs]
        for key, value in theirs[0].items():
            expected = [row[key] for row in theirs]
            if isinstance(value, float):
                expected = pytest.approx(expected, rel=1e-4, abs=1e-5, nan_ok=True)
            assert [row[key] for row in mine] == expected, key
    for name, moved in getattr(stacked, "params", {}).items():  # each stream's weights are its own
        for s, adapter in enumerate(alone):
            torch.testing.assert_close(moved[s], adapter.params[name], rtol=1e-4, atol=1e-5)
    if method != "noadapt":
        assert any(any(row["updated"]) for row in stacked.history)


@pytest.mark.parametrize("method, key", [("sar", "updated"), ("deyo", "updated"), ("sar", "recovered")])
def test_streams_of_the_exactness_test_part_ways(confident_gn, method, key):
    """The exactness test above means something for the filtering methods only if their streams differ:
    in some step one stream updates (or recovers) and another does not; SAR also holds back a stream
    whose first pass kept a sample and whose second pass kept none."""
    options = {"recover": ema_below(0.6)} if key == "recovered" else {}
    stacked = zerosiam.adapt(confident_gn, method, lr=0.1, streams=STREAMS, **options)
    for batch in _streams_of_batches(steps=8, per_stream=1):
        stacked(batch.flatten(0, 1))
    flags = [row[key] for row in stacked.history]
    assert any(any(row) and not all(row) for row in flags)
    if method == "sar" and key == "updated":
        reasons = [reason for row in stacked.history for reason in row["skipped"]]
        assert "no sample selected at the perturbed weights" in reasons


def test_a_collapsed_stream_is_reset_alone(tiny_gn, images):
    adapter = zerosiam.adapt(tiny_gn, "zerosiam", lr=0.5, predictor_lr=0.5, streams=3)
    adapter(images)
    adapter(images)
    moved = {name: p.detach().clone() for name, p in adapter.params.items()}
    drift = [float(v) for v in identity_drift(adapter.predictor)]
    adapter.restore_source(torch.tensor([False, True, False]))
    for name, param in adapter.params.items():
        torch.testing.assert_close(param[1], adapter._source[name][1])
        torch.testing.assert_close(param[[0, 2]], moved[name][[0, 2]])
    assert [float(v) for v in identity_drift(adapter.predictor)] == [drift[0], 0.0, drift[2]]
    momentum = adapter.optimizer.state[adapter.params["gn.weight"]]["momentum_buffer"]
    assert torch.all(momentum[1] == 0) and torch.any(momentum[0] != 0)


def test_release_gives_back_the_source_model_untouched(tiny_gn, images):
    before = copy.deepcopy(tiny_gn.state_dict())
    reference = tiny_gn(images)
    adapter = zerosiam.adapt(tiny_gn, "zerosiam", lr=0.5, streams=2)
    adapter(images)
    with pytest.raises(ValueError, match="no one adapted state"):
        adapter.release(keep_adapted=True)
    model = adapter.release()
    assert set(model.state_dict()) == set(before)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert torch.equal(model(images), reference)
    assert not model._forward_hooks and not model.gn._forward_hooks


def test_what_cannot_stack_is_refused_in_one_line(tiny_gn, tiny_bn, images):
    with pytest.raises(ValueError, match="BatchNorm layer"):
        zerosiam.adapt(tiny_bn, "tent", streams=2)
    with pytest.raises(ValueError, match="does not stack over streams; use a linear one"):
        zerosiam.adapt(copy.deepcopy(tiny_gn), "zerosiam", predictor="mlp", streams=2)(images)
    for streams in (0, 1.5, True):
        with pytest.raises((ValueError, TypeError), match="streams must be a positive integer"):
            zerosiam.adapt(copy.deepcopy(tiny_gn), "tent", streams=streams)
    adapter = zerosiam.adapt(tiny_gn, "tent", streams=4)
    with pytest.raises(ValueError, match="a batch of 6 samples does not split into 4 streams"):
        adapter(images)
    with pytest.raises(ValueError, match="stream 4 out of range"):
        adapter.stream_history(4)


def test_stream_norms_scale_each_stream_by_its_own_copy(tiny_gn, images):
    """Layer by layer: stream s's rows come out as the layer with stream s's parameters makes them."""
    x = torch.randn(4, 8, 5, 5)
    norms = StreamNorms(tiny_gn, [("gn", tiny_gn.gn), ("norm", tiny_gn.norm)], streams=2)
    with torch.no_grad():
        norms.params["gn.weight"][1].mul_(2.0)
        norms.params["norm.bias"][0].add_(1.0)
    stacked_gn, stacked_ln = tiny_gn.gn(x), tiny_gn.norm(x.mean((2, 3)))
    norms.restore()
    gn, ln = tiny_gn.gn, tiny_gn.norm
    expected_gn = torch.cat(
        [gn(x[:2]), (gn(x[2:]) - gn.bias.view(1, -1, 1, 1)) * 2 + gn.bias.view(1, -1, 1, 1)]
    )
    torch.testing.assert_close(stacked_gn, expected_gn)
    expected_ln = torch.cat([ln(x[:2].mean((2, 3))) + 1.0, ln(x[2:].mean((2, 3)))])
    torch.testing.assert_close(stacked_ln, expected_ln)


@pytest.mark.parametrize("name", ["resnet26_gn", "convnext_nano_ln", "vit_tiny_ln"])
def test_the_zoos_norm_layouts_stack(name):
    """GroupNorm, timm's channel-first LayerNorm2d and token LayerNorm on the trained zoo models: three
    stacked ZeroSiam streams give the logits of three lone ones, step after step."""
    torch.manual_seed(0)
    model = zerosiam.load_model(name)
    data = torch.rand(3, STREAMS, 1, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    alone = [
        zerosiam.adapt(copy.deepcopy(model), "zerosiam", batch_size=1, lr_scale=10) for _ in range(STREAMS)
    ]
    stacked = zerosiam.adapt(model, "zerosiam", batch_size=1, lr_scale=10, streams=STREAMS)
    for batch in data:
        expected = torch.cat([adapter(batch[s]) for s, adapter in enumerate(alone)])
        torch.testing.assert_close(stacked(batch.flatten(0, 1)), expected, rtol=1e-4, atol=1e-4)
