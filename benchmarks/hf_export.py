"""The zoo's trained ``vit_tiny_ln`` as a Hugging Face ``transformers`` image classifier, for ``--model hf:``.

    python benchmarks/hf_export.py runs/hf/vit_tiny_ln

Writes the folder with ``save_pretrained`` (``config.json``, ``model.safetensors``) and the image
processor's ``preprocessor_config.json`` (32×32, the CIFAR-10 mean and std the zoo model normalizes with,
bilinear resizing), then loads it back as the benchmark does, ``zerosiam.load_model("hf:<folder>")``, and
checks that it gives the zoo model's logits on random images (it prints the largest difference).
``docs/zoo.md`` ("Your own model") compares the two in ``zerosiam bench``.

Why ``IJepaForImageClassification`` and not ``ViTForImageClassification``: the zoo's ViT has no class
token and classifies the mean of its patch tokens after the final LayerNorm. HF's ViT (and DeiT) prepend a
class token that every patch token attends to and classify that token alone; BEiT and DINOv2 keep the
class token in the attention too. No weights make those compute the zoo model's function. I-JEPA's
classifier in ``transformers`` is the same ViT code without the class token, mean-pooling the patch tokens
after the final LayerNorm: each zoo weight maps onto one of its weights (the fused ``qkv`` split into
query, key and value), and its logits equal the zoo model's exactly.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import Tensor, nn

import zerosiam
from zerosiam.data.sources import CIFAR10_CLASSES
from zerosiam.zoo.trained import CIFAR10_MEAN, CIFAR10_STD, load_trained

MODEL = "vit_tiny_ln"


def ijepa_config(net: nn.Module) -> object:
    """The ``IJepaConfig`` of the zoo's ViT ``net``: its width, depth, heads, MLP, patch and image size."""
    from transformers import IJepaConfig

    block = net.blocks[0]
    patch = net.patch_embed.kernel_size[0]
    return IJepaConfig(
        hidden_size=net.head.in_features,
        num_hidden_layers=len(net.blocks),
        num_attention_heads=block.attn.heads,
        intermediate_size=block.mlp.fc1.out_features,
        hidden_act="gelu",  # exact GELU, as torch.nn.functional.gelu
        layer_norm_eps=net.norm.eps,
        image_size=round(net.pos_embed.shape[1] ** 0.5) * patch,
        patch_size=patch,
        num_channels=3,
        qkv_bias=True,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        id2label=dict(enumerate(CIFAR10_CLASSES)),
        label2id={name: index for index, name in enumerate(CIFAR10_CLASSES)},
    )


def ijepa_state(zoo: dict[str, Tensor], depth: int) -> dict[str, Tensor]:
    """The zoo ViT's state dict under I-JEPA's names."""
    state = {
        "ijepa.embeddings.position_embeddings": zoo["pos_embed"],
        "ijepa.embeddings.patch_embeddings.projection.weight": zoo["patch_embed.weight"],
        "ijepa.embeddings.patch_embeddings.projection.bias": zoo["patch_embed.bias"],
        "ijepa.layernorm.weight": zoo["norm.weight"],
        "ijepa.layernorm.bias": zoo["norm.bias"],
        "classifier.weight": zoo["head.weight"],
        "classifier.bias": zoo["head.bias"],
    }
    for index in range(depth):
        state.update(_block_state(zoo, f"blocks.{index}.", f"ijepa.layers.{index}."))
    return state


def _block_state(zoo: dict[str, Tensor], source: str, target: str) -> dict[str, Tensor]:
    """One transformer block: the fused ``qkv`` (query, key, value rows in that order) split in three."""
    state = {}
    for kind in ("weight", "bias"):
        query, key, value = zoo[f"{source}attn.qkv.{kind}"].chunk(3)
        state |= {
            f"{target}attention.q_proj.{kind}": query,
            f"{target}attention.k_proj.{kind}": key,
            f"{target}attention.v_proj.{kind}": value,
            f"{target}attention.o_proj.{kind}": zoo[f"{source}attn.proj.{kind}"],
            f"{target}layernorm_before.{kind}": zoo[f"{source}norm1.{kind}"],
            f"{target}layernorm_after.{kind}": zoo[f"{source}norm2.{kind}"],
            f"{target}mlp.fc1.{kind}": zoo[f"{source}mlp.fc1.{kind}"],
            f"{target}mlp.fc2.{kind}": zoo[f"{source}mlp.fc2.{kind}"],
        }
    return state


def export(folder: Path) -> None:
    """Write the converted model and its processor config into ``folder``."""
    from transformers import IJepaForImageClassification, ViTImageProcessor

    net = load_trained(MODEL, normalized=False)
    converted = IJepaForImageClassification(ijepa_config(net)).eval()
    converted.load_state_dict(ijepa_state(net.state_dict(), len(net.blocks)), strict=True)
    converted.save_pretrained(folder)
    size = converted.config.image_size
    processor = ViTImageProcessor(
        size={"height": size, "width": size},
        resample=2,
        image_mean=list(CIFAR10_MEAN),
        image_std=list(CIFAR10_STD),
    )
    processor.save_pretrained(folder)


def largest_difference(folder: Path, images: int = 256) -> float:
    """The largest logit difference between the zoo model and the exported one, through ``load_model``."""
    torch.manual_seed(0)
    x = torch.rand(images, 3, 32, 32)
    with torch.no_grad():
        zoo = zerosiam.load_model(MODEL)(x)
        exported = zerosiam.load_model(f"hf:{folder}")(x)
    return float((zoo - exported).abs().max())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folder", type=Path, help="where to write the model (created)")
    args = parser.parse_args()
    export(args.folder)
    print(f"wrote {args.folder}: {', '.join(sorted(p.name for p in args.folder.iterdir()))}")
    difference = largest_difference(args.folder)
    print(f"largest |logit difference| against {MODEL} on 256 random images: {difference:.3g}")


if __name__ == "__main__":
    main()
