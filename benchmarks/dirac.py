"""Dirac integrators (Salnikov and Hamdouni (2019), Hamdouni and Salnikov (2021)): derived steps vs the same schemes written by hand.

Part 1, the pendulum in Cartesian coordinates (Salnikov and Hamdouni (2019) §IV.A: L = m/2|v|² − m g y,
φ = x² + y² − ℓ², m = 1, g = 9.81, ℓ = 1, h = 1e-3), each variant in the same `lax.scan`
over the state pieces:

- Dirac-1, Dirac-2: `geomjax.dirac1/dirac2(L, holonomic=phi).advance` (everything from
  autodiff of L and φ; the equations are found affine and solved by one linear solve)
  against Salnikov and Hamdouni (2019) eq. (7) solved by hand (λ = q·(p − h m g e_y)/|q|², q̃ = …);
- Dirac–RK (Gauss, 2 stages): `geomjax.dirac_rk(L, "gauss", 2, holonomic=phi).advance`
  against the stage equations written by hand for this L and φ, solved by simplified
  Newton (the Jacobian at the guess inverted once, by the same unrolled elimination) with
  a fixed number of iterations and no convergence test;
- integrate: the public driver, `geomjax.integrate(step, x0, dt=h, steps=N, save_every=N)`
  inside `jax.jit` (adds the per-step checks).

Single trajectory (`--steps`) and `vmap` over `--batch` initial angles (`--batch-steps`).

Part 2, Ziegler column sweep throughput: `vmap` of a Dirac-1 and a Dirac-2 run over
`--sweep` loads P for n = 2, 8, 32 rods (`geomjax.models.ziegler_column`), in
trajectory-steps per second (compile time printed separately).

Run: `python benchmarks/dirac.py [--steps N] [--batch B] [--batch-steps N] [--sweep S]`.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

import geomjax
from _harness import count_fusions, size_arguments, timeit

M, G, ELL, H = 1.0, 9.81, 1.0, 1e-3


def lagrangian(q, v):
    return 0.5 * M * v @ v - M * G * q[1]


def phi(q):
    return jnp.array([q @ q - ELL**2])


# --------------------------------------------------------------------------------------
# hand-written maps on pieces


def _eq7_velocity(q, p):
    """q̃ from Salnikov and Hamdouni (2019) eq. (7): m q̃ = p − h m g e_y − λ q with q·q̃ = 0."""
    b = p - jnp.array([0.0, H * M * G])
    lam = (q @ b) / (q @ q)
    return (b - lam * q) / M


def hand_dirac1(q, p):
    qt = _eq7_velocity(q, p)
    return q + H * qt, M * qt


def hand_dirac2(q, p, past):
    qt = _eq7_velocity(q, p)
    return past[0] + 2 * H * qt, M * qt, (q,)


TAB = geomjax.PartitionedTableau.gauss(2)
GAUSS_A, GAUSS_B = np.array(TAB.a), np.array(TAB.b)
HAND_ITERATIONS, HAND_TOL = 6, 1e-13


def hand_gauss2(q0, p0):
    """Dirac–RK Gauss-2 for the pendulum by hand: unknowns V₁, V₂ and Λ₁, Λ₂ with
    Qᵢ = q + h Σ aᵢⱼVⱼ, Fⱼ = −m g e_y + 2ΛⱼQⱼ, m Vᵢ = p + h Σ aᵢⱼFⱼ, Qᵢ·Vᵢ = 0; simplified
    Newton with the Jacobian at the guess inverted once (unrolled elimination, as geomjax),
    a fixed number of iterations (no convergence test: the hand version's advantage)."""
    a = GAUSS_A
    gravity = jnp.array([0.0, -M * G])

    def stages(u):
        v1, v2, l1, l2 = u[0:2], u[2:4], u[4], u[5]
        q1 = q0 + H * (a[0, 0] * v1 + a[0, 1] * v2)
        q2 = q0 + H * (a[1, 0] * v1 + a[1, 1] * v2)
        return v1, v2, gravity + 2.0 * l1 * q1, gravity + 2.0 * l2 * q2, q1, q2

    def residual(u):
        v1, v2, f1, f2, q1, q2 = stages(u)
        r1 = M * v1 - p0 - H * (a[0, 0] * f1 + a[0, 1] * f2)
        r2 = M * v2 - p0 - H * (a[1, 0] * f1 + a[1, 1] * f2)
        return jnp.concatenate([r1, r2, jnp.stack([q1 @ v1, q2 @ v2])])

    u = jnp.concatenate([p0 / M, p0 / M, jnp.zeros(2)])
    jac = jax.jacfwd(residual)(u)
    inverse = jnp.linalg.inv(jac)  # once per step (a chord iteration), by LAPACK
    for _ in range(HAND_ITERATIONS):
        u = u - inverse @ residual(u)
    v1, v2, f1, f2, _, _ = stages(u)
    b = GAUSS_B
    return q0 + H * (b[0] * v1 + b[1] * v2), p0 + H * (b[0] * f1 + b[1] * f2)


# --------------------------------------------------------------------------------------


def derived(step):
    return lambda *z: step.advance(0.0, z, H, None)[0]


def loop(step, steps, start=None):
    """x0 ↦ x_steps for a step on the pieces (q, p[, past]); `start` builds the history."""

    def run(x0):
        pieces = (x0[:2], x0[2:])
        if start is not None:
            pieces = start(pieces)

        def body(carry, _):
            return step(*carry), None

        out, _ = jax.lax.scan(body, pieces, None, length=steps)
        return jnp.concatenate([out[0], out[1]])

    return run


def _integrate(step, steps):
    return lambda x0: geomjax.integrate(step, x0, dt=H, steps=steps, save_every=steps, drift_tol=None, throw=False).xs[-1]


def at_angle(theta):
    return jnp.stack([ELL * jnp.sin(theta), -ELL * jnp.cos(theta), 0.0 * theta, 0.0 * theta], axis=-1)


def pendulum_part(args):
    d1 = geomjax.dirac1(lagrangian, holonomic=phi)
    d2 = geomjax.dirac2(lagrangian, holonomic=phi)
    start2 = lambda z: d2.start(0.0, z, H, None)  # noqa: E731  (the same q_{-1} for both)
    groups = {
        "Dirac-1": (d1, {"hand": (hand_dirac1, None), "derived": (derived(d1), None)}),
        "Dirac-2": (d2, {"hand": (hand_dirac2, start2), "derived": (derived(d2), start2)}),
    }
    rk = geomjax.dirac_rk(lagrangian, "gauss", 2, holonomic=phi)
    groups["Dirac-RK Gauss-2"] = (rk, {"hand": (hand_gauss2, None), "derived": (derived(rk), None)})
    x0 = at_angle(jnp.asarray(1.0))
    xs = at_angle(jnp.linspace(0.2, 2.0, args.batch))
    print(f"pendulum (Cartesian), h = {H}; device {jax.devices()[0]}, JAX {jax.__version__}")
    print(f"single: {args.steps} steps; vmap: {args.batch} states x {args.batch_steps} steps")
    print()
    print(f"{'method':<18}{'variant':<11}{'single [s]':>11}{'ns/step':>9}{'vs hand':>9}"
          f"{'vmap [s]':>10}{'vs hand':>9}{'max |dx|':>10}{'fusions':>9}")
    for group, (public, variants) in groups.items():
        single = {name: jax.jit(loop(s, args.steps, start)) for name, (s, start) in variants.items()}
        batch = {name: jax.jit(jax.vmap(loop(s, args.batch_steps, start))) for name, (s, start) in variants.items()}
        single["integrate"] = jax.jit(_integrate(public, args.steps))
        batch["integrate"] = jax.jit(jax.vmap(_integrate(public, args.batch_steps)))
        ref, ref_b = single["hand"](x0), batch["hand"](xs)
        rows = {}
        for name in single:
            diff = max(float(jnp.max(jnp.abs(single[name](x0) - ref))), float(jnp.max(jnp.abs(batch[name](xs) - ref_b))))
            t1, tb = timeit(single[name], x0), timeit(batch[name], xs, repeat=3)
            fus = count_fusions(loop(*variants[name][:1], 10, variants[name][1]), x0)[0] if name in variants else -1
            rows[name] = (t1, tb, diff, fus)
        for name, (t1, tb, diff, fus) in rows.items():
            print(f"{group:<18}{name:<11}{t1:>11.4f}{t1 / args.steps * 1e9:>9.1f}{t1 / rows['hand'][0]:>9.2f}"
                  f"{tb:>10.4f}{tb / rows['hand'][1]:>9.2f}{diff:>10.1e}{fus if fus >= 0 else '-':>9}")
        print()


def ziegler_part(args):
    print(f"Ziegler column sweep: vmap over {args.sweep} loads P in [0.2, 0.8], {args.sweep_steps} steps, "
          f"h = {args.sweep_h}; device {jax.devices()[0]}")
    print(f"{'rods':>5}{'method':>10}{'compile [s]':>13}{'run [s]':>9}{'traj-steps/s':>14}{'failed':>8}")
    loads = jnp.linspace(0.2, 0.8, args.sweep)
    for n in args.rods:
        for name, make in (("Dirac-1", geomjax.dirac1), ("Dirac-2", geomjax.dirac2)):

            def run(load, n=n, make=make):
                model = geomjax.models.ziegler_column(n, P=load, angles=jnp.full((n,), 0.3 / n))
                step = make(model.lagrangian, holonomic=model.holonomic)
                sol = geomjax.integrate(step, model.x0, dt=args.sweep_h, steps=args.sweep_steps,
                                        save_every=args.sweep_steps, drift_tol=None, throw=False)
                return sol.xs[-1], sol.status

            fn = jax.jit(jax.vmap(run))
            start = time.perf_counter()
            jax.block_until_ready(fn(loads))
            compile_s = time.perf_counter() - start
            t = timeit(fn, loads, repeat=2)
            failed = int(jnp.sum(fn(loads)[1] != 0))
            rate = args.sweep * args.sweep_steps / t
            print(f"{n:>5}{name:>10}{compile_s:>13.2f}{t:>9.3f}{rate:>14.3g}{failed:>8}", flush=True)


def main(argv=None):
    parser = size_arguments(__doc__.splitlines()[0])
    parser.add_argument("--sweep", type=int, default=1024, help="loads P in the Ziegler sweep")
    parser.add_argument("--sweep-steps", type=int, default=2000, help="steps of each Ziegler run")
    parser.add_argument("--sweep-h", type=float, default=1e-3, help="step of the Ziegler runs")
    parser.add_argument("--rods", type=int, nargs="+", default=[2, 8, 32], help="column sizes of the sweep")
    parser.add_argument("--skip-sweep", action="store_true")
    parser.add_argument("--skip-pendulum", action="store_true")
    args = parser.parse_args(argv)
    if not args.skip_pendulum:
        pendulum_part(args)
    if not args.skip_sweep:
        ziegler_part(args)


if __name__ == "__main__":
    main()
