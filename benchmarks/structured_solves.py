"""Small structured and dense solves inside a compiled loop: plain JAX against LAPACK calls.

Each case iterates x ← solve(T(x), x) + c for `--steps` steps in one `lax.scan` (the matrix
depends on the carry, so nothing is hoisted out of the loop) and reports the best of
`--repeat` warm runs in ns per step, one trajectory and `vmap` over `--batch` members.

Tridiagonal T (k × k, SPD, diagonally dominant), versions:

- lapack:    `jax.lax.linalg.tridiagonal_solve` (gtsv custom call on the CPU);
- thomas:    `geomjax._solve.linalg.tridiagonal_solve` (Thomas elimination, unrolled for
             k ≤ 4, two `fori_loop`s above; a row with too much growth gives a NaN pivot);
- unchecked: the same elimination without the growth check (what the check costs);
- cond-fallback: the library's solve redone by LAPACK under `lax.cond` when non-finite
             (the alternative to reporting a failed solve as a non-finite state);
- lineax:    `lineax.linear_solve(lineax.TridiagonalLinearOperator(...), b, lineax.Tridiagonal())`.

Dense (m × m, diagonally dominant), versions: `jnp.linalg.solve` against
`geomjax._solve.linalg.unrolled_solve` (`small_solve`'s size threshold), and the inverse
`jnp.linalg.inv` against `unrolled_solve(a, I)` (dirac_rk's `_UNROLLED_INVERSE_MAX`).

Run: `python benchmarks/structured_solves.py [--steps 2000] [--repeat 7] [--batch 256]`.
"""

import argparse
import time

import jax
import jax.numpy as jnp
from _harness import timeit

import geomjax  # noqa: F401  (float64)
from geomjax._solve import linalg


def _tri(x):
    """An SPD, diagonally dominant tridiagonal T(x): (dl, d, du)."""
    off = 0.3 * jnp.cos(x[:-1])
    zero = jnp.zeros((1,), x.dtype)
    return jnp.concatenate([zero, off]), 2.0 + jnp.sin(x) ** 2, jnp.concatenate([off, zero])


def _lapack(dl, d, du, b):
    return jax.lax.linalg.tridiagonal_solve(dl, d, du, b[:, None])[:, 0]


def _unchecked(dl, d, du, b):
    """The library's elimination with the growth check switched off (what the check costs)."""
    bound = linalg._THOMAS_GROWTH_MAX
    linalg._THOMAS_GROWTH_MAX = jnp.inf  # read at trace time
    try:
        return linalg.tridiagonal_solve(dl, d, du, b)
    finally:
        linalg._THOMAS_GROWTH_MAX = bound


def _cond_fallback(dl, d, du, b):
    """The checked Thomas solve, redone by LAPACK under `lax.cond` when it is non-finite."""
    x = linalg.tridiagonal_solve(dl, d, du, b)
    return jax.lax.cond(jnp.all(jnp.isfinite(x)), lambda: x, lambda: _lapack(dl, d, du, b))


def _lineax(dl, d, du, b):
    import lineax as lx

    op = lx.TridiagonalLinearOperator(d, dl[1:], du[:-1])
    return lx.linear_solve(op, b, lx.Tridiagonal()).value


TRI = {
    "lapack": _lapack,
    "thomas": linalg.tridiagonal_solve,
    "unchecked": _unchecked,
    "cond-fallback": _cond_fallback,
    "lineax": _lineax,
}


def _dense(x):
    m = x.shape[0]
    return jnp.eye(m) * (m + 1.0) + 0.3 * jnp.cos(x[:, None] + 0.7 * x[None, :])


DENSE = {
    "jnp.linalg.solve": lambda a, b: jnp.linalg.solve(a, b),
    "unrolled_solve": linalg.unrolled_solve,
}
INVERSE = {
    "jnp.linalg.inv": lambda a: jnp.linalg.inv(a),
    "unrolled inverse": lambda a: linalg.unrolled_solve(a, jnp.eye(a.shape[0], dtype=a.dtype)),
}


def loop(update, steps):
    def run(x0):
        return jax.lax.scan(lambda x, _: (update(x), None), x0, None, length=steps)[0]

    return run


def measure(update, x0, steps, repeat, batch):
    one = jax.jit(loop(update, steps))
    t = time.perf_counter()
    jax.block_until_ready(one(x0))
    t_compile = time.perf_counter() - t
    t_one = timeit(one, x0, repeat=repeat) / steps * 1e9
    xs = x0[None] + 0.01 * jnp.arange(batch, dtype=x0.dtype)[:, None]
    many = jax.jit(jax.vmap(loop(update, steps)))
    t_many = timeit(many, xs, repeat=repeat) / steps / batch * 1e9
    return t_compile, t_one, t_many


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,3,4,6,8,10,12,16,24,32")
    parser.add_argument("--dense-sizes", default="3,4,5,6,7,8,10,12")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--versions", default=",".join(TRI))
    args = parser.parse_args(argv)
    print(
        f"steps {args.steps}, best of {args.repeat}, vmap batch {args.batch}; jax {jax.__version__}, {jax.devices()[0]}"
    )
    versions = args.versions.split(",")
    print("\ntridiagonal solve x <- T(x)^-1 x + 1 in a scan; ns per step (one trajectory | per vmap member)")
    print(f"{'k':>3}  " + "".join(f"{v:>22}" for v in versions) + "   (compile s)")
    for k in [int(s) for s in args.sizes.split(",")]:
        x0 = jnp.linspace(0.1, 1.0, k)
        cells, compiles = [], []
        for v in versions:
            solve = TRI[v]
            c, one, many = measure(lambda x, s=solve: s(*_tri(x), x) + 1.0, x0, args.steps, args.repeat, args.batch)
            cells.append(f"{one:>10.0f} |{many:>9.0f}")
            compiles.append(f"{c:.2f}")
        print(f"{k:>3}  " + "".join(f"{c:>22}" for c in cells) + "   (" + " ".join(compiles) + ")", flush=True)

    for title, table in [("dense solve a(x)^-1 x + 1", DENSE), ("dense inverse, x <- inv(a(x)) x + 1", INVERSE)]:
        print(f"\n{title} in a scan; ns per step (one trajectory | per vmap member)")
        print(f"{'m':>3}  " + "".join(f"{v:>22}" for v in table) + "   (compile s)")
        for m in [int(s) for s in args.dense_sizes.split(",")]:
            x0 = jnp.linspace(0.1, 1.0, m)
            cells, compiles = [], []
            for fn in table.values():
                if table is DENSE:
                    update = lambda x, f=fn: f(_dense(x), x) + 1.0
                else:
                    update = lambda x, f=fn: f(_dense(x)) @ x + 1.0
                c, one, many = measure(update, x0, args.steps, args.repeat, args.batch)
                cells.append(f"{one:>10.0f} |{many:>9.0f}")
                compiles.append(f"{c:.2f}")
            print(f"{m:>3}  " + "".join(f"{c:>22}" for c in cells) + "   (" + " ".join(compiles) + ")", flush=True)


if __name__ == "__main__":
    main()
