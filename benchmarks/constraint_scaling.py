"""RATTLE on large sparse constraint graphs: geomjax against hand-written sparse floors.

Models (`geomjax.models`): the planar cloth n × n (rods on the grid's edges, two pinned
corners), the random tree of rods in space, the closed ring of rods, the box of rigid
triatomic molecules. For each size, in one process and interleaved rounds (best kept):

- geomjax:      `geomjax.rattle(model.system)` (defaults: the pattern of G M⁻¹Gᵀ read off the
                jaxpr; matrix-free Jacobi-preconditioned CG and a chord iteration for a
                sparse graph of ≥ 16 constraints), its `advance` in a plain `lax.scan`;
- integrate:    the same step through `geomjax.integrate` (start checks, status, monitoring;
                one save at the end), timed end to end after a first call;
- banded / krylov: geomjax with its sparse plan forced: the block Cholesky of the RCM-ordered
                G M⁻¹Gᵀ (`structured="banded"`) or Jacobi-preconditioned CG (`"krylov"`, up to
                `--krylov-max` constraints); the default picks the first when the RCM band is at most
                `geomjax._solve.block_cholesky.direct_band_limit(m)` = max(96, 2√m);
- dense:        `geomjax.rattle(model.system, structured=False)` (k jvps, LAPACK LU), up to
                `--dense-max` constraints: where the switch to the sparse path pays;
- floor banded: RATTLE written by hand with block-banded Cholesky solves: A's entries in closed
                form (±(d_e·d_f)/m_k for rods sharing particle k), scipy's reverse Cuthill–McKee
                order, blocks of max(band, 16), the chord iteration with exact solves;
- floor CG warm / CG cold (up to `--floor-max` constraints): RATTLE written by hand for rod networks (edge lists, G and Gᵀ as
                gathers and scatter-adds, the Jacobi diagonal |d_e|²(1/m_a + 1/m_b) in closed
                form, pinned particles as infinite masses): the position multipliers by the
                chord iteration ν ← ν + A₀⁻¹g(q₁(ν)), A₀ = G(q)M⁻¹G(q)ᵀ by PCG to a relative
                1e−3, the velocity multipliers by PCG to 1e−14, stopping on the same update test as
                geomjax (|M⁻¹GᵀΔν| ≤ 1e−13(1 + |q|)); "warm" starts both from the previous step's
                multipliers (carried in the loop), "cold" from zero;
- floor SHAKE (up to `--floor-max`):  RATTLE by coloured SHAKE/RATTLE sweeps (nonlinear Gauss–Seidel over the rods,
                rods of one colour share no particle so a colour is one vectorised update; over-
                relaxation ω = 1.5), position sweeps until max|g| ≤ 1e−14, velocity sweeps until
                max|G M⁻¹p| ≤ 1e−13 max|M⁻¹p|.

Fields (`--fields`): the Dirac field (explicit Euler, RK4) and the feedback field (Euler,
gains chosen for h by `feedback_field(..., dt=h)`), µs per step in a plain `lax.scan` of
the explicit step: geomjax's sparse derivation (`geomjax._field.derived.GramDiracPlan`:
A = G M⁻¹Gᵀ by block Cholesky or CG, C never formed), the dense derivation (C column by
column, LAPACK), and the Dirac field written by hand for rod networks
(`geomjax.experiments.rod_floors.dirac_field_floor`: C's blocks in closed form, A by
block-banded Cholesky or Jacobi-PCG; checked against geomjax to 1e−10 first), with
geomjax ÷ best floor, and the Dirac RK4 run through `integrate`.

Implicit steps (`--implicit`): Dirac-1 (velocity and position constraints), Dirac–Runge–
Kutta (Gauss, 2 stages), RATTLE for a non-separable H and a projected RK4 on the cloth, ms
per step in a plain scan: Newton by block LU in RCM order (`geomjax._solve.block_lu`, the
default from 100 unknowns) against the dense Newton (`geomjax.Newton(sparse=False)`), with
the growth exponents.

Before timing, every floor is checked against geomjax on the smallest size of each model
(100 steps, ≤ 1e−10 in q and p). Printed per case: µs per step, compile time
(lower + compile of the scan) and the compiled program's temporary memory; then
geomjax ÷ best floor, integrate ÷ scan, and the growth exponents d log(cost)/d log(m).

Run: `python benchmarks/constraint_scaling.py [--quick] [--cloth 4,8,16,32] [--tree 64,256,1024]
[--ring 64,256,1024] [--water 2,4,6] [--rounds 3]`.
"""

import argparse
import time

import jax
import numpy as np
from jax import lax

import geomjax
from _harness import timeit
from geomjax.experiments.rod_floors import (H_STEP, check_field_floors, check_floors, dense_dirac_field, dirac_field_floor,
                                             field_floor_scan, field_scan, floors, geomjax_scan, scan_run)


def compiled(run, x0):
    t = time.perf_counter()
    exe = jax.jit(run).lower(x0).compile()
    seconds = time.perf_counter() - t
    mem = exe.memory_analysis()
    temp = getattr(mem, "temp_size_in_bytes", float("nan")) if mem is not None else float("nan")
    return exe, seconds, temp


def best_time(fn, x0, rounds):
    return timeit(fn, x0, repeat=rounds)


CHECK_SIZE = {"cloth": 4, "tree": 64, "ring": 64, "water": 2}


def build(kind, size):
    if kind == "cloth":
        return geomjax.models.cloth(size)
    if kind == "tree":
        return geomjax.models.rod_tree(size)
    if kind == "ring":
        return geomjax.models.rod_ring(size)
    return geomjax.models.water_box(size)


def steps_for(m):
    return 200 if m < 300 else 50 if m < 3000 else 10


def run_case(kind, size, args):
    model = build(kind, size)
    n = model.system.dim // 2
    m = int(model.system.holonomic(model.x0[:n]).shape[0])
    steps = steps_for(m)
    rows = {}
    cases = {"geomjax": geomjax_scan(model, steps)}
    for other in ("banded", "krylov"):
        cases[other] = geomjax_scan(model, steps, structured=other)
    if m <= args.dense_max:
        cases["dense"] = geomjax_scan(model, steps, structured=False)
    if m > args.krylov_max:
        del cases["krylov"]
    for name, (step, extra) in floors(model, m <= args.floor_max).items():
        cases["floor " + name] = scan_run(step, extra, steps, n)
    exes = {}
    for name, run in cases.items():
        exe, seconds, temp = compiled(run, model.x0)
        exes[name] = exe
        rows[name] = dict(compile=seconds, temp=temp, us=np.inf)
    for _ in range(args.rounds):  # interleaved
        for name, exe in exes.items():
            rows[name]["us"] = min(rows[name]["us"], best_time(exe, model.x0, 1) / steps * 1e6)
    step = geomjax.rattle(model.system)
    integ = lambda x0: geomjax.integrate(step, x0, dt=H_STEP, steps=steps, save_every=steps).xs
    t = time.perf_counter()
    jax.block_until_ready(integ(model.x0))
    first = time.perf_counter() - t
    rows["integrate"] = dict(compile=first, temp=float("nan"), us=best_time(integ, model.x0, args.rounds) / steps * 1e6)
    return m, rows


def run_fields(kind, size, args):
    """µs per step of the Dirac field (Euler, RK4) and of the feedback field (Euler):
    geomjax's sparse derivation, the dense derivation (up to `--dense-max`) and the
    hand-written Dirac fields (block-banded Cholesky, and Jacobi-PCG up to `--floor-max`),
    each in the same plain `lax.scan` of the explicit step, compiled first, interleaved;
    then the Dirac RK4 run through `integrate` (start checks, status, monitoring)."""
    model = build(kind, size)
    n = model.system.dim // 2
    m = int(model.system.constraint_functions(model.x0).shape[0])
    steps = steps_for(m)
    dirac = geomjax.dirac_field(model.system)
    feedback = geomjax.feedback_field(model.system, model.x0, dt=H_STEP, method="euler")
    cases = {}
    for method, label in (("euler", "Euler"), ("rk4", "RK4")):
        cases[f"Dirac {label}"] = field_scan(dirac, method, steps, H_STEP)
        if m <= args.dense_max:
            cases[f"Dirac {label} dense"] = field_scan(dense_dirac_field(model.system), method, steps, H_STEP)
        for solver in ("banded", "CG") if m // 2 <= args.floor_max else ("banded",):
            cases[f"floor {solver} {label}"] = field_floor_scan(dirac_field_floor(model, solver), method, steps, H_STEP)
    cases["feedback Euler"] = field_scan(feedback, "euler", steps, H_STEP)
    rows, exes = {}, {}
    for name, run in cases.items():
        exe, seconds, _ = compiled(run, model.x0)
        exes[name] = exe
        rows[name] = dict(first=seconds, us=np.inf)
    for _ in range(args.rounds):  # interleaved
        for name, exe in exes.items():
            rows[name]["us"] = min(rows[name]["us"], best_time(exe, model.x0, 1) / steps * 1e6)
    fn = jax.jit(lambda x: geomjax.integrate(dirac, x, dt=H_STEP, steps=steps, method="rk4", save_every=steps).xs[-1])
    t = time.perf_counter()
    jax.block_until_ready(fn(model.x0))
    rows["Dirac RK4 integrate"] = dict(first=time.perf_counter() - t, us=best_time(fn, model.x0, args.rounds) / steps * 1e6)
    del n
    return m, rows


def field_ratios(rows):
    """geomjax ÷ best hand-written floor for the Dirac field (Euler, RK4), and the feedback
    field ÷ the best Dirac floor (a bound: a hand-written feedback field computes the
    Dirac field and more)."""
    out = {}
    for label in ("Euler", "RK4"):
        best = min(r["us"] for k, r in rows.items() if k.startswith("floor") and k.endswith(label))
        out[f"Dirac {label}"] = rows[f"Dirac {label}"]["us"] / best
        if label == "Euler":
            out["feedback Euler (vs Dirac floor)"] = rows["feedback Euler"]["us"] / best
    return out


def implicit_steps(model, newton):
    """The implicit steps whose Newton (or linear) solve grows with the graph, for a cloth."""
    system, g = model.system, model.params["g"]

    def lagrangian(q, v):
        return 0.5 * (v @ v) - g * q.reshape(-1, 2)[:, 1].sum()

    field = geomjax.hamiltonian_vector_field(system.hamiltonian, system.structure)
    return {
        "Dirac-1 velocity": geomjax.dirac1(lagrangian, system.holonomic, newton=newton),
        "Dirac-1 position": geomjax.dirac1(lagrangian, system.holonomic, constraint="position", newton=newton),
        "Dirac-RK Gauss 2": geomjax.dirac_rk(lagrangian, "gauss", 2, holonomic=system.holonomic, newton=newton),
        "RATTLE non-separable": geomjax.rattle(system, separable=False, newton=newton),
        "projected RK4": geomjax.project(geomjax.explicit_rk(field, geomjax.RK4), system, newton=newton),
    }


def run_implicit(size, args):
    """ms per step of the implicit steps on an n × n cloth: Newton by block LU in RCM order
    (the default from `SPARSE_NEWTON_MIN` unknowns) against the dense Newton
    (`Newton(sparse=False)`, up to `--dense-max` constraints), in a plain scan, interleaved."""
    model = build("cloth", size)
    m = int(model.system.holonomic(model.x0[: model.system.dim // 2]).shape[0])
    steps = max(5, min(50, 20_000 // m))
    kinds = {"blocks": geomjax.Newton()}
    if m <= args.dense_max:
        kinds["dense"] = geomjax.Newton(sparse=False)
    exes, rows = {}, {}
    for kind, newton in kinds.items():
        for name, step in implicit_steps(model, newton).items():
            run = lambda x0, step=step: lax.scan(lambda z, _: (step.advance(0.0, z, H_STEP, None)[0], None),
                                                 step.split(x0), None, length=steps)[0]
            exe, seconds, _ = compiled(run, model.x0)
            exes[(name, kind)] = exe
            rows[(name, kind)] = dict(compile=seconds, ms=np.inf)
    for _ in range(args.rounds):
        for key, exe in exes.items():
            rows[key]["ms"] = min(rows[key]["ms"], best_time(exe, model.x0, 1) / steps * 1e3)
    return m, rows


def exponent(ms, costs):
    ms, costs = np.log(np.asarray(ms, float)), np.log(np.asarray(costs, float))
    return float(np.polyfit(ms, costs, 1)[0]) if len(ms) > 1 else float("nan")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cloth", default="4,8,16,32,48")
    parser.add_argument("--tree", default="64,256,1024,4096")
    parser.add_argument("--ring", default="64,256,1024,4096")
    parser.add_argument("--water", default="2,4,6,8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dense-max", type=int, default=600)
    parser.add_argument("--floor-max", type=int, default=1200,
                        help="largest m for the iterative floors (CG, SHAKE): their iterations grow with the "
                             "condition number, a ring of 4096 rods takes seconds a step")
    parser.add_argument("--krylov-max", type=int, default=2100, help="largest m for geomjax's forced CG path")
    parser.add_argument("--implicit", default="4,8,12,16",
                        help="cloth sizes for the implicit steps (Dirac, Dirac-RK, non-separable RATTLE, projection); '' to skip")
    parser.add_argument("--quick", action="store_true", help="small sizes only")
    parser.add_argument("--fields", default="cloth:4,8,16,32;ring:64,256,1024",
                        help="graphs and sizes for the Dirac and feedback fields ('' to skip)")
    args = parser.parse_args()
    if args.quick:
        args.cloth, args.tree, args.ring, args.water, args.rounds = "4,8", "64,256", "64,256", "2,3", 2
        args.fields = "cloth:4,8"
        args.implicit = "4,8"
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, h = {H_STEP}; µs per step, best of "
          f"{args.rounds} interleaved rounds")
    summary = {}
    for kind in ("cloth", "tree", "ring", "water"):
        sizes = [int(s) for s in getattr(args, kind).split(",") if s]
        if not sizes:
            continue
        check_floors(build(kind, min(sizes[0], CHECK_SIZE[kind])))  # where the floors' stopping tests agree to 1e-10
        for size in sizes:
            m, rows = run_case(kind, size, args)
            best = min((r["us"], k) for k, r in rows.items() if k.startswith("floor"))
            line = "  ".join(f"{k} {r['us']:9.1f}" for k, r in rows.items())
            print(f"{kind:5s} {size:5d} m={m:6d}  {line}")
            comp = "  ".join(f"{k} {r['compile']:.2f}s" for k, r in rows.items())
            mem = "  ".join(f"{k} {r['temp'] / 1e6:.2f}MB" for k, r in rows.items() if np.isfinite(r["temp"]))
            print(f"      compile: {comp}\n      temp memory: {mem}")
            print(f"      geomjax / best floor ({best[1]}) = {rows['geomjax']['us'] / best[0]:.2f}; integrate / scan = "
                  f"{rows['integrate']['us'] / rows['geomjax']['us']:.2f}"
                  + (f"; dense / geomjax = {rows['dense']['us'] / rows['geomjax']['us']:.1f}" if "dense" in rows else ""))
            summary.setdefault(kind, []).append((m, rows))
    if args.fields:
        print("\nfields: µs per step through integrate inside jit (first call: trace + compile + run)")
        for item in args.fields.split(";"):
            kind, sizes = item.split(":")
            field_cases = []
            size_list = [int(v) for v in sizes.split(",")]
            check_field_floors(build(kind, min(size_list[0], CHECK_SIZE[kind])))
            for size in size_list:
                m, rows = run_fields(kind, size, args)
                field_cases.append((m, rows))
                print(f"{kind:5s} {size:5d} m={m:6d}  " + "  ".join(f"{k} {r['us']:9.1f}" for k, r in rows.items()))
                print("      compile (integrate: first call): " + "  ".join(f"{k} {r['first']:.2f}s" for k, r in rows.items()))
                print("      geomjax / best floor: " + "  ".join(f"{k} {v:.2f}" for k, v in field_ratios(rows).items()))
            ms = [m for m, _ in field_cases]
            names = [k for k in field_cases[0][1] if all(k in r for _, r in field_cases)]
            print("      growth exponents: " + "  ".join(
                f"{k} {exponent(ms, [r[k]['us'] for _, r in field_cases]):.2f}" for k in names))
    if args.implicit:
        print("\nimplicit steps on the cloth: ms per step, Newton by blocks (dense), compile s")
        cases = []
        for size in (int(v) for v in args.implicit.split(",")):
            m, rows = run_implicit(size, args)
            cases.append((m, rows))
            for name in dict.fromkeys(k[0] for k in rows):
                blocks, dense = rows[(name, "blocks")], rows.get((name, "dense"))
                extra = f"  dense {dense['ms']:9.3f} ({dense['ms'] / blocks['ms']:.1f}x)" if dense else ""
                print(f"cloth {size:3d} m={m:5d}  {name:22s} blocks {blocks['ms']:9.3f}{extra}  compile "
                      f"{blocks['compile']:.2f}s")
        ms = [m for m, _ in cases]
        print("      growth exponents (blocks): " + "  ".join(
            f"{name} {exponent(ms, [r[(name, 'blocks')]['ms'] for _, r in cases]):.2f}"
            for name in dict.fromkeys(k[0] for k in cases[0][1])))
    print("\ngrowth exponents d log(µs per step) / d log(m):")
    for kind, cases in summary.items():
        ms = [m for m, _ in cases]
        names = [k for k in cases[0][1] if all(k in r for _, r in cases)]
        print(f"  {kind:5s} " + "  ".join(f"{k} {exponent(ms, [r[k]['us'] for _, r in cases]):.2f}" for k in names))


if __name__ == "__main__":
    main()
