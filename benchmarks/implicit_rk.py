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
            algebra (the floor the issue measured at 0.35 µs/step).

Also, for context, diffrax Tsit5 and Dopri8 (adaptive) at the final error of gauss4.
Prints ns/step and the ratios measured in this run.

Run: `python benchmarks/implicit_rk.py [--t-final T] [--dt H]`.
"""

import argparse
import math

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


def hand_fixed_point_gauss4(field, h):
    """One Gauss-4 step x ↦ (x₁, ok), stages by fixed-point iteration (no linear algebra)."""

    def step(x):
        n = x.shape[0]
        k0 = field(x)
        z0 = jnp.concatenate([C[0] * h * k0, C[1] * h * k0])

        def phi(z):
            f1, f2 = field(x + z[:n]), field(x + z[n:])
            return h * jnp.concatenate([A[0, 0] * f1 + A[0, 1] * f2, A[1, 0] * f1 + A[1, 1] * f2])

        def body(c):
            z, k, _ = c
            z_new = phi(z)
            return z_new, k + 1, jnp.max(jnp.abs(z_new - z)) <= 1e-15 * (1.0 + jnp.max(jnp.abs(z_new)))

        z, _, ok = jax.lax.while_loop(lambda c: (c[1] < 40) & ~c[2], body, (z0, 0, False))
        f1, f2 = field(x + z[:n]), field(x + z[n:])
        return x + h * (B[0] * f1 + B[1] * f2), ok

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
    hand_fp = jax.jit(hand_run(field, h, steps, hand_fixed_point_gauss4))
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


if __name__ == "__main__":
    main()
