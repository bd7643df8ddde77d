"""10⁴ RATTLE steps of a 100 × 100 cloth (19 804 constraints) on the CPU: time, constraints,
energy.

The planar cloth of `geomjax.models.cloth(n)` (rods on the grid edges, two pinned top
corners) falls from rest under gravity. RATTLE (`geomjax.rattle(system,
refactor_every=10)`: block-banded factors of G M⁻¹Gᵀ in reverse Cuthill–McKee order, kept
for 10 steps) runs `--steps` steps of `--dt` saved every `--save-every`; printed per save:
the wall time so far, max |g(q)| (position constraints), max |G M⁻¹p| (hidden velocity
constraints) and the relative energy error |H − H₀|/|H₀|. The planar model is a mechanism
that becomes singular where a rhombus of the grid flattens (t ≈ 3.4 for n = 32, later for
larger n), so the default run covers t ∈ [0, 3] (dt = 3e−4).

Run: `python benchmarks/cloth_long_run.py [--n 100] [--steps 10000] [--dt 3e-4]`.
"""

import argparse
import time

import jax
import jax.numpy as jnp

import geomjax


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--dt", type=float, default=3e-4)
    parser.add_argument("--save-every", type=int, default=500)
    parser.add_argument("--refactor-every", type=int, default=10)
    args = parser.parse_args(argv)
    model = geomjax.models.cloth(args.n)
    system = model.system
    step = geomjax.rattle(system, refactor_every=args.refactor_every)
    m = int(system.holonomic(model.x0[: system.dim // 2]).shape[0])
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}; cloth {args.n} x {args.n}: m = {m} constraints, "
          f"{system.dim} coordinates; RATTLE refactor_every={args.refactor_every}, dt = {args.dt:g}, {args.steps} steps")
    hamiltonian = jax.jit(lambda x: system.hamiltonian(x))
    half = system.dim // 2

    @jax.jit
    def residuals(x):
        q, p = x[:half], x[half:]
        g, velocity = jax.jvp(system.holonomic, (q,), (jax.grad(lambda pp: system.hamiltonian(jnp.concatenate([q, pp])))(p),))
        return jnp.max(jnp.abs(g)), jnp.max(jnp.abs(velocity))

    h0 = float(hamiltonian(model.x0))
    x = model.x0
    start = time.perf_counter()
    print(f"{'step':>7}{'t':>8}{'wall [s]':>10}{'max |g|':>11}{'max |G v|':>11}{'|ΔH|/|H0|':>12}", flush=True)
    worst = (0.0, 0.0, 0.0)
    for done in range(args.save_every, args.steps + 1, args.save_every):
        sol = geomjax.integrate(step, x, dt=args.dt, t0=(done - args.save_every) * args.dt,
                                steps=args.save_every, save_every=args.save_every)
        x = sol.xs[-1]
        g, gv = (float(v) for v in residuals(x))
        drift = abs(float(hamiltonian(x)) - h0) / abs(h0)
        worst = tuple(max(a, b) for a, b in zip(worst, (g, gv, drift)))
        print(f"{done:>7}{done * args.dt:>8.3f}{time.perf_counter() - start:>10.1f}{g:>11.2e}{gv:>11.2e}{drift:>12.2e}", flush=True)
    wall = time.perf_counter() - start
    print(f"total {wall:.0f} s ({1e3 * wall / args.steps:.0f} ms/step, compile included); "
          f"worst max|g| {worst[0]:.2e}, max|G v| {worst[1]:.2e}, |ΔH|/|H0| {worst[2]:.2e}")


if __name__ == "__main__":
    main()
