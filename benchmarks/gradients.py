"""Reverse-mode gradients through `geomjax.integrate`: time and memory against the forward run.

For a loss on the final state, times the forward run and `jax.grad` (both inside `jit`)
for save_every ∈ {1, 100, steps}, with the driver's checkpointing on (the default) and
off, on the spherical pendulum's feedback field (explicit Euler) and on RATTLE. Memory:
the bytes of the residuals reverse mode keeps from the forward pass
(the arrays held by `jax.vjp`'s pullback), since CPU devices report no peak memory.

Run: `python benchmarks/gradients.py [--steps 10000] [--repeat 5]`.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from _harness import timeit

import geomjax


def residual_bytes(fn, x):
    """Bytes kept between the forward and the backward pass: the arrays `jax.vjp` holds."""
    _, pullback = jax.vjp(fn, x)
    return sum(np.asarray(leaf).nbytes for leaf in jax.tree_util.tree_leaves(pullback))


def peak_memory():
    stats = jax.devices()[0].memory_stats()
    return None if stats is None else stats.get("peak_bytes_in_use")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    steps = args.steps
    model = geomjax.models.spherical_pendulum()
    holonomic = geomjax.models.spherical_pendulum(holonomic=True)
    cases = {
        "feedback field, Euler": (geomjax.feedback_field(model.system, model.x0, gains=50.0), model.x0),
        "RATTLE": (geomjax.rattle(holonomic.system), holonomic.x0),
    }
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}; {steps} steps, dt = 1e-3")
    print(f"{'case':<24}{'save_every':>11}{'ckpt':>6}{'forward [ms]':>14}{'reverse [ms]':>14}{'ratio':>8}{'residuals':>12}")
    for name, (target, x0) in cases.items():
        for save_every in (1, 100, steps):
            for checkpoint in (True, False):

                def loss(x):
                    sol = geomjax.integrate(
                        target, x, dt=1e-3, steps=steps, save_every=save_every, checkpoint=checkpoint
                    )
                    return jnp.sum(sol.xs[-1] ** 2)

                forward = timeit(jax.jit(loss), x0, repeat=args.repeat)
                reverse = timeit(jax.jit(jax.grad(loss)), x0, repeat=args.repeat)
                kib = residual_bytes(loss, x0) / 1024
                print(
                    f"{name:<24}{save_every:>11}{str(checkpoint):>6}{forward * 1e3:>14.2f}{reverse * 1e3:>14.2f}"
                    f"{reverse / forward:>8.1f}{kib:>9.0f} KiB"
                )
    peak = peak_memory()
    print("peak device memory:", "not reported on this device" if peak is None else f"{peak / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
