"""The figures an experiment saves, and the arrays drawn in them.

`recording_figures()` is a context manager yielding a list that receives one
`SavedFigure(path, figure)` per `Figure.savefig` call made inside it (whatever module
makes the call: it wraps `matplotlib.figure.Figure.savefig` for the duration and
restores it on exit). `figure_arrays(saved)` gathers the data of every line, collection
and image of those figures, keyed `"<figure stem>/<axes index>/<series label>/<x|y|...>"`,
ready for `numpy.savez`: the numbers behind each figure.

```python
>>> import numpy as np, pathlib, tempfile
>>> from matplotlib.figure import Figure
>>> with tempfile.TemporaryDirectory() as tmp, recording_figures() as saved:
...     fig = Figure()
...     _ = fig.subplots().plot([0.0, 1.0], [2.0, 3.0], label="run")
...     fig.savefig(pathlib.Path(tmp) / "demo.png")
>>> sorted(figure_arrays(saved))
['demo/ax0/run/x', 'demo/ax0/run/y']

```
"""

import contextlib
import pathlib
import re
from dataclasses import dataclass

import numpy as np

__all__ = ["SavedFigure", "figure_arrays", "recording_figures"]


@dataclass(frozen=True)
class SavedFigure:
    """A figure saved inside `recording_figures`, with the path it was saved to."""

    path: pathlib.Path
    figure: object


@contextlib.contextmanager
def recording_figures():
    """Record every `Figure.savefig` call made inside the block (see the module docstring)."""
    from matplotlib.figure import Figure

    saved: list[SavedFigure] = []
    original = Figure.savefig

    def savefig(self, fname, *args, **kwargs):
        result = original(self, fname, *args, **kwargs)
        if isinstance(fname, (str, pathlib.PurePath)):
            saved.append(SavedFigure(pathlib.Path(fname), self))
        return result

    Figure.savefig = savefig
    try:
        yield saved
    finally:
        Figure.savefig = original


def _key(text: str) -> str:
    text = re.sub(r"[^0-9A-Za-z_.,+=()\- ]+", "", text).strip() or "series"
    return text.replace(" ", "_")[:60]


def _series(ax):
    from matplotlib.collections import Collection
    from matplotlib.image import AxesImage
    from matplotlib.lines import Line2D

    for i, artist in enumerate([*ax.lines, *ax.collections, *ax.images]):
        label = artist.get_label()
        name = _key(label if label and not label.startswith("_") else f"{type(artist).__name__.lower()}{i}")
        if isinstance(artist, Line2D):
            yield name, {"x": np.asarray(artist.get_xdata(), dtype=float), "y": np.asarray(artist.get_ydata(), dtype=float)}
        elif isinstance(artist, Collection):
            offsets = np.asarray(artist.get_offsets(), dtype=float)
            arrays = {"offsets": offsets} if offsets.size else {}
            values = artist.get_array()
            if values is not None:
                arrays["values"] = np.asarray(values, dtype=float)
            if arrays:
                yield name, arrays
        elif isinstance(artist, AxesImage):
            yield name, {"image": np.asarray(artist.get_array(), dtype=float)}


def figure_arrays(saved) -> dict[str, np.ndarray]:
    """The data of every line, collection and image of the saved figures, by key."""
    arrays: dict[str, np.ndarray] = {}
    for item in saved:
        stem = _key(item.path.stem)
        for a, ax in enumerate(item.figure.axes):
            for name, data in _series(ax):
                for field, values in data.items():
                    key = f"{stem}/ax{a}/{name}/{field}"
                    n = 2
                    while key in arrays:
                        key = f"{stem}/ax{a}/{name}~{n}/{field}"
                        n += 1
                    arrays[key] = values
    return arrays
