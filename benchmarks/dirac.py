"""Dirac integrators (seeds 003, 004): derived steps vs the same schemes written by hand.

Part 1, the pendulum in Cartesian coordinates (seed 003 §IV.A: L = m/2|v|² − m g y,
φ = x² + y² − ℓ², m = 1, g = 9.81, ℓ = 1, h = 1e-3), each variant in the same `lax.scan`
over the state pieces:

- Dirac-1, Dirac-2: `geomjax.dirac1/dirac2(L, holonomic=phi).advance` (everything from
  autodiff of L and φ; the equations are found affine and solved by one linear solve)
  against seed 003 eq. (7) solved by hand (λ = q·(p − h m g e_y)/|q|², q̃ = …);
- Dirac–RK (Gauss, 2 stages): `geomjax.dirac_rk(L, "gauss", 2, holonomic=phi).advance`
  against the stage equations written by hand for this L and φ, solved by the same number
  of Newton iterations with a hand-written Jacobian (when `geomjax.dirac_rk` exists);
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
    """q̃ from seed 003 eq. (7): m q̃ = p − h m g e_y − λ q with q·q̃ = 0."""
    b = p - jnp.array([0.0, H * M * G])
    lam = (q @ b) / (q @ q)
    return (b - lam * q) / M


def hand_dirac1(q, p):
    qt = _eq7_velocity(q, p)
    return q + H * qt, M * qt


def hand_dirac2(q, p, past):
    qt = _eq7_velocity(q, p)
    return past[0] + 2 * H * qt, M * qt, (q,)


# Gauss 2-stage coefficients
_S3 = np.sqrt(3.0)
GAUSS_A = np.array([[0.25, 0.25 - _S3 / 6], [0.25 + _S3 / 6, 0.25]])
GAUSS_B = np.array([0.5, 0.5])


def hand_gauss2(q, p, iterations: int = 4):
    """Dirac–RK Gauss-2 for the pendulum by hand: unknowns V (2×2) and Λ (2):
    Q_i = q + h Σ a_ij V_j, m V_i = p + h Σ a_ij (−m g e_y + 2 Λ_j Q_j), Q_i·V_i = 0."""
    a = jnp.asarray(GAUSS_A)
    grav = jnp.array([0.0, -M * G])

    def residual(u):
        v, lam = u[:4].reshape(2, 2), u[4:]
        qs = q + H * a @ v
        forces = grav + 2.0 * lam[:, None] * qs
        r1 = M * v - p - H * a @ forces
        r2 = jnp.sum(qs * v, axis=1)
        return jnp.concatenate([r1.ravel(), r2])

    def jacobian(u):
        v, lam = u[:4].reshape(2, 2), u[4:]
        qs = q + H * a @ v
        j = jnp.zeros((6, 6))
        # ∂r1_i/∂V_k = m δ_ik − h Σ_j a_ij 2 λ_j h a_jk ;  ∂r1_i/∂Λ_j = −h a_ij 2 Q_j
        for i in range(2):
            for k in range(2):
                coeff = M * (i == k) - 2.0 * H * H * sum(a[i, jj] * lam[jj] * a[jj, k] for jj in range(2))
                j = j.at[2 * i : 2 * i + 2, 2 * k : 2 * k + 2].set(coeff * jnp.eye(2))
            for jj in range(2):
                j = j.at[2 * i : 2 * i + 2, 4 + jj].set(-2.0 * H * a[i, jj] * qs[jj])
        # ∂r2_i/∂V_k = h a_ik V_i + δ_ik Q_i
        for i in range(2):
            for k in range(2):
                j = j.at[4 + i, 2 * k : 2 * k + 2].set(H * a[i, k] * v[i] + (i == k) * qs[i])
        return j

    u = jnp.concatenate([jnp.tile(p / M, 2), jnp.zeros(2)])
    for _ in range(iterations):
        u = u - jnp.linalg.solve(jacobian(u), residual(u))
    v, lam = u[:4].reshape(2, 2), u[4:]
    qs = q + H * a @ v
    forces = grav + 2.0 * lam[:, None] * qs
    return q + H * jnp.asarray(GAUSS_B) @ v, p + H * jnp.asarray(GAUSS_B) @ forces


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
    if hasattr(geomjax, "dirac_rk"):
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
    if not hasattr(geomjax.models, "ziegler_column"):
        print("(geomjax.models.ziegler_column not available: sweep skipped)")
        return
    print(f"Ziegler column sweep: vmap over {args.sweep} loads P, {args.sweep_steps} steps, h = {args.sweep_h}")
    print(f"{'rods':>5}{'method':>9}{'compile [s]':>13}{'run [s]':>9}{'traj-steps/s':>14}{'failed':>8}")
    for n in (2, 8, 32):
        model = geomjax.models.ziegler_column(n)
        loads = jnp.linspace(0.2, 1.5, args.sweep) * model.params.get("P", 1.0) if hasattr(model, "params") else jnp.linspace(0.2, 1.5, args.sweep)
        for name, make in (("Dirac-1", geomjax.dirac1), ("Dirac-2", geomjax.dirac2)):

            def run(load):
                m = geomjax.models.ziegler_column(n, P=load)
                step = make(m.lagrangian, holonomic=m.holonomic)
                sol = geomjax.integrate(step, m.x0, dt=args.sweep_h, steps=args.sweep_steps,
                                        save_every=args.sweep_steps, drift_tol=None, throw=False)
                return sol.xs[-1], sol.result._value

            fn = jax.jit(jax.vmap(run))
            start = time.perf_counter()
            jax.block_until_ready(fn(loads))
            compile_s = time.perf_counter() - start
            t = timeit(fn, loads, repeat=2)
            failed = int(jnp.sum(fn(loads)[1] != 0))
            rate = args.sweep * args.sweep_steps / t
            print(f"{n:>5}{name:>9}{compile_s:>13.2f}{t:>9.3f}{rate:>14.3g}{failed:>8}")


def main(argv=None):
    parser = size_arguments(__doc__.splitlines()[0])
    parser.add_argument("--sweep", type=int, default=256, help="loads P in the Ziegler sweep")
    parser.add_argument("--sweep-steps", type=int, default=2000, help="steps of each Ziegler run")
    parser.add_argument("--sweep-h", type=float, default=1e-3, help="step of the Ziegler runs")
    parser.add_argument("--skip-sweep", action="store_true")
    args = parser.parse_args(argv)
    pendulum_part(args)
    if not args.skip_sweep:
        ziegler_part(args)


if __name__ == "__main__":
    main()
