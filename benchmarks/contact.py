"""Derived contact (Herglotz) and forced Lagrange–d'Alembert steps vs the same maps by hand.

The damped oscillator of Maciel, Ortiz and Schaerer (2020) §3.1, L = ½v² − ½q² (− αz), F = −αv, α = 0.01, h = 0.001 (so
that 1e6 steps end at t = 1000 with the state ~1e−3: no subnormal numbers in the timing).
Each variant runs in the same `lax.scan` over the state pieces (q, p, z) or (q, p):

- derived:  `geomjax.herglotz(L, order=1 | 2).advance` and `geomjax.forced_dla(L, force).advance`
            (defaults), everything from autodiff of L; their equations are found affine in
            the unknowns from the jaxpr and solved by linear solves (no Newton iteration);
- derived, Newton: the same steps forced through `geomjax.Newton` (a while loop, the
            solve used before the structure analysis), for comparison;
- hand:     the maps written out: seed eq. (10) with the action update (order 1), the
            symmetric map solved by hand (order 2), seed eq. (7) with 1 + hα (LA);
- integrate: the public driver, `geomjax.integrate(step, x0, dt=h, steps=N, save_every=N)`
            inside `jax.jit` (adds the per-step status and the start checks);
- NumPy:    the hand-written maps as a Python loop over floats.

Prints times, ns per step, ratios measured in this run and the largest difference of the
final states from the hand-written maps. Single trajectory (`--steps`) and `vmap` over
`--batch` initial states (`--batch-steps`).

Run: `python benchmarks/contact.py [--steps N] [--batch B] [--batch-steps N]`.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

import geomjax
from _harness import count_fusions, size_arguments, timeit

ALPHA = 0.01
H = 0.001


def contact_lagrangian(q, v, z):
    return 0.5 * v @ v - 0.5 * q @ q - ALPHA * z


def lagrangian(q, v):
    return 0.5 * v @ v - 0.5 * q @ q


def force(q, v, t):
    return -ALPHA * v


# --------------------------------------------------------------------------------------
# hand-written maps on pieces


def hand_contact1(q, p, z):
    """Seed eq. (10) and z₁ = z + L_d, L_d = h[½v² − ¼(q² + q₁²) − αz]."""
    q1 = (1.0 - 0.5 * H * H) * q + H * (1.0 - H * ALPHA) * p
    p1 = (1.0 - H * ALPHA) * p - 0.5 * H * (q + q1)
    v = (q1 - q) / H
    z1 = z + H * (0.5 * v * v - 0.25 * (q * q + q1 * q1) - ALPHA * z)
    return q1, p1, z1


def hand_contact2(q, p, z):
    """The symmetric contact map of the oscillator, solved by hand (L_d trapezoidal in q, z)."""
    a = 0.5 * H * ALPHA
    q1 = (H - 0.5 * H * H * ALPHA) * p + (1.0 - 0.5 * H * H) * q
    p1 = ((1.0 - a) * p - 0.5 * H * (q + q1)) / (1.0 + a)
    v = (q1 - q) / H
    z1 = (z * (1.0 - a) + 0.5 * H * (v * v - 0.5 * (q * q + q1 * q1))) / (1.0 + a)
    return q1, p1, z1


def hand_la(q, p):
    """Seed eq. (7) with 1 + hα."""
    p1 = (p - H * q) / (1.0 + H * ALPHA)
    return q + H * p1, p1


def derived(step):
    return lambda *z: step.advance(0.0, z, H, None)[0]


def on_pieces(scalar_map):
    """A map of scalars (q, p[, z]) on the pieces (q, p[, z]) with q, p of shape (1,)."""

    def step(q, p, *z):
        out = scalar_map(q[0], p[0], *z)
        return (jnp.reshape(out[0], (1,)), jnp.reshape(out[1], (1,)), *out[2:])

    return step


def loop(step, steps):
    """x0 ↦ x_steps for a step on the pieces of x0 = (q, p[, z]) (n = 1)."""

    def run(x0):
        pieces = (x0[0:1], x0[1:2]) if x0.shape[0] == 2 else (x0[0:1], x0[1:2], x0[2])

        def body(carry, _):
            return step(*carry), None

        out, _ = jax.lax.scan(body, pieces, None, length=steps)
        return jnp.concatenate([jnp.reshape(a, (-1,)) for a in out])

    return run


def _integrate(step, steps):
    return lambda x0: geomjax.integrate(step, x0, dt=H, steps=steps, save_every=steps, throw=False).xs[-1]


def numpy_loop(step, x0, steps):
    state = tuple(float(a) for a in x0)
    for _ in range(steps):
        state = step(*state)
    return np.array(state)


def main(argv=None):
    parser = size_arguments(__doc__.splitlines()[0])
    parser.add_argument("--numpy-steps", type=int, default=100_000)
    args = parser.parse_args(argv)
    newton = geomjax.Newton()  # the while loop the steps used before the structure analysis
    public = {
        "contact order 1": geomjax.herglotz(contact_lagrangian, order=1),
        "contact order 2": geomjax.herglotz(contact_lagrangian, order=2),
        "LA (forced DLA)": geomjax.forced_dla(lagrangian, force=force),
    }
    groups = {
        "contact order 1": (
            jnp.array([-0.25, 0.75, 0.0]),
            {
                "hand": on_pieces(hand_contact1),
                "derived": derived(geomjax.herglotz(contact_lagrangian, order=1)),
            },
        ),
        "contact order 2": (
            jnp.array([-0.25, 0.75, 0.0]),
            {
                "hand": on_pieces(hand_contact2),
                "derived": derived(geomjax.herglotz(contact_lagrangian, order=2)),
            },
        ),
        "LA (forced DLA)": (
            jnp.array([-0.25, 0.75]),
            {
                "hand": on_pieces(hand_la),
                "derived": derived(geomjax.forced_dla(lagrangian, force=force)),
            },
        ),
    }
    key = jax.random.PRNGKey(0)
    batches = {}
    for group, (x0, _) in groups.items():
        xs = x0 + 0.1 * jax.random.normal(key, (args.batch, x0.shape[0]))
        batches[group] = xs.at[:, 2].set(0.0) if x0.shape[0] == 3 else xs
    # The same derived steps through Newton's method, bypassing the structure analysis.
    from geomjax._step import variational

    original = variational._solve_plan
    variational._solve_plan = lambda *a: "newton"
    try:
        newton_steps = {
            "contact order 1": derived(geomjax.herglotz(contact_lagrangian, order=1, newton=newton)),
            "contact order 2": derived(geomjax.herglotz(contact_lagrangian, order=2, newton=newton)),
            "LA (forced DLA)": derived(geomjax.forced_dla(lagrangian, force=force, newton=newton)),
        }
        newton_single = {g: jax.jit(loop(s, args.steps)) for g, s in newton_steps.items()}
        newton_batch = {g: jax.jit(jax.vmap(loop(s, args.batch_steps))) for g, s in newton_steps.items()}
        for g, (x0, _) in groups.items():  # compile (trace) while the plan is forced
            newton_single[g](x0)
            newton_batch[g](batches[g])
    finally:
        variational._solve_plan = original

    print(f"damped oscillator, alpha = {ALPHA}, h = {H}; device {jax.devices()[0]}")
    print(f"single: {args.steps} steps; vmap: {args.batch} states x {args.batch_steps} steps; "
          f"NumPy: {args.numpy_steps} steps, scaled")
    print()
    header = (f"{'map':<17}{'variant':<17}{'single [s]':>11}{'ns/step':>9}{'vs hand':>9}"
              f"{'vmap [s]':>10}{'vs hand':>9}{'max |dx|':>10}{'fusions':>9}")
    print(header)
    for group, (x0, variants) in groups.items():
        xs = batches[group]
        single = {name: jax.jit(loop(s, args.steps)) for name, s in variants.items()}
        batch = {name: jax.jit(jax.vmap(loop(s, args.batch_steps))) for name, s in variants.items()}
        single["derived, Newton"] = newton_single[group]
        batch["derived, Newton"] = newton_batch[group]
        single["integrate"] = jax.jit(_integrate(public[group], args.steps))
        batch["integrate"] = jax.jit(jax.vmap(_integrate(public[group], args.batch_steps)))
        ref = single["hand"](x0)
        ref_b = batch["hand"](xs)
        rows = {}
        for name in single:
            diff = max(float(jnp.max(jnp.abs(single[name](x0) - ref))), float(jnp.max(jnp.abs(batch[name](xs) - ref_b))))
            t1, tb = timeit(single[name], x0), timeit(batch[name], xs, repeat=3)
            fus = count_fusions(loop(variants[name], 10), x0)[0] if name in variants else -1
            rows[name] = (t1, tb, diff, fus)
        hand_np = {"contact order 1": hand_contact1, "contact order 2": hand_contact2, "LA (forced DLA)": hand_la}[group]
        start = time.perf_counter()
        x_np = numpy_loop(hand_np, np.asarray(x0), args.numpy_steps)
        t_np = (time.perf_counter() - start) * args.steps / args.numpy_steps
        x_short = np.asarray(jax.jit(loop(variants["derived"], args.numpy_steps))(x0))
        for name, (t1, tb, diff, fus) in rows.items():
            print(f"{group:<17}{name:<17}{t1:>11.4f}{t1 / args.steps * 1e9:>9.1f}{t1 / rows['hand'][0]:>9.2f}"
                  f"{tb:>10.4f}{tb / rows['hand'][1]:>9.2f}{diff:>10.1e}{fus if fus >= 0 else '-':>9}")
        print(f"{group:<17}{'NumPy loop':<17}{t_np:>11.4f}{t_np / args.steps * 1e9:>9.1f}{t_np / rows['hand'][0]:>9.1f}"
              f"{'':>10}{'':>9}{float(np.max(np.abs(x_np - x_short))):>10.1e}")
        print(f"{'':<17}derived is {t_np / rows['derived'][0]:.0f}x faster than the NumPy loop (single trajectory)")
        print()


if __name__ == "__main__":
    main()
