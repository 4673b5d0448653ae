"""ZeroSiam and its baselines on a tiny randomly initialised Llama (hidden 32, 2 layers, vocab 97).

What must hold for the language-model adapter: the predictor starts as the identity so the online and
target logits coincide; an update changes only LoRA and predictor weights; answers come from the
target branch (never through h); each method's text recipe gives the loss its definition says, checked
against a computation written out by hand; SAM, SAR's recovery and EATA's weight are the very parts the
image path uses.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from tests.llm.goldens import VOCAB, tiny_llama  # noqa: E402
from zerosiam.llm.adapter import LMAdapter, LMSettings  # noqa: E402
from zerosiam.llm.loop import run_online, summarise  # noqa: E402
from zerosiam.llm.math_data import MathProblem  # noqa: E402
from zerosiam.methods import get_recipe  # noqa: E402
from zerosiam.methods.adapter import Adapter  # noqa: E402
from zerosiam.methods.tlm import tlm_with  # noqa: E402
from zerosiam.parts.contract import Batch, ModalityError  # noqa: E402
from zerosiam.parts.learner import GradientLearner  # noqa: E402
from zerosiam.parts.losses import entropy  # noqa: E402
from zerosiam.parts.recovery import EmaBelow, ema_below  # noqa: E402
from zerosiam.parts.sam import SAM  # noqa: E402
from zerosiam.parts.selection import EntropyBelow, ExpMargin, entropy_below  # noqa: E402


@pytest.fixture(scope="module")
def base() -> torch.nn.Module:
    return tiny_llama(initializer_range=0.02)  # transformers' default: near-uniform predictions


def prompt(length: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


def loose(method: str, e0: float = 100.0):
    """The method's text recipe with an entropy threshold that keeps every token of a random model."""
    recipe = get_recipe(method, "text")
    weight = None if recipe.weight is None else ExpMargin(entropy_below(nats=e0).margin)
    return recipe.with_(select=[entropy_below(nats=e0)], weight=weight)


def adapter_for(base, method, **config) -> LMAdapter:
    torch.manual_seed(0)
    config.setdefault("max_new_tokens", 10)
    return LMAdapter(copy.deepcopy(base), method, LMSettings(**config))


# --------------------------------------------------------------------------------------- the branches
def test_predictor_starts_as_identity_and_branches_agree(base):
    adapter = adapter_for(base, "zerosiam")
    weight = adapter.net.predictor.weight
    assert weight.shape == (32, 32) and torch.equal(weight, torch.eye(32))
    assert adapter.predictor_drift() == 0.0
    branches = adapter.net.branches(prompt(), keep=5)
    assert branches.target.shape == (1, 5, VOCAB) and branches.hidden.shape == (1, 5, 32)
    torch.testing.assert_close(branches.online, branches.target, rtol=0, atol=1e-6)
    with torch.no_grad():
        reference = base(prompt()).logits[:, -5:]
    torch.testing.assert_close(branches.target, reference, rtol=0, atol=1e-5)  # LoRA starts as a no-op


def test_only_lora_and_predictor_change(base):
    adapter = adapter_for(base, "zerosiam", lr=1e-2)
    trainable = {id(p) for p in adapter.trainable}
    names = {n for n, p in adapter.net.named_parameters() if id(p) in trainable}
    assert names and all("lora_" in n or n.startswith("predictor.") for n in names)
    assert any(n.startswith("predictor.") for n in names)
    before = {n: p.detach().clone() for n, p in adapter.net.named_parameters()}
    ids = prompt()
    for _ in range(2):  # LoRA's A only gets a gradient once B has left zero
        record = adapter.adapt(ids, adapter.answer(ids))
        assert record.updated
    changed = {n for n, p in adapter.net.named_parameters() if not torch.equal(p, before[n])}
    assert changed == names
    assert adapter.predictor_drift() > 0


def test_answers_come_from_the_target_branch(base):
    ids = prompt()
    with torch.no_grad():
        expected = base.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False)
    adapter = adapter_for(base, "zerosiam", lr=0.0, predictor_lr=0.5)
    first = adapter.answer(ids)
    assert torch.equal(first, expected[0, ids.shape[1] :])
    adapter.adapt(ids, first)  # moves only h (η_f = 0) ...
    assert adapter.predictor_drift() > 0.1
    assert torch.equal(adapter.answer(ids), first)  # ... and h is not on the generation path


def test_adaptation_uses_the_first_k_generated_positions(base):
    adapter = adapter_for(base, "tent", k=3)
    ids, generated = prompt(), torch.tensor([5, 6, 7, 8, 9])
    evaluation = adapter._evaluate(ids, generated)
    full = torch.cat([ids, generated.view(1, -1)], dim=1)
    with torch.no_grad():
        logits = base(full).logits[0]
    # position L-1 predicts generated[0]; L+1 predicts generated[2]: three samples of the recipe
    torch.testing.assert_close(
        evaluation.batch.target.detach(), logits[ids.shape[1] - 1 : ids.shape[1] + 2], atol=1e-5, rtol=0
    )
    assert evaluation.batch.modality == "text" and evaluation.selected == 3


def test_noadapt_never_changes_anything(base):
    adapter = adapter_for(base, "noadapt")
    before = [p.detach().clone() for p in adapter.net.parameters()]
    ids = prompt()
    record = adapter.adapt(ids, adapter.answer(ids))
    assert not record.updated and math.isnan(record.loss)
    assert all(torch.equal(a, b) for a, b in zip(before, adapter.net.parameters(), strict=True))


def test_sar_filters_unreliable_tokens_and_steps_when_some_are_reliable(base):
    ids = prompt()
    strict = adapter_for(base, "sar", lr=1e-2)  # a random model's tokens have entropy ≈ ln 97 > 0.4
    before = [p.detach().clone() for p in strict.trainable]
    assert not strict.adapt(ids, strict.answer(ids)).updated
    assert all(torch.equal(a, b) for a, b in zip(before, strict.trainable, strict=True))
    relaxed = adapter_for(base, loose("sar"), lr=1e-2)
    record = relaxed.adapt(ids, relaxed.answer(ids))
    assert record.updated and record.stats["selected"] == 8
    assert any(not torch.equal(a, b) for a, b in zip(before, relaxed.trainable, strict=True))


def test_sar_recovery_resets_to_the_source(base):
    adapter = adapter_for(base, loose("sar").with_(recover=ema_below(100.0)), lr=1e-2)
    ids = prompt()
    adapter.adapt(ids, adapter.answer(ids))
    assert adapter.resets == 1
    assert all(torch.equal(p, q) for p, q in zip(adapter.trainable, adapter._initial, strict=True))


def test_language_and_vision_share_sam_recovery_and_eata_weight():
    """Not look-alikes: the language recipes hold instances of the very classes vision's hold."""
    sar_image, sar_text = get_recipe("sar", "image"), get_recipe("sar", "text")
    assert type(sar_text.step) is type(sar_image.step) is SAM
    assert type(sar_text.select[0]) is type(sar_image.select[0]) is EntropyBelow
    assert type(sar_image.recover) is type(ema_below(0.2)) is EmaBelow  # the text recovery is ema_below too
    assert type(get_recipe("eata", "text").weight) is type(get_recipe("eata", "image").weight) is ExpMargin
    # and both adapters take their steps through one GradientLearner (backward, finiteness, skip)
    assert issubclass(LMAdapter, GradientLearner) and issubclass(Adapter, GradientLearner)


def test_image_only_parts_refuse_text(base):
    with pytest.raises(ValueError, match="supports image only, not text"):
        get_recipe("deyo", "text")
    with pytest.raises(ValueError, match="do not work on text"):
        get_recipe(get_recipe("deyo").with_(name="deyo_on_text"), "text")
    deyo_rule = get_recipe("deyo").select[1]
    with pytest.raises(ModalityError, match="image batches only; this batch is text"):
        deyo_rule(text_batch(LOGITS))


def test_every_method_runs_through_the_loop(base):
    class CharTokenizer:
        """Just enough of a tokenizer: characters to ids and back, no chat template."""

        chat_template = None
        eos_token_id = 2

        def __call__(self, text, return_tensors=None):
            return {"input_ids": torch.tensor([[3 + ord(c) % (VOCAB - 3) for c in text[:40]]])}

        def decode(self, ids, skip_special_tokens=True):
            return " ".join(str(int(i)) for i in ids)

        def get_vocab(self):
            return {}

    problems = [MathProblem(f"p{i}", f"What is {i} + {i}?", str(2 * i)) for i in range(2)]
    recipes = {name: get_recipe(name, "text") for name in ("noadapt", "tent", "zerosiam", "come")}
    # thresholds above ln 97 so that every filter keeps this random model's tokens
    recipes.update(sar=loose("sar", 5.0), eata=loose("eata", 5.0), tlm=tlm_with(log_p0=0.0))
    for name, recipe in recipes.items():
        adapter = adapter_for(base, recipe, max_new_tokens=3, k=2)
        questions = problems if name == "zerosiam" else problems[:1]
        metrics, curves = summarise(run_online(adapter, CharTokenizer(), questions))
        assert metrics["questions"] == len(questions) and 0.0 <= metrics["accuracy"] <= 1.0
        assert metrics["updates"] == (0 if name == "noadapt" else len(questions)), name
        assert len(curves["correct"]) == len(questions) and metrics["tokens_per_s"] > 0
        if name == "zerosiam":  # h moves on the first question, so the second sees a divergence
            assert curves["divergence"][0] == 0.0 and curves["divergence"][1] > 0.0


# ---------------------------------------------------------------------- the objectives, by hand
LOGITS = torch.tensor([[4.0, 0.0, 0.0, 0.0], [1.0, 0.5, 0.0, -1.0], [9.0, 0.0, 0.0, 0.0]])


def hand_entropy(row: list[float]) -> float:
    total = sum(math.exp(u) for u in row)
    return -sum(math.exp(u) / total * math.log(math.exp(u) / total) for u in row)


def hand_softmax(row: list[float]) -> list[float]:
    total = sum(math.exp(u) for u in row)
    return [math.exp(u) / total for u in row]


def text_batch(logits: torch.Tensor, target: torch.Tensor | None = None, tokens=None) -> Batch:
    """A text batch as the language adapter builds it (no learner: these recipes need none)."""
    target = logits if target is None else target
    per_sample = entropy(logits).detach()
    per_sample = per_sample.flatten(1).mean(1) if logits.ndim > 2 else per_sample
    return Batch(x=LOGITS, logits=logits, target=target, entropy=per_sample, learner=None, modality="text",
                 tokens=tokens)  # fmt: skip


def text_loss(method, logits, **batch) -> torch.Tensor:
    recipe = get_recipe(method, "text") if isinstance(method, str) else method
    return recipe.evaluate(text_batch(logits, **batch)).loss


def test_tent_is_the_mean_entropy():
    expected = sum(hand_entropy(r) for r in LOGITS.tolist()) / 3
    assert text_loss("tent", LOGITS).item() == pytest.approx(expected, rel=1e-5)


def test_zerosiam_is_online_entropy_plus_symmetric_kl_to_a_stopped_target():
    online = LOGITS.clone().requires_grad_(True)
    target = (LOGITS * 0.5).requires_grad_(True)
    expected = 0.0
    for o, r in zip(online.tolist(), target.tolist(), strict=True):
        po, pr = hand_softmax(o), hand_softmax(r)
        skl = sum((a - b) * (math.log(a) - math.log(b)) for a, b in zip(po, pr, strict=True))
        expected += hand_entropy(o) + 2.0 * skl
    recipe = get_recipe("zerosiam", "text")
    recipe = recipe.with_(asymmetry=dataclasses.replace(recipe.asymmetry, alpha=2.0))
    loss = text_loss(recipe, online, target=target)
    assert loss.item() == pytest.approx(expected / 3, rel=1e-5)
    loss.backward()
    assert target.grad is None and online.grad.abs().sum() > 0  # stop-gradient on the target


def test_sar_keeps_only_tokens_below_e0_nats():
    entropies = [hand_entropy(r) for r in LOGITS.tolist()]
    kept = [h for h in entropies if h < 0.4]
    assert len(kept) == 2  # rows 0 and 2 are confident, row 1 is not
    recipe = get_recipe("sar", "text")  # E0 = 0.4 nats, not 0.4·ln C
    evaluation = recipe.evaluate(text_batch(LOGITS))
    assert evaluation.loss.item() == pytest.approx(sum(kept) / 2, rel=1e-5)
    assert evaluation.mask.tolist() == [True, False, True]
    restricted = recipe.evaluate(text_batch(LOGITS), restrict=torch.tensor([False, True, True]))
    assert restricted.mask.tolist() == [False, False, True]
    assert recipe.evaluate(text_batch(torch.zeros(2, 4))).selected == 0  # uniform: nothing reliable


def test_eata_weights_kept_tokens_by_exp_e0_minus_h():
    entropies = [hand_entropy(r) for r in LOGITS.tolist()]
    terms = [math.exp(0.4 - h) * h for h in entropies if h < 0.4]
    assert text_loss("eata", LOGITS).item() == pytest.approx(sum(terms) / 2, rel=1e-5)


def test_come_uses_the_vocabulary_as_uncertainty_mass():
    expected = 0.0
    for row in LOGITS.tolist():
        strength = sum(math.exp(u) for u in row) + len(row)  # K = vocabulary size = 4
        opinion = [math.exp(u) / strength for u in row] + [len(row) / strength]
        expected += -sum(q * math.log(q + 1e-7) for q in opinion)
    assert text_loss("come", LOGITS).item() == pytest.approx(expected / 3, rel=1e-5)


def test_tlm_minimises_prompt_perplexity_above_the_threshold():
    logits = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0], [0.0, 0.0, 5.0], [1.0, 1.0, 1.0]])
    ids = torch.tensor([0, 2, 1, 2])
    nll = 0.0
    for position in range(3):  # logits at t predict token t + 1
        nll += -math.log(hand_softmax(logits[position].tolist())[ids[position + 1]])
    nll /= 3
    prompt_logits, next_tokens = logits[None, :-1], ids[None, 1:]  # one sample: the prompt
    below = tlm_with(log_p0=nll + 0.1).evaluate(text_batch(prompt_logits, tokens=next_tokens))
    assert below.selected == 0  # a familiar prompt is not learned from
    above = text_loss(tlm_with(log_p0=1.0, lam=0.1), prompt_logits, tokens=next_tokens)
    assert above.item() == pytest.approx(0.1 * math.exp(nll - 1.0) * nll, rel=1e-5)
    with pytest.raises(ValueError, match="two tokens"):
        text_loss("tlm", logits[None, :0], tokens=ids[None, :0])


def test_bad_input_is_a_clear_error(base):
    with pytest.raises(ValueError, match="unknown method 'tentt' for text"):
        get_recipe("tentt", "text")
    with pytest.raises(ValueError, match="k must be positive"):
        LMSettings(k=0)
    with pytest.raises(ValueError, match="not in the model"):
        LMAdapter(copy.deepcopy(base), "tent", LMSettings(lora_targets=("query",)))
    adapter = adapter_for(base, "tent")
    with pytest.raises(ValueError, match="one prompt"):
        adapter.answer(torch.zeros(2, 3, dtype=torch.long))
