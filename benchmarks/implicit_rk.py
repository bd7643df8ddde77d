"""2-stage Gauss (order 4): `geomjax.integrate(..., method="gauss4")` vs a hand-written JAX step.

Both integrate the Dirac field of the spherical pendulum, `geomjax.dirac_field(system)`
(the same field function, so only the stage solver differs), over t ∈ [0, T]:

- geomjax:  `geomjax.integrate(X, x0, dt=H, steps=..., method="gauss4")`;
  with its stage solver "auto" (the default: fixed-point iteration, Newton where it does
  not contract), "fixed_point" and "newton" (simplified Newton);
- hand (simplified Newton): 2-stage Gauss–Legendre written out in plain JAX: the
            field's Jacobian J at x_n once per step, the 2n × 2n matrix I − h A⊗J factored
            once (LU), `FIXED` iterations from the predictor Zᵢ = cᵢhX(x_n), then a check of
            the last update (a failure flag, as geomjax reports);
- hand (fixed point): the stage equations iterated Z ← h(A⊗I)X(x_n + Z) from the same
            predictor in a `while_loop` until the update is ≤ 1e−15(1 + |Z|), no linear
            algebra (the floor the issue measured at 0.35 µs/step; also for Gauss-6 at
            equal error, where its ratio to Dopri8 is what the method itself allows).

Also, for context, diffrax Tsit5 and Dopri8 (adaptive) at the final error of gauss4, and
at equal final error (1e−5 and 1e−8 against a Gauss-6 reference at h = 0.005) the fastest
of gauss4, gauss6 and gauss8 over a ladder of step sizes against Dopri8 over a ladder of
tolerances, with each run's largest energy error (Gauss: round-off; Dopri8 drifts).
Prints ns/step and the ratios measured in this run.

Run: `python benchmarks/implicit_rk.py [--t-final T] [--dt H]`.
"""

import argparse
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np

import geomjax
from _harness import timeit

R3 = math.sqrt(3.0)
A = np.array([[0.25, 0.25 - R3 / 6.0], [0.25 + R3 / 6.0, 0.25]])
B = np.array([0.5, 0.5])
C = A.sum(axis=1)
FIXED = 6
TOL = 1e-13


def hand_gauss4(field, h):
    """One Gauss-4 step x ↦ (x₁, ok) for a flat field x ↦ ẋ, simplified Newton, FIXED iterations."""

    def step(x):
        n = x.shape[0]
        jac = jax.jacfwd(field)(x)
        lu = jax.scipy.linalg.lu_factor(jnp.eye(2 * n) - h * jnp.kron(jnp.asarray(A), jac))
        k0 = field(x)
        z = jnp.concatenate([C[0] * h * k0, C[1] * h * k0])
        for _ in range(FIXED):
            f1, f2 = field(x + z[:n]), field(x + z[n:])
            r = z - h * jnp.concatenate([A[0, 0] * f1 + A[0, 1] * f2, A[1, 0] * f1 + A[1, 1] * f2])
            dz = jax.scipy.linalg.lu_solve(lu, r)
            z = z - dz
        f1, f2 = field(x + z[:n]), field(x + z[n:])
        ok = jnp.max(jnp.abs(dz)) <= TOL + TOL * jnp.max(jnp.abs(z))
        return x + h * (B[0] * f1 + B[1] * f2), ok

    return step


def hand_fixed_point_gauss(field, h, a=A, b=B):
    """One s-stage Gauss step x ↦ (x₁, ok) for the tableau (a, b) (default Gauss-4), stages
    by fixed-point iteration (no linear algebra)."""
    a, b = np.asarray(a), np.asarray(b)
    s, c = len(b), np.asarray(a).sum(axis=1)

    def step(x):
        n = x.shape[0]
        k0 = field(x)
        z0 = jnp.concatenate([c[i] * h * k0 for i in range(s)])

        def slopes(z):
            return [field(x + z[i * n : (i + 1) * n]) for i in range(s)]

        def phi(z):
            f = slopes(z)
            return h * jnp.concatenate([sum(a[i, j] * f[j] for j in range(s)) for i in range(s)])

        def body(carry):
            z, k, _ = carry
            z_new = phi(z)
            return z_new, k + 1, jnp.max(jnp.abs(z_new - z)) <= 1e-15 * (1.0 + jnp.max(jnp.abs(z_new)))

        z, _, ok = jax.lax.while_loop(lambda carry: (carry[1] < 40) & ~carry[2], body, (z0, 0, False))
        f = slopes(z)
        return x + h * sum(b[i] * f[i] for i in range(s)), ok

    return step


def hand_run(field, h, steps, make=hand_gauss4):
    step = make(field, h)

    def run(x0):
        def body(carry, _):
            x, ok = carry
            x1, ok1 = step(x)
            return (x1, ok & ok1), None

        (x, ok), _ = jax.lax.scan(body, (x0, jnp.asarray(True)), None, length=steps)
        return x, ok

    return run


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--t-final", type=float, default=100.0)
    parser.add_argument("--dt", type=float, default=0.05)
    parser.add_argument("--no-diffrax", action="store_true")
    args = parser.parse_args(argv)
    model = geomjax.models.spherical_pendulum()
    field = geomjax.dirac_field(model.system)
    x0, h = model.x0, args.dt
    steps = int(round(args.t_final / h))

    geo = jax.jit(lambda x: geomjax.integrate(field, x, dt=h, steps=steps, save_every=steps, method="gauss4").xs[-1])

    def with_solver(solver):
        step = geomjax.implicit_rk(field, geomjax.GAUSS4, solver=solver)
        return jax.jit(lambda x: geomjax.integrate(step, x, dt=h, steps=steps, save_every=steps).xs[-1])

    solvers = {name: with_solver(name) for name in ("fixed_point", "newton")}
    hand = jax.jit(hand_run(field, h, steps))
    hand_fp = jax.jit(hand_run(field, h, steps, hand_fixed_point_gauss))
    x_geo = geo(x0)
    x_hand, ok = hand(x0)
    x_fp, ok_fp = hand_fp(x0)
    t_geo, t_hand, t_fp = timeit(geo, x0, repeat=3), timeit(hand, x0, repeat=3), timeit(hand_fp, x0, repeat=3)
    t_solvers = {name: timeit(fn, x0, repeat=3) for name, fn in solvers.items()}

    # Reference: 6th-order Gauss with a 10x smaller step.
    ref_step = geomjax.implicit_rk(field, geomjax.GAUSS6)
    ref, _ = geomjax.diagnostics.final_state(ref_step, x0, h / 10, steps * 10)
    err_geo = float(jnp.max(jnp.abs(x_geo - ref)))
    err_hand = float(jnp.max(jnp.abs(x_hand - ref)))

    print(f"spherical pendulum, Dirac field, gauss4, h = {h:g}, t in [0, {args.t_final:g}] ({steps} steps); device {jax.devices()[0]}")
    print(f"final error vs gauss6 (h/10): geomjax {err_geo:.2e}, hand ({FIXED} simplified-Newton iterations, check {'passed' if bool(ok) else 'FAILED'}) {err_hand:.2e}")
    print(f"hand fixed point: check {'passed' if bool(ok_fp) else 'FAILED'}, |x - geomjax| = {float(jnp.max(jnp.abs(x_fp - x_geo))):.1e}")
    print(f"{'variant':<34}{'ns/step':>10}{'vs hand Newton':>16}{'vs hand fixed point':>21}")
    rows = [("hand (simplified Newton)", t_hand), ("hand (fixed point)", t_fp), ("geomjax gauss4 (auto)", t_geo)]
    rows += [(f"geomjax gauss4 ({name})", t) for name, t in t_solvers.items()]
    for label, t in rows:
        print(f"{label:<34}{t / steps * 1e9:>10.0f}{t / t_hand:>16.2f}{t / t_fp:>21.2f}")

    if not args.no_diffrax:
        import diffrax

        term = diffrax.ODETerm(lambda t, y, _: field(y))
        for solver in (diffrax.Tsit5(), diffrax.Dopri8()):
            for tol in (1e-6, 1e-7, 1e-8, 1e-9, 1e-10, 1e-11, 1e-12):

                def solve(x, tol=tol, solver=solver):
                    sol = diffrax.diffeqsolve(
                        term, solver, 0.0, args.t_final, h, x,
                        stepsize_controller=diffrax.PIDController(rtol=tol, atol=tol * 1e-2),
                        max_steps=10**7, saveat=diffrax.SaveAt(t1=True),
                    )
                    return sol.ys[-1], sol.stats["num_accepted_steps"]

                run = jax.jit(solve)
                y, n_acc = run(x0)
                err = float(jnp.max(jnp.abs(y - ref)))
                if err <= err_geo:
                    t = timeit(run, x0, repeat=3)
                    print(f"diffrax {type(solver).__name__:<8} rtol {tol:g}: error {err:.2e} (<= gauss4's), "
                          f"{int(n_acc)} steps, {t * 1e3:.1f} ms total = {t / t_geo:.2f}x geomjax gauss4")
                    break
            else:
                print(f"diffrax {type(solver).__name__}: gauss4's error not reached down to rtol 1e-12")


def equal_error(field, energy, x0, t_final, targets=(1e-5, 1e-8)):
    """At each target final error over [0, t_final]: the fastest Gauss order (4, 6, 8) over a
    ladder of step sizes that reaches it, against diffrax Dopri8 over a ladder of
    tolerances; both runs' largest energy error is printed (Gauss bounded, Dopri8 drifts)."""
    import diffrax

    ref_h = 0.005
    ref, _ = geomjax.diagnostics.final_state(geomjax.implicit_rk(field, geomjax.GAUSS6), x0, ref_h, int(round(t_final / ref_h)))
    e0 = energy(x0)
    saves = 100

    def gauss(tableau, h):
        steps = int(round(t_final / h))
        steps -= steps % saves
        step = geomjax.implicit_rk(field, tableau)
        run = jax.jit(lambda x: geomjax.integrate(step, x, dt=t_final / steps, steps=steps, save_every=steps // saves, throw=False).xs)
        return run

    def dopri(tol):
        term = diffrax.ODETerm(lambda t, y, _: field(y))
        ts = jnp.linspace(0.0, t_final, saves + 1)

        def solve(x):
            sol = diffrax.diffeqsolve(
                term, diffrax.Dopri8(), 0.0, t_final, 0.01, x, saveat=diffrax.SaveAt(ts=ts),
                stepsize_controller=diffrax.PIDController(rtol=tol, atol=tol * 1e-2), max_steps=10**7,
            )
            return sol.ys

        return jax.jit(solve)

    print(f"equal final error over t in [0, {t_final:g}] (reference: gauss6, h = {ref_h:g}); time of the run, largest |energy error| at {saves} saves")
    for target in targets:
        best, floors = {}, {}
        for name, tableau in (("gauss4", geomjax.GAUSS4), ("gauss6", geomjax.GAUSS6), ("gauss8", geomjax.GAUSS8)):
            for h in (0.25, 0.2, 0.17, 0.15, 0.125, 0.1, 0.085, 0.075, 0.065, 0.05, 0.035, 0.025, 0.0175, 0.0125, 0.00875, 0.00625):
                run = gauss(tableau, h)
                xs = run(x0)
                if float(jnp.max(jnp.abs(xs[-1] - ref))) <= target:
                    best[f"{name} h={h:g}"] = (timeit(run, x0, repeat=3), float(jnp.max(jnp.abs(jax.vmap(energy)(xs) - e0))))
                    # the floor: the same method and step written by hand (fixed point, no saves)
                    steps = int(round(t_final / h))
                    steps -= steps % saves
                    floor = jax.jit(hand_run(field, t_final / steps, steps, lambda f, dt, t=tableau: hand_fixed_point_gauss(f, dt, t.a, t.b)))
                    floor(x0)
                    floors[f"{name} h={h:g}"] = timeit(floor, x0, repeat=3)
                    break
        for tol in (1e-5, 1e-6, 1e-7, 1e-8, 1e-9, 1e-10, 1e-11, 1e-12, 1e-13):
            run = dopri(tol)
            ys = run(x0)
            if float(jnp.max(jnp.abs(ys[-1] - ref))) <= target:
                dop = (f"Dopri8 rtol={tol:g}", timeit(run, x0, repeat=3), float(jnp.max(jnp.abs(jax.vmap(energy)(ys) - e0))))
                break
        else:
            dop = None
        line = f"  error <= {target:g}: " + ", ".join(f"{k}: {t * 1e3:.2f} ms, |dE| {de:.1e}" for k, (t, de) in best.items())
        if dop is not None:
            line += f"; {dop[0]}: {dop[1] * 1e3:.2f} ms, |dE| {dop[2]:.1e}"
            if best:
                label, (t, _) = min(best.items(), key=lambda kv: kv[1][0])
                line += f"; best Gauss ({label}) / Dopri8 = {t / dop[1]:.2f}"
                line += f" (hand fixed-point {label.split()[0]} at that h, the floor: {floors[label] / dop[1]:.2f})"
        print(line, flush=True)


if __name__ == "__main__":
    main()
    model = geomjax.models.spherical_pendulum()
    if "--no-diffrax" not in sys.argv:
        equal_error(geomjax.dirac_field(model.system), model.system.hamiltonian, model.x0, 100.0)
