"""Eager calls of a loss that builds its system from closures: the first call against the
next ones, and against the same loss under `jax.jit`.

The loss of docs/howto/gradients.md (RATTLE, 200 steps on the sphere; H closes over g,
the constraint over the length) is called eagerly for a few values of g, as a function
and through `jax.grad`: each call makes new Python functions, which geomjax keys by their
code with the closed-over numbers hoisted out as arguments (`geomjax._driver.hoisting`),
so only the first call compiles. The reference is `jax.jit` of the same function, whose
later calls run the compiled program directly.

Run: `python benchmarks/eager_closures.py`.
"""

import time

import jax
import jax.numpy as jnp

import geomjax

X0 = jnp.array([1.0, 0.0, 0.0, 0.0, 1.0, 0.0])


def final_height(g, length=1.0):
    H = lambda x: 0.5 * x[3:] @ x[3:] + g * x[2]  # noqa: E731
    sphere = lambda q: q @ q - length**2  # noqa: E731
    system = geomjax.System(H, geomjax.canonical(3), holonomic=sphere)
    start = X0.at[:3].multiply(length)
    return geomjax.integrate(geomjax.rattle(system), start, dt=0.01, steps=200).x_final[2]


def timed(fn, values):
    out = []
    for v in values:
        t = time.perf_counter()
        jax.block_until_ready(fn(v))
        out.append(time.perf_counter() - t)
    return out


def main():
    print(f"jax {jax.__version__}, {jax.devices()[0]}; seconds per call, g = 9.81, 9.5, 9.0, 8.5")
    values = (9.81, 9.5, 9.0, 8.5)
    rows = {
        "eager loss(g)": timed(final_height, values),
        "eager jax.grad(loss)(g)": timed(jax.grad(final_height), values),
        "jax.jit(loss)(g)": timed(jax.jit(final_height), values),
        "jax.jit(jax.grad(loss))(g)": timed(jax.jit(jax.grad(final_height)), values),
    }
    for name, ts in rows.items():
        later = min(ts[1:])
        print(f"{name:28s} first {ts[0]:7.3f}  later {later:7.4f} (best of {len(ts) - 1})  first/later {ts[0] / later:6.1f}")
    print(f"eager grad, later calls ÷ jitted grad, later calls: "
          f"{min(rows['eager jax.grad(loss)(g)'][1:]) / min(rows['jax.jit(jax.grad(loss))(g)'][1:]):.0f}")


if __name__ == "__main__":
    main()
