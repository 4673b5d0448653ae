"""ZeroSiam and its baselines on a tiny randomly initialised Llama (hidden 32, 2 layers, vocab 97).

What must hold for the language-model adapter: the predictor starts as the identity so the online and
target logits coincide; an update changes only LoRA and predictor weights; answers come from the
target branch (never through h); each baseline's loss is what its definition says, checked against a
computation written out by hand.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from zerosiam.llm.adapter import LMAdapter, LMConfig  # noqa: E402
from zerosiam.llm.loop import run_online, summarise  # noqa: E402
from zerosiam.llm.math_data import MathProblem  # noqa: E402
from zerosiam.llm.objectives import (  # noqa: E402
    View,
    come_loss,
    eata_loss,
    get_method,
    sar_loss,
    tent_loss,
    tlm_loss,
    zerosiam_loss,
)
from zerosiam.llm.table import markdown_table  # noqa: E402

VOCAB = 97


def tiny_llama(seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def base() -> torch.nn.Module:
    return tiny_llama()


def prompt(length: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


def adapter_for(base, method: str, **config) -> LMAdapter:
    torch.manual_seed(0)
    config.setdefault("max_new_tokens", 10)
    return LMAdapter(copy.deepcopy(base), method, LMConfig(**config))


# --------------------------------------------------------------------------------------- the branches
def test_predictor_starts_as_identity_and_branches_agree(base):
    adapter = adapter_for(base, "zerosiam")
    weight = adapter.net.predictor.weight
    assert weight.shape == (32, 32) and torch.equal(weight, torch.eye(32))
    assert adapter.predictor_distance() == 0.0
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
    assert adapter.predictor_distance() > 0


def test_answers_come_from_the_target_branch(base):
    ids = prompt()
    with torch.no_grad():
        expected = base.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False)
    adapter = adapter_for(base, "zerosiam", lr=0.0, lr_predictor=0.5)
    first = adapter.answer(ids)
    assert torch.equal(first, expected[0, ids.shape[1] :])
    adapter.adapt(ids, first)  # moves only h (η_f = 0) ...
    assert adapter.predictor_distance() > 0.1
    assert torch.equal(adapter.answer(ids), first)  # ... and h is not on the generation path


def test_adaptation_uses_the_first_k_generated_positions(base):
    adapter = adapter_for(base, "tent", k=3)
    ids, generated = prompt(), torch.tensor([5, 6, 7, 8, 9])
    view = adapter._view(ids, generated)
    full = torch.cat([ids, generated.view(1, -1)], dim=1)
    with torch.no_grad():
        logits = base(full).logits[0]
    # position L-1 predicts generated[0]; L+1 predicts generated[2]
    torch.testing.assert_close(
        view.target.detach(), logits[ids.shape[1] - 1 : ids.shape[1] + 2], atol=1e-5, rtol=0
    )


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
    loose = adapter_for(base, "sar", lr=1e-2, e0=100.0)
    record = loose.adapt(ids, loose.answer(ids))
    assert record.updated and record.stats["selected"] == 8
    assert any(not torch.equal(a, b) for a, b in zip(before, loose.trainable, strict=True))


def test_sar_recovery_resets_to_the_source(base):
    adapter = adapter_for(base, "sar", lr=1e-2, e0=100.0, sar_reset_below=100.0)
    ids = prompt()
    adapter.adapt(ids, adapter.answer(ids))
    assert adapter.resets == 1
    assert all(torch.equal(p, q) for p, q in zip(adapter.trainable, adapter._initial, strict=True))


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
    for name in ("noadapt", "tent", "zerosiam", "sar", "eata", "come", "tlm"):
        # thresholds above ln 97 so that every filter keeps this random model's tokens
        adapter = adapter_for(base, name, e0=5.0, tlm_log_p0=0.0, max_new_tokens=3, k=2)
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


def test_tent_is_the_mean_entropy():
    expected = sum(hand_entropy(r) for r in LOGITS.tolist()) / 3
    assert tent_loss(View(target=LOGITS)).loss.item() == pytest.approx(expected, rel=1e-5)


def test_zerosiam_is_online_entropy_plus_symmetric_kl_to_a_stopped_target():
    online = LOGITS.clone().requires_grad_(True)
    target = (LOGITS * 0.5).requires_grad_(True)
    expected = 0.0
    for o, r in zip(online.tolist(), target.tolist(), strict=True):
        po, pr = hand_softmax(o), hand_softmax(r)
        skl = sum((a - b) * (math.log(a) - math.log(b)) for a, b in zip(po, pr, strict=True))
        expected += hand_entropy(o) + 2.0 * skl
    evaluation = zerosiam_loss(View(target=target, online=online), alpha=2.0)
    assert evaluation.loss.item() == pytest.approx(expected / 3, rel=1e-5)
    evaluation.loss.backward()
    assert target.grad is None and online.grad.abs().sum() > 0  # stop-gradient on the target


def test_sar_keeps_only_tokens_below_e0():
    entropies = [hand_entropy(r) for r in LOGITS.tolist()]
    kept = [h for h in entropies if h < 0.4]
    assert len(kept) == 2  # rows 0 and 2 are confident, row 1 is not
    evaluation = sar_loss(View(target=LOGITS), e0=0.4)
    assert evaluation.loss.item() == pytest.approx(sum(kept) / 2, rel=1e-5)
    assert evaluation.mask.tolist() == [True, False, True]
    assert sar_loss(View(target=LOGITS, restrict=torch.tensor([False, True, True]))).mask.tolist() == [
        False,
        False,
        True,
    ]
    assert sar_loss(View(target=torch.zeros(2, 4))).loss is None  # uniform: nothing reliable


def test_eata_weights_kept_tokens_by_exp_e0_minus_h():
    entropies = [hand_entropy(r) for r in LOGITS.tolist()]
    terms = [math.exp(0.4 - h) * h for h in entropies if h < 0.4]
    assert eata_loss(View(target=LOGITS), e0=0.4).loss.item() == pytest.approx(sum(terms) / 2, rel=1e-5)


def test_come_uses_the_vocabulary_as_uncertainty_mass():
    expected = 0.0
    for row in LOGITS.tolist():
        strength = sum(math.exp(u) for u in row) + len(row)  # K = vocabulary size = 4
        opinion = [math.exp(u) / strength for u in row] + [len(row) / strength]
        expected += -sum(q * math.log(q + 1e-7) for q in opinion)
    assert come_loss(View(target=LOGITS)).loss.item() == pytest.approx(expected / 3, rel=1e-5)


def test_tlm_minimises_prompt_perplexity_above_the_threshold():
    logits = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0], [0.0, 0.0, 5.0], [1.0, 1.0, 1.0]])
    ids = torch.tensor([0, 2, 1, 2])
    nll = 0.0
    for position in range(3):  # logits at t predict token t + 1
        nll += -math.log(hand_softmax(logits[position].tolist())[ids[position + 1]])
    nll /= 3
    below = tlm_loss(View(prompt_logits=logits, prompt_ids=ids), log_p0=nll + 0.1, lam=0.1)
    assert below.loss is None  # a familiar prompt is not learned from
    above = tlm_loss(View(prompt_logits=logits, prompt_ids=ids), log_p0=1.0, lam=0.1)
    assert above.loss.item() == pytest.approx(0.1 * math.exp(nll - 1.0) * nll, rel=1e-5)
    with pytest.raises(ValueError, match="two tokens"):
        tlm_loss(View(prompt_logits=logits[:1], prompt_ids=ids[:1]))


def test_bad_input_is_a_clear_error(base):
    with pytest.raises(ValueError, match="unknown language-model method"):
        get_method("tentt")
    with pytest.raises(ValueError, match="k must be positive"):
        LMConfig(k=0)
    with pytest.raises(ValueError, match="not in the model"):
        LMAdapter(copy.deepcopy(base), "tent", LMConfig(lora_targets=("query",)))
    with pytest.raises(ValueError, match="needs online logits"):
        zerosiam_loss(View(target=LOGITS))
    adapter = adapter_for(base, "tent")
    with pytest.raises(ValueError, match="one prompt"):
        adapter.answer(torch.zeros(2, 3, dtype=torch.long))


def test_markdown_table_orders_methods_and_averages():
    rows = [
        {"spec": {"method": m, "dataset": d}, "metrics": {"accuracy": a}}
        for m, d, a in [
            ("zerosiam", "gsm8k", 0.2),
            ("noadapt", "gsm8k", 0.1),
            ("noadapt", "math500", 0.0),
            ("zerosiam", "math500", 0.1),
            ("zerosiam", "math500", 0.3),
        ]
    ]
    table = markdown_table(rows, datasets=["math500", "gsm8k"]).splitlines()
    assert table[0] == "| Method | Math-500 | GSM8K | Average |"
    assert table[2] == "| NoAdapt | 0.0 | 10.0 | 5.0 |"
    assert table[3] == "| ZeroSiam | 20.0 (n=2) | 20.0 | 20.0 |"
    assert markdown_table([]) == "(no results)"


def test_cli_parses_and_rejects_unknown_names_before_loading_a_model(tmp_path):
    from zerosiam.cli import build_parser

    args = build_parser().parse_args(
        ["llm", "--dataset", "math500,gsm8k", "--methods", "noadapt,zerosiam", "--limit", "3", "--db", "x.db"]
    )
    assert (
        args.datasets == ["math500", "gsm8k"] and args.methods == ["noadapt", "zerosiam"] and args.limit == 3
    )
    for flag, value, message in [
        ("--dataset", "math5000", "unknown math dataset"),
        ("--methods", "tnet", "method"),
    ]:
        bad = build_parser().parse_args(["llm", flag, value, "--db", str(tmp_path / "r.db")])
        with pytest.raises(ValueError, match=message):
            bad.func(bad)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["llm", "--limit", "0"])
