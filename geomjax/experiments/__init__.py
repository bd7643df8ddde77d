"""Reproducible experiments: the papers' figures and tables, run by one command.

Each experiment is a function `run(out_dir: pathlib.Path, progress: bool, **kw) -> dict`
that writes its PNG figures into `out_dir` and returns JSON-ready metrics. It is
registered under a name with a one-line description, the options it accepts (names from
`OPTIONS`: `dt`, `t_final`, `gains`, passed to `run` as keywords) and the keywords of its
tiny `quick` configuration (a short horizon, few step sizes: every figure in seconds):

```python
# geomjax/experiments/my_experiment.py
from . import register

@register("my-experiment", "Author (year) sec. Y: what it shows",
          options=("dt", "t_final"), quick={"t_final": 0.5})
def run(out_dir, progress, dt=None, t_final=None):
    ...
    return {"summary": [...], ...}
```

and its module is listed once in `_MODULES` below. That is all: `geomjax list` shows it
and its options, `geomjax reproduce my-experiment [--dt H] [--t-final T] [--quick]` runs it,
writes `DIR/my-experiment.json` (the metrics), `DIR/my-experiment.npz` (the arrays drawn in
every figure it saved) and prints the `"summary"` entry of the metrics (a list of flat
dicts, one per table row) as a table, then its `"findings"` (a list of sentences), if any. Every saved figure goes through the readability
checks of `_figure_check`. Shared helpers (running methods, invariant errors, JSON,
log-scale plots, tables, applying the options to a setup) live in
`geomjax.experiments._common`.
"""

import importlib
import pathlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._errors import ExperimentOptionError

# One line per experiment module; importing a module registers its experiments.
_MODULES = (
    "spherical_pendulum",
    "planar_pendulum",
    "nonholonomic_systems",
    "nonholonomic_oscillator",
    "damped_oscillator",
    "damped_foucault",
    "pendulum_dirac",
    "ziegler",
    "feedback_paper",
    "gain_tuning",
    "learn_chain",
    "learn_gyroscope",
    "scaling",
)


def _positive_float(name):
    def parse(value):
        try:
            x = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"--{name.replace('_', '-')} must be a number, got {value!r}") from None
        if not (x > 0 and x < float("inf")):
            raise ValueError(f"--{name.replace('_', '-')} must be a positive finite number, got {value!r}")
        return x

    return parse


def _gains(value):
    items = value.split(",") if isinstance(value, str) else (value if isinstance(value, (list, tuple)) else [value])
    parse = _positive_float("gains")
    gains = tuple(parse(v) for v in items)
    if not gains:
        raise ValueError("--gains needs at least one value")
    return gains


@dataclass(frozen=True)
class Option:
    """An option an experiment may accept: the keyword `name` of its `run` (on the
    command line `--name` with `_` as `-`), a parser from text (or a number) to the
    value, a metavar and a help line."""

    name: str
    parse: Callable[[Any], Any]
    metavar: str
    help: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


# The options experiments can declare (`register(..., options=("dt", ...))`).
OPTIONS: dict[str, Option] = {
    o.name: o
    for o in (
        Option("dt", _positive_float("dt"), "H", "step size h of the runs (the horizon is kept: steps = t_final/h)"),
        Option("t_final", _positive_float("t_final"), "T", "final time of the runs"),
        Option("gains", _gains, "K[,K...]", "feedback gains: one value for all, or one per gain"),
    )
}


@dataclass(frozen=True)
class Experiment:
    """A registered experiment: `run(out_dir, progress, **options) -> metrics`.

    `options` are the names (keys of `OPTIONS`) that `run` accepts as keywords; `quick`
    the keywords of a tiny configuration (a short horizon, few step sizes) that exercises
    every figure in seconds, for smoke tests: its numbers are not the paper's.
    """

    name: str
    description: str
    run: Callable[..., dict]
    options: tuple[str, ...] = ()
    quick: Mapping[str, Any] = field(default_factory=dict)

    def accepted(self) -> str:
        """The accepted options as command-line flags, for messages."""
        return ", ".join(OPTIONS[o].flag for o in self.options) or "no options"


_REGISTRY: dict[str, Experiment] = {}
_loaded = False


def register(name: str, description: str, *, options=(), quick=None):
    """Decorator registering `run(out_dir, progress, **kw) -> dict` as experiment `name`.

    `options`: names from `OPTIONS` that `run` accepts as keyword arguments; `quick`: the
    keyword arguments of its tiny configuration (`reproduce(..., quick=True)`).
    """
    unknown = [o for o in options if o not in OPTIONS]
    if unknown:
        raise ValueError(f"experiment {name!r} declares unknown options {unknown}; known: {list(OPTIONS)}")

    def decorate(fn):
        if name in _REGISTRY and _REGISTRY[name].run is not fn:
            raise ValueError(f"experiment {name!r} is registered twice")
        _REGISTRY[name] = Experiment(name, description, fn, tuple(options), dict(quick or {}))
        return fn

    return decorate


def _load_all() -> None:
    global _loaded
    if not _loaded:
        for module in _MODULES:
            importlib.import_module(f"{__name__}.{module}")
        _loaded = True


def experiments() -> dict[str, Experiment]:
    """All registered experiments, by name (sorted)."""
    _load_all()
    return dict(sorted(_REGISTRY.items()))


def names() -> list[str]:
    """Names of the registered experiments."""
    return list(experiments())


class UnknownExperimentError(KeyError):
    """Raised for a name that is not a registered experiment; the message lists the valid ones."""

    def __str__(self):  # KeyError would quote the message
        return self.args[0]


def get(name: str) -> Experiment:
    """The experiment registered as `name`; raises `UnknownExperimentError` otherwise."""
    table = experiments()
    if name not in table:
        raise UnknownExperimentError(
            f"unknown experiment {name!r}; valid names: {', '.join(table) or '(none)'}"
        )
    return table[name]


def check_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The parsed values of `options` (None entries dropped) for experiment `name`.

    Raises `ExperimentOptionError` naming the experiment and what it accepts for an
    option it does not take, or for a value that does not parse.
    """
    experiment = get(name)
    given = {k: v for k, v in options.items() if v is not None}
    bad = [k for k in given if k not in experiment.options]
    if bad:
        flags = ", ".join(OPTIONS[k].flag if k in OPTIONS else repr(k) for k in bad)
        raise ExperimentOptionError(
            f"experiment {name!r} does not take {flags}; it accepts: {experiment.accepted()}"
        )
    try:
        return {k: OPTIONS[k].parse(v) for k, v in given.items()}
    except ValueError as err:
        raise ExperimentOptionError(f"experiment {name!r}: {err}") from None


def reproduce(name: str, out_dir="results", progress: bool = False, *, quick: bool = False,
              check_figures: bool = True, **options) -> dict:
    """Run experiment `name`; write `out_dir/name.json` (metrics), `out_dir/name.npz` (the
    arrays drawn in its figures) and its PNG figures; return the metrics.

    `options` (`dt=...`, `t_final=...`, `gains=...`) must be among the experiment's
    `options`; `quick=True` runs its tiny configuration. With `check_figures` every saved
    figure goes through `_figure_check.figure_problems`; problems are warned about and
    listed in the metrics under `"figure_problems"`.
    """
    import warnings

    import numpy as np

    from ._common import save_json
    from ._figure_check import figure_problems
    from ._figure_record import figure_arrays, recording_figures

    experiment = get(name)
    values = check_options(name, options)
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    kwargs = {**(experiment.quick if quick else {}), **values}
    with recording_figures() as saved:
        metrics = experiment.run(out, progress, **kwargs)
    problems = {}
    if check_figures:
        for item in saved:
            found = figure_problems(item.figure)
            if found:
                problems[item.path.name] = found
                warnings.warn(f"{name}: figure {item.path.name}: " + "; ".join(found), stacklevel=2)
    arrays = out / f"{name}.npz"
    np.savez_compressed(arrays, **figure_arrays(saved))
    metrics = {
        "experiment": name,
        "description": experiment.description,
        **({"options": values} if values else {}),
        **({"quick": True} if quick else {}),
        **metrics,
        "arrays": arrays.name,
    }
    if check_figures:
        metrics["figure_problems"] = problems
    if metrics.get("summary"):
        from ._columns import legends

        metrics["columns"] = legends(metrics["summary"])  # what each summary column means
    save_json(out / f"{name}.json", metrics)
    return metrics


__all__ = [
    "OPTIONS",
    "Experiment",
    "ExperimentOptionError",
    "Option",
    "check_options",
    "UnknownExperimentError",
    "experiments",
    "get",
    "names",
    "register",
    "reproduce",
]
