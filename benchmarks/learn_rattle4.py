"""The fourth-order structure-preserving trainer: a CHNN trained through RATTLE's triple
jump (`method="rattle4"`) against the same network trained through RK4 on the Dirac field
and through RATTLE (order 2).

Chain-pendulum data (`geomjax.chain_trajectories`, independent of the trainers: RK4 at
h = 10⁻³ on the exact Dirac field), the same initial network, optimizer, minibatches and
epochs for every trainer. Printed per trainer: training time per epoch, the rollout error
on held-out trajectories (`geomjax.rollout_error`, geometric mean of ‖x̂−x‖/‖x̂+x‖ over
the observation horizon, rolled out with the trainer's own method), and the largest
constraint residual |g(q)| of rollouts 100× longer than the training chunks' horizon.

Targets (issue 37): rattle4's rollout error within 1.5× of the RK4-trained network's, at
≤ 3× RATTLE's training cost per epoch, and |g| ≤ 1e−12 over the long rollouts.

Run: `python benchmarks/learn_rattle4.py [--links 2] [--train 24] [--epochs 300] [--width 64]`.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax

import geomjax


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--links", type=int, default=2)
    parser.add_argument("--train", type=int, default=24)
    parser.add_argument("--test", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    data = geomjax.chain_trajectories(args.links, args.train + args.test, steps=40, key=jax.random.key(args.seed))
    train, test = data.split(args.train)
    net0 = geomjax.ConstrainedHamiltonianNetwork(2 * args.links, data.constraints, space_dim=2, width_size=args.width,
                                                 depth=args.depth, key=jax.random.key(args.seed + 1))
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}; {args.links}-link chain, {args.train} training and "
          f"{args.test} test trajectories of 41 observations (dt = {data.dt}), chunks of 5, MLP {args.depth}×{args.width}, "
          f"{args.epochs} epochs")
    print(f"{'trainer':>8}{'s/epoch':>10}{'compile s':>11}{'final loss':>12}{'rollout error':>15}{'max |g|, 100× horizon':>24}")
    rows = {}
    for method in ("rk4", "rattle", "rattle4"):
        optimizer = optax.adamw(optax.cosine_decay_schedule(3e-3, args.epochs * max(1, (args.train * 8) // 200)), weight_decay=1e-4)
        net, history = geomjax.train(net0, train, method=method, epochs=args.epochs, optimizer=optimizer,
                                     key=jax.random.key(args.seed + 2))
        error = geomjax.rollout_error(net, test, method=method)
        long_steps = 100 * 4  # 100 × the 4 steps of a training chunk
        xs = jax.vmap(lambda x: geomjax.rollout(net, x, long_steps, data.dt, method))(test.xs[:, 0])
        g = float(jnp.max(jnp.abs(jax.vmap(jax.vmap(data.constraints))(xs[..., : 2 * args.links]))))
        per_epoch = float(np.median(history["seconds"]))
        rows[method] = (per_epoch, error)
        print(f"{method:>8}{per_epoch:>10.3f}{history['compile_seconds']:>11.1f}{history['loss'][-1]:>12.3g}"
              f"{error:>15.3g}{g:>24.2e}", flush=True)
    print(f"rattle4 / rk4 rollout error: {rows['rattle4'][1] / rows['rk4'][1]:.2f} (target ≤ 1.5); "
          f"rattle / rk4: {rows['rattle'][1] / rows['rk4'][1]:.2f}; "
          f"rattle4 / rattle cost per epoch: {rows['rattle4'][0] / rows['rattle'][0]:.2f} (target ≤ 3)")


if __name__ == "__main__":
    main()
