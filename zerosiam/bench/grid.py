"""Grids: a YAML file or CLI flags expand into run specs, checked before any of them runs.

A ``Grid`` is the axes of a study (models, methods, corruptions, protocols, seeds, swept options, ...);
``validate`` refuses in one line what would fail only once workers run, and ``specs`` crosses the axes
into ``RunSpec``s. Running them is ``bench/execution.py``'s ``execute``, re-exported here with the names
that lived here before (``Execution``, ``Progress``, ``tasks_of``, ...).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from zerosiam import corruptions
from zerosiam.bench import datasets
from zerosiam.bench.execution import Execution, execute, pending, prepare_data
from zerosiam.bench.spec import KIND, RunSpec, check_prelude
from zerosiam.bench.tasks import Progress, tasks_of, throttled
from zerosiam.corruptions.datasets import SEVERITIES
from zerosiam.methods import get_recipe, options_of
from zerosiam.methods.limits import check_numbers
from zerosiam.parts.guards import GUARDS
from zerosiam.parts.precision import PRECISIONS
from zerosiam.parts.split import OutputNotLogitsError
from zerosiam.protocols import PROTOCOLS, SEQUENCES
from zerosiam.protocols.build import CCC
from zerosiam.zoo import MODELS, model_info
from zerosiam.zoo.specs import MODEL_OPTIONS, SYNTAX, is_spec

# What callers import from here: the grid, and the names of its execution that lived here before.
__all__ = [
    "KIND",
    "RATES",
    "RATE_OPTIONS",
    "STREAM_FIELDS",
    "Execution",
    "Grid",
    "GridError",
    "Progress",
    "execute",
    "pending",
    "prepare_data",
    "tasks_of",
    "throttled",
]

RATES = ("paper", "selected")  # where each method's learning rates come from
RATE_OPTIONS = ("lr", "predictor_lr", "lr_scale")
# the RunSpec fields a grid's ``stream:`` may sweep: label shift's imbalance ratio and length, the
# noise-prefix length, the passes of the epochs protocol, the source accuracy a CCC stream holds
STREAM_FIELDS = ("imbalance_ratio", "stream_length", "noise", "epochs", "target")


# Where a benchmark takes adapt()'s ``output``: the zoo's wrapper reads the logits as it loads the model.
OUTPUT_OPTION = "--model-option output=NAME (a grid file's model_options: {output: NAME})"


class GridError(ValueError):
    """A grid that cannot run as asked; the message names the value and the choices."""


def _check_model_options(model: str, options: dict[str, Any]) -> None:
    """Model options go to a ``timm:``/``builder:``/``torchscript:`` model; a zoo entry takes none."""
    if model in MODELS and options:
        raise GridError(f"model {model!r} is a zoo entry and takes no model options (got {sorted(options)})")
    unknown = sorted(set(options) - set(MODEL_OPTIONS))
    if unknown:
        raise GridError(f"unknown model option(s) {unknown}; choose from {', '.join(MODEL_OPTIONS)}")
    if is_spec(model):
        try:  # what the spec needs (mean and std, an importable builder, a readable checkpoint)
            model_info(model, **options)
        except OutputNotLogitsError as error:  # a benchmark names the field where it loads the model
            raise GridError(f"model {model!r}: {error}; here: {OUTPUT_OPTION}") from None
        except (ValueError, TypeError, ImportError, OSError) as error:
            raise GridError(f"model {model!r}: {error}") from None


def _choose(what: str, values: Iterable[Any], choices: Iterable[Any]) -> None:
    choices = list(choices)
    for value in values:
        if value not in choices:
            raise GridError(f"unknown {what} {value!r}; choose one of {', '.join(map(str, choices))}")


@dataclass
class Grid:
    """The axes of a grid; every combination is one run. ``sweep`` maps an hparam to a list of values
    (e.g. ``{"lr": [1e-3, 1e-4], "predictor_lr": [1e-2]}``), crossed with every method that accepts it;
    a method that does not runs once without it."""

    models: list[str]
    methods: list[str]
    corruptions: list[str] = field(default_factory=lambda: list(corruptions.BENCHMARK))
    severities: list[int] = field(default_factory=lambda: [5])
    protocols: list[str] = field(default_factory=lambda: ["mild"])
    seeds: list[int] = field(default_factory=lambda: [0])
    dataset: str = "cifar10c"
    batch_size: int = 64
    limit: int | None = None
    precision: str = "fp32"
    model_options: dict[str, Any] = field(default_factory=dict)
    hparams: dict[str, Any] = field(default_factory=dict)
    sweep: dict[str, list[Any]] = field(default_factory=dict)
    rates: str = "paper"  # or "selected": each method's rates as `zerosiam select-lr` chose them
    rate_factors: list[float] = field(default_factory=lambda: [1])  # each rate also times these (scaled)
    stream: dict[str, list[Any]] = field(default_factory=dict)  # a protocol's parameters, swept
    prelude: dict[str, Any] = field(default_factory=dict)  # another method first (RunSpec.prelude)
    guards: list[str] = field(default_factory=lambda: ["none"])  # what each method wears (parts.guards)
    replicas: list[int] = field(default_factory=lambda: [0])  # executions of each run (bench/replica.py)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> Grid:
        """From a parsed YAML mapping, over ``defaults`` (what a command supplies for the keys a file may
        leave out, such as ``models``); ``corruptions: benchmark`` means the 15 benchmark corruptions."""
        values = {**(defaults or {}), **values}
        if values.get("corruptions") in ("benchmark", "all"):
            values["corruptions"] = list(corruptions.BENCHMARK)
        unknown = set(values) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(
                f"unknown grid keys {sorted(unknown)}; allowed: {sorted(cls.__dataclass_fields__)}"
            )
        missing = sorted(name for name in ("models", "methods") if name not in values)
        if missing:
            raise ValueError(f"a grid needs {' and '.join(missing)}")
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: Path, defaults: Mapping[str, Any] | None = None) -> Grid:
        """From a YAML file of the grid's keys (``docs/benchmark.md``, "Grids and execution")."""
        import yaml

        return cls.from_mapping(yaml.safe_load(Path(path).read_text()) or {}, defaults)

    def with_values(self, values: Mapping[str, Any]) -> Grid:
        """This grid with ``values`` in place of its own, read as a file's are: a command's flags over the
        grid of its file."""
        return type(self).from_mapping({**asdict(self), **values})

    def validate(self) -> None:
        """Refuse, in one line naming the value and the choices, anything that would fail only once
        workers run: unknown names, out-of-range numbers, options a method does not take."""
        for model in self.models:
            if model not in MODELS and not is_spec(model):
                specs = ", ".join(SYNTAX)
                raise GridError(
                    f"unknown model {model!r}; choose one of {', '.join(MODELS)} or a spec: {specs}"
                )
        for method in self.methods:
            try:
                get_recipe(method)
            except ValueError as error:
                raise GridError(str(error)) from None
        _choose("precision", [self.precision], PRECISIONS)
        _choose("rates", [self.rates], RATES)
        _choose("guard", self.guards, GUARDS)
        if not self.rate_factors or not all(_non_negative(f) and f > 0 for f in self.rate_factors):
            raise GridError(f"rate_factors must be positive numbers, got {self.rate_factors!r}")
        for model in self.models:
            _check_model_options(model, self.model_options)
        try:
            datasets.parse(self.dataset)
        except ValueError as error:
            raise GridError(str(error)) from None
        _choose("corruption", self.corruptions, corruptions.ALL)
        _choose("protocol", self.protocols, PROTOCOLS)
        _choose("severity", self.severities, SEVERITIES)
        for name, value in (("batch size", self.batch_size), ("limit", self.limit)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise GridError(f"{name} must be a positive integer, got {value!r}")
        _choose("stream parameter", self.stream, STREAM_FIELDS)
        for name, values in self.stream.items():
            if not values or not all(_non_negative(value) for value in values):
                raise GridError(f"stream parameter {name!r} takes non-negative numbers, got {values!r}")
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in self.seeds):
            raise GridError(f"seeds must be non-negative integers, got {self.seeds}")
        if not self.replicas or any(not _non_negative(r) or isinstance(r, float) for r in self.replicas):
            raise GridError(f"replicas must be non-negative integers, got {self.replicas}")
        for method in self.methods:
            _check_options(method, self.hparams, "option")
        for option in sorted(self.sweep):
            if not any(option in options_of(method) for method in self.methods):
                methods = ", ".join(self.methods)
                raise GridError(f"swept option {option!r} applies to none of the grid's methods ({methods})")
        self._check_option_values()
        if self.prelude:
            self._validate_prelude()

    def _check_option_values(self) -> None:
        """Every option's value as ``adapt`` checks it (``zerosiam.methods.limits``), the swept ones each,
        so that ``lr: nan`` or a rate read as text stops the grid here rather than failing every run; and
        ``output`` sent where the benchmark reads it, the model's options."""
        if "output" in self.hparams or "output" in self.sweep:
            raise GridError(
                f"option 'output' is the model's in a benchmark, read where it is loaded: {OUTPUT_OPTION}"
            )
        points = [self.hparams, *({name: value} for name, values in self.sweep.items() for value in values)]
        for options in points:
            try:
                check_numbers(options)
            except (TypeError, ValueError) as error:
                raise GridError(str(error)) from None

    def _validate_prelude(self) -> None:
        try:
            check_prelude(self.prelude)
        except ValueError as error:
            raise GridError(str(error)) from None
        options = set(self.prelude) - {"method", "steps"}
        _check_options(self.prelude["method"], options, "prelude option")
        try:
            check_numbers({name: self.prelude[name] for name in options})
        except (TypeError, ValueError) as error:
            raise GridError(f"prelude: {error}") from None

    def specs(self) -> list[RunSpec]:
        """Every run of the grid, in a stable order; a method without a predictor ignores η_h, and one
        that does not adapt (NoAdapt) every rate, guard and replica, so such an axis runs it once."""
        out = []
        axes = (
            self.models,
            self.protocols,
            self.severities,
            _points(self.stream),
            self.seeds,
            self.methods,
            _points(self.sweep),
            self.guards,
            self.replicas,
        )
        for model, protocol, severity, stream, seed, method, point, guard, replica in itertools.product(
            *axes
        ):
            if (guard != "none" or replica) and not get_recipe(method).adapts:
                continue  # NoAdapt has nothing to guard nor to round apart: it runs once
            accepted = options_of(method)
            hparams = {**self.hparams, **{key: value for key, value in point.items() if key in accepted}}
            for option in _ignored_rates(method):
                hparams.pop(option, None)
            if protocol != CCC:  # the other protocols take no target: such points are one run (``_unique``)
                stream = {key: value for key, value in stream.items() if key != "target"}
            for corruption in [protocol] if protocol in SEQUENCES else self.corruptions:
                out.append(
                    RunSpec(
                        model=model,
                        dataset=self.dataset,
                        corruption=corruption,
                        severity=severity,
                        protocol=protocol,
                        method=method,
                        seed=seed,
                        batch_size=self.batch_size,
                        limit=self.limit,
                        precision=self.precision,
                        model_options=self.model_options,
                        hparams=hparams,
                        prelude=self.prelude,
                        guard=guard,
                        replica=replica,
                        **stream,
                    )
                )
        return _unique(out)


def scaled(specs: list[RunSpec], factors: list[float]) -> list[RunSpec]:
    """Each adapting run once per factor, its rates (``lr_scale``, as selected or set) times the factor;
    a factor of 1 leaves a run as it is, so its id too. NoAdapt takes no rate and runs once."""
    out = []
    for spec in specs:
        adapts = get_recipe(spec.method).adapts
        for factor in factors if adapts else [1]:
            if factor == 1:
                out.append(spec)
                continue
            rate = float(f"{spec.hparams.get('lr_scale', 1.0) * factor:.12g}")  # 0.3 × 3 = 0.9, not 0.8999…
            out.append(dataclasses.replace(spec, hparams={**spec.hparams, "lr_scale": rate}))
    return _unique(out)


def _check_options(method: str, options: Iterable[str], what: str) -> None:
    """Refuse the first of ``options`` that ``method`` does not take, naming the ones it does."""
    accepted = options_of(method)
    for option in sorted(set(options) - accepted):
        takes = ", ".join(sorted(accepted))
        raise GridError(f"{what} {option!r} does not apply to method {method!r}; it takes {takes}")


def _non_negative(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0


def _points(axes: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the values of ``axes`` (one empty point when there are none)."""
    names = sorted(axes)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*(axes[n] for n in names))]


def _ignored_rates(method: str) -> tuple[str, ...]:
    """The rate options ``method`` has no use for: all of them when it does not adapt, η_h when it has
    no predictor."""
    recipe = get_recipe(method)
    if not recipe.adapts:
        return RATE_OPTIONS
    return ("predictor_lr",) if recipe.asymmetry is None else ()


def _unique(specs: Iterable[RunSpec]) -> list[RunSpec]:
    seen: dict[str, RunSpec] = {}
    for spec in specs:
        seen.setdefault(spec.run_id, spec)
    return list(seen.values())
