"""Tests of the corruption engine: API contract, reproducibility, severity ordering and the spec's details."""

from __future__ import annotations

import io
import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage

from zerosiam import corruptions
from zerosiam.assets import AssetError
from zerosiam.corruptions import _common, api, blur, digital, weather
from zerosiam.corruptions.presets import PER_PIXEL, PRESETS

RANDOM = tuple(name for name in corruptions.ALL if corruptions.CORRUPTIONS[name].random)
DETERMINISTIC = tuple(name for name in corruptions.ALL if not corruptions.CORRUPTIONS[name].random)


def natural_like(n: int, size: int, seed: int = 0) -> np.ndarray:
    """Images with smooth gradients, sharp edges and mild texture, so blurs and noise act visibly."""
    rng = np.random.default_rng(seed)
    rows, cols = np.mgrid[0:size, 0:size] / size
    out = []
    for _ in range(n):
        image = 0.3 + 0.3 * rows[..., None] * rng.uniform(-1, 1, 3)
        for _ in range(6):  # waves of random frequency and direction, not aligned with any pixel grid
            freq, angle, phase = rng.uniform(2, 9), rng.uniform(0, np.pi), rng.uniform(0, 2 * np.pi)
            wave = np.sin(2 * np.pi * freq * (rows * np.cos(angle) + cols * np.sin(angle)) + phase)
            image = image + 0.08 * wave[..., None] * rng.uniform(0.2, 1, 3)
        image = image + 0.05 * rng.random((size, size, 3))
        out.append(np.clip(image * 255, 0, 255).astype(np.uint8))
    return np.stack(out)


def skip_without_frost_textures(name: str) -> None:
    """Frost reads its textures through the asset registry; skip (not fail) where none can be had."""
    if name != "frost":
        return
    try:
        weather.frost_textures(1)
    except AssetError as error:
        pytest.skip(f"frost textures unavailable: {error}")


@pytest.fixture(scope="module")
def cifar_batch() -> np.ndarray:
    return natural_like(3, 32)


@pytest.fixture(scope="module")
def imagenet_batch() -> np.ndarray:
    return natural_like(1, 224, seed=1)


# ------------------------------------------------------------------------------------------- registry
def test_names_and_groups_follow_the_benchmark() -> None:
    assert corruptions.BENCHMARK == (
        "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur",
        "zoom_blur", "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate",
        "jpeg_compression",
    )  # fmt: skip
    assert corruptions.EXTRA == ("speckle_noise", "gaussian_blur", "spatter", "saturate")
    assert sum(corruptions.GROUPS.values(), ()) == corruptions.BENCHMARK
    # Hendrycks & Dietterich's figure 1 and the paper's tables: 3/4/4/4, brightness under Weather
    assert corruptions.GROUPS["weather"] == ("snow", "frost", "fog", "brightness")
    assert corruptions.GROUPS["digital"] == ("contrast", "elastic_transform", "pixelate", "jpeg_compression")
    for preset in PRESETS.values():
        assert set(preset.table) == set(corruptions.ALL)
        assert all(len(values) == 5 for values in preset.table.values())


# ------------------------------------------------------------------------------------------- contract
@pytest.mark.parametrize("name", corruptions.ALL)
def test_every_corruption_and_severity_runs_in_both_presets(name, cifar_batch, imagenet_batch) -> None:
    skip_without_frost_textures(name)
    for preset, batch in (("cifar", cifar_batch), ("imagenet", imagenet_batch)):
        before = batch.copy()
        outs = [corruptions.apply(batch, name, severity, preset) for severity in corruptions.SEVERITIES]
        for out in outs:
            assert out.dtype == np.uint8 and out.shape == batch.shape
        assert np.array_equal(batch, before), "the input must not be modified"
        assert any(not np.array_equal(out, batch) for out in outs), f"{name} changed nothing in {preset}"


def test_empty_batch_gives_empty_result() -> None:
    out = corruptions.apply(np.zeros((0, 32, 32, 3), np.uint8), "gaussian_noise", 3)
    assert out.shape == (0, 32, 32, 3) and out.dtype == np.uint8


# ------------------------------------------------------------------------------------------- randomness
@pytest.mark.parametrize("name", RANDOM)
def test_random_corruptions_are_reproducible_and_independent_of_the_batch(name, cifar_batch) -> None:
    skip_without_frost_textures(name)
    severity = 3
    batch = corruptions.apply(cifar_batch, name, severity, seed=7)
    assert np.array_equal(batch, corruptions.apply(cifar_batch, name, severity, seed=7))
    for i in range(len(cifar_batch)):
        alone = corruptions.apply(cifar_batch[i : i + 1], name, severity, seed=7, start_index=i)
        assert np.array_equal(alone[0], batch[i])
    other_seed = corruptions.apply(cifar_batch, name, severity, seed=8)
    assert not np.array_equal(batch, other_seed)
    # the same pixels at another position get other randomness
    shifted = corruptions.apply(cifar_batch, name, severity, seed=7, start_index=1)
    assert not np.array_equal(shifted[0], batch[0])


def test_chunking_does_not_change_results(monkeypatch, cifar_batch) -> None:
    whole = corruptions.apply(cifar_batch, "glass_blur", 5, seed=3)
    monkeypatch.setattr(api, "_CHUNK_PIXELS", 32 * 32)  # one image per chunk
    assert np.array_equal(whole, corruptions.apply(cifar_batch, "glass_blur", 5, seed=3))


@pytest.mark.parametrize("name", DETERMINISTIC)
def test_deterministic_corruptions_ignore_the_seed(name, cifar_batch) -> None:
    a = corruptions.apply(cifar_batch, name, 4, seed=0)
    assert np.array_equal(a, corruptions.apply(cifar_batch, name, 4, seed=123, start_index=5))


# ------------------------------------------------------------------------------------------- severity
@pytest.mark.parametrize(
    "name",
    ["gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise", "defocus_blur", "gaussian_blur",
     "zoom_blur", "contrast", "brightness", "pixelate", "snow"],
)  # fmt: skip
@pytest.mark.parametrize("preset", ["cifar", "imagenet"])
def test_damage_grows_with_severity(name, preset, cifar_batch, imagenet_batch) -> None:
    batch = cifar_batch if preset == "cifar" else imagenet_batch
    damage = [
        np.abs(corruptions.apply(batch, name, s, preset).astype(float) - batch).mean()
        for s in corruptions.SEVERITIES
    ]
    assert all(b > a for a, b in zip(damage, damage[1:], strict=False)), damage


@pytest.mark.parametrize("name", corruptions.BENCHMARK)
def test_the_ccc_scale_is_cifars_with_imagenets_per_pixel_constants(name, cifar_batch) -> None:
    """``cifar-ccc`` takes ImageNet-C's constants only where they act on each pixel (the same image as
    ``imagenet`` would make of it, at 32 pixels), CIFAR-10-C's elsewhere; and it is harsher there."""
    skip_without_frost_textures(name)
    ccc = corruptions.apply(cifar_batch, name, 5, "cifar-ccc")
    cifar = corruptions.apply(cifar_batch, name, 5, "cifar")
    if name not in PER_PIXEL:
        np.testing.assert_array_equal(ccc, cifar)
        return
    assert PRESETS["cifar-ccc"].params(name, 5) == PRESETS["imagenet"].params(name, 5)
    damage = [np.abs(x.astype(float) - cifar_batch).mean() for x in (cifar, ccc)]
    assert damage[1] > damage[0], damage


# ------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"images": np.zeros((1, 32, 32, 3), np.float32)}, TypeError, "uint8"),
        ({"images": [[0]]}, TypeError, "numpy array"),
        ({"images": np.zeros((32, 32, 3), np.uint8)}, ValueError, "shape"),
        ({"images": np.zeros((1, 32, 32, 1), np.uint8)}, ValueError, "shape"),
        ({"images": np.zeros((1, 224, 224, 3), np.uint8)}, ValueError, "preset 'cifar'"),
        ({"name": "rain"}, ValueError, "unknown corruption 'rain'"),
        ({"preset": "tiny"}, ValueError, "unknown preset"),
        ({"severity": 0}, ValueError, "severity"),
        ({"severity": 6}, ValueError, "severity"),
        ({"severity": 2.0}, ValueError, "severity"),
        ({"severity": True}, ValueError, "severity"),
        ({"seed": -1}, ValueError, "seed"),
        ({"start_index": -2}, ValueError, "start_index"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, error, match) -> None:
    args = {"images": np.zeros((1, 32, 32, 3), np.uint8), "name": "fog", "severity": 1, "preset": "cifar"}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        corruptions.apply(**args)


# ------------------------------------------------------------------------------------------- the spec
def test_zoom_factor_lists_keep_the_reference_counts() -> None:
    counts = {
        preset: [len(blur.zoom_factors(*PRESETS[preset].params("zoom_blur", s))) for s in range(1, 6)]
        for preset in ("imagenet", "cifar")
    }
    assert counts == {"imagenet": [12, 16, 11, 13, 11], "cifar": [7, 12, 16, 21, 26]}


def test_clipped_zoom_matches_scipy_zoom_and_crop() -> None:
    field = np.random.default_rng(0).random((1, 32, 32))
    for zoom in (1.06, 1.75, 2.25, 1.25):
        crop = int(np.ceil(32 / zoom))
        top = (32 - crop) // 2
        zoomed = ndimage.zoom(field[0, top : top + crop, top : top + crop], zoom, order=1)
        trim = (zoomed.shape[0] - 32) // 2
        expected = zoomed[trim : trim + 32, trim : trim + 32]
        np.testing.assert_allclose(_common.clipped_zoom(field, zoom)[0], expected, atol=1e-12)


def test_gaussian_matrix_matches_scipy_even_beyond_the_image() -> None:
    field = np.random.default_rng(1).random((1, 32, 32))
    for sigma, border, mode, truncate in ((0.7, "edge", "nearest", 4.0), (25.0, "symmetric", "reflect", 3.0)):
        ours = _common.separable(field, _common.gaussian_matrix(sigma, 32, border, truncate))[0]
        expected = ndimage.gaussian_filter(field[0], sigma, mode=mode, truncate=truncate)
        np.testing.assert_allclose(ours, expected, atol=1e-12)


def test_defocus_kernel_is_not_renormalized_where_the_disk_touches_the_grid() -> None:
    assert blur.disk_kernel(8, 0.5).sum() == pytest.approx(1.0130, abs=2e-4)
    assert blur.disk_kernel(10, 0.5).sum() == pytest.approx(1.0108, abs=2e-4)
    assert blur.disk_kernel(3, 0.5).sum() == pytest.approx(1.0, abs=1e-12)
    assert blur.disk_kernel(1.5, 0.1)[1:4, 1:4] == pytest.approx(np.full((3, 3), 1 / 9), abs=1e-12)


@pytest.mark.parametrize(("size", "delta"), [(24, 1), (30, 2), (36, 3), (40, 4)])
def test_parallel_glass_pass_equals_the_sequential_scan(size, delta) -> None:
    rng = np.random.default_rng(size)
    visited = blur._scan_order(size, size, delta)
    offsets = rng.integers(-delta, delta, size=(1, len(visited), 2))
    image = rng.integers(0, 256, (size, size))
    sequential, k = image.copy(), 0
    for h in range(size - delta, delta, -1):
        for w in range(size - delta, delta, -1):
            dx, dy = offsets[0, k]
            sequential[h, w] = sequential[h + dy, w + dx]
            k += 1
    parallel = image.ravel()[blur._pass_sources(visited, offsets, size, size)[0]].reshape(size, size)
    assert np.array_equal(parallel, sequential)


def test_pixelate_is_pillow_box_resizing(cifar_batch) -> None:
    for severity in corruptions.SEVERITIES:
        small = int(32 * PRESETS["cifar"].params("pixelate", severity))
        expected = [
            np.asarray(Image.fromarray(img).resize((small, small), Image.BOX).resize((32, 32), Image.BOX))
            for img in cifar_batch
        ]
        assert np.array_equal(corruptions.apply(cifar_batch, "pixelate", severity), np.stack(expected))


def test_jpeg_is_a_pillow_round_trip(cifar_batch) -> None:
    buffer = io.BytesIO()
    Image.fromarray(cifar_batch[0]).save(buffer, format="JPEG", quality=40)
    expected = np.asarray(Image.open(buffer).convert("RGB"))
    assert np.array_equal(corruptions.apply(cifar_batch, "jpeg_compression", 5)[0], expected)


def test_motion_blur_smears_a_point_one_sided_and_keeps_flat_images() -> None:
    image = np.zeros((1, 32, 32, 1), np.uint8)
    image[0, 16, 16] = 255
    out = _common.motion_blur(image, 6, 2, np.array([0.0]))[0, :, :, 0]
    assert out[16, 16] == out.max() and out[16, 11:16].min() > 0  # streak to the left at θ = 0
    assert out[16, 17:].max() == 0 and np.count_nonzero(out[:16]) == 0
    flat = np.full((2, 32, 32, 3), 100, np.uint8)
    assert np.array_equal(_common.motion_blur(flat, 9, 2.5, np.array([-30.0, 40.0])), flat)


def _imagemagick() -> str | None:
    """The real ImageMagick ``convert``, or None (a stand-in of the same name does not count)."""
    for path in filter(None, (shutil.which("convert", path="/usr/bin"), shutil.which("convert"))):
        version = subprocess.run([path, "-version"], capture_output=True, text=True).stdout
        if version.startswith("Version: ImageMagick"):  # a stand-in only complains on stderr
            return path
    return None


@pytest.mark.skipif(_imagemagick() is None, reason="ImageMagick is not installed")
@pytest.mark.parametrize(("radius", "sigma", "angle"), [(9, 2.5, 22.2), (12, 12, -101.0), (20, 15, -45.0)])
def test_motion_blur_equals_imagemagick(tmp_path, cifar_batch, radius, sigma, angle) -> None:
    image = cifar_batch[0]
    source, target = tmp_path / "in.png", tmp_path / "out.png"
    Image.fromarray(image).save(source)
    subprocess.run([_imagemagick(), source, "-motion-blur", f"{radius}x{sigma}+{angle}", target], check=True)
    theirs = np.asarray(Image.open(target).convert("RGB"))
    assert np.array_equal(_common.motion_blur(image[None], radius, sigma, np.array([angle]))[0], theirs)


def test_brightness_and_saturate_closed_forms() -> None:
    image = np.array([[[[0, 0, 0], [10, 10, 10], [200, 100, 50], [255, 255, 255]]]], np.uint8)
    bright = weather.brightness(image, 0.1, [])[0, 0]
    assert bright[0].tolist() == [25, 25, 25]  # black becomes grey (c, c, c)
    assert bright[3].tolist() == [255, 255, 255]  # saturated stays saturated
    assert bright[2][0] == 225 and bright[2][1] < bright[2][0]  # gain on the value keeps the hue
    tinted = digital.saturate(image, (5, 0.2), [])[0, 0]
    assert tinted[1].tolist() == [10, 8, 8]  # the reference's red tint of grey pixels


def test_noise_statistics_match_the_constants() -> None:
    grey = np.full((4, 32, 32, 3), 128, np.uint8)
    c = PRESETS["cifar"].params("gaussian_noise", 5)
    noisy = corruptions.apply(grey, "gaussian_noise", 5).astype(float) / 255
    assert np.std(noisy) == pytest.approx(c, rel=0.05)
    c = PRESETS["cifar"].params("impulse_noise", 5)
    flipped = corruptions.apply(grey, "impulse_noise", 5) != 128  # decided per channel
    assert flipped.mean() == pytest.approx(c, abs=0.01)
    assert flipped.any(axis=-1).mean() == pytest.approx(1 - (1 - c) ** 3, abs=0.02)  # channels independent


def test_frost_blends_a_texture_on_the_0_255_scale() -> None:
    skip_without_frost_textures("frost")
    black = np.zeros((2, 32, 32, 3), np.uint8)
    out = corruptions.apply(black, "frost", 1).astype(float)
    # on black, the result is b·texture with b = 0.2: bright frost can reach at most 0.2·255
    assert 0 < out.max() <= 0.2 * 255 + 1 and out.std() > 0
