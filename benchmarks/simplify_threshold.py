"""Where the scalar-graph simplification stops paying: a planar chain of N pendulum links.

For N = 1..8 links (state dimension 4N, N holonomic constraints |q_i − q_{i−1}|² = 1 with
q_0 = 0, H = ½|p|² + Σ y_i) the Dirac field is built through the public API and run with
explicit Euler through `geomjax.integrate`, with the simplification on (its size limits
lifted, to see past them) and off (`geomjax.internal.simplify.unsimplified(field)`). Prints
the scalar operations of the simplified graph, the compile time and the time per step of
both, which is what `MAX_INPUTS`, `MAX_NODES` and `MAX_OPERATIONS` are chosen from.

From N = 5 on the constraint matrix (2N × 2N) is past the unrolled pivoting solve of
`geomjax._solve.linalg` and the field calls `jnp.linalg.solve`, which the expansion does not
handle (it warns and runs the field unchanged). Rows `N*` (up to `--unroll-up-to` links)
unroll that solve too, to measure the simplified graph past the shipped limits.

Run: `python benchmarks/simplify_threshold.py [--max-links 8] [--steps 20000] [--unroll-up-to 6]`
(with the checkout first on `PYTHONPATH` when geomjax is installed from elsewhere).
"""

import argparse
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

import geomjax
from geomjax import _linalg as linalg
from geomjax.internal import simplify


def chain(n: int):
    """The Dirac field of an N-link planar chain and a state on its constraint set."""

    def hamiltonian(x):
        q, p = x[: 2 * n], x[2 * n :]
        return 0.5 * p @ p + jnp.sum(q[1::2])

    def constraints(q):
        points = q.reshape(n, 2)
        previous = jnp.concatenate([jnp.zeros((1, 2), q.dtype), points[:-1]])
        return jnp.sum((points - previous) ** 2, axis=1) - 1.0

    angles = 0.3 + 0.2 * np.arange(n)
    points = np.cumsum(np.stack([np.sin(angles), -np.cos(angles)], axis=1), axis=0)
    x0 = jnp.asarray(np.concatenate([points.reshape(-1), np.zeros(2 * n)]))
    system = geomjax.System(hamiltonian, geomjax.canonical(2 * n), holonomic=constraints)
    return geomjax.dirac_field(system), x0


def graph_size(field, x0) -> int:
    """Equations in the jaxpr of `field.rhs` (scalar operations when it was simplified),
    not counting the slicing and restacking of the state."""
    moves = {"slice", "squeeze", "stack", "reshape", "concatenate", "broadcast_in_dim"}
    jaxpr = jax.make_jaxpr(field.rhs)(field.split(x0)).jaxpr
    return sum(e.primitive.name not in moves for e in jaxpr.eqns)


def measure(field, x0, steps: int, dt: float):
    """(compile seconds, ns per step) of an explicit-Euler `geomjax.integrate`."""

    def run(x):
        return geomjax.integrate(field, x, dt=dt, steps=steps, method="euler", save_every=steps).xs[-1]

    start = time.perf_counter()
    compiled = jax.jit(run).lower(x0).compile()
    compile_s = time.perf_counter() - start
    jax.block_until_ready(compiled(x0))
    best = np.inf
    for _ in range(3):
        start = time.perf_counter()
        jax.block_until_ready(compiled(x0))
        best = min(best, time.perf_counter() - start)
    return compile_s, best / steps * 1e9


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-links", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--unroll-up-to", type=int, default=6)
    args = parser.parse_args(argv)
    limits = simplify.MAX_NODES, simplify.MAX_OPERATIONS
    print(f"planar N-link chain, Dirac field, explicit Euler ({args.steps} steps), limits lifted for 'on'")
    print(f"{'N':>2}{'dim':>5}{'graph ops':>11}  {'compile on':>10}{'off':>8}  {'ns/step on':>11}{'off':>10}{'on/off':>8}")
    try:
        simplify.MAX_NODES, simplify.MAX_OPERATIONS = 10**7, 10**7
        for n in range(1, args.max_links + 1):
            field, x0 = chain(n)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                ops = graph_size(field, x0)
            off = measure(simplify.unsimplified(chain(n)[0]), x0, args.steps, 1e-3)
            # a field that is not simplified runs as it does with the pass off
            on = off if caught else measure(field, x0, args.steps, 1e-3)
            note = ""
            if caught:
                note = "  (not simplified: " + str(caught[0].message).split(": ", 2)[-1] + ")"
            print(
                f"{n:>2}{4 * n:>5}{ops:>11}  {on[0]:>9.2f}s{off[0]:>7.2f}s  {on[1]:>11.1f}{off[1]:>10.1f}{on[1] / off[1]:>8.2f}{note}"
            )
            if 2 * n > linalg._UNROLL_MAX and n <= args.unroll_up_to:
                unroll = linalg._UNROLL_MAX
                try:
                    linalg._UNROLL_MAX = 2 * n
                    field, x0 = chain(n)
                    ops = graph_size(field, x0)
                    lifted = measure(field, x0, args.steps, 1e-3)
                finally:
                    linalg._UNROLL_MAX = unroll
                print(
                    f"{str(n) + '*':>2}{4 * n:>5}{ops:>11}  {lifted[0]:>9.2f}s{off[0]:>7.2f}s  "
                    f"{lifted[1]:>11.1f}{off[1]:>10.1f}{lifted[1] / off[1]:>8.2f}  (solve unrolled, simplified)"
                )
    finally:
        simplify.MAX_NODES, simplify.MAX_OPERATIONS = limits
        simplify.clear_cache()


if __name__ == "__main__":
    main()
