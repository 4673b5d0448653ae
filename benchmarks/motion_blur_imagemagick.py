"""Check the motion-blur kernel of zerosiam.corruptions against ImageMagick itself, pixel by pixel.

    apt-get install imagemagick          # test-only; zerosiam never calls ImageMagick
    python benchmarks/motion_blur_imagemagick.py --images 16

The original ImageNet-C and CIFAR-10-C scripts blur with ImageMagick (Wand's ``motion_blur(radius, sigma,
angle)``, the same call as ``convert -motion-blur RADIUSxSIGMA+ANGLE``). ``zerosiam.corruptions`` has its
own NumPy line kernel written to ImageMagick's semantics. This script feeds both the same real images
(CIFAR-10 JPEG q75 test images at 32×32, ImageNet sample images at 224×224) at every severity's
(radius, sigma) of each preset and at fixed angles spanning the corruption's range, and it also blurs the
grey flake layer the way ``snow`` does (angles in [−135°, −45°)).

Tolerance: the exact kernel is the same, so the only differences allowed are rounding ones — at most
0.5 % of values off by one grey level and none by more than one.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from zerosiam.corruptions._common import motion_blur
from zerosiam.corruptions.presets import PRESETS
from zerosiam.data.sources import read_cifar10_jpeg, read_imagenet_sample

MOTION_ANGLES = (-45.0, -31.3, -12.0, 0.0, 7.5, 22.2, 44.9)
SNOW_ANGLES = (-135.0, -118.4, -90.0, -67.7, -45.1)


def imagemagick() -> str:
    """The path of ImageMagick's ``convert``, refusing stand-ins that are not ImageMagick."""
    path = shutil.which("convert", path="/usr/bin") or shutil.which("convert")
    if path is None:
        raise SystemExit("ImageMagick is not installed: apt-get install imagemagick")
    version = subprocess.run([path, "-version"], capture_output=True, text=True).stdout
    if not version.startswith("Version: ImageMagick"):
        raise SystemExit(f"{path} is not ImageMagick: apt-get install imagemagick")
    return path


def magick_blur(convert: str, image: np.ndarray, radius: float, sigma: float, angle: float) -> np.ndarray:
    """Blur one uint8 (H, W, C) image with ``convert -motion-blur`` through lossless PNG files."""
    with tempfile.TemporaryDirectory() as folder:
        source, target = Path(folder, "in.png"), Path(folder, "out.png")
        mode = "L" if image.shape[-1] == 1 else "RGB"
        Image.fromarray(image.squeeze(-1) if mode == "L" else image).save(source)
        blur = ["-motion-blur", f"{radius}x{sigma}+{angle}"]
        subprocess.run([convert, str(source), *blur, str(target)], check=True)
        out = np.asarray(Image.open(target).convert(mode))
    return out[..., None] if mode == "L" else out


def compare(convert: str, images: np.ndarray, radius: float, sigma: float, angles: tuple[float, ...]) -> dict:
    """Differences between ours and ImageMagick's over every image × angle."""
    diffs = []
    for angle in angles:
        ours = motion_blur(images, radius, sigma, np.full(len(images), angle))
        for image, mine in zip(images, ours, strict=True):
            theirs = magick_blur(convert, image, radius, sigma, angle)
            diffs.append(np.abs(mine.astype(np.int16) - theirs.astype(np.int16)).ravel())
    diff = np.concatenate(diffs)
    share = float((diff == 1).mean())
    return {"values": diff.size, "mad": float(diff.mean()), "max": int(diff.max()), "off_by_one": share}


def flake_layers(count: int, size: int, seed: int) -> np.ndarray:
    """Grey uint8 layers like snow's thresholded flakes: mostly black with scattered bright specks."""
    rng = np.random.default_rng(seed)
    field = rng.normal(0.1, 0.3, size=(count, size, size, 1))
    return (np.clip(np.where(field < 0.5, 0.0, field), 0, 1) * 255).astype(np.uint8)


def rows(convert: str, preset: str, images: np.ndarray, seed: int):
    """One table row per (severity, layer): the RGB images under motion_blur, then snow's flake layer."""
    for severity in range(1, 6):
        radius, sigma = PRESETS[preset].params("motion_blur", severity)
        flake_radius, flake_sigma = PRESETS[preset].params("snow", severity)[4:6]
        flakes = flake_layers(len(images), images.shape[1], seed + severity)
        yield severity, "RGB image", (radius, sigma), compare(convert, images, radius, sigma, MOTION_ANGLES)
        yield (
            severity,
            "snow flakes",
            (flake_radius, flake_sigma),
            compare(convert, flakes, flake_radius, flake_sigma, SNOW_ANGLES),
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--images", type=int, default=16, help="real images per preset")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    convert = imagemagick()
    version = subprocess.run([convert, "-version"], capture_output=True, text=True).stdout.splitlines()[0]
    print(f"reference: {version}")
    rng = np.random.default_rng(args.seed)
    cifar = read_cifar10_jpeg("test")[0]
    imagenet = read_imagenet_sample()[0]
    sources = {
        "cifar": cifar[rng.choice(len(cifar), args.images, replace=False)],
        "imagenet": imagenet[rng.choice(len(imagenet), min(args.images, 6), replace=False)],
    }
    print("| preset | layer | severity | radius, sigma | values | mean abs diff | max | share off by 1 |")
    print("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |")
    worst_max, worst_share = 0, 0.0
    for preset, images in sources.items():
        for severity, layer, (radius, sigma), stats in rows(convert, preset, images, args.seed):
            worst_max, worst_share = max(worst_max, stats["max"]), max(worst_share, stats["off_by_one"])
            print(
                f"| {preset} | {layer} | {severity} | {radius}, {sigma} | {stats['values']:,} "
                f"| {stats['mad']:.4f} | {stats['max']} | {100 * stats['off_by_one']:.3f} % |",
                flush=True,
            )
    verdict = "PASS" if worst_max <= 1 and worst_share <= 0.005 else "FAIL"
    print(f"worst: max diff {worst_max}, off by one {100 * worst_share:.3f} % -> {verdict}")


if __name__ == "__main__":
    main()
