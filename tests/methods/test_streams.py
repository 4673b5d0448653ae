"""Stacked streams: B streams adapted in one forward give what B adapters, one per stream, give."""

from __future__ import annotations

import copy

import pytest
import torch

import zerosiam
from zerosiam.parts.streams import StreamNorms

STREAMS = 3


def _streams_of_batches(steps: int = 6, per_stream: int = 2) -> torch.Tensor:
    """``[steps, STREAMS, per_stream, 3, 8, 8]`` images: each stream its own data."""
    return torch.rand(steps, STREAMS, per_stream, 3, 8, 8, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize(
    "method, options",
    [("tent", {}), ("zerosiam", {}), ("zerosiam", {"predictor": "random_learned"}), ("noadapt", {})],
)
@pytest.mark.parametrize("per_stream", [1, 2])
def test_stacked_streams_adapt_as_separate_adapters(tiny_gn, method, options, per_stream):
    data = _streams_of_batches(per_stream=per_stream)
    alone = [zerosiam.adapt(copy.deepcopy(tiny_gn), method, lr=0.5, predictor_lr=0.5, **options) for _ in range(STREAMS)]
    stacked = zerosiam.adapt(tiny_gn, method, lr=0.5, predictor_lr=0.5, streams=STREAMS, **options)
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
    if method != "noadapt":  # the streams did move, and apart from each other
        moved = stacked.params["gn.weight"]
        assert not torch.equal(moved[0], moved[1])
        torch.testing.assert_close(moved[1], alone[1].params["gn.weight"], rtol=1e-4, atol=1e-5)


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
    for method in ("sar", "eta", "deyo"):
        with pytest.raises(ValueError, match=f"method '{method}' does not stack over streams"):
            zerosiam.adapt(copy.deepcopy(tiny_gn), method, streams=2)
    with pytest.raises(ValueError, match="BatchNorm layer"):
        zerosiam.adapt(tiny_bn, "tent", streams=2)
    with pytest.raises(ValueError, match="does not stack over streams; use a linear one"):
        zerosiam.adapt(copy.deepcopy(tiny_gn), "zerosiam", predictor="mlp", streams=2)(images)
    for streams in (0, 1.5, True):
        with pytest.raises(ValueError, match="streams must be a positive integer"):
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
    expected_gn = torch.cat([gn(x[:2]), (gn(x[2:]) - gn.bias.view(1, -1, 1, 1)) * 2 + gn.bias.view(1, -1, 1, 1)])
    torch.testing.assert_close(stacked_gn, expected_gn)
    expected_ln = torch.cat([ln(x[:2].mean((2, 3))) + 1.0, ln(x[2:].mean((2, 3)))])
    torch.testing.assert_close(stacked_ln, expected_ln)
