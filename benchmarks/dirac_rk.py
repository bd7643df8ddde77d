"""Dirac–Runge–Kutta, Gauss s = 2: `geomjax.dirac_rk` vs a hand-written JAX step.

The planar pendulum as a constrained particle: q ∈ R², L = ½|v|² − g y, φ = |q|² − 1
(α = 2qᵀ), h = 0.01, one trajectory in a jitted `lax.scan`:

- geomjax: `geomjax.dirac_rk(L, "gauss", 2, holonomic=phi)`, every derivative by autodiff;
- hand:    the same stage equations written out for this L and φ (Vᵢ − Pᵢ = 0,
           2Qᵢ·Vᵢ = 0 with Fⱼ = (0, −g) + 2QⱼΛⱼ), simplified Newton with the Jacobian at
           the guess inverted once per step (jnp.linalg.inv, or "hand, unrolled": the
           unrolled elimination geomjax uses), `FIXED` iterations, then the size of the
           last update checked (a failure flag).

Prints µs/step, the ratio, the agreement of the final states and the HLO of the geomjax
loop (fusions, custom calls).

Run: `python benchmarks/dirac_rk.py [--steps N]`.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import geomjax
from _harness import count_fusions, timeit
from geomjax._solve.linalg import unrolled_solve

G, H = 9.81, 0.01
FIXED = 6
TOL = 1e-13
TAB = geomjax.PartitionedTableau.gauss(2)
A = np.array(TAB.a)
B = np.array(TAB.b)


def hand_step(x, invert=jnp.linalg.inv):
    q0, p0 = x[:2], x[2:]
    gravity = jnp.array([0.0, -G])

    def stages(u):
        v1, v2, l1, l2 = u[0:2], u[2:4], u[4], u[5]
        q1 = q0 + H * (A[0, 0] * v1 + A[0, 1] * v2)
        q2 = q0 + H * (A[1, 0] * v1 + A[1, 1] * v2)
        f1 = gravity + 2.0 * l1 * q1
        f2 = gravity + 2.0 * l2 * q2
        return v1, v2, q1, q2, f1, f2

    def residual(u):
        v1, v2, q1, q2, f1, f2 = stages(u)
        p1 = p0 + H * (A[0, 0] * f1 + A[0, 1] * f2)
        p2 = p0 + H * (A[1, 0] * f1 + A[1, 1] * f2)
        return jnp.concatenate([v1 - p1, v2 - p2, jnp.stack([2.0 * q1 @ v1, 2.0 * q2 @ v2])])

    u = jnp.concatenate([p0, p0, jnp.zeros(2)])
    inverse = invert(jax.jacfwd(residual)(u))
    for _ in range(FIXED):
        du = inverse @ residual(u)
        u = u - du
    ok = jnp.max(jnp.abs(du)) <= TOL + TOL * jnp.max(jnp.abs(u))
    v1, v2, _, _, f1, f2 = stages(u)
    x1 = jnp.concatenate([q0 + H * (B[0] * v1 + B[1] * v2), p0 + H * (B[0] * f1 + B[1] * f2)])
    return x1, ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    args = parser.parse_args()
    x0 = jnp.array([1.0, 0.0, 0.0, 0.0])
    step = geomjax.dirac_rk(lambda q, v: 0.5 * v @ v - G * q[1], "gauss", 2, holonomic=lambda q: jnp.atleast_1d(q @ q - 1.0))

    def ours(x):
        return jax.lax.scan(lambda x, _: (step(x, H), None), x, None, length=args.steps)[0]

    def hand_loop(invert):
        def hand(x):
            def body(carry, _):
                x, ok = carry
                x1, ok1 = hand_step(x, invert)
                return (x1, ok & ok1), None

            return jax.lax.scan(body, (x, jnp.asarray(True)), None, length=args.steps)[0]

        return jax.jit(hand)

    unrolled = lambda m: unrolled_solve(m, jnp.eye(m.shape[0], dtype=m.dtype))  # noqa: E731
    ours_j = jax.jit(ours)
    t_ours = timeit(ours_j, x0) / args.steps * 1e6
    print(f"geomjax.dirac_rk gauss2: {t_ours:.2f} µs/step")
    for label, invert in (("hand, LAPACK inverse", jnp.linalg.inv), ("hand, unrolled inverse", unrolled)):
        hand_j = hand_loop(invert)
        t_hand = timeit(hand_j, x0) / args.steps * 1e6
        x_hand, ok = hand_j(x0)
        diff = float(jnp.max(jnp.abs(ours_j(x0) - x_hand)))
        print(f"{label}: {t_hand:.2f} µs/step   geomjax/hand {t_ours / t_hand:.2f}   states agree to {diff:.1e} (hand converged: {bool(ok)})")
    fusions, calls = count_fusions(ours, x0)
    print(f"geomjax loop: {fusions} fusions, {calls} custom calls")


if __name__ == "__main__":
    main()
