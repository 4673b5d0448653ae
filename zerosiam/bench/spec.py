"""A run's identity: the ``RunSpec`` that names everything a run's result depends on, and its run id.

The spec is what a grid expands into, what a worker receives, what the store keys a row by and what the
blind spot's cache of source-model mistakes is named after. It sits apart from the runner that executes
it, so that each of those imports the spec without importing the others.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from zerosiam.bench.store import run_id_for
from zerosiam.methods import get_recipe
from zerosiam.parts.guards import guard_named
from zerosiam.parts.precision import check_precision
from zerosiam.protocols.build import CCC, CCC_TARGET, PROTOCOLS, SEQUENCES
from zerosiam.zoo.trained import shipped_sha256

KIND = "vision"  # the store's kind of a RunSpec's rows (language runs store their own)
# RunSpec fields younger than the stores, and their defaults: not in a run's identity while at them
NO_GUARD = "none"  # the guard of every run stored before guards existed
LATER_FIELDS = {"prelude": {}, "guard": NO_GUARD, "replica": 0, "target": CCC_TARGET}


def without_later_defaults(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``spec`` less its fields younger than the stores (``LATER_FIELDS``) while at their defaults: what a
    run stored before such a field existed and the same run stored after it have in common."""
    return {
        key: value for key, value in spec.items() if not (key in LATER_FIELDS and value == LATER_FIELDS[key])
    }


def check_prelude(prelude: dict[str, Any]) -> None:
    """A prelude names a known method and a positive number of steps (its other keys are that method's
    options); anything else is refused in one line before the run starts."""
    if "method" not in prelude or "steps" not in prelude:
        raise ValueError(f"a prelude needs a method and a number of steps, got {sorted(prelude)}")
    get_recipe(prelude["method"])  # a ValueError naming the methods if it is unknown
    steps = prelude["steps"]
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"a prelude's steps must be a positive integer, got {steps!r}")


def check_target(protocol: str, target: float) -> None:
    """A CCC stream's target is a source accuracy in (0, 100) %; no other protocol takes one."""
    if isinstance(target, bool) or not isinstance(target, int | float) or not 0 < target < 100:
        raise ValueError(f"a CCC target is a source accuracy in % between 0 and 100, got {target!r}")
    if protocol != CCC and target != CCC_TARGET:
        raise ValueError(f"only the ccc protocol takes a target, not {protocol!r} (got target {target!r})")


@dataclass(frozen=True)
class RunSpec:
    """Everything that determines a run's result. ``hparams`` are ``adapt`` overrides (lr, predictor_lr, …).

    ``corruption`` is the protocol's name for the protocols that stream all 15 corruptions in one run
    (``mixed``, ``continual``, ``gradual``, ``ccc``).
    ``stream_length`` sets T for label shift (default: the dataset size), the length of the blind-spot
    stream (default: one pass over the source model's mistakes, as the paper) and of the gradual and CCC
    streams (default 100,000); ``noise`` the noise-prefix length; ``epochs`` the passes of the epochs
    protocol; ``target`` the source model's accuracy (%) a CCC stream is calibrated to hold (only CCC
    takes one).
    ``precision`` is the forward's (``fp32``, ``bf16``, ``fp16``); ``model_options`` go to
    ``zerosiam.load_model`` (mean, std, checkpoint, … of a ``timm:``/``builder:``/``torchscript:`` model).
    ``prelude`` (``{"method": "tent", "steps": 100, "lr_scale": 10}``) lets another method adapt the
    stream's first ``steps`` batches before ``method`` takes the adapted model over (a ``Relay``); those
    batches are scored apart, as ``prelude_accuracy``. ``guard`` names the guard the method wears
    (``zerosiam.parts.guards``: none, rdumb, sar, auto, asr). The device is not here: it is where a run
    computes, not what it computes.
    ``replica`` numbers the executions of one spec that the noise study makes: replica 0 is the run as
    it always was; a replica ``r`` ≥ 1 moves every adapted input value by one float32 rounding step, in a
    pattern drawn from ``r`` (``zerosiam.bench.noise``), which changes what a run computes by no more than
    another machine's rounding does, so that how far one spec's number moves can be measured on one
    machine.
    """

    model: str
    dataset: str
    corruption: str
    severity: int
    protocol: str
    method: str
    seed: int = 0
    batch_size: int = 64
    limit: int | None = None
    imbalance_ratio: float = math.inf
    stream_length: int | None = None
    noise: int = 1000
    epochs: int = 1
    precision: str = "fp32"
    model_options: dict[str, Any] = field(default_factory=dict)
    hparams: dict[str, Any] = field(default_factory=dict)
    prelude: dict[str, Any] = field(default_factory=dict)
    guard: str = "none"
    replica: int = 0
    target: float = CCC_TARGET

    def __post_init__(self) -> None:
        check_precision(self.precision)
        guard_named(self.guard)  # a ValueError naming the guards if it is unknown
        if self.prelude:
            check_prelude(self.prelude)
        if isinstance(self.replica, bool) or not isinstance(self.replica, int) or self.replica < 0:
            raise ValueError(f"a replica is a non-negative integer, got {self.replica!r}")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {self.protocol!r}; choose one of {PROTOCOLS}")
        if (self.protocol in SEQUENCES or self.corruption in SEQUENCES) and self.corruption != self.protocol:
            raise ValueError(
                f"the protocols {', '.join(SEQUENCES)} run with their own name as the corruption, and only "
                f"they do (protocol {self.protocol!r}, corruption {self.corruption!r})"
            )
        check_target(self.protocol, self.target)
        object.__setattr__(self, "target", float(self.target))  # 15 and 15.0 are one run, with one id

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def run_id(self) -> str:
        """A stable identity: the sha256 of the spec's canonical JSON, as for every row of the store.

        A zoo model trained by this project (``resnet26_gn``, ...) adds its shipped weights' sha256: the
        name stays when the weights are retrained, and a store written with the old ones must not be
        resumed as if it held results of the new ones. A field added after stores were written
        (``LATER_FIELDS``) is left out while at its default, so the runs stored before it keep their ids.
        """
        identity = without_later_defaults(self.as_dict())
        weights = shipped_sha256(self.model)
        if weights is not None:
            identity["weights_sha256"] = weights
        return run_id_for(identity)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunSpec:
        return cls(**values)
