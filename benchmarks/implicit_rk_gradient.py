"""Gradients through the matrix-free Gauss-4 stage solve on a cloth's Dirac field.

Above `geomjax._step.implicit_rk.MATRIX_FREE_MIN` state components, `implicit_rk(...,
solver="newton")` solves the stages' simplified Newton systems I − h A⊗J by GMRES on jvp
products. The derivatives of the stages (implicit function theorem) need one more solve,
with the exact stage Jacobian. Compared in one process, per Gauss-4 step on the Dirac
field of an n × n planar cloth (state 4n², m = 2n(n − 1) rods):

- forward:      the step alone (the reference);
- grad, GMRES:  `jax.grad` of a scalar of the step, tangent solve by GMRES on the linear
                map (`geomjax._solve.krylov.krylov_tangent_solve`; what geomjax does);
- grad, dense:  the same with the tangent Jacobian formed by `jax.jacfwd` (s·n forward
                passes) and solved by dense LU (what geomjax did before), where it fits.

Prints ms per call, grad ÷ forward, and the largest array in each traced gradient.

Run: `python benchmarks/implicit_rk_gradient.py [--sizes 8 12 16]`.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import geomjax
from _harness import timeit
from geomjax._solve import newton as newton_module
from geomjax._step import implicit_rk

H = 0.01


def largest_array(fn, x):
    def shapes(jaxpr):
        for eqn in jaxpr.eqns:
            for v in eqn.outvars:
                yield int(np.prod(v.aval.shape))
            for param in eqn.params.values():
                for sub in param if isinstance(param, (list, tuple)) else [param]:
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        yield from shapes(inner)

    return max(shapes(jax.make_jaxpr(fn)(x).jaxpr))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 12, 16])
    parser.add_argument("--dense-max", type=int, default=12, help="largest n for the dense tangent solve")
    args = parser.parse_args(argv)
    print(f"Gauss 4, solver='newton', h = {H}, Dirac field of an n x n planar cloth; device {jax.devices()[0]}")
    print(f"{'n':>3} {'state':>6} {'forward ms':>11} {'grad GMRES ms':>14} {'÷ fwd':>6} {'largest':>9}"
          f" {'grad dense ms':>14} {'÷ fwd':>6} {'largest':>9} {'|Δgrad|':>8}")
    for n in args.sizes:
        model = geomjax.models.cloth(n)
        field = geomjax.dirac_field(model.system)
        step = geomjax.implicit_rk(field, geomjax.GAUSS4, solver="newton")
        x0 = model.x0
        size = x0.shape[0]
        assert size >= implicit_rk.MATRIX_FREE_MIN or n < 10, "below the matrix-free threshold"

        def forward(x):
            return step.merge(step.advance(0.0, step.split(x), H, None)[0])

        def loss(x):
            return jnp.sum(forward(x)[: size // 2] ** 2)

        fwd = timeit(jax.jit(forward), x0, repeat=3)
        grad = jax.jit(jax.grad(loss))
        t_free = timeit(grad, x0, repeat=3)
        g_free = grad(x0)
        big_free = largest_array(jax.grad(loss), x0)
        row = f"{n:>3} {size:>6} {1e3 * fwd:>11.2f} {1e3 * t_free:>14.2f} {t_free / fwd:>6.1f} {big_free:>9}"
        if n <= args.dense_max:
            saved = implicit_rk.krylov_tangent_solve
            implicit_rk.krylov_tangent_solve = newton_module.tangent_solve
            try:
                dense = jax.jit(jax.grad(loss))
                t_dense = timeit(dense, x0, repeat=3)
                diff = float(jnp.max(jnp.abs(dense(x0) - g_free)) / jnp.max(jnp.abs(g_free)))
                big_dense = largest_array(jax.grad(loss), x0)
            finally:
                implicit_rk.krylov_tangent_solve = saved
            row += f" {1e3 * t_dense:>14.2f} {t_dense / fwd:>6.1f} {big_dense:>9} {diff:>8.1e}"
        print(row, flush=True)


if __name__ == "__main__":
    main()
