"""Compile time, compiled size and run time of `geomjax.integrate`'s run loop.

For each case, one `jax.jit`-ed run `x0 ↦ integrate(...).xs[-1]` of `--steps` steps saved
every `--save-every` steps (default: once, at the end): trace+lower and XLA compile time,
the number of HLO instructions and of `while` loops in the compiled program, and the best
of `--repeat` warm runs in ns/step. Cases: the planar chain (`geomjax.models.planar_chain`,
N = 8, 16, 32) with the Dirac field and RK4, the feedback field and explicit Euler, and
RATTLE (built as in `chain_scaling.py`, whose plain-JAX `lax.scan` with the tridiagonal
(Thomas) field is timed beside them as the hand reference); the spherical pendulum with
`gauss4` (Dirac field, h = 0.05) and RATTLE.

Target (issue 25): compile (lower + XLA) ≤ 2 s for every N ≤ 32 on an idle 2-core CPU.

Run: `python benchmarks/run_loop.py [--links 8,16,32] [--steps 2000] [--save-every S] [--rounds R]
[--only TEXT]`.
"""

import argparse
import math
import re
import time

import jax

import geomjax
from chain_scaling import make_run


def hlo_counts(text):
    """(instructions, while loops) of compiled HLO text."""
    instrs = sum(1 for line in text.splitlines() if re.match(r"^\s+(ROOT )?%\S+ = ", line))
    return instrs, len(re.findall(r" while\(", text))


def measure(run, x0, steps, repeat, rounds=1):
    """Compile (best of `rounds` fresh lowerings and compilations; wall and CPU time, which
    a loaded machine inflates less) and run time of `jax.jit(run)` at `x0`."""
    best = {}
    for _ in range(rounds):
        jax.clear_caches()  # each round traces, lowers and compiles anew
        w, c = time.perf_counter(), time.process_time()
        lowered = jax.jit(lambda x: run(x)).lower(x0)
        t_lower, c_lower = time.perf_counter() - w, time.process_time() - c
        w, c = time.perf_counter(), time.process_time()
        compiled = lowered.compile()
        t_compile, c_compile = time.perf_counter() - w, time.process_time() - c
        for key, value in dict(lower=t_lower, compile=t_compile, cpu=c_lower + c_compile).items():
            best[key] = min(best.get(key, math.inf), value)
    instrs, loops = hlo_counts(compiled.as_text())
    jax.block_until_ready(compiled(x0))
    ns = math.inf
    for _ in range(repeat):
        t = time.perf_counter()
        jax.block_until_ready(compiled(x0))
        ns = min(ns, time.perf_counter() - t)
    return dict(best, instrs=instrs, loops=loops, ns=ns / steps * 1e9)


def cases(links, steps, save_every):
    every = save_every or steps
    for n in links:
        model = geomjax.models.planar_chain(n)
        for method in ("dirac rk4", "feedback euler", "rattle"):
            for version in ("hand tri", "geomjax"):
                run = make_run(method, version, model, steps)
                if version == "geomjax" and save_every:
                    run = _resaved(method, model, steps, every)
                yield f"chain N={n:<2} {method:<14} {version:<8}", run, model.x0
    model = geomjax.models.spherical_pendulum()
    x_field = geomjax.dirac_field(model.system)
    yield (
        "pendulum gauss4 h=0.05          ",
        lambda x: geomjax.integrate(x_field, x, dt=0.05, steps=steps, method="gauss4", save_every=every).xs[-1],
        model.x0,
    )
    model = geomjax.models.spherical_pendulum(holonomic=True)
    step = geomjax.rattle(model.system)
    yield (
        "pendulum rattle h=1e-3          ",
        lambda x: geomjax.integrate(step, x, dt=1e-3, steps=steps, save_every=every).xs[-1],
        model.x0,
    )


def _resaved(method, model, steps, every):
    kind, _, scheme = method.partition(" ")
    if kind == "rattle":
        target, scheme = geomjax.rattle(model.system), "euler"
    elif kind == "dirac":
        target = geomjax.dirac_field(model.system)
    else:
        target = geomjax.feedback_field(model.system, model.x0, gains=10.0)
    return lambda x: geomjax.integrate(target, x, dt=1e-3, steps=steps, method=scheme, save_every=every).xs[-1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--links", default="8,16,32")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--save-every", type=int, default=0, help="0: one save at the end")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1, help="compilations per case (the best is shown)")
    parser.add_argument("--only", default="", help="run the cases whose label contains this")
    args = parser.parse_args(argv)
    links = [int(v) for v in args.links.split(",") if v]
    print(f"{'case':<34}{'lower s':>8}{'XLA s':>7}{'total':>7}{'CPU s':>7}{'instrs':>8}{'whiles':>7}{'ns/step':>10}")
    for label, run, x0 in cases(links, args.steps, args.save_every):
        if args.only and args.only not in label:
            continue
        r = measure(run, x0, args.steps, args.repeat, args.rounds)
        total = r["lower"] + r["compile"]
        flag = "" if "hand" in label or total <= 2.0 else "  > 2 s target"
        print(
            f"{label:<34}{r['lower']:8.2f}{r['compile']:7.2f}{total:7.2f}{r['cpu']:7.2f}{r['instrs']:8d}{r['loops']:7d}"
            f"{r['ns']:10.1f}{flag}",
            flush=True,
        )


if __name__ == "__main__":
    main()
