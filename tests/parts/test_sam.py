"""SAM as a recipe step: the two passes, and the second restricted to the first one's selection."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import zerosiam
from tests.toys import tiny
from zerosiam.methods.tent import tent
from zerosiam.parts.contract import Evaluation
from zerosiam.parts.layout import ONE_STREAM
from zerosiam.parts.losses import entropy
from zerosiam.parts.sam import SAM, sam


def test_sam_step_equals_a_manual_two_pass_computation():
    model, lr, rho = tiny(scale=3.0), 0.1, 0.05
    reference = copy.deepcopy(model)
    x = torch.rand(6, 3, 8, 8)
    adapter = zerosiam.adapt(model, tent.with_(name="tent-sam", step=SAM(rho)), lr=lr)
    adapter(x)

    params = [reference.gn.weight, reference.gn.bias]
    entropy(reference(x)).mean().backward()
    grads = [p.grad.clone() for p in params]
    norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
    with torch.no_grad():
        for p, g in zip(params, grads, strict=True):
            p.add_(rho * g / norm)
            p.grad = None
    entropy(reference(x)).mean().backward()
    with torch.no_grad():
        for p, g in zip(params, grads, strict=True):
            p.sub_(rho * g / norm)
            p.sub_(lr * p.grad)  # SGD's first step with momentum: the buffer is the gradient itself
    assert torch.allclose(model.gn.weight, reference.gn.weight, atol=1e-6)
    assert torch.allclose(model.gn.bias, reference.gn.bias, atol=1e-6)
    assert not torch.allclose(model.gn.weight, tiny(scale=3.0).gn.weight)


def test_sam_second_pass_is_restricted_to_the_first_selection():
    calls = []
    first_mask = torch.tensor([True, False, True])

    def closure(restrict=None):
        calls.append(restrict)
        loss = (adapter.trainable[0] ** 2).sum()
        mask = first_mask if restrict is None else restrict & torch.tensor([True, True, False])
        return Evaluation(loss, mask, None, {})

    weight = nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([weight], lr=0.1)

    def backward(loss):
        optimizer.zero_grad()
        loss.backward()
        return True

    held = []
    adapter = SimpleNamespace(
        trainable=[weight],
        optimizer=optimizer,
        layout=ONE_STREAM,
        backward=backward,
        hold=lambda reason, streams: held.append(bool(streams)),
    )
    evaluations = SAM(0.05)(adapter, closure)
    assert calls[0] is None and torch.equal(calls[1], first_mask)
    assert evaluations[1].selected == 1
    assert held == [False]  # the second pass kept a sample: the step was not held back


def test_the_old_sam_factory_warns_and_returns_the_step() -> None:
    with pytest.warns(DeprecationWarning, match="SAM"):
        step = sam(0.1)
    assert step == SAM(0.1)
