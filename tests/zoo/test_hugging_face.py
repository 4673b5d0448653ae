"""``hf:<folder>``: a Hugging Face image classifier saved with ``save_pretrained``, its preprocessing read
from the processor config beside it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import zerosiam
from zerosiam.zoo import model_info
from zerosiam.zoo.checkpoint import ChecksumMismatchError

transformers = pytest.importorskip("transformers")


def save_classifier(folder: Path, num_labels: int = 10, image_size: int = 16, processor: bool = True) -> Path:
    """A tiny random ViT written as a user would: ``save_pretrained`` for the model and, unless told
    not to, for its image processor (mean 0.5, std 0.25, ``image_size``², bilinear)."""
    torch.manual_seed(0)
    config = transformers.ViTConfig(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        image_size=image_size, patch_size=8, num_labels=num_labels,
    )  # fmt: skip
    transformers.ViTForImageClassification(config).save_pretrained(folder)
    if processor:
        size = {"height": image_size, "width": image_size}
        transformers.ViTImageProcessor(
            size=size, resample=2, image_mean=[0.5] * 3, image_std=[0.25] * 3
        ).save_pretrained(folder)
    return folder


def test_the_folder_says_its_classes_input_size_and_normalization(tmp_path):
    info = model_info(f"hf:{save_classifier(tmp_path)}")
    assert (info.num_classes, info.input_size, info.dataset, info.resize) == (10, 16, "cifar10", "bilinear")
    assert info.mean == (0.5, 0.5, 0.5) and info.std == (0.25, 0.25, 0.25)


def test_options_override_the_processor(tmp_path):
    info = model_info(f"hf:{save_classifier(tmp_path)}", mean=0, std=1, input_size=32, dataset="imagenet")
    assert (info.mean, info.std, info.input_size, info.dataset) == ((0.0,) * 3, (1.0,) * 3, 32, "imagenet")


def test_the_loaded_model_resizes_normalizes_and_returns_logits(tmp_path):
    folder = save_classifier(tmp_path)
    model = zerosiam.load_model(f"hf:{folder}")
    bare = transformers.ViTForImageClassification.from_pretrained(folder).eval()
    x = torch.rand(3, 3, 32, 32)
    with torch.no_grad():
        resized = F.interpolate(x, size=(16, 16), mode="bilinear", antialias=True, align_corners=False)
        assert torch.equal(model(x), bare((resized - 0.5) / 0.25).logits)
        assert torch.equal(model(resized), bare((resized - 0.5) / 0.25).logits)  # the right size: as it is


def test_a_rescale_factor_other_than_one_over_255_is_folded_into_the_normalization(tmp_path):
    folder = save_classifier(tmp_path)
    file = folder / "preprocessor_config.json"
    config = json.loads(file.read_text())
    file.write_text(
        json.dumps({**config, "do_rescale": False, "image_mean": [127.5] * 3, "image_std": [51] * 3})
    )
    info = model_info(f"hf:{folder}")  # the model takes [0, 255] pixels: (255·x − 127.5) / 51
    assert info.mean == pytest.approx((0.5,) * 3) and info.std == pytest.approx((0.2,) * 3)


def test_a_folder_without_a_processor_config_is_refused_unless_every_value_is_given(tmp_path):
    folder = save_classifier(tmp_path, processor=False)
    with pytest.raises(ValueError, match="no preprocessor_config.json") as refused:
        model_info(f"hf:{folder}", mean=0.5)
    assert "\n" not in str(refused.value)
    assert model_info(f"hf:{folder}", mean=0.5, std=0.5, input_size=16).input_size == 16


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"num_classes": 3}, "has 10 classes"),
        ({"checkpoint": "/elsewhere.pt"}, "holds its own weights"),
    ],
)
def test_options_that_contradict_the_folder_are_refused(tmp_path, options, says):
    with pytest.raises(ValueError, match=says):
        model_info(f"hf:{save_classifier(tmp_path)}", **options)


def test_not_a_model_folder_is_one_line(tmp_path):
    with pytest.raises(ValueError, match="does not exist; hf: takes a folder written by save_pretrained"):
        model_info(f"hf:{tmp_path / 'absent'}")
    with pytest.raises(ValueError, match="has no config.json"):
        model_info(f"hf:{tmp_path}")


def test_weights_the_folder_lacks_are_an_error_not_a_random_initialization(tmp_path):
    folder = save_classifier(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(ValueError, match="lacks weights"):
        zerosiam.load_model(f"hf:{folder}")


def test_checkpoint_sha256_pins_the_weights_file(tmp_path):
    from zerosiam.assets.files import sha256_file

    folder = save_classifier(tmp_path)
    good = sha256_file(folder / "model.safetensors")
    assert zerosiam.load_model(f"hf:{folder}", checkpoint_sha256=good) is not None
    with pytest.raises(ChecksumMismatchError):
        zerosiam.load_model(f"hf:{folder}", checkpoint_sha256="0" * 64)
