"""Real -C folders on disk: CIFAR-10-C as published and ImageNet-C streamed in the protocol's order."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from tests.conftest import needs_assets
from zerosiam.bench import datasets, runner
from zerosiam.bench.batches import StackedBatches, encoded, padded
from zerosiam.bench.runner import RunSpec, StreamBatches
from zerosiam.corruptions.datasets import build_cifar10c, build_imagenet_c
from zerosiam.data.sources import DatasetFormatError, EncodedBatch, ImageFiles, imagenet_wnids
from zerosiam.methods.speed import Speed
from zerosiam.protocols.build import build_stream, to_device

pytestmark = [needs_assets(), pytest.mark.slow]
CORRUPTIONS = ("brightness", "contrast")


@pytest.fixture(scope="module")
def imagenet_c(tmp_path_factory) -> tuple:
    """An ImageNet-C folder as ``zerosiam corrupt --dataset imagenetc`` writes it (2 corruptions at
    severity 1), kept to 12 of its 1,000 class folders so that every protocol streams it in seconds."""
    root = tmp_path_factory.mktemp("ImageNet-C")
    build_imagenet_c(root, names=CORRUPTIONS, severities=[1], progress=False)
    for corruption in CORRUPTIONS:
        for folder in sorted((root / corruption / "1").iterdir())[12:]:
            shutil.rmtree(folder)
    return root, imagenet_wnids()


def test_cifar10_c_on_disk_scores_exactly_as_the_project_build(tmp_path):
    root = tmp_path / "CIFAR-10-C"
    build_cifar10c(root, names=["brightness"], progress=False)
    for protocol in ("mild", "label_shift"):
        for method in ("noadapt", "tent", "zerosiam"):
            spec = dict(model="resnet20", corruption="brightness", severity=5, protocol=protocol,
                        method=method, limit=96)  # fmt: skip
            built = runner.run(RunSpec(dataset="cifar10c", **spec)).metrics["accuracy"]
            on_disk = runner.run(RunSpec(dataset=f"cifar10-c:{root}", **spec)).metrics["accuracy"]
            assert on_disk == built, (protocol, method)


class Spec:
    """The stream parameters of one protocol, as ``build_stream`` reads them."""

    def __init__(self, protocol: str, corruption: str = "brightness", **values) -> None:
        self.protocol, self.corruption, self.seed, self.batch_size, self.limit = (
            protocol,
            corruption,
            0,
            5,
            None,
        )
        self.imbalance_ratio, self.stream_length, self.noise, self.epochs = float("inf"), None, 3, 2
        self.__dict__.update(values)


PROTOCOLS = ["mild", "label_shift", "bs1", "label_shift_bs1", "noise_prefix", "epochs", "blind_spot", "mixed"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_streamed_batches_equal_decoding_the_files_into_memory(imagenet_c, protocol):
    root, wnids = imagenet_c
    streamed = lambda name: datasets.open_domain(f"imagenet-c:{root}", name, 1)  # noqa: E731

    def in_memory(name):
        files, labels = streamed(name)
        return np.stack([np.asarray(Image.open(f).convert("RGB")) for f in files.files]), labels

    predict = lambda x: torch.zeros(len(x), 1000)  # noqa: E731  # wrong on every image but class 0
    spec = Spec(protocol, corruption="mixed" if protocol == "mixed" else "brightness")
    options = dict(mixed_domains=CORRUPTIONS, predict=predict)
    disk, memory = build_stream(spec, streamed, **options), build_stream(spec, in_memory, **options)
    assert isinstance(disk.domains[-1][0], ImageFiles)
    np.testing.assert_array_equal(disk.rows, memory.rows)
    loader = StreamBatches(disk).loader(torch.device("cpu"))
    assert loader.num_workers >= 1  # files are decoded by worker processes
    reference = [memory_batch for memory_batch in StreamBatches(memory)]
    for (pixels, labels), (expected_pixels, expected_labels) in zip(loader, reference, strict=True):
        assert torch.equal(pixels, expected_pixels) and torch.equal(labels, expected_labels)


def test_stacked_streams_of_files_share_one_loader_and_its_workers(imagenet_c):
    """A stacked task's streams (two corruptions under two seeds here, up to 45 in a grid) are decoded by
    one loader with the machine's workers, not by a loader and a worker or more per stream, and its
    batches are the streams' own, stream after stream."""
    root, _ = imagenet_c
    streamed = lambda name: datasets.open_domain(f"imagenet-c:{root}", name, 1)  # noqa: E731
    specs = [Spec("bs1", corruption=name, seed=seed, batch_size=1) for name in CORRUPTIONS for seed in (0, 1)]
    streams = [build_stream(spec, streamed) for spec in specs]
    length = max(len(stream.rows) for stream in streams)
    alone = [StreamBatches(padded(stream, length)) for stream in streams]
    loader = StackedBatches(alone).loader(torch.device("cpu"), start=3)
    assert loader.num_workers == alone[0].loader(torch.device("cpu")).num_workers >= 1
    for index, (pixels, labels) in enumerate(loader, start=3):
        assert torch.equal(pixels, torch.cat([batches[index][0] for batches in alone]))
        assert torch.equal(labels, torch.cat([batches[index][1] for batches in alone]))
    assert index == length - 1


def test_a_subset_of_the_classes_keeps_the_canonical_labels(imagenet_c, tmp_path):
    root, wnids = imagenet_c
    subset = tmp_path / "subset"
    kept = sorted(p.name for p in (root / "brightness" / "1").iterdir())[3:6]
    for wnid in kept:
        shutil.copytree(root / "brightness" / "1" / wnid, subset / "brightness" / "1" / wnid)
    _, labels = datasets.open_domain(f"imagenet-c:{subset}", "brightness", 1)
    assert sorted(set(labels.tolist())) == [wnids.index(w) for w in kept]  # not 0, 1, 2

    model = dict(model="efficientnet_lite0", corruption="brightness", severity=1, protocol="mild",
                 method="noadapt", batch_size=2)  # fmt: skip
    on_subset = runner.run(RunSpec(dataset=f"imagenet-c:{subset}", **model)).metrics
    full = runner.run(RunSpec(dataset=f"imagenet-c:{root}", **model, limit=None))
    files, labels = datasets.open_domain(f"imagenet-c:{root}", "brightness", 1)
    chosen = [i for i, f in enumerate(files.files) if f.parent.name in kept]
    net = runner.zerosiam.load_model("efficientnet_lite0").eval()
    with torch.no_grad():
        x = torch.from_numpy(files[chosen]).permute(0, 3, 1, 2).float() / 255
        expected = (net(x).argmax(1).numpy() == labels[chosen]).mean()
    assert on_subset["samples"] == len(chosen) and on_subset["accuracy"] == pytest.approx(expected)
    assert full.metrics["samples"] == 12


def test_missing_empty_and_corrupt_files_are_named(imagenet_c, tmp_path):
    root, _ = imagenet_c
    with pytest.raises(ValueError, match="dataset folder '/nowhere' of 'imagenet-c:/nowhere' does not exist"):
        datasets.open_domain("imagenet-c:/nowhere", "brightness", 1)
    with pytest.raises(FileNotFoundError, match="ImageNet-C folder .*fog/1 does not exist"):
        datasets.open_domain(f"imagenet-c:{root}", "fog", 1)
    broken = tmp_path / "broken"
    shutil.copytree(root / "brightness", broken / "brightness")
    some_class = next((broken / "brightness" / "1").iterdir())
    (some_class / "0.JPEG").write_bytes(b"not a jpeg")
    files, labels = datasets.open_domain(f"imagenet-c:{broken}", "brightness", 1)
    with pytest.raises(DatasetFormatError, match=f"cannot decode image {some_class / '0.JPEG'}"):
        files[[files.files.index(some_class / "0.JPEG")]]
    read = encoded(build_stream(Spec("mild", corruption="brightness"), lambda name: (files, labels)))
    cpu = torch.device("cpu")
    with pytest.raises(DatasetFormatError, match=f"cannot decode image {some_class / '0.JPEG'}: Not a JPEG"):
        for batch in StreamBatches(read).loader(cpu):  # read by a worker, refused by the device's decoder
            to_device(*batch, cpu)
    (some_class / "1.JPEG").write_bytes(b"")
    with pytest.raises(DatasetFormatError, match=f"image file {some_class / '1.JPEG'} is empty"):
        datasets.open_domain(f"imagenet-c:{broken}", "brightness", 1)
    for image in some_class.iterdir():
        image.unlink()
    with pytest.raises(DatasetFormatError, match=f"class folder {some_class} holds no images"):
        datasets.open_domain(f"imagenet-c:{broken}", "brightness", 1)
    with pytest.raises(ValueError, match="unknown dataset 'imagenet'; choose one of cifar10c, imagenetc"):
        datasets.parse("imagenet")


@pytest.mark.parametrize("protocol", ["mild", "mixed"])
def test_files_read_for_the_device_to_decode_give_the_loaders_input(imagenet_c, protocol):
    """With ``decode_on_device`` the loader's workers only read the files and the device decodes them: on a
    CPU the same model input, batch for batch, as the workers' own decoding, alone and stacked."""
    root, _ = imagenet_c
    streamed = lambda name: datasets.open_domain(f"imagenet-c:{root}", name, 1)  # noqa: E731
    corruption = "mixed" if protocol == "mixed" else "brightness"
    spec = Spec(protocol, corruption=corruption)
    stream = build_stream(spec, streamed, mixed_domains=CORRUPTIONS)
    cpu = torch.device("cpu")
    read = StreamBatches(encoded(stream)).loader(cpu)
    assert read.num_workers >= 1  # the files are still read by worker processes
    for (files, labels), (pixels, expected) in zip(read, StreamBatches(stream).loader(cpu), strict=True):
        assert isinstance(files, EncodedBatch) and torch.equal(labels, expected)
        assert torch.equal(to_device(files, labels, cpu)[0], to_device(pixels, expected, cpu)[0])
    other = build_stream(Spec(protocol, corruption=corruption, seed=1), streamed, mixed_domains=CORRUPTIONS)
    stacked = StackedBatches([StreamBatches(encoded(stream)), StreamBatches(encoded(other))])
    files, labels = stacked[0]  # stream after stream, as the decoded stacks are
    decoded = StackedBatches([StreamBatches(stream), StreamBatches(other)])[0]
    assert torch.equal(to_device(files, labels, cpu)[0], to_device(*decoded, cpu)[0])


def test_decoding_on_the_device_is_refused_for_images_already_in_memory():
    spec = RunSpec(model="resnet20", dataset="cifar10c", corruption="fog", severity=5, protocol="mild",
                   method="tent", limit=32)  # fmt: skip
    with pytest.raises(ValueError, match="decode_on_device decodes image files"):
        runner.run(spec, speed=Speed(decode_on_device=True))
