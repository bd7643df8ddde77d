"""Checks a program can make on a rendered matplotlib figure: is it readable at a glance?

`figure_problems(fig)` draws the figure (Agg, at its own dpi, layout engine included)
and returns one sentence per defect found:

- **text outside the canvas**: a title, axis label, tick label, legend, annotation or
  suptitle whose rendered extent (`get_window_extent` / `Axis.get_tightbbox` with the
  renderer of the draw) leaves the figure's bounding box by more than `tol_px` pixels:
  it is cut off in the saved image;
- **empty axes**: a visible Axes with no visible artist that has a finite point (lines,
  collections, images, patches), no text and no table;
- **invisible series**: a line with points none of which can be drawn: no finite
  point, or on a log axis no positive one (all zero or negative values on a log scale
  leave the curve out entirely);
- **overlapping texts**: two annotations (`ax.texts`) of one Axes whose extents overlap,
  or a legend over a title;
- **coinciding series**: two labelled lines of one Axes, same length, same marker and
  line widths within a factor 2.5 (a thin line over a wide band shows both), whose
  points are within `coincide_px` pixels of each other everywhere: only the one drawn
  last can be seen;
- **legend over data**: a legend inside an Axes whose box hides more than
  `legend_cover` of the drawn points of a series of that Axes;
- **mostly empty panel**: an Axes with a fixed aspect (`set_aspect("equal")`) where the
  box around its lines fills less than `min_fill` of the panel.

The checks look only at the figure, so they apply to any figure; `assert_readable(fig)`
raises with all the problems listed.

```python
>>> import numpy as np
>>> from matplotlib.figure import Figure
>>> fig = Figure(figsize=(4, 3), layout="constrained")
>>> ax = fig.subplots()
>>> _ = ax.plot(np.arange(5.0), np.zeros(5), label="zero error")
>>> ax.set_yscale("log")
>>> figure_problems(fig)
["axes 1 of 1: series 'zero error' has no positive finite value on the log y axis (an invisible curve)"]

```
"""

import itertools
import warnings

import numpy as np

__all__ = ["FigureCheckError", "assert_readable", "figure_problems"]


class FigureCheckError(AssertionError):
    """A figure has defects `figure_problems` can detect; the message lists them."""


def _renderer(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    # The draw's own warnings (e.g. "Data has no positive values" on a log axis) are what
    # the checks below report, in words that name the series.
    with np.errstate(over="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        canvas.draw()
    return canvas.get_renderer()


def _axes_name(fig, ax) -> str:
    axes = [a for a in fig.axes if a.get_visible()]
    index = axes.index(ax) + 1 if ax in axes else 0
    title = ax.get_title() or ax.get_title("left") or ax.get_title("right")
    name = f"axes {index} of {len(axes)}"
    return f"{name} ({title[:50]!r})" if title else name


def _outside(bbox, frame, tol) -> list[str]:
    sides = []
    if bbox.x0 < frame.x0 - tol:
        sides.append(f"left edge by {frame.x0 - bbox.x0:.0f} px")
    if bbox.x1 > frame.x1 + tol:
        sides.append(f"right edge by {bbox.x1 - frame.x1:.0f} px")
    if bbox.y0 < frame.y0 - tol:
        sides.append(f"bottom edge by {frame.y0 - bbox.y0:.0f} px")
    if bbox.y1 > frame.y1 + tol:
        sides.append(f"top edge by {bbox.y1 - frame.y1:.0f} px")
    return sides


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 60 else text[:57] + "..."


def _text_problems(fig, renderer, tol) -> list[str]:
    from matplotlib.text import Text

    frame = fig.bbox
    problems = []
    owned = set()  # texts judged as part of a larger box (axis, legend)
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        for axis_name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            owned.update(id(t) for t in axis.findobj(Text))
            if not axis.get_visible():
                continue
            box = axis.get_tightbbox(renderer)
            if box is not None:
                for side in _outside(box, frame, tol):
                    problems.append(
                        f"{_axes_name(fig, ax)}: the {axis_name} axis (tick labels or label) "
                        f"passes the figure's {side}: cut off"
                    )
    legends = [leg for ax in fig.axes if ax.get_visible() for leg in [ax.get_legend()] if leg is not None]
    for leg in [*legends, *fig.legends]:
        owned.update(id(t) for t in leg.findobj(Text))
        if leg.get_visible():
            for side in _outside(leg.get_window_extent(renderer), frame, tol):
                problems.append(f"a legend passes the figure's {side}: cut off")
    for text in fig.findobj(Text):
        if id(text) in owned or not text.get_visible() or not text.get_text().strip():
            continue
        owner = getattr(text, "axes", None)
        if owner is not None and not owner.get_visible():
            continue
        for side in _outside(text.get_window_extent(renderer), frame, tol):
            problems.append(f"text {_short(text.get_text())!r} passes the figure's {side}: cut off")
    return problems


def _data_artists(ax):
    return [*ax.lines, *ax.collections, *ax.images, *ax.patches]


def _has_finite_point(artist) -> bool:
    from matplotlib.collections import Collection
    from matplotlib.image import AxesImage
    from matplotlib.lines import Line2D

    if isinstance(artist, Line2D):
        xy = np.asarray(artist.get_xydata(), dtype=float)
        return bool(np.any(np.all(np.isfinite(xy), axis=1))) if xy.size else False
    if isinstance(artist, Collection):
        offsets = np.asarray(artist.get_offsets(), dtype=float)
        paths = artist.get_paths()
        if offsets.size and np.any(np.all(np.isfinite(offsets), axis=1)):
            return True
        return any(np.all(np.isfinite(p.vertices)) and len(p.vertices) for p in paths)
    if isinstance(artist, AxesImage):
        data = np.asarray(artist.get_array(), dtype=float)
        return bool(np.any(np.isfinite(data)))
    return True  # a patch (bar, polygon) always draws


def _empty_axes(fig) -> list[str]:
    problems = []
    for ax in fig.axes:
        if not ax.get_visible() or not ax.axison:
            continue
        drawn = [a for a in _data_artists(ax) if a.get_visible() and _has_finite_point(a)]
        if not drawn and not ax.texts and not ax.tables:
            problems.append(f"{_axes_name(fig, ax)}: empty axes (no visible data)")
    return problems


def _line_label(line) -> str:
    label = line.get_label()
    return label if label and not label.startswith("_") else "(unlabelled)"


def _series_problems(fig) -> list[str]:
    problems = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        for line in ax.lines:
            if not line.get_visible():
                continue
            x = np.asarray(line.get_xdata(), dtype=float)
            y = np.asarray(line.get_ydata(), dtype=float)
            if x.size == 0:
                continue
            in_x, in_y = line.get_transform().contains_branch_seperately(ax.transData)
            ok = np.isfinite(x) & np.isfinite(y)
            if not ok.any():
                problems.append(
                    f"{_axes_name(fig, ax)}: series {_line_label(line)!r} has no finite point (all NaN or inf: "
                    "an invisible curve)"
                )
                continue
            for which, on, scale, values in (("x", in_x, ax.get_xscale(), x), ("y", in_y, ax.get_yscale(), y)):
                if on and scale == "log" and not np.any(ok & (values > 0)):
                    problems.append(
                        f"{_axes_name(fig, ax)}: series {_line_label(line)!r} has no positive finite value "
                        f"on the log {which} axis (an invisible curve)"
                    )
    return problems


def _overlapping_texts(fig, renderer) -> list[str]:
    problems = []
    for ax in fig.axes:
        texts = [t for t in ax.texts if t.get_visible() and t.get_text().strip()]
        boxes = [t.get_window_extent(renderer) for t in texts]
        for (a, ba), (b, bb) in itertools.combinations(zip(texts, boxes), 2):
            if ba.overlaps(bb):
                problems.append(
                    f"{_axes_name(fig, ax)}: texts {_short(a.get_text())!r} and {_short(b.get_text())!r} overlap"
                )
    return problems


def _titles_under_legends(fig, renderer) -> list[str]:
    """A suptitle or axes title that a legend box overlaps."""
    titles = [t for t in (fig._suptitle, *fig.texts) if t is not None]
    for ax in fig.axes:
        if ax.get_visible():
            titles += [ax.title, ax._left_title, ax._right_title]
    titles = list({id(t): t for t in titles if t.get_visible() and t.get_text().strip()}.values())
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_visible() and ax.get_legend())]
    problems = []
    for leg in legends:
        if not leg.get_visible():
            continue
        box = leg.get_window_extent(renderer)
        for t in titles:
            if box.overlaps(t.get_window_extent(renderer)):
                problems.append(f"a legend overlaps the title {_short(t.get_text())!r}")
    return problems


def _display_points(line):
    xy = np.asarray(line.get_xydata(), dtype=float)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return np.asarray(line.get_transform().transform(xy), dtype=float)


def _marker(line) -> str:
    marker = line.get_marker()
    return "" if marker in (None, "", "None", " ", "none") else str(marker)


def _coinciding(fig, renderer, coincide_px) -> list[str]:
    problems = []
    for ax in fig.axes:
        lines = [ln for ln in ax.lines if ln.get_visible() and not _line_label(ln).startswith("(")]
        points = [_display_points(ln) for ln in lines]
        group = list(range(len(lines)))  # union-find over "coincides with"

        def root(i):
            while group[i] != i:
                i = group[i]
            return i

        for a, b in itertools.combinations(range(len(lines)), 2):
            pa, pb = points[a], points[b]
            if pa.shape != pb.shape or pa.size == 0 or _marker(lines[a]) != _marker(lines[b]):
                continue
            widths = sorted((lines[a].get_linewidth(), lines[b].get_linewidth()))
            if widths[1] >= 2.5 * widths[0]:
                continue  # a thin line over a wide band (a reference drawn thick) shows both
            both = np.all(np.isfinite(pa), axis=1) & np.all(np.isfinite(pb), axis=1)
            if both.sum() >= 2 and float(np.max(np.hypot(*(pa[both] - pb[both]).T))) < coincide_px:
                group[root(b)] = root(a)
        clusters: dict[int, list[str]] = {}
        for i, line in enumerate(lines):
            clusters.setdefault(root(i), []).append(_line_label(line))
        for labels in clusters.values():
            if len(labels) > 1:
                problems.append(
                    f"{_axes_name(fig, ax)}: series {', '.join(map(repr, labels))} coincide (within "
                    f"{coincide_px:g} px everywhere): only the one drawn last is visible"
                )
    return problems


def _legend_over_data(fig, renderer, legend_cover) -> list[str]:
    problems = []
    for ax in fig.axes:
        leg = ax.get_legend()
        if leg is None or not leg.get_visible() or not ax.get_visible():
            continue
        box = leg.get_window_extent(renderer)
        frame = ax.get_window_extent(renderer)
        if not box.overlaps(frame):
            continue  # a legend placed outside the axes
        for line in ax.lines:
            if not line.get_visible():
                continue
            pts = _display_points(line)
            pts = pts[np.all(np.isfinite(pts), axis=1)]
            inside_axes = pts[
                (pts[:, 0] >= frame.x0) & (pts[:, 0] <= frame.x1) & (pts[:, 1] >= frame.y0) & (pts[:, 1] <= frame.y1)
            ] if pts.size else pts
            if len(inside_axes) < 10:
                continue
            hidden = (
                (inside_axes[:, 0] >= box.x0)
                & (inside_axes[:, 0] <= box.x1)
                & (inside_axes[:, 1] >= box.y0)
                & (inside_axes[:, 1] <= box.y1)
            )
            share = float(hidden.mean())
            if share > legend_cover:
                problems.append(
                    f"{_axes_name(fig, ax)}: the legend hides {100 * share:.0f}% of the points of series "
                    f"{_line_label(line)!r}"
                )
    return problems


def _mostly_empty(fig, renderer, min_fill) -> list[str]:
    """Axes with a fixed aspect (`set_aspect("equal")`): the box around the drawn lines
    should fill a fair share of the panel (a long thin path at equal aspect leaves most
    of it blank)."""
    problems = []
    for ax in fig.axes:
        if not ax.get_visible() or ax.get_aspect() == "auto" or not ax.lines:
            continue
        pts = [_display_points(ln) for ln in ax.lines if ln.get_visible()]
        pts = np.concatenate([p[np.all(np.isfinite(p), axis=1)] for p in pts]) if pts else np.zeros((0, 2))
        if len(pts) < 2:
            continue
        frame = ax.get_window_extent(renderer)
        lo = np.maximum(pts.min(axis=0), [frame.x0, frame.y0])
        hi = np.minimum(pts.max(axis=0), [frame.x1, frame.y1])
        fill = float(np.prod(np.maximum(hi - lo, 0.0))) / max(frame.width * frame.height, 1.0)
        if fill < min_fill:
            problems.append(
                f"{_axes_name(fig, ax)}: with its fixed aspect the data fill {100 * fill:.0f}% of the panel "
                "(mostly empty: let the aspect follow the data, or crop the limits)"
            )
    return problems


def figure_problems(fig, *, tol_px: float = 1.0, coincide_px: float = 1.0, legend_cover: float = 0.05,
                    min_fill: float = 0.25) -> list[str]:
    """The detectable readability defects of `fig`, one sentence each (empty: none found).

    The figure is drawn once (Agg, its own dpi, its layout engine), then every check runs
    on the rendered extents; see the module docstring for the list.
    """
    renderer = _renderer(fig)
    return [
        *_text_problems(fig, renderer, tol_px),
        *_empty_axes(fig),
        *_series_problems(fig),
        *_overlapping_texts(fig, renderer),
        *_titles_under_legends(fig, renderer),
        *_coinciding(fig, renderer, coincide_px),
        *_legend_over_data(fig, renderer, legend_cover),
        *_mostly_empty(fig, renderer, min_fill),
    ]


def assert_readable(fig, name: str = "figure", **tolerances) -> None:
    """Raise `FigureCheckError` listing `figure_problems(fig)` if there are any."""
    problems = figure_problems(fig, **tolerances)
    if problems:
        raise FigureCheckError(f"{name}: " + "; ".join(problems))
