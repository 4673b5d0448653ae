"""Dataset readers. Each returns ``(images, labels, class_names)``: uint8 ``(N, H, W, 3)``, int64 ``(N,)``
and the list of class names that the labels index.

Decoding thousands of JPEGs is the slow part of a run, so the decoded arrays are kept as ``.npz`` files in
``<cache>/decoded/``, keyed by the source's identity (its sha256 for registered assets, else its path, size
and mtime) and by the reader's parameters; a second call only loads the arrays.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pickle
import re
import tarfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path, PurePosixPath

import numpy as np
import torch
from PIL import Image

from zerosiam import assets
from zerosiam.assets.files import building, intact, write_checked

CIFAR10_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
CIFAR10_SPLITS = ("train", "test")
_CACHE_VERSION = 1  # bump when a reader's output changes, so old cached arrays are not reused
_WNID = re.compile(r"^n\d{8}$")
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")

Dataset = tuple[np.ndarray, np.ndarray, list[str]]
PathLike = str | os.PathLike[str]


class DatasetFormatError(ValueError):
    """The files on disk do not have the layout a reader expects."""


# ---------------------------------------------------------------------------------------------- caching
def _file_identity(path: Path) -> dict[str, object]:
    stat = path.stat()
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _cache_path(cache: PathLike | None, reader: str, key: dict[str, object]) -> Path:
    blob = json.dumps({"version": _CACHE_VERSION, "reader": reader, **key}, sort_keys=True, default=str)
    digest = hashlib.sha256(blob.encode()).hexdigest()[:20]
    return assets.cache_dir(cache) / "decoded" / f"{reader}-{digest}.npz"


def _save(path: Path, data: Dataset) -> None:
    """Write the arrays atomically with their check record; a failure (read-only cache) only means
    decoding again next time."""
    images, labels, names = data
    arrays = {"images": images, "labels": labels, "class_names": np.array(names, dtype=np.str_)}
    with contextlib.suppress(OSError):
        write_checked(path, lambda handle: np.savez(handle, **arrays), shape=list(images.shape))


def _load(path: Path) -> Dataset | None:
    """The cached arrays, or None when there are none or they are damaged (then removed, with a warning)."""
    if not intact(path):
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            return data["images"], data["labels"], [str(n) for n in data["class_names"]]
    except (OSError, ValueError, KeyError):
        return None


def _cached(
    reader: str, key: dict[str, object], build: Callable[[], Dataset], cache: PathLike | None, use_cache: bool
) -> Dataset:
    """``build()``'s result, from the decoded-array cache when it is there."""
    if not use_cache:
        return build()
    path = _cache_path(cache, reader, key)
    with building(path):  # a second process decoding the same source waits, then reads the cache
        hit = _load(path)
        if hit is not None:
            return hit
        data = build()
        _save(path, data)
        return data


def _as_dataset(images: list[np.ndarray], labels: list[int], names: list[str], where: object) -> Dataset:
    if not images:
        raise DatasetFormatError(f"no images found in {where}")
    shapes = {im.shape for im in images}
    if len(shapes) != 1:
        raise DatasetFormatError(f"images in {where} have different shapes: {sorted(shapes)[:5]}")
    return np.stack(images), np.asarray(labels, dtype=np.int64), list(names)


def _decode_rgb(data: bytes | Path, where: object) -> np.ndarray:
    source = io.BytesIO(data) if isinstance(data, bytes) else data
    try:
        with Image.open(source) as image:
            return np.asarray(image.convert("RGB"), dtype=np.uint8)
    except OSError as error:
        raise DatasetFormatError(f"cannot decode image {where}: {error}") from error


def _tar_images(path: Path) -> Iterator[tuple[PurePosixPath, bytes]]:
    """(member path, bytes) of every image file in a tarball, read in one sequential pass."""
    with tarfile.open(path) as archive:
        for member in archive:
            name = PurePosixPath(member.name)
            if member.isfile() and name.suffix.lower() in _IMAGE_SUFFIXES:
                handle = archive.extractfile(member)
                if handle is not None:
                    yield name, handle.read()


# ---------------------------------------------------------------------------------------------- CIFAR JPEG
def read_cifar10_jpeg(
    split: str = "test",
    *,
    path: PathLike | None = None,
    cache: PathLike | None = None,
    use_cache: bool = True,
) -> Dataset:
    """CIFAR-10 (JPEG q75) from ``<split>/<class>/NNNN.jpg`` inside a tarball (default: the registered asset).

    Images are ordered by class (standard order airplane…truck), then by file name.
    """
    if split not in CIFAR10_SPLITS:
        raise ValueError(f"split must be one of {CIFAR10_SPLITS}, got {split!r}")
    if path is None:
        source = assets.fetch(f"cifar10-jpeg-{split}")
        key: dict[str, object] = {"sha256": assets.get_asset(f"cifar10-jpeg-{split}").file().sha256}
    else:
        source = Path(path)
        key = _file_identity(source)
    return _cached(
        "cifar10-jpeg", {**key, "split": split}, lambda: _decode_cifar_tar(source, split), cache, use_cache
    )


def _decode_cifar_tar(path: Path, split: str) -> Dataset:
    found: list[tuple[int, str, np.ndarray]] = []
    for name, data in _tar_images(path):
        parts = name.parts[-3:]
        if len(parts) != 3 or parts[0] != split:
            continue
        if parts[1] not in CIFAR10_CLASSES:
            raise DatasetFormatError(f"{path}: {name} is in an unknown class folder {parts[1]!r}")
        found.append((CIFAR10_CLASSES.index(parts[1]), parts[2], _decode_rgb(data, f"{path}:{name}")))
    if not found:
        raise DatasetFormatError(f"{path} holds no images under {split}/<class>/")
    found.sort(key=lambda item: (item[0], item[1]))
    return _as_dataset([f[2] for f in found], [f[0] for f in found], list(CIFAR10_CLASSES), path)


# ---------------------------------------------------------------------------------------------- ImageNet
def resize_center_crop(image: Image.Image, resize: int = 256, crop: int = 224) -> Image.Image:
    """Shorter side to ``resize`` (bilinear, antialiased by PIL), then the central ``crop``×``crop`` square.

    This is the ImageNet-C / torchvision ``Resize(256)`` + ``CenterCrop(224)`` preprocessing.
    """
    width, height = image.size
    if width <= height:
        size = (resize, int(resize * height / width))
    else:
        size = (int(resize * width / height), resize)
    image = image.resize(size, Image.Resampling.BILINEAR)
    left = int(round((size[0] - crop) / 2.0))
    top = int(round((size[1] - crop) / 2.0))
    return image.crop((left, top, left + crop, top + crop))


def _parse_sample_name(name: PurePosixPath) -> tuple[str, str]:
    wnid, _, label = name.stem.partition("_")
    if not _WNID.match(wnid):
        raise DatasetFormatError(f"{name} does not start with a WordNet id (n########)")
    return wnid, label.replace("_", " ")


def read_imagenet_sample(
    *,
    path: PathLike | None = None,
    resize: int = 256,
    crop: int = 224,
    cache: PathLike | None = None,
    use_cache: bool = True,
) -> Dataset:
    """The ImageNet sample (``<wnid>_<name>.JPEG`` files in a tarball), resized and centre-cropped.

    Labels index the sorted list of the wnids in the archive: for the real sample (one image for each of
    the 1,000 classes) that is the standard ImageNet class index. Class names come from the file names.
    """
    if path is None:
        source = assets.fetch("imagenet-sample")
        key: dict[str, object] = {"sha256": assets.get_asset("imagenet-sample").file().sha256}
    else:
        source = Path(path)
        key = _file_identity(source)
    params = {**key, "resize": resize, "crop": crop}
    return _cached(
        "imagenet-sample", params, lambda: _decode_imagenet_tar(source, resize, crop), cache, use_cache
    )


def _decode_imagenet_tar(path: Path, resize: int, crop: int) -> Dataset:
    found: list[tuple[str, str, str, np.ndarray]] = []
    for name, data in _tar_images(path):
        wnid, label = _parse_sample_name(name)
        with Image.open(io.BytesIO(data)) as image:
            pixels = np.asarray(resize_center_crop(image.convert("RGB"), resize, crop), dtype=np.uint8)
        found.append((wnid, name.name, label, pixels))
    if not found:
        raise DatasetFormatError(f"{path} holds no images")
    found.sort(key=lambda item: (item[0], item[1]))
    wnids = sorted({f[0] for f in found})
    names = {f[0]: f[2] for f in found}
    labels = [wnids.index(f[0]) for f in found]
    return _as_dataset([f[3] for f in found], labels, [names[w] for w in wnids], path)


# ---------------------------------------------------------------------------------------------- CIFAR-10-C
def _check_severity(severity: int) -> None:
    if not isinstance(severity, int | np.integer) or not 1 <= severity <= 5:
        raise ValueError(f"severity must be an integer from 1 to 5, got {severity!r}")


def read_cifar10c(root: PathLike, corruption: str, severity: int) -> Dataset:
    """One severity of a CIFAR-10-C style folder: ``<corruption>.npy`` holds severities 1–5 stacked.

    Memory-mapped, so only the requested fifth is read; no cache is needed.
    """
    _check_severity(severity)
    root = Path(root)
    images_path, labels_path = root / f"{corruption}.npy", root / "labels.npy"
    for needed in (images_path, labels_path):
        if not needed.is_file():
            raise FileNotFoundError(f"CIFAR-10-C file {needed} does not exist")
    images = np.load(images_path, mmap_mode="r")
    labels = np.load(labels_path, mmap_mode="r")
    if images.ndim != 4 or images.shape[-1] != 3 or images.shape[0] % 5:
        raise DatasetFormatError(f"{images_path} has shape {images.shape}; expected (5*N, H, W, 3)")
    per = images.shape[0] // 5
    if labels.shape[0] not in (per, 5 * per):
        raise DatasetFormatError(f"{labels_path} has {labels.shape[0]} labels for {per} images per severity")
    part = slice((severity - 1) * per, severity * per)
    chosen = labels[part] if labels.shape[0] == 5 * per else labels
    return (
        np.ascontiguousarray(images[part], dtype=np.uint8),
        np.asarray(chosen, dtype=np.int64),
        list(CIFAR10_CLASSES),
    )


# ---------------------------------------------------------------------------------------------- ImageNet-C
def read_imagenet_c(
    root: PathLike, corruption: str, severity: int, *, cache: PathLike | None = None, use_cache: bool = True
) -> Dataset:
    """``<root>/<corruption>/<severity>/<wnid>/*.JPEG`` decoded into memory, as stored (ImageNet-C images
    are already 224²): for samples. A whole folder is 50,000 images, 7.5 GB decoded: stream it with
    ``open_imagenet_c``, as the benchmark does.

    Labels are the canonical ImageNet-1k index of each image's wnid (as ``open_imagenet_c``'s), so a
    folder holding a subset of the classes keeps the right labels; class names are the 1,000 wnids.
    """
    folder, files = _imagenet_c_folder(root, corruption, severity)
    listing = [(str(f.relative_to(folder)), *_size_mtime(f)) for f in files]
    key = {
        "folder": str(folder.resolve()),
        "listing": hashlib.sha256(repr(listing).encode()).hexdigest(),
        "labels": "imagenet-1k",  # earlier versions numbered the folders found; never reuse their cache
    }
    return _cached("imagenet-c", key, lambda: _decode_imagenet_c(folder, files), cache, use_cache)


class ImageFiles:
    """Image files read on demand: an array-like of uint8 ``(N, H, W, 3)`` whose rows are decoded when
    indexed, so that a 50,000-image ImageNet-C folder costs its file list, not 7.5 GB of pixels.

    Images of ``size``² are kept as they are (ImageNet-C's are 224²); others are resized to 256 on the
    shorter side and centre-cropped to 224, as ImageNet-C was made. A file that cannot be decoded is a
    ``DatasetFormatError`` naming it.
    """

    def __init__(self, files: Sequence[Path], size: int = 224) -> None:
        self.files = list(files)
        self.size = size

    def __len__(self) -> int:
        return len(self.files)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (len(self.files), self.size, self.size, 3)

    def __getitem__(self, index: int | np.ndarray | Sequence[int]) -> np.ndarray:
        if isinstance(index, int | np.integer):
            return self._decode(self.files[int(index)])
        return np.stack([self._decode(self.files[int(i)]) for i in np.asarray(index).reshape(-1)])

    def _decode(self, path: Path) -> np.ndarray:
        try:
            with Image.open(path) as image:
                image = image.convert("RGB")
                if image.size != (self.size, self.size):
                    image = resize_center_crop(image, resize=self.size * 256 // 224, crop=self.size)
                return np.asarray(image, dtype=np.uint8)
        except (OSError, ValueError) as error:
            raise DatasetFormatError(f"cannot decode image {path}: {error}") from None


class EncodedBatch(list):
    """A batch of images still encoded: each a uint8 tensor of a file's bytes, in the batch's order, and
    ``files``, their paths, so that a file the device cannot decode is named. A loader's worker only reads
    them; the device decodes them (``zerosiam.data.tensors.decode_on``)."""

    def __init__(self, encoded: Iterable[torch.Tensor] = (), files: Iterable[Path] = ()) -> None:
        super().__init__(encoded)
        self.files = list(files)

    @classmethod
    def joined(cls, batches: Iterable[EncodedBatch]) -> EncodedBatch:
        """The files of several batches as one batch, batch after batch."""
        batches = list(batches)
        return cls(
            (data for batch in batches for data in batch), (path for batch in batches for path in batch.files)
        )


class EncodedFiles:
    """The files of an ``ImageFiles`` as their encoded bytes: what a batch is when the device decodes
    (``Speed(decode_on_device=True)``), so that a loader's workers read files and no more, where decoding
    a 224² JPEG on a core is slow beside a GPU's step on it."""

    def __init__(self, files: ImageFiles) -> None:
        self.source = files

    def __len__(self) -> int:
        return len(self.source)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return self.source.shape

    def __getitem__(self, index: int | np.ndarray | Sequence[int]) -> EncodedBatch:
        indices = [int(index)] if isinstance(index, int | np.integer) else np.asarray(index).reshape(-1)
        files = [self.source.files[int(i)] for i in indices]
        return EncodedBatch((self._read(path) for path in files), files)

    @staticmethod
    def _read(path: Path) -> torch.Tensor:
        try:
            data = path.read_bytes()
        except OSError as error:
            raise DatasetFormatError(f"cannot read image {path}: {error}") from None
        if not data:
            raise DatasetFormatError(f"cannot read image {path}: the file is empty")
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def open_imagenet_c(
    root: PathLike, corruption: str, severity: int, wnids: Sequence[str]
) -> tuple[ImageFiles, np.ndarray]:
    """``<root>/<corruption>/<severity>/<wnid>/*.JPEG``, streamed: the files (decoded when indexed) and
    their labels, the canonical ImageNet-1k index of each wnid in ``wnids`` (the 1,000 sorted wnids), so
    a folder holding a subset of the classes keeps the labels of the full set."""
    folder, files = _imagenet_c_folder(root, corruption, severity)
    return ImageFiles(files), np.array(_canonical_labels(files, wnids, folder), dtype=np.int64)


def _canonical_labels(files: Sequence[Path], wnids: Sequence[str], folder: Path) -> list[int]:
    index = {wnid: position for position, wnid in enumerate(wnids)}
    unknown = sorted({f.parent.name for f in files} - set(index))
    if unknown:
        raise DatasetFormatError(f"{folder} has class folders that are no ImageNet-1k wnid: {unknown[:5]}")
    return [index[f.parent.name] for f in files]


IMAGENET_WNIDS = Path(__file__).with_name("imagenet1k_wnids.txt")


def imagenet_wnids() -> list[str]:
    """The 1,000 ImageNet-1k wnids in canonical label order (sorted, as torchvision's ImageFolder and
    every published ImageNet-C evaluation number them), shipped with the package. The list was read from
    the ImageNet sample's file names (one image per class); ``tests/data`` checks that it still matches."""
    return IMAGENET_WNIDS.read_text().split()


def _size_mtime(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


def _imagenet_c_folder(root: PathLike, corruption: str, severity: int) -> tuple[Path, list[Path]]:
    """``<root>/<corruption>/<severity>`` and its images (``_imagenet_c_files``); a missing folder or a bad
    severity is an error naming it."""
    _check_severity(severity)
    folder = Path(root) / corruption / str(severity)
    if not folder.is_dir():
        raise FileNotFoundError(f"ImageNet-C folder {folder} does not exist")
    return folder, _imagenet_c_files(folder)


def _imagenet_c_files(folder: Path) -> list[Path]:
    """The images of every class folder, classes and files in sorted order; an empty class folder or an
    empty file is an error naming it (a copy that stopped half-way)."""
    classes = sorted(d for d in folder.iterdir() if d.is_dir())
    if not classes:
        raise DatasetFormatError(f"{folder} has no class folders")
    files = []
    for directory in classes:
        found = sorted(f for f in directory.iterdir() if f.suffix.lower() in _IMAGE_SUFFIXES)
        if not found:
            raise DatasetFormatError(f"class folder {directory} holds no images")
        empty = [f for f in found if f.stat().st_size == 0]
        if empty:
            raise DatasetFormatError(f"image file {empty[0]} is empty")
        files.extend(found)
    return files


def _decode_imagenet_c(folder: Path, files: list[Path]) -> Dataset:
    wnids = imagenet_wnids()
    labels = _canonical_labels(files, wnids, folder)
    return _as_dataset([_decode_rgb(f, f) for f in files], labels, wnids, folder)


# ---------------------------------------------------------------------------------------------- CIFAR python
class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles plain containers and numpy arrays only: a downloaded pickle cannot run code."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }

    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name} from a CIFAR batch")
        return super().find_class(module, name)


def _unpickle(data: bytes) -> dict[str, object]:
    raw = _ArrayUnpickler(io.BytesIO(data), encoding="bytes").load()
    if not isinstance(raw, dict):
        raise DatasetFormatError("a CIFAR batch must unpickle to a dict")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in raw.items()}


def read_cifar10_python(
    path: PathLike, split: str = "test", *, cache: PathLike | None = None, use_cache: bool = True
) -> Dataset:
    """The official ``cifar-10-python.tar.gz`` (pickled ``data_batch_1..5`` / ``test_batch``)."""
    if split not in CIFAR10_SPLITS:
        raise ValueError(f"split must be one of {CIFAR10_SPLITS}, got {split!r}")
    source = Path(path)
    if not source.is_file():
        raise FileNotFoundError(f"CIFAR-10 python tarball {source} does not exist")
    key = {**_file_identity(source), "split": split}
    return _cached("cifar10-python", key, lambda: _decode_cifar_python(source, split), cache, use_cache)


def _decode_cifar_python(path: Path, split: str) -> Dataset:
    wanted = ["test_batch"] if split == "test" else [f"data_batch_{i}" for i in range(1, 6)]
    members = _read_members(path, {*wanted, "batches.meta"})
    images, labels = [], []
    for batch_name in wanted:
        batch = _unpickle(members[batch_name])
        data = np.asarray(batch["data"], dtype=np.uint8)
        if data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
            raise DatasetFormatError(f"{path}:{batch_name} data has shape {data.shape}; expected (N, 3072)")
        images.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        labels.append(np.asarray(batch["labels"], dtype=np.int64))
    meta = _unpickle(members["batches.meta"])
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in meta["label_names"]]
    return np.ascontiguousarray(np.concatenate(images)), np.concatenate(labels), names


def _read_members(path: Path, wanted: set[str]) -> dict[str, bytes]:
    """The bytes of the members whose base name is in ``wanted``; every one must be present."""
    found: dict[str, bytes] = {}
    with tarfile.open(path) as archive:
        for member in archive:
            base = PurePosixPath(member.name).name
            handle = archive.extractfile(member) if member.isfile() and base in wanted else None
            if handle is not None:
                found[base] = handle.read()
    missing = sorted(wanted - found.keys())
    if missing:
        raise DatasetFormatError(f"{path} lacks {missing}")
    return found
