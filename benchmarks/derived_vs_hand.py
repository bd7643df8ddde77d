"""Autodiff-derived feedback field vs Chang, Perlmutter and Vankerschaver (2022) eqs. (7)–(8) written by hand.

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
from _harness import (
    compare_fields,
    size_arguments,
    sphere_states,
    time_integrate,
    timeit,
)

import geomjax

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


def derived_field(x0, simplified=True):
    model = geomjax.models.spherical_pendulum(m=M, g=G)
    y = geomjax.feedback_field(model.system, x0, gains=K)
    if simplified:
        return lambda q, p: y.rhs(0.0, (q, p), None)
    return lambda q, p: y.vector((q, p))  # as traced from the autodiff derivation


def main(argv=None):
    args = size_arguments(__doc__.splitlines()[0]).parse_args(argv)
    h = 1e-3
    model = geomjax.models.spherical_pendulum()
    x0 = model.x0
    xs = sphere_states(args.batch, jax.random.PRNGKey(0))
    print("spherical pendulum, feedback field (Chang, Perlmutter and Vankerschaver (2022) eqs. (7)-(8)), explicit Euler, h = 1e-3, k = 50")
    times = compare_fields(
        {
            "hand-written eqs. (7)-(8)": hand_field_wrap,
            "derived (geomjax rhs)": derived_field,
            "derived, not simplified": lambda x: derived_field(x, simplified=False),
        },
        x0,
        xs,
        args.steps,
        args.batch_steps,
        h,
    )
    y = geomjax.feedback_field(model.system, x0, gains=K)
    time_integrate(y, x0, h, args.steps, times["hand-written eqs. (7)-(8)"][0])
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
