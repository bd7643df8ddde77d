"""Shared pieces of the benchmark scripts: the compiled loops, timing and test states."""

import time

import jax
import jax.numpy as jnp
import numpy as np


def scan_loop(step, steps: int, n: int = 3):
    """`x0 ↦ x_steps` for `step(q, p) ↦ (q, p)` iterated in one `lax.scan` on the (q, p) pieces."""

    def run(x0):
        def body(carry, _):
            return step(*carry), None

        (q, p), _ = jax.lax.scan(body, (x0[:n], x0[n:]), None, length=steps)
        return jnp.concatenate([q, p])

    return run


def euler_loop(make_field, steps: int, h: float, n: int = 3):
    """Explicit Euler for the field `make_field(x0)`, a callable `(q, p) ↦ (q̇, ṗ)`."""

    def run(x0):
        field = make_field(x0)

        def step(q, p):
            dq, dp = field(q, p)
            return q + h * dq, p + h * dp

        return scan_loop(step, steps, n)(x0)

    return run


def timeit(fn, *args, repeat: int = 5) -> float:
    """Best wall time of `repeat` calls after one warm-up (compilation) call."""
    jax.block_until_ready(fn(*args))
    best = np.inf
    for _ in range(repeat):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - start)
    return best


def sphere_states(n: int, key):
    """n states on T*S² ⊂ T*R³: a random unit q and a random momentum tangent to the sphere."""
    kq, kp = jax.random.split(key)
    q = jax.random.normal(kq, (n, 3))
    q = q / jnp.linalg.norm(q, axis=1, keepdims=True)
    p = jax.random.normal(kp, (n, 3))
    p = p - jnp.sum(p * q, axis=1, keepdims=True) * q
    return jnp.concatenate([q, p], axis=1)


def count_fusions(fn, x):
    """(fusions, custom calls) in the compiled HLO of `fn(x)`."""
    text = jax.jit(fn).lower(x).compile().as_text()
    return text.count(" fusion("), text.count("custom-call")


def size_arguments(description: str):
    """An argument parser with the sizes every derived-vs-hand benchmark takes."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=100_000, help="steps of the single run")
    parser.add_argument("--batch", type=int, default=1024, help="initial states under vmap")
    parser.add_argument("--batch-steps", type=int, default=10_000, help="steps of the batched run")
    return parser


def compare_fields(fields: dict, x0, xs, steps: int, batch_steps: int, h: float, n: int = 3):
    """Time each field `x0 ↦ ((q, p) ↦ (q̇, ṗ))` in the same explicit-Euler loop.

    The first entry of `fields` is the reference (the hand-written field). Runs one
    trajectory from `x0` for `steps` steps and `vmap` over the rows of `xs` for
    `batch_steps` steps, prints the times with their ratios to the reference and the
    largest difference of every final state from the reference's, and returns
    `{name: (single seconds, batched seconds)}`.
    """
    times, worst = {}, {}
    ref_single = ref_batch = None
    for name, make in fields.items():
        single = jax.jit(euler_loop(make, steps, h, n))
        batch = jax.jit(jax.vmap(euler_loop(make, batch_steps, h, n)))
        end_single, end_batch = single(x0), batch(xs)
        if ref_single is None:
            ref_single, ref_batch = end_single, end_batch
        worst[name] = max(float(jnp.max(jnp.abs(end_single - ref_single))), float(jnp.max(jnp.abs(end_batch - ref_batch))))
        times[name] = (timeit(single, x0), timeit(batch, xs, repeat=3))
    ref = next(iter(times.values()))
    print(f"{'field':<30}{'single [s]':>11}{'ratio':>7}{'ns/step':>9}{'vmap [s]':>10}{'ratio':>7}{'max |Δx|':>10}")
    for name, (ts, tb) in times.items():
        print(
            f"{name:<30}{ts:>11.4f}{ts / ref[0]:>7.2f}{ts / steps * 1e9:>9.1f}{tb:>10.4f}{tb / ref[1]:>7.2f}"
            f"{worst[name]:>10.1e}"
        )
    print(f"(single: {steps} steps; vmap: {xs.shape[0]} states × {batch_steps} steps)")
    return times


def time_integrate(field, x0, h: float, steps: int, reference_seconds: float) -> float:
    """Time `geomjax.integrate(field, x0, ...)` for one trajectory, called directly and
    inside `jax.jit`; print both against `reference_seconds`; return the direct time."""
    import geomjax

    run = lambda x: geomjax.integrate(field, x, dt=h, steps=steps, save_every=steps).xs[-1]
    direct, jitted = timeit(run, x0), timeit(jax.jit(run), x0)
    print(
        f"geomjax.integrate, single: {direct:.4f} s called directly ({direct / reference_seconds:.2f}x hand), "
        f"{jitted:.4f} s inside jit ({jitted / reference_seconds:.2f}x)"
    )
    return direct
