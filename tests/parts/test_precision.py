"""The forward's precision: tf32 turns on tensor cores for the block and restores torch's settings."""

from __future__ import annotations

import pytest
import torch

from zerosiam.parts.precision import check_precision, forward_precision, tensor_cores


def _flags() -> tuple[bool, bool]:
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


@pytest.fixture
def strict_fp32():
    saved = _flags()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_tf32_allows_tensor_cores_inside_the_block_only(strict_fp32: None) -> None:
    with tensor_cores("tf32"):
        assert _flags() == (True, True)
    assert _flags() == (False, False)
    with forward_precision("tf32", torch.device("cpu")):
        assert _flags() == (True, True)
    assert _flags() == (False, False)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_other_precisions_leave_the_settings_alone(strict_fp32: None, precision: str) -> None:
    with tensor_cores(precision):
        assert _flags() == (False, False)


def test_tf32_restores_the_settings_after_an_error(strict_fp32: None) -> None:
    with pytest.raises(RuntimeError), tensor_cores("tf32"):
        raise RuntimeError
    assert _flags() == (False, False)


def test_unknown_precision_names_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown precision 'fp8'; choose one of fp32, tf32, bf16, fp16"):
        check_precision("fp8")
