"""RATTLE on large sparse constraint graphs: cost per step, compile time and memory against
the number of constraints m, beside hand-written floors.

Graphs (`geomjax.models`): the planar n × n cloth (rods on the grid's edges, two pinned
corners), the random tree of rods in space, the closed ring of rods in space, and the box of
rigid triatomic molecules. For each size, each method's `lax.scan` of RATTLE steps
(h = 0.002) is compiled once (the compile time: lower + XLA compile) and timed in
interleaved rounds (the best kept); the memory is the compiled program's temporary buffers.

Methods:

- geomjax: `geomjax.rattle(model.system)` with its defaults: the pattern of G M⁻¹Gᵀ read
  off the jaxpr; a block Cholesky factorization in reverse Cuthill–McKee order where the
  band is narrow, conjugate gradients otherwise;
- geomjax dense: `structured=False` (k forward products and a dense LU), for m ≤ 300;
- the hand-written floors of `geomjax.experiments.rod_floors`: block-banded Cholesky,
  and the chord iteration with Jacobi-preconditioned CG (warm-started multipliers), for
  m ≤ 600 (its iterations grow with the condition number, which grows with the size
  of a cloth or a ring).

Figure 1: µs per step against m, a panel per graph. Figure 2: compile time and memory of
geomjax's program against m. Findings: the growth exponents d log(cost)/d log(m) and
geomjax ÷ the best floor. `benchmarks/constraint_scaling.py` runs the same comparison at
more sizes and with more floors (cold CG, coloured SHAKE sweeps).
"""

import pathlib
import time

import jax
import numpy as np
from matplotlib.ticker import NullFormatter

import geomjax

from . import register
from ._common import _figure, _marked, _positive, _save, _title
from .rod_floors import cg_floor, banded_floor, geomjax_scan, scan_run

NAME = "scaling"
DEFAULT_SIZES = {"cloth": (4, 8, 16, 32), "tree": (64, 256, 1024), "ring": (64, 256, 1024), "water": (2, 4, 6)}
QUICK_SIZES = {"cloth": (4, 6), "ring": (24, 48)}
BUILDERS = {"cloth": geomjax.models.cloth, "tree": geomjax.models.rod_tree, "ring": geomjax.models.rod_ring,
            "water": geomjax.models.water_box}
GRAPHS = {"cloth": "n × n cloth", "tree": "random tree of rods", "ring": "closed ring of rods",
          "water": "box of rigid molecules"}
METHODS = ("geomjax", "geomjax dense", "floor banded", "floor CG")
STYLES = {"geomjax": {"color": "tab:red"}, "geomjax dense": {"color": "tab:gray"},
          "floor banded": {"color": "tab:blue", "linestyle": "--"}, "floor CG": {"color": "tab:green", "linestyle": "--"}}
DENSE_MAX, FLOOR_CG_MAX = 300, 600


def _steps(m):
    return 100 if m < 300 else 30 if m < 3000 else 10


def _compile(run, x0):
    start = time.perf_counter()
    exe = jax.jit(run).lower(x0).compile()
    seconds = time.perf_counter() - start
    memory = exe.memory_analysis()
    temp = float(getattr(memory, "temp_size_in_bytes", np.nan)) if memory is not None else np.nan
    return exe, seconds, temp


def _case(kind, size, rounds):
    model = BUILDERS[kind](size)
    n = model.system.dim // 2
    m = int(model.system.holonomic(model.x0[:n]).shape[0])
    steps = _steps(m)
    runs = {"geomjax": geomjax_scan(model, steps)}
    if m <= DENSE_MAX:
        runs["geomjax dense"] = geomjax_scan(model, steps, structured=False)
    runs["floor banded"] = scan_run(*banded_floor(model), steps, n)
    if m <= FLOOR_CG_MAX:
        runs["floor CG"] = scan_run(*cg_floor(model, True), steps, n)
    compiled = {name: _compile(run, model.x0) for name, run in runs.items()}
    outs = jax.block_until_ready({name: exe(model.x0) for name, (exe, _, _) in compiled.items()})
    best = {name: np.inf for name in runs}
    for _ in range(rounds):  # interleaved
        for name, (exe, _, _) in compiled.items():
            start = time.perf_counter()
            jax.block_until_ready(exe(model.x0))
            best[name] = min(best[name], time.perf_counter() - start)
    # every method integrates the same motion (the floors' pinned momenta are zero)
    ref = np.asarray(outs["geomjax"])
    agree = max(float(np.max(np.abs(np.asarray(x)[:n] - ref[:n]))) for x in outs.values())
    return dict(graph=kind, size=size, m=m, steps=steps, agree=agree,
                us={k: v / steps * 1e6 for k, v in best.items()},
                compile={k: c[1] for k, c in compiled.items()}, memory={k: c[2] for k, c in compiled.items()})


def _exponent(ms, values):
    ms, values = np.asarray(ms, float), np.asarray(values, float)
    ok = np.isfinite(values)
    if ok.sum() < 2:
        return float("nan")
    return float(np.polyfit(np.log(ms[ok]), np.log(values[ok]), 1)[0])


def _cost_figure(path, cases):
    kinds = list(dict.fromkeys(c["graph"] for c in cases))
    cols = 2 if len(kinds) > 1 else 1
    rows = -(-len(kinds) // cols)
    fig, axes = _figure(rows, cols, size=(4.2 * cols, 3.4 * rows), sharex=False)
    for ax, kind in zip(axes.ravel(), kinds):
        mine = [c for c in cases if c["graph"] == kind]
        for i, name in enumerate(METHODS):
            pts = [(c["m"], c["us"][name]) for c in mine if name in c["us"]]
            if pts:
                ms, us = zip(*pts)
                ax.loglog(ms, _positive(np.asarray(us)), label=name, **_marked(STYLES[name], i, len(METHODS), len(ms)))
        ax.set_title(GRAPHS[kind], fontsize=10)
        ax.xaxis.set_minor_formatter(NullFormatter())  # decade labels only: no overlapping minor ones
        ax.set_xlabel("constraints m")
        ax.set_ylabel("µs per RATTLE step")
        ax.grid(True, which="both", alpha=0.3)
    for ax in axes.ravel()[len(kinds):]:
        ax.set_visible(False)
    axes.ravel()[0].legend(fontsize=8)
    _title(fig, None, "RATTLE on sparse rod graphs: cost per step against the number of constraints", 11)
    return _save(fig, path)


def _compile_figure(path, cases):
    fig, axes = _figure(1, 2, size=(9.0, 3.6), sharex=False)
    kinds = list(dict.fromkeys(c["graph"] for c in cases))
    for i, kind in enumerate(kinds):
        mine = [c for c in cases if c["graph"] == kind]
        ms = [c["m"] for c in mine]
        style = {"color": f"C{i}"}
        axes[0, 0].semilogx(ms, [c["compile"]["geomjax"] for c in mine], label=GRAPHS[kind],
                            **_marked(style, i, len(kinds), len(ms)))
        axes[0, 1].loglog(ms, _positive(np.asarray([c["memory"]["geomjax"] / 1e6 for c in mine])), label=GRAPHS[kind],
                          **_marked(style, i, len(kinds), len(ms)))
    axes[0, 0].set_ylabel("compile time [s]")
    axes[0, 1].set_ylabel("temporary memory [MB]")
    for ax in axes.ravel():
        ax.set_xlabel("constraints m")
        ax.grid(True, which="both", alpha=0.3)
        ax.xaxis.set_minor_formatter(NullFormatter())
    axes[0, 0].set_ylim(bottom=0)
    axes[0, 1].legend(fontsize=8)
    _title(fig, None, "geomjax's RATTLE program: compile time and memory against the number of constraints", 11)
    return _save(fig, path)


@register(NAME, "RATTLE on sparse rod graphs (cloth, tree, ring, molecules): cost per step, compile time and "
          "memory against the number of constraints, beside hand-written floors",
          quick={"sizes": QUICK_SIZES, "rounds": 1})
def run(out_dir: pathlib.Path, progress: bool, sizes=None, rounds: int = 3) -> dict:
    """Measure every graph of `sizes` ({graph: sizes}, default `DEFAULT_SIZES`)."""
    sizes = DEFAULT_SIZES if sizes is None else sizes
    out_dir = pathlib.Path(out_dir)
    cases = []
    for kind, values in sizes.items():
        for size in values:
            if progress:
                print(f"{NAME}: {GRAPHS[kind]}, size {size}", flush=True)
            cases.append(_case(kind, size, rounds))
    figures = [_cost_figure(out_dir / f"{NAME}_fig1_cost.png", cases),
               _compile_figure(out_dir / f"{NAME}_fig2_compile_memory.png", cases)]
    summary, findings = [], []
    for c in cases:
        floors = {k: v for k, v in c["us"].items() if k.startswith("floor")}
        best = min(floors, key=floors.get)
        summary.append({"problem": f"{c['graph']} {c['size']}", "m": c["m"], "geomjax us/step": c["us"]["geomjax"],
                        "best floor us/step": floors[best], "best floor": best,
                        "geomjax / floor": c["us"]["geomjax"] / floors[best],
                        "dense us/step": c["us"].get("geomjax dense", float("nan")),
                        "compile [s]": c["compile"]["geomjax"], "memory [MB]": c["memory"]["geomjax"] / 1e6,
                        "max |dq| vs geomjax": c["agree"]})
    for kind in dict.fromkeys(c["graph"] for c in cases):
        mine = [c for c in cases if c["graph"] == kind]
        ms = [c["m"] for c in mine]
        ratios = [row["geomjax / floor"] for row in summary if row["problem"].startswith(kind + " ")]
        findings.append(
            f"{GRAPHS[kind]}, m = {ms[0]}–{ms[-1]}: cost per step grows like m^{_exponent(ms, [c['us']['geomjax'] for c in mine]):.2f} "
            f"(the banded floor m^{_exponent(ms, [c['us']['floor banded'] for c in mine]):.2f}); geomjax ÷ best floor "
            f"{min(ratios):.2f}–{max(ratios):.2f}; compile {min(c['compile']['geomjax'] for c in mine):.2f}–"
            f"{max(c['compile']['geomjax'] for c in mine):.2f} s; memory m^{_exponent(ms, [c['memory']['geomjax'] for c in mine]):.2f}.")
    return {"summary": summary, "findings": findings, "figures": [p.name for p in figures],
            "jax": jax.__version__, "device": jax.devices()[0].device_kind}
