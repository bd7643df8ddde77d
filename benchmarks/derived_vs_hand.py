"""Autodiff-derived feedback field vs seed 000 eqs. (7)–(8) written by hand.

Both fields run in the same `lax.scan` explicit-Euler loop on the (q, p) pieces, for one
trajectory (1e5 steps) and for `vmap` over 1024 initial states (1e4 steps). Also times
`geomjax.integrate` (the public driver, with its per-step failure flag) and
`scipy.integrate.solve_ivp` (DOP853) at the same final accuracy.

Run: `python benchmarks/derived_vs_hand.py` (prints a table of times and ratios).
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

import geomjax
from _harness import euler_loop, size_arguments, sphere_states, timeit

M = G = 1.0
K = 50.0


def hand_field(q0, p0):
    """Seed 000 eqs. (7)–(8), m = g = 1, k1..k4 = K, written out by hand."""
    e3 = jnp.array([0.0, 0.0, 1.0])
    f10, f20 = q0 @ q0, q0 @ p0
    h0 = 0.5 * p0 @ p0 / M + M * G * q0[2]
    j0 = q0[0] * p0[1] - q0[1] * p0[0]

    def field(q, p):
        f1, f2 = q @ q, q @ p
        h = 0.5 * p @ p / M + M * G * q[2]
        j = q[0] * p[1] - q[1] * p[0]
        df1, df2, dh, dj = f1 - f10, f2 - f20, h - h0, j - j0
        p_x_e3 = jnp.stack([p[1], -p[0], 0.0 * p[2]])
        e3_x_q = jnp.stack([-q[1], q[0], 0.0 * q[2]])
        qdot = p / M - f2 / (M * f1) * q - 2 * K * df1 * q - K * df2 * p - K * M * G * dh * e3 - K * dj * p_x_e3
        pdot = (
            -M * G * e3
            + f2 / (M * f1) * p
            + (-(p @ p) / M + M * G * q[2]) / f1 * q
            - K * df2 * q
            - K * dh / M * p
            - K * dj * e3_x_q
        )
        return qdot, pdot

    return field


def derived_field(x0):
    model = geomjax.models.spherical_pendulum(m=M, g=G)
    y = geomjax.feedback_field(model.system, x0, gains=K)
    return lambda q, p: y.rhs((q, p))








def main(argv=None):
    args = size_arguments(__doc__.splitlines()[0]).parse_args(argv)
    h = 1e-3
    model = geomjax.models.spherical_pendulum()
    x0 = model.x0

    rows = []
    single_hand = jax.jit(euler_loop(hand_field_wrap, args.steps, h))
    single_derived = jax.jit(euler_loop(derived_field, args.steps, h))
    xh, xd = single_hand(x0), single_derived(x0)
    agree = float(jnp.max(jnp.abs(xh - xd)))
    t_hand = timeit(single_hand, x0)
    t_der = timeit(single_derived, x0)
    y = geomjax.feedback_field(model.system, x0, gains=K)
    integ = lambda x: geomjax.integrate(y, x, dt=h, steps=args.steps, save_every=args.steps).xs[-1]
    t_int = timeit(integ, x0)
    rows.append(("single, 1e5 steps", t_hand, t_der, t_int))

    xs = sphere_states(args.batch, jax.random.PRNGKey(0))
    batch_hand = jax.jit(jax.vmap(euler_loop(hand_field_wrap, args.batch_steps, h)))
    batch_derived = jax.jit(jax.vmap(euler_loop(derived_field, args.batch_steps, h)))
    t_bh = timeit(batch_hand, xs, repeat=3)
    t_bd = timeit(batch_derived, xs, repeat=3)

    def integ_batch(xs):
        def one(x):
            yy = geomjax.feedback_field(model.system, x, gains=K)
            return geomjax.integrate(yy, x, dt=h, steps=args.batch_steps, save_every=args.batch_steps).xs[-1]

        return jax.vmap(one)(xs)

    integ_batch = jax.jit(integ_batch)
    t_bi = timeit(integ_batch, xs, repeat=3)
    rows.append((f"vmap {args.batch}, 1e4 steps", t_bh, t_bd, t_bi))

    print(f"derived vs hand-written final states agree to {agree:.2e}")
    print(f"{'case':<24}{'hand [s]':>12}{'derived [s]':>13}{'ratio':>8}{'integrate [s]':>15}{'ratio':>8}")
    for name, th, td, ti in rows:
        print(f"{name:<24}{th:>12.4f}{td:>13.4f}{td / th:>8.2f}{ti:>15.4f}{ti / th:>8.2f}")
    n1 = args.steps
    nb = args.batch * args.batch_steps
    print(
        f"per step: hand {rows[0][1] / n1 * 1e9:.0f} ns, derived {rows[0][2] / n1 * 1e9:.0f} ns; "
        f"batched throughput: hand {nb / rows[1][1]:.3g}, derived {nb / rows[1][2]:.3g} trajectory-steps/s"
    )
    scipy_comparison(model, y, h)


def hand_field_wrap(x0):
    return hand_field(x0[:3], x0[3:])


def scipy_comparison(model, y, h, t_end=100.0):
    """geomjax feedback-Euler vs scipy DOP853 on the same feedback field, same final error."""
    from scipy.integrate import solve_ivp

    steps = int(round(t_end / h))
    ref = geomjax.integrate(y, model.x0, dt=h / 10, steps=10 * steps, method="rk4", save_every=10 * steps).xs[-1]
    run = lambda x: geomjax.integrate(y, x, dt=h, steps=steps, save_every=steps).xs[-1]
    t_g = timeit(run, model.x0, repeat=3)
    err_g = float(jnp.max(jnp.abs(run(model.x0) - ref)))
    field_np = jax.jit(lambda x: y(x))
    rhs = lambda t, x: np.asarray(field_np(x))
    # Loosen scipy's tolerance until its final error matches the Euler run's.
    for rtol in [1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8]:
        t = time.perf_counter()
        sol = solve_ivp(rhs, (0.0, t_end), np.asarray(model.x0), method="DOP853", rtol=rtol, atol=rtol * 1e-2)
        t_s = time.perf_counter() - t
        err_s = float(np.max(np.abs(sol.y[:, -1] - np.asarray(ref))))
        if err_s <= err_g:
            break
    print(
        f"scipy DOP853 (rtol {rtol:g}, {sol.nfev} field evals, error {err_s:.2e}): {t_s:.3f} s; "
        f"geomjax feedback-Euler (error {err_g:.2e}): {t_g:.4f} s; speed-up {t_s / t_g:.1f}x"
    )


if __name__ == "__main__":
    main()
