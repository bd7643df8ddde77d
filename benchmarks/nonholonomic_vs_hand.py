"""Autodiff-derived nonholonomic feedback field vs the same field written by hand.

The knife edge on an inclined plane (Chang and Perlmutter (2019) §3.2, `geomjax.models.knife_edge`):
geomjax derives J, C, H_ext, λ and ∇V from H and ω(q) = (sin φ, −cos φ, 0) by autodiff;
the hand-written field below is the same extension worked out on paper. Both run in the
same `lax.scan` explicit-Euler loop on the (q, p) pieces, for one trajectory (1e5 steps)
and for `vmap` over 1024 initial states (1e4 steps).

Run: `python benchmarks/nonholonomic_vs_hand.py` (prints times and derived/hand ratios).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from _harness import compare_fields, size_arguments, time_integrate

import geomjax

GAINS = (10.0, 10.0, 10.0)  # k_J, k_H, k_pφ
H_STEP = 1e-3


def hand_field(model, x0):
    """The knife edge's feedback field, worked out by hand.

    With P∥ = p_x cos φ + p_y sin φ and P⊥ = p_x sin φ − p_y cos φ: J = P⊥/m, C = 1/m,
    H_ext = P∥²/2m + p_φ²/2I − m g sin α x, λ = −P∥p_φ/I − m g sin α sin φ, and
    V = k_J/2 J² + k_H/2 (H_ext − H₀)² + k_p/2 (p_φ − p_φ₀)².
    """
    pr = model.params
    m, inertia = pr["m"], pr["inertia"]
    f = m * pr["g"] * jnp.sin(pr["alpha"])
    k_j, k_h, k_p = GAINS

    def h_ext(q, p):
        c, s = jnp.cos(q[2]), jnp.sin(q[2])
        par = p[0] * c + p[1] * s
        return 0.5 * par * par / m + 0.5 * p[2] * p[2] / inertia - f * q[0]

    h0 = h_ext(x0[:3], x0[3:])
    pphi0 = x0[5]

    def field(q, p):
        c, s = jnp.cos(q[2]), jnp.sin(q[2])
        par = p[0] * c + p[1] * s
        perp = p[0] * s - p[1] * c
        j = perp / m
        lam = -par * p[2] / inertia - f * s
        w_j = k_j * j
        w_h = k_h * (0.5 * par * par / m + 0.5 * p[2] * p[2] / inertia - f * q[0] - h0)
        w_p = k_p * (p[2] - pphi0)
        vel = par / m
        qdot = jnp.stack(
            [
                vel * c + w_h * f,
                vel * s,
                p[2] / inertia - w_j * par / m + w_h * par * perp / m,
            ]
        )
        pdot = jnp.stack(
            [
                f + lam * s - w_j * s / m - w_h * vel * c,
                -lam * c + w_j * c / m - w_h * vel * s,
                par * perp / m - w_h * p[2] / inertia - w_p,
            ]
        )
        return qdot, pdot

    return field


def derived_field(model, x0, simplified=True):
    y = geomjax.feedback_field(model.system, x0, gains=jnp.asarray(GAINS))
    if simplified:
        return lambda q, p: y.rhs(0.0, (q, p), None)
    return lambda q, p: y.vector((q, p))  # as traced from the autodiff derivation


def initial_states(model, n, key):
    """n knife-edge states on the constraint set: random heading, speed along the blade, spin."""
    k1, k2, k3 = jax.random.split(key, 3)
    phi = jax.random.uniform(k1, (n,), minval=-np.pi, maxval=np.pi)
    speed = jax.random.normal(k2, (n,))
    spin = 1.0 + jax.random.uniform(k3, (n,))
    zero = jnp.zeros((n,))
    m = model.params["m"]
    return jnp.stack(
        [zero, zero, phi, m * speed * jnp.cos(phi), m * speed * jnp.sin(phi), model.params["inertia"] * spin], axis=1
    )


def main(argv=None):
    args = size_arguments(__doc__.splitlines()[0]).parse_args(argv)
    model = geomjax.models.knife_edge()
    x0 = model.x0
    xs = initial_states(model, args.batch, jax.random.PRNGKey(0))
    print("knife edge, nonholonomic feedback field, explicit Euler, h = 1e-3, gains (k_J, k_H, k_p) = 10")
    times = compare_fields(
        {
            "hand-written": functools.partial(hand_field, model),
            "derived (geomjax rhs)": functools.partial(derived_field, model),
            "derived, not simplified": functools.partial(derived_field, model, simplified=False),
        },
        x0,
        xs,
        args.steps,
        args.batch_steps,
        H_STEP,
    )
    y = geomjax.feedback_field(model.system, x0, gains=jnp.asarray(GAINS))
    time_integrate(y, x0, H_STEP, args.steps, times["hand-written"][0])


if __name__ == "__main__":
    main()
