"""Reproducible experiments: the seed papers' figures and tables, run by one command.

Each experiment is a function `run(out_dir: pathlib.Path, progress: bool) -> dict` that
writes its PNG figures into `out_dir` and returns JSON-ready metrics. It is registered
under a name with a one-line description:

```python
# geomjax/experiments/my_experiment.py
from . import register

@register("my-experiment", "Seed 00X sec. Y: what it shows")
def run(out_dir, progress):
    ...
    return {"summary": [...], ...}
```

and its module is listed once in `_MODULES` below. That is all: `geomjax list` shows it
and `geomjax reproduce my-experiment` runs it, writes `DIR/my-experiment.json` and prints
the `"summary"` entry of the metrics (a list of flat dicts, one per table row) as a table.
Shared helpers (running methods, invariant errors, JSON, log-scale plots, tables) live
in `geomjax.experiments._common`.
"""

import importlib
import pathlib
from collections.abc import Callable
from dataclasses import dataclass

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
)


@dataclass(frozen=True)
class Experiment:
    """A registered experiment: `run(out_dir, progress) -> metrics`."""

    name: str
    description: str
    run: Callable[[pathlib.Path, bool], dict]


_REGISTRY: dict[str, Experiment] = {}
_loaded = False


def register(name: str, description: str):
    """Decorator registering `run(out_dir, progress) -> dict` as experiment `name`."""

    def decorate(fn):
        if name in _REGISTRY and _REGISTRY[name].run is not fn:
            raise ValueError(f"experiment {name!r} is registered twice")
        _REGISTRY[name] = Experiment(name, description, fn)
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


def reproduce(name: str, out_dir="results", progress: bool = False) -> dict:
    """Run experiment `name`, writing its figures and `out_dir/name.json`; return the metrics."""
    from ._common import save_json

    experiment = get(name)
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    metrics = experiment.run(out, progress)
    metrics = {"experiment": name, "description": experiment.description, **metrics}
    save_json(out / f"{name}.json", metrics)
    return metrics


__all__ = [
    "Experiment",
    "UnknownExperimentError",
    "experiments",
    "get",
    "names",
    "register",
    "reproduce",
]
