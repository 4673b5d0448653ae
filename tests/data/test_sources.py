"""Dataset readers on tiny fixtures written here (plus one read of the real CIFAR-10 JPEG test set)."""

from __future__ import annotations

import io
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import SHARED_ASSETS, needs_assets
from zerosiam import assets
from zerosiam.data import sources

COLOURS = {"airplane": (250, 10, 10), "cat": (10, 250, 10), "truck": (10, 10, 250)}


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(assets.CACHE_ENV, str(folder))
    return folder


def encode(pixels: np.ndarray, fmt: str = "JPEG") -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt, quality=95)
    return buffer.getvalue()


def write_tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz" if path.suffix == ".gz" else "w") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def solid(colour: tuple[int, int, int], height: int = 32, width: int = 32) -> np.ndarray:
    return np.broadcast_to(np.array(colour, dtype=np.uint8), (height, width, 3)).copy()


@pytest.fixture
def cifar_tar(tmp_path: Path) -> Path:
    """``test/<class>/NNNN.jpg`` with members deliberately out of order."""
    members = {}
    for name in ("truck", "airplane", "cat"):
        for number in (1, 0):
            members[f"test/{name}/{number:04d}.jpg"] = encode(solid(COLOURS[name]))
    members["README.txt"] = b"not an image"
    return write_tar(tmp_path / "tiny-cifar.tar.gz", members)


# ---------------------------------------------------------------------------------------------- CIFAR JPEG
def test_cifar_jpeg_orders_by_class_then_file(cifar_tar: Path) -> None:
    images, labels, names = sources.read_cifar10_jpeg("test", path=cifar_tar)
    assert names == list(sources.CIFAR10_CLASSES)
    assert images.dtype == np.uint8 and images.shape == (6, 32, 32, 3)
    assert labels.dtype == np.int64 and labels.tolist() == [0, 0, 3, 3, 9, 9]
    for image, label in zip(images, labels, strict=True):
        expected = np.array(COLOURS[names[label]])
        assert np.abs(image.reshape(-1, 3).mean(0) - expected).max() < 8  # JPEG is lossy


def test_cifar_jpeg_decodes_once_then_reads_the_cache(cifar_tar: Path, cache: Path, monkeypatch) -> None:
    first = sources.read_cifar10_jpeg("test", path=cifar_tar)
    assert len(list((cache / "decoded").glob("cifar10-jpeg-*.npz"))) == 1

    def no_decoding(*args: object) -> None:
        raise AssertionError("decoded again")

    monkeypatch.setattr(sources, "_decode_cifar_tar", no_decoding)
    second = sources.read_cifar10_jpeg("test", path=cifar_tar)
    assert np.array_equal(first[0], second[0]) and np.array_equal(first[1], second[1])
    assert first[2] == second[2]
    os.utime(cifar_tar, ns=(1, 1))  # a changed source must not be served from the cache
    with pytest.raises(AssertionError, match="decoded again"):
        sources.read_cifar10_jpeg("test", path=cifar_tar)


def test_cifar_jpeg_bad_input(cifar_tar: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="split"):
        sources.read_cifar10_jpeg("val", path=cifar_tar)
    with pytest.raises(sources.DatasetFormatError, match="no images under train"):
        sources.read_cifar10_jpeg("train", path=cifar_tar, use_cache=False)
    odd = write_tar(tmp_path / "odd.tar", {"test/zebra/0000.jpg": encode(solid((1, 2, 3)))})
    with pytest.raises(sources.DatasetFormatError, match="zebra"):
        sources.read_cifar10_jpeg("test", path=odd)


@pytest.mark.skipif(not SHARED_ASSETS.is_dir(), reason="the shared asset mirror is absent")
def test_real_cifar_jpeg_test_set() -> None:
    images, labels, names = sources.read_cifar10_jpeg("test", use_cache=False)
    assert images.shape == (10_000, 32, 32, 3) and images.dtype == np.uint8
    assert np.array_equal(labels, np.repeat(np.arange(10), 1000))
    assert names[0] == "airplane" and names[-1] == "truck"
    with tarfile.open(assets.fetch("cifar10-jpeg-test")) as archive:
        handle = archive.extractfile("test/cat/0000.jpg")
        assert handle is not None
        expected = np.asarray(Image.open(io.BytesIO(handle.read())).convert("RGB"))
    assert np.array_equal(images[3000], expected)


# ---------------------------------------------------------------------------------------------- ImageNet
def striped(width: int, height: int) -> np.ndarray:
    """Red left quarter, green middle half, blue right quarter."""
    pixels = solid((0, 200, 0), height, width)
    pixels[:, : width // 4] = (200, 0, 0)
    pixels[:, 3 * width // 4 :] = (0, 0, 200)
    return pixels


def test_imagenet_sample_labels_names_and_centre_crop(tmp_path: Path) -> None:
    members = {
        "imagenet-sample/n00000002_great_white_shark.JPEG": encode(striped(128, 64)),
        "imagenet-sample/n00000001_tench.JPEG": encode(striped(96, 64).transpose(1, 0, 2).copy()),
    }
    archive = write_tar(tmp_path / "sample.tar", members)
    images, labels, names = sources.read_imagenet_sample(path=archive, resize=32, crop=16)
    assert images.shape == (2, 16, 16, 3) and images.dtype == np.uint8
    assert labels.tolist() == [0, 1] and names == ["tench", "great white shark"]
    # wide image: 128×64 -> 64×32, the central 16 columns lie in the green half
    assert np.abs(images[1].reshape(-1, 3).mean(0) - (0, 200, 0)).max() < 10


def test_resize_center_crop_matches_torchvision() -> None:
    """ImageNet-C preprocesses with torchvision's Resize(256) + CenterCrop(224) on PIL images."""
    transforms = pytest.importorskip("torchvision.transforms")
    reference = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224)])
    rng = np.random.default_rng(0)
    for height, width in ((300, 500), (375, 333), (256, 256), (200, 601)):
        image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
        ours = np.asarray(sources.resize_center_crop(image))
        assert ours.shape == (224, 224, 3)
        assert np.array_equal(ours, np.asarray(reference(image)))


def test_imagenet_sample_rejects_names_without_wnid(tmp_path: Path) -> None:
    archive = write_tar(tmp_path / "bad.tar", {"imagenet-sample/tench.JPEG": encode(solid((1, 1, 1)))})
    with pytest.raises(sources.DatasetFormatError, match="WordNet"):
        sources.read_imagenet_sample(path=archive)


# ---------------------------------------------------------------------------------------------- CIFAR-10-C
@pytest.fixture
def cifar_c(tmp_path: Path) -> Path:
    root = tmp_path / "CIFAR-10-C"
    root.mkdir()
    per = 4
    images = np.zeros((5 * per, 8, 8, 3), dtype=np.uint8)
    for severity in range(5):
        images[severity * per : (severity + 1) * per] = (
            10 * (severity + 1) + np.arange(per)[:, None, None, None]
        )
    np.save(root / "fog.npy", images)
    np.save(root / "labels.npy", np.tile(np.array([3, 1, 4, 1], dtype=np.uint8), 5))
    return root


def test_cifar10c_slices_one_severity(cifar_c: Path) -> None:
    images, labels, names = sources.read_cifar10c(cifar_c, "fog", 3)
    assert images.shape == (4, 8, 8, 3) and images.dtype == np.uint8
    assert images[:, 0, 0, 0].tolist() == [30, 31, 32, 33]
    assert labels.dtype == np.int64 and labels.tolist() == [3, 1, 4, 1]
    assert names == list(sources.CIFAR10_CLASSES)


def test_cifar10c_bad_input(cifar_c: Path) -> None:
    for severity in (0, 6, 2.5):
        with pytest.raises(ValueError, match="severity"):
            sources.read_cifar10c(cifar_c, "fog", severity)  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match="snow.npy"):
        sources.read_cifar10c(cifar_c, "snow", 1)
    np.save(cifar_c / "bad.npy", np.zeros((7, 8, 8, 3), dtype=np.uint8))
    with pytest.raises(sources.DatasetFormatError, match="shape"):
        sources.read_cifar10c(cifar_c, "bad", 1)


# ---------------------------------------------------------------------------------------------- ImageNet-C
def test_imagenet_c_folders(tmp_path: Path, cache: Path) -> None:
    root = tmp_path / "ImageNet-C"
    wnids = sources.imagenet_wnids()
    layout = {wnids[7]: [(0, 0, 200)], wnids[3]: [(200, 0, 0), (0, 200, 0)]}  # a subset of the classes
    for wnid, colours in layout.items():
        folder = root / "snow" / "5" / wnid
        folder.mkdir(parents=True)
        for number, colour in enumerate(colours):
            (folder / f"img{number}.JPEG").write_bytes(encode(solid(colour, 16, 16)))
    images, labels, names = sources.read_imagenet_c(root, "snow", 5)
    assert names == wnids and labels.tolist() == [3, 3, 7]  # canonical indices, not the folders' positions
    assert images.shape == (3, 16, 16, 3)
    assert images[2, 8, 8].argmax() == 2 and images[0, 8, 8].argmax() == 0
    again = sources.read_imagenet_c(root, "snow", 5)
    assert np.array_equal(again[0], images) and len(list((cache / "decoded").glob("imagenet-c-*.npz"))) == 1
    with pytest.raises(FileNotFoundError, match="fog"):
        sources.read_imagenet_c(root, "fog", 5)
    (root / "snow" / "5" / "n99999999").mkdir()
    (root / "snow" / "5" / "n99999999" / "a.JPEG").write_bytes(encode(solid((0, 0, 0), 16, 16)))
    with pytest.raises(sources.DatasetFormatError, match="no ImageNet-1k wnid: \\['n99999999'\\]"):
        sources.read_imagenet_c(root, "snow", 5)


# ---------------------------------------------------------------------------------------------- CIFAR python
def batch_bytes(pixels: np.ndarray, labels: list[int]) -> bytes:
    """A batch laid out as the official files: rows of 1024 red, 1024 green, 1024 blue values."""
    rows = pixels.transpose(0, 3, 1, 2).reshape(len(pixels), -1)
    return pickle.dumps({b"batch_label": b"x", b"labels": labels, b"data": rows})


def test_cifar10_python_tarball(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    members = {}
    train = []
    for i in range(1, 6):
        pixels = rng.integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
        train.append(pixels)
        members[f"cifar-10-batches-py/data_batch_{i}"] = batch_bytes(pixels, [i, i + 1])
    test_pixels = rng.integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    members["cifar-10-batches-py/test_batch"] = batch_bytes(test_pixels, [7, 8, 9])
    members["cifar-10-batches-py/batches.meta"] = pickle.dumps({b"label_names": [b"a", b"b"]})
    archive = write_tar(tmp_path / "cifar-10-python.tar.gz", members)

    images, labels, names = sources.read_cifar10_python(archive, "test")
    assert np.array_equal(images, test_pixels) and labels.tolist() == [7, 8, 9] and names == ["a", "b"]
    images, labels, _ = sources.read_cifar10_python(archive, "train")
    assert np.array_equal(images, np.concatenate(train)) and labels.tolist()[:4] == [1, 2, 2, 3]


def test_cifar10_python_refuses_code_in_pickles(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self) -> tuple:
            return (os.getcwd, ())

    members = {
        "cifar-10-batches-py/test_batch": pickle.dumps({b"labels": Evil()}),
        "cifar-10-batches-py/batches.meta": pickle.dumps({b"label_names": []}),
    }
    archive = write_tar(tmp_path / "evil.tar.gz", members)
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        sources.read_cifar10_python(archive, "test")
    incomplete = write_tar(tmp_path / "partial.tar.gz", {"cifar-10-batches-py/test_batch": b""})
    with pytest.raises(sources.DatasetFormatError, match="batches.meta"):
        sources.read_cifar10_python(incomplete, "test")


@needs_assets()
def test_the_shipped_imagenet_label_order_is_the_samples():
    """The wnids in ``imagenet1k_wnids.txt`` are the sample's 1,000 classes in label order."""
    with tarfile.open(assets.fetch("imagenet-sample")) as archive:
        stems = {Path(name).name.split("_", 1)[0] for name in archive.getnames() if "_" in Path(name).name}
    assert sources.imagenet_wnids() == sorted(s for s in stems if s.startswith("n")) and len(stems) >= 1000


@needs_assets()
def test_jpegs_decoded_on_the_device_are_the_files_pil_decodes():
    """On a CPU the device's decoder is libjpeg-turbo, as PIL's: 224² files (ImageNet-C's) come out pixel
    for pixel; other sizes are resized and cropped on the device, within one level of PIL's resize."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchvision.io")
    from zerosiam.data.tensors import decode_on, to_input

    def on_cpu(files: list[bytes]):
        encoded = (torch.frombuffer(bytearray(data), dtype=torch.uint8) for data in files)
        return decode_on(sources.EncodedBatch(encoded), torch.device("cpu"))

    with tarfile.open(assets.fetch("imagenet-sample")) as archive:
        files = [archive.extractfile(m).read() for m in archive.getmembers() if m.isfile()][:8]
    pictures = [Image.open(io.BytesIO(data)).convert("RGB") for data in files]
    assert all(picture.size != (224, 224) for picture in pictures)
    cropped = [np.asarray(sources.resize_center_crop(picture)) for picture in pictures]
    decoded = on_cpu(files)
    assert decoded.shape == (8, 3, 224, 224)
    assert (decoded - to_input(np.stack(cropped))).abs().max() <= 1 / 255 + 1e-6
    squares = [encode(square) for square in cropped]  # as ImageNet-C's files are: 224² JPEGs
    expected = np.stack([np.asarray(Image.open(io.BytesIO(data)).convert("RGB")) for data in squares])
    assert torch.equal(on_cpu(squares), to_input(expected))
