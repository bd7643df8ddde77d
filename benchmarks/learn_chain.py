"""Constrained Hamiltonian networks against a neural ODE on a chain of pendulums.

The comparison of Finzi, Wang and Wilson (2020), on geomjax's chains: trajectories of a
chain of `--links` links (100 observations, dt = 0.03, g = 9.81) from random starts,
`--train` of them cut into chunks of 5 observations to train on and `--test` held out.
Trained, each with `geomjax.train`'s defaults (AdamW 3·10⁻³, cosine schedule, mean
absolute error, minibatches of 200 chunks):

- a CHNN (learned M = LLᵀ ⊗ I₂, MLP potential) by RK4 on its Dirac field (their method),
  by RATTLE and by RK4 on its feedback field;
- a neural ODE with about as many parameters, by RK4.

Printed for each: the geometric mean of the relative state error over 100-step rollouts
of the held-out trajectories (their measure), rolled out by the method it was trained
with, the largest constraint violation |g| along those rollouts, the final training loss,
and the time per epoch and to compile.

Run: `python benchmarks/learn_chain.py` (options `--links`, `--train`, `--test`,
`--epochs`, `--width`, `--depth`).
"""

import argparse
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import geomjax


@eqx.filter_jit
def rollouts(model, starts, dt, method, substeps, gains):
    return jax.vmap(lambda x0: geomjax.rollout(model, x0, 100, dt, method, substeps=substeps, gains=gains))(starts)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--links", type=int, default=2)
    parser.add_argument("--space-dim", type=int, default=2)
    parser.add_argument("--train", type=int, default=100)
    parser.add_argument("--test", type=int, default=50)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument(
        "--methods",
        default="rk4,rattle,feedback,node",
        help="comma-separated; 'rattle:4' takes 4 substeps per observation",
    )
    args = parser.parse_args()

    start = time.perf_counter()
    data = geomjax.chain_trajectories(
        args.links, args.train + args.test, space_dim=args.space_dim, key=jax.random.key(0)
    )
    train_set, test_set = data.split(args.train)
    print(
        f"chain of {args.links} links in R^{args.space_dim}: {args.train} training trajectories "
        f"({train_set.chunks(5).shape[0]} chunks of 5), {args.test} held out, 100 observations at dt = {data.dt}; "
        f"data in {time.perf_counter() - start:.1f} s"
    )
    print(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}), jax {jax.__version__}")
    net = geomjax.ConstrainedHamiltonianNetwork(
        data.n,
        data.constraints,
        space_dim=args.space_dim,
        width_size=args.width,
        depth=args.depth,
        key=jax.random.key(1),
    )
    node = geomjax.NeuralODE.sized_like(net, key=jax.random.key(1))
    print(
        f"CHNN: MLP {args.depth}×{args.width} tanh, {geomjax.parameter_count(net)} parameters; "
        f"neural ODE: width {node.network.width_size}, {geomjax.parameter_count(node)} parameters; "
        f"{args.epochs} epochs"
    )
    n = data.n
    rows = []
    for name in args.methods.split(","):
        method, _, substeps = name.partition(":")
        substeps = int(substeps or 1)
        model, method = (node, "rk4") if method == "node" else (net, method)
        # feedback: the gains train() chooses for the initial network, kept for the test rollouts
        gains = geomjax.network_gains(net, train_set.xs[:64, 0], data.dt / substeps) if method == "feedback" else None
        start = time.perf_counter()
        trained, history = geomjax.train(
            model, train_set, method=method, substeps=substeps, gains=gains, epochs=args.epochs, key=jax.random.key(2)
        )
        train_seconds = time.perf_counter() - start
        # rollout_error's measure, from the rollouts that also give the constraint violation
        predicted = rollouts(trained, test_set.xs[:, 0], data.dt, method, substeps, gains)
        rel = np.asarray(geomjax.relative_error(predicted, test_set.xs))
        # a rollout that failed (a RATTLE step whose Newton solve did not converge) is NaN
        # from there on: counted, and the error is taken over the others
        ran = np.all(np.isfinite(rel), axis=1)
        rel = rel[ran]
        error = float(np.exp(np.mean(np.log(rel[:, 1:])))) if ran.any() else float("nan")
        failed = "" if ran.all() else f", {int((~ran).sum())} of {ran.size} held-out rollouts failed (error over the others)"
        violation = float(jnp.nanmax(jnp.abs(jax.vmap(jax.vmap(data.constraints))(predicted[..., :n]))))
        label = (
            "neural ODE (RK4)"
            if name == "node"
            else f"CHNN ({method}{f', {substeps} substeps' if substeps > 1 else ''})"
        )
        rows.append(
            (
                label,
                error,
                float(np.exp(np.mean(np.log(rel[:, -1])))),
                violation,
                history["loss"][-1],
                float(np.median(history["seconds"])),
                history["compile_seconds"],
                train_seconds,
            )
        )
        print(
            f"{label:18s} rollout error {error:.3e} (at t = 3: {rows[-1][2]:.3e}), max |g| {violation:.1e}, "
            f"loss {history['loss'][0]:.3e} → {history['loss'][-1]:.3e}, "
            f"{1e3 * rows[-1][5]:.1f} ms/epoch, compile {history['compile_seconds']:.1f} s, total {train_seconds:.0f} s"
            f"{failed}",
            flush=True,
        )
    print()
    print(
        "| model | geometric-mean relative error, 100 steps | at t = 3 | max abs(g) on rollouts | final loss | ms/epoch | compile s |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, error, last, violation, loss, epoch, compile_s, _ in rows:
        print(
            f"| {label} | {error:.2e} | {last:.2e} | {violation:.1e} | {loss:.2e} | {1e3 * epoch:.1f} | {compile_s:.1f} |"
        )


if __name__ == "__main__":
    main()
