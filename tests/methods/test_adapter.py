"""The Adapter with Tent, ZeroSiam and its ablations: the behaviours the paper and users rely on."""

from __future__ import annotations

import copy

import pytest
import torch

import zerosiam
from tests.conftest import TinyBN, TinyGN
from zerosiam.methods import Adapter, Frozen, NonFiniteInputError, get_recipe, options_of
from zerosiam.methods.recipe import Asymmetry
from zerosiam.parts.learner import keyword_options


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _stream(n: int = 4, seed: int = 2) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.rand(6, 3, 8, 8, generator=generator) * 2 for _ in range(n)]


def test_available_methods_lists_the_core_ones():
    assert {"noadapt", "tent", "zerosiam"} <= set(zerosiam.available_methods())


def test_at_initialization_branches_agree_and_alignment_is_zero(tiny_gn: TinyGN, images):
    adapter = zerosiam.adapt(tiny_gn, "zerosiam", lr=1e-2, predictor_lr=1e-1)
    adapter(images)
    assert adapter.last["divergence"] == pytest.approx(0.0, abs=1e-7)
    assert adapter.last["predictor_drift"] > 0  # h moved after the first update
    adapter(images)
    assert adapter.last["divergence"] > 1e-9  # and the branches now differ


def test_first_prediction_equals_the_unadapted_model(tiny_gn: TinyGN, images):
    with torch.no_grad():
        expected = tiny_gn(images)
    for method in ("noadapt", "tent", "zerosiam"):
        adapter = zerosiam.adapt(tiny_gn, method, lr=1e-2, predictor_lr=1e-2)
        assert torch.allclose(adapter(images), expected, atol=1e-6), method
        adapter.release()


def test_one_step_moves_only_norm_affine_parameters_and_the_predictor(tiny_gn: TinyGN, images):
    before = _params(tiny_gn)
    adapter = zerosiam.adapt(tiny_gn, "zerosiam", lr=1e-1, predictor_lr=1e-1)
    adapter(images)
    changed = {name for name, p in tiny_gn.named_parameters() if not torch.equal(p, before[name])}
    assert changed == {"gn.weight", "gn.bias", "norm.weight", "norm.bias"}
    assert not torch.equal(adapter.predictor.weight, torch.eye(8))


def test_zerosiam_without_predictor_learning_follows_tents_trajectory(tiny_gn: TinyGN):
    twin = copy.deepcopy(tiny_gn)
    tent = zerosiam.adapt(tiny_gn, "tent", lr=5e-2)
    siam = zerosiam.adapt(twin, "zerosiam", lr=5e-2, predictor_lr=0.0)
    for x in _stream(5):
        assert torch.allclose(tent(x), siam(x), atol=1e-5)
    twin_params = dict(twin.named_parameters())
    for name, p in tiny_gn.named_parameters():
        assert torch.allclose(p, twin_params[name], atol=1e-6), name
    assert not torch.equal(tiny_gn.gn.weight, TinyGN().gn.weight)
    assert torch.equal(siam.predictor.weight, torch.eye(8))


def test_stop_gradient_blocks_the_target_branch_and_its_ablation_does_not():
    online = torch.randn(3, 5, requires_grad=True)
    for stop, expect_grad in ((True, False), (False, True)):
        target = torch.randn(3, 5, requires_grad=True)
        Asymmetry(stop_gradient=stop).align(online, target).sum().backward()
        assert (target.grad is not None and target.grad.abs().sum() > 0) == expect_grad


def test_no_stop_gradient_changes_the_trajectory(tiny_gn: TinyGN):
    twin = copy.deepcopy(tiny_gn)
    with_sg = zerosiam.adapt(tiny_gn, "zerosiam", lr=5e-2, predictor_lr=5e-1)
    without = zerosiam.adapt(twin, "zerosiam", lr=5e-2, predictor_lr=5e-1, stop_gradient=False)
    for x in _stream(4):
        with_sg(x), without(x)
    assert not torch.allclose(tiny_gn.gn.weight, twin.gn.weight)


def test_reset_restores_outputs_bit_for_bit(tiny_gn: TinyGN, images):
    adapter = zerosiam.adapt(tiny_gn, "zerosiam", lr=1e-1, predictor_lr=1e-1)
    first = adapter(images)
    for x in _stream(3):
        adapter(x)
    assert not torch.equal(adapter(images), first)
    adapter.reset()
    assert torch.equal(adapter(images), first)
    assert adapter.steps == 1 and len(adapter.history) == 1
    adapter.reset()
    replay = [adapter(x) for x in _stream(3)]
    adapter.reset()
    assert all(torch.equal(a, adapter(x)) for a, x in zip(replay, _stream(3), strict=True))


def test_checkpoint_resumes_the_same_trajectory(tiny_gn: TinyGN):
    twin = copy.deepcopy(tiny_gn)
    stream = _stream(6)
    straight = zerosiam.adapt(tiny_gn, "zerosiam", lr=5e-2, predictor_lr=5e-1)
    expected = [straight(x) for x in stream]
    first = zerosiam.adapt(twin, "zerosiam", lr=5e-2, predictor_lr=5e-1)
    [first(x) for x in stream[:3]]
    state = first.state_dict()
    fresh = zerosiam.adapt(copy.deepcopy(twin), "zerosiam", lr=5e-2, predictor_lr=5e-1)
    fresh.reset()
    fresh.load_state_dict(state)
    assert all(torch.equal(fresh(x), e) for x, e in zip(stream[3:], expected[3:], strict=True))
    assert fresh.steps == 6 and fresh.history == straight.history  # the record goes on too
    with pytest.raises(ValueError, match="method 'zerosiam'"):
        zerosiam.adapt(copy.deepcopy(twin), "tent", lr=1e-2).load_state_dict(state)


def test_diagnostics_are_recorded_each_step(tiny_gn: TinyGN, images):
    adapter = zerosiam.adapt(tiny_gn, "zerosiam", lr=1e-2, predictor_lr=1e-2)
    logits = adapter(images)
    row = adapter.last
    for key in (
        "loss",
        "objective",
        "divergence",
        "entropy",
        "logit_norm",
        "centre_dominance",
        "predictor_drift",
    ):
        assert key in row
    assert row["logit_norm"] == pytest.approx(float(logits.norm(dim=1).mean()), rel=1e-5)
    assert row["centre_dominance"] == pytest.approx(
        float(logits.mean(0).norm() / logits.norm(dim=1).mean()), rel=1e-5
    )
    assert row["updated"] and row["selected"] == images.shape[0]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_input_never_reaches_the_weights(tiny_gn: TinyGN, images, bad):
    before = _params(tiny_gn)
    adapter = zerosiam.adapt(tiny_gn, "zerosiam", lr=1e-1, predictor_lr=1e-1)
    poisoned = images.clone()
    poisoned[2, 0, 1, 1] = bad
    with pytest.raises(NonFiniteInputError, match="1 of 6 samples"):
        adapter(poisoned)
    assert all(torch.equal(p, before[n]) for n, p in tiny_gn.named_parameters())


def test_a_non_finite_loss_skips_the_update_and_says_so(tiny_gn: TinyGN, images):
    before = _params(tiny_gn)
    adapter = zerosiam.adapt(tiny_gn, "tent", lr=1e-1, objective=lambda logits: logits.sum(-1) * float("nan"))
    adapter(images)
    assert adapter.last["skipped"] == "non-finite loss" and not adapter.last["updated"]
    assert all(torch.equal(p, before[n]) for n, p in tiny_gn.named_parameters())


def test_bad_inputs_get_clear_errors(tiny_gn: TinyGN, tiny_bn: TinyBN):
    adapter = zerosiam.adapt(tiny_gn, "tent", lr=1e-2)
    with pytest.raises(TypeError, match="floating-point"):
        adapter(torch.zeros(2, 3, 8, 8, dtype=torch.uint8))
    with pytest.raises(ValueError, match="non-empty"):
        adapter(torch.zeros(0, 3, 8, 8))
    with pytest.raises(ValueError, match="batch size 1 with BatchNorm"):
        zerosiam.adapt(tiny_bn, "zerosiam", lr=1e-2)(torch.rand(1, 3, 8, 8))
    with pytest.raises(TypeError, match="unknown option"):
        zerosiam.adapt(tiny_gn, "tent", learning_rate=1)
    with pytest.raises(TypeError, match="predictor"):
        zerosiam.adapt(tiny_gn, "tent", alpha=2.0)
    with pytest.raises(ValueError, match="unknown method"):
        zerosiam.adapt(tiny_gn, "tnet")


def test_an_unknown_option_names_every_option_adapt_takes(tiny_gn: TinyGN):
    """The list comes from ``adapt``'s signature and the recipe, so a new keyword cannot be left out."""
    with pytest.raises(TypeError, match="unknown option") as error:
        zerosiam.adapt(tiny_gn, "tent", learning_rate=1)
    named = set(str(error.value).split("options are ")[1].split(", "))
    assert keyword_options(zerosiam.adapt) <= named
    assert {"lr_scale", "precision", "diagnostics", "streams", "select"} <= named
    assert "alpha" not in named  # Tent has no predictor
    with pytest.raises(TypeError, match="alpha"):
        zerosiam.adapt(tiny_gn, "zerosiam", learning_rate=1)
    # a grid's options: everything adapt takes but the batches' layout
    assert options_of("tent") == named - {"streams"}


def test_batch_size_one_works_with_groupnorm(tiny_gn: TinyGN, images):
    adapter = zerosiam.adapt(tiny_gn, "zerosiam", lr=1e-2, predictor_lr=1e-2, batch_size=1)
    assert adapter(images[:1]).shape == (1, 5)


@pytest.mark.parametrize(
    "options",
    [
        {"predictor": "random"},
        {"predictor": "mlp"},
        {"divergence": "js"},
        {"divergence": "mse"},
        {"divergence": "reverse_kl", "alpha": 2.5},
        {"objective": "slr"},
        {"objective": "ce"},
        {"objective": "neg_p2"},
    ],
)
def test_ablation_variants_run_and_adapt(tiny_gn: TinyGN, options):
    before = tiny_gn.gn.weight.detach().clone()
    adapter = zerosiam.adapt(tiny_gn, "zerosiam", lr=5e-2, predictor_lr=5e-2, **options)
    for x in _stream(2):
        assert torch.isfinite(adapter(x)).all()
    assert not torch.equal(tiny_gn.gn.weight, before)
    if options.get("predictor") == "random":
        assert adapter.predictor.weight.requires_grad is False
        assert len(adapter.optimizer.param_groups) == 1


def test_bn_model_adapts_without_touching_running_stats_and_release_restores_it(tiny_bn: TinyBN, images):
    with torch.no_grad():
        reference = tiny_bn(images)
    buffers = {k: v.clone() for k, v in tiny_bn.named_buffers()}
    adapter = zerosiam.adapt(tiny_bn, "zerosiam", lr=1e-1, predictor_lr=1e-1)
    for x in _stream(3):
        adapter(x)
    assert all(torch.equal(v, buffers[k]) for k, v in tiny_bn.named_buffers())
    model = adapter.release()
    assert model is tiny_bn and not model.training and model.bn.track_running_stats
    assert all(p.requires_grad for p in model.parameters())
    with torch.no_grad():
        assert torch.equal(model(images), reference)


def test_default_learning_rates_follow_the_paper_table():
    timm = pytest.importorskip("timm")
    vit = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=10)
    assert zerosiam.adapt(vit, "zerosiam").settings.lr == pytest.approx(1e-3)
    assert zerosiam.adapt(vit, "zerosiam").settings.predictor_lr == pytest.approx(1e-2)
    assert zerosiam.adapt(vit, "tent", batch_size=1).settings.lr == pytest.approx(1e-4 / 64)
    assert zerosiam.adapt(vit, "zerosiam", batch_size=1).settings.lr == pytest.approx(1e-3 / 32)
    gn = timm.create_model("resnet50_gn", pretrained=False, num_classes=10)
    assert zerosiam.adapt(gn, "zerosiam", batch_size=1).settings.lr == pytest.approx(2.5e-3 / 16)


def test_lr_scale_moves_both_default_rates_and_leaves_explicit_ones(tiny_bn) -> None:
    base = zerosiam.adapt(copy.deepcopy(tiny_bn), "zerosiam").settings
    scaled = zerosiam.adapt(copy.deepcopy(tiny_bn), "zerosiam", lr_scale=10).settings
    assert scaled.lr == pytest.approx(10 * base.lr) and scaled.predictor_lr == pytest.approx(
        10 * base.predictor_lr
    )
    explicit = zerosiam.adapt(copy.deepcopy(tiny_bn), "zerosiam", lr=1e-3, lr_scale=10).settings
    assert explicit.lr == 1e-3 and explicit.predictor_lr == pytest.approx(10 * base.predictor_lr)
    with pytest.raises(ValueError, match="lr_scale"):
        zerosiam.adapt(copy.deepcopy(tiny_bn), "tent", lr_scale=0)


def test_noadapt_is_a_whole_frozen_model_with_the_adapters_face(tiny_bn: TinyBN, images):
    tiny_bn.train()
    frozen = zerosiam.adapt(tiny_bn, "noadapt")
    assert isinstance(frozen, Frozen) and not isinstance(frozen, Adapter)
    assert frozen.params == {} and frozen.predictor is None and not hasattr(frozen, "optimizer")
    assert not tiny_bn.training  # the source model as it is deployed: running statistics, eval mode
    before = tiny_bn.bn.running_mean.clone()
    first = frozen(images)
    assert torch.equal(first, frozen.predict(images)) and torch.equal(tiny_bn.bn.running_mean, before)
    assert frozen.steps == 1 and frozen.last["updated"] is False and frozen.last["entropy"] > 0
    checkpoint = frozen.state_dict()
    frozen.reset()
    assert frozen.steps == 0 and frozen.history == []
    frozen.load_state_dict(checkpoint)
    assert frozen.steps == 1 and len(frozen.history) == 1
    assert frozen.release() is tiny_bn and tiny_bn.training  # modes given back as they came


def test_an_adapter_refuses_a_recipe_that_does_not_adapt(tiny_gn: TinyGN):
    from zerosiam.methods.adapter import Settings

    with pytest.raises(ValueError, match="noadapt does not adapt; zerosiam.adapt wraps it in a Frozen"):
        Adapter(tiny_gn, get_recipe("noadapt"), Settings(lr=0.0, predictor_lr=0.0))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_gradient_under_a_finite_loss_skips_the_update_and_says_so(tiny_gn: TinyGN, images, bad):
    before = _params(tiny_gn)
    adapter = zerosiam.adapt(tiny_gn, "tent", lr=1e-1)
    poisoned = next(p for p in tiny_gn.parameters() if p.requires_grad)
    poisoned.register_hook(lambda grad: grad * bad)
    adapter(images)
    assert adapter.last["skipped"] == "non-finite gradient" and not adapter.last["updated"]
    assert all(torch.equal(p, before[n]) for n, p in tiny_gn.named_parameters())
