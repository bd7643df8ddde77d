"""RATTLE's global error over a long interval: second order down to the round-off floor.

Spherical pendulum (holonomic form, g = |q|² − 1), t ∈ [0, 100], RATTLE
(`geomjax.rattle`) at 10⁶ … 3·10⁷ steps, against a reference from the Gauss–Legendre
method of order 6 on the Dirac field at 2·10⁵ steps (its own error is estimated by the
run at 10⁵ steps). Prints the error, the ratio to the previous row and the ratio h²
predicts, so a floor (an error that stops falling) shows as a ratio near 1. With
`--newton-iterations` the fixed Newton iteration count of RATTLE is changed, to show
that the Newton solve does not set the floor.

Run: `python benchmarks/rattle_long_run.py [--max-steps 30000000] [--newton-iterations 3]`.
"""

import argparse
import time

import jax
import jax.numpy as jnp

import geomjax

T = 100.0


def final_state(target, x0, steps, method="euler"):
    sol = geomjax.integrate(target, x0, dt=T / steps, steps=steps, save_every=steps, method=method)
    return sol.xs[-1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=30_000_000)
    parser.add_argument("--newton-iterations", type=int, default=None)
    args = parser.parse_args(argv)
    model = geomjax.models.spherical_pendulum(holonomic=True)
    field = geomjax.dirac_field(model.system)
    start = time.perf_counter()
    coarse = final_state(field, model.x0, 100_000, "gauss6")
    reference = final_state(field, model.x0, 200_000, "gauss6")
    ref_error = float(jnp.max(jnp.abs(coarse - reference)))
    print(f"jax {jax.__version__}; reference: gauss6 at 2e5 steps (vs 1e5 steps: {ref_error:.1e}), "
          f"{time.perf_counter() - start:.0f} s")
    newton = None if args.newton_iterations is None else geomjax.Newton(iterations=args.newton_iterations)
    step = geomjax.rattle(model.system) if newton is None else geomjax.rattle(model.system, newton=newton)
    print(f"{'steps':>10}{'h':>10}{'max |x - ref|':>16}{'ratio':>8}{'h² ratio':>10}{'time [s]':>10}")
    previous = None
    steps = 1_000_000
    while steps <= args.max_steps:
        start = time.perf_counter()
        error = float(jnp.max(jnp.abs(final_state(step, model.x0, steps) - reference)))
        elapsed = time.perf_counter() - start
        ratio = "" if previous is None else f"{previous[1] / error:8.2f}"
        expected = "" if previous is None else f"{(steps / previous[0]) ** 2:10.2f}"
        print(f"{steps:>10}{T / steps:>10.1e}{error:>16.2e}{ratio:>8}{expected:>10}{elapsed:>10.1f}")
        previous = (steps, error)
        steps = steps * 3 if str(steps).startswith("1") else steps * 10 // 3


if __name__ == "__main__":
    main()
