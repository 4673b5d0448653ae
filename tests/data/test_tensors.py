"""The readers' uint8 NHWC images become the models' float NCHW input in [0, 1]."""

import numpy as np
import pytest
import torch

from zerosiam.data.tensors import to_input


def test_a_pixel_lands_on_its_channel_plane_scaled_to_one() -> None:
    images = np.zeros((2, 4, 5, 3), dtype=np.uint8)
    images[1, 2, 3] = (255, 51, 0)
    x = to_input(images)
    assert x.dtype == torch.float32 and x.shape == (2, 3, 4, 5)
    assert x[1, :, 2, 3].tolist() == pytest.approx([1.0, 0.2, 0.0])
    assert float(x.sum()) == pytest.approx(1.2)


def test_a_tensor_and_an_array_give_the_same_input() -> None:
    images = np.random.default_rng(0).integers(0, 256, (3, 6, 6, 3), dtype=np.uint8)
    assert torch.equal(to_input(images), to_input(torch.from_numpy(images)))


def test_a_sliced_array_is_made_contiguous() -> None:
    images = np.random.default_rng(1).integers(0, 256, (4, 6, 6, 3), dtype=np.uint8)
    assert torch.equal(to_input(images[::2]), to_input(images[[0, 2]]))


def test_a_read_only_array_is_not_shared_with_a_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch warns (once per process, so a warning check could pass by order) when a tensor shares a
    read-only array, as the datasets' cached memmaps are: what reaches ``from_numpy`` must be writable."""
    shared = []
    from_numpy = torch.from_numpy
    monkeypatch.setattr(
        torch, "from_numpy", lambda array: shared.append(array.flags.writeable) or from_numpy(array)
    )
    images = np.random.default_rng(2).integers(0, 256, (2, 4, 4, 3), dtype=np.uint8)
    frozen = images.copy()
    frozen.flags.writeable = False
    assert torch.equal(to_input(frozen), to_input(images))
    assert shared == [True, True]


@pytest.mark.parametrize(
    ("images", "shown"),
    [
        (np.zeros((1, 4, 4, 3), dtype=np.float32), "float32"),
        (np.zeros((1, 3, 4, 4), dtype=np.uint8), "(1, 3, 4, 4)"),
        (np.zeros((4, 4, 3), dtype=np.uint8), "(4, 4, 3)"),
    ],
)
def test_what_is_not_uint8_nhwc_is_refused_by_name(images: np.ndarray, shown: str) -> None:
    with pytest.raises(ValueError, match=r"uint8 images of shape \(B, H, W, 3\)") as error:
        to_input(images)
    assert shown in str(error.value)
