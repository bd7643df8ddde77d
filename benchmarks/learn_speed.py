"""One training epoch of a constrained Hamiltonian network: geomjax vs plain JAX by hand.

geomjax: `geomjax.train` on a `ConstrainedHamiltonianNetwork` (learned M = LLᵀ ⊗ I, MLP
potential), rollouts of each chunk by RK4 on the Dirac field that geomjax derives from
the network's H and the chain's constraints. By hand: the same network written as plain
arrays, the Lagrange-multiplier field of the chain written out

    q̇ = M⁻¹p,  ṗ = −∇V − Gᵀλ,  (G M⁻¹ Gᵀ) λ = |u|² − G M⁻¹∇V

(G the chain's constraint Jacobian, u_i = v_i − v_{i−1} the links' relative velocities),
RK4 in a `lax.scan`, `vmap` over chunks, the same optax optimizer, the same minibatch
order, the epoch one compiled `lax.scan` over minibatches, as `train` runs it. The two
are timed in turns (best of the rounds, each round a few epochs), and the compile
times are printed.

Run: `python benchmarks/learn_speed.py` (the paper's network size, 3×256; about 7
minutes on 2 CPU cores); options: `--links`, `--space-dim`, `--width`, `--depth`,
`--trajectories`, `--batch`, `--rounds`. Results: `benchmarks/learn_speed_results.txt`.
"""

import argparse
import time

import equinox as eqx
import jax
import optax
import jax.numpy as jnp
import numpy as np

import geomjax


def hand_written_trainer(net, chunks, dt, batch_size, epochs, optimizer):
    """`(params, compiled epoch, order_of)` for the hand-written CHNN on `chunks`."""
    n_links = net.bodies
    d = net.space_dim
    params = {
        "mass": net.mass_factor,
        "layers": [(layer.weight, layer.bias) for layer in net.network.layers],
    }
    rows, cols = np.tril_indices(n_links)

    def factor(mass):
        raw = jnp.zeros((n_links, n_links)).at[rows, cols].set(mass)
        return jnp.tril(raw, -1) + jnp.diag(jax.nn.softplus(jnp.diagonal(raw)) + 1e-4)

    def potential(layers, q):
        h = q
        for w, b in layers[:-1]:
            h = jnp.tanh(w @ h + b)
        w, b = layers[-1]
        return (w @ h + b)[0]

    def loss(params, batch):
        lower = factor(params["mass"])
        mass = lower @ lower.T
        minv = jnp.linalg.inv(mass)
        grad_v = jax.grad(potential, argnums=1)
        idx = np.arange(n_links)

        def field(q, p):
            pos, mom = q.reshape(n_links, d), p.reshape(n_links, d)
            vel = minv @ mom
            dv = grad_v(params["layers"], q).reshape(n_links, d)
            links = jnp.diff(pos, axis=0, prepend=jnp.zeros((1, d)))
            rel = jnp.diff(vel, axis=0, prepend=jnp.zeros((1, d)))
            jac = jnp.zeros((n_links, n_links, d)).at[idx, idx].set(links).at[idx[1:], idx[:-1]].set(-links[1:])
            jac_minv = jnp.einsum("ikd,kj->ijd", jac, minv)
            gram = jnp.einsum("ikd,jkd->ij", jac_minv, jac)
            rhs = jnp.sum(rel * rel, axis=1) - jnp.einsum("ikd,kd->i", jac_minv, dv)
            lam = jnp.linalg.solve(gram, rhs)
            force = -dv - jnp.einsum("i,ikd->kd", lam, jac)
            return vel.reshape(-1), force.reshape(-1)

        def rk4(q, p):
            k1 = field(q, p)
            k2 = field(q + 0.5 * dt * k1[0], p + 0.5 * dt * k1[1])
            k3 = field(q + 0.5 * dt * k2[0], p + 0.5 * dt * k2[1])
            k4 = field(q + dt * k3[0], p + dt * k3[1])
            return (
                q + dt / 6 * (k1[0] + 2 * k2[0] + 2 * k3[0] + k4[0]),
                p + dt / 6 * (k1[1] + 2 * k2[1] + 2 * k3[1] + k4[1]),
            )

        def rollout(chunk):
            q0 = chunk[0, : n_links * d]
            p0 = (mass @ chunk[0, n_links * d :].reshape(n_links, d)).reshape(-1)

            def body(carry, _):
                q, p = rk4(*carry)
                v = (minv @ p.reshape(n_links, d)).reshape(-1)
                return (q, p), jnp.concatenate([q, v])

            _, xs = jax.lax.scan(body, (q0, p0), None, length=chunk.shape[0] - 1)
            return jnp.concatenate([chunk[:1], xs])

        return jnp.mean(jnp.abs(jax.vmap(rollout)(batch) - batch))

    count = chunks.shape[0]
    batches = count // batch_size

    def step(carry, index):
        params, state, chunks = carry
        value, grads = jax.value_and_grad(loss)(params, chunks[index])
        updates, state = optimizer.update(grads, state, params)
        return (eqx.apply_updates(params, updates), state, chunks), value

    @jax.jit
    def epoch(params, state, chunks, order):
        (params, state, _), values = jax.lax.scan(step, (params, state, chunks), order)
        return params, state, values

    def order_of(key):
        return jax.random.permutation(key, count)[: batches * batch_size].reshape(batches, batch_size)

    state = optimizer.init(params)
    start = time.perf_counter()
    compiled = epoch.lower(params, state, chunks, order_of(jax.random.key(0))).compile()
    return params, state, (lambda p, s, order: compiled(p, s, chunks, order)), order_of, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--links", type=int, default=2)
    parser.add_argument("--space-dim", type=int, default=2)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--trajectories", type=int, default=32)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--chunk", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3, help="epochs per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    data = geomjax.chain_trajectories(args.links, args.trajectories, space_dim=args.space_dim, key=jax.random.key(0))
    chunks = data.chunks(args.chunk)
    n = data.n
    net = geomjax.ConstrainedHamiltonianNetwork(
        n, data.constraints, space_dim=args.space_dim, width_size=args.width, depth=args.depth, key=jax.random.key(1)
    )
    batches = chunks.shape[0] // args.batch
    print(
        f"chain of {args.links} links in R^{args.space_dim}, MLP {args.depth}×{args.width} tanh "
        f"({geomjax.parameter_count(net)} parameters), {chunks.shape[0]} chunks of {args.chunk} observations "
        f"(dt = {data.dt}), minibatches of {args.batch} ({batches} per epoch), RK4, one step per observation"
    )
    print(f"backend {jax.default_backend()}, {jax.device_count()} device(s), jax {jax.__version__}")

    # geomjax.train's default (Finzi, Wang and Wilson's): AdamW 3e-3, weight decay 1e-4, cosine to 0
    optimizer = optax.adamw(optax.cosine_decay_schedule(3e-3, args.epochs * batches), weight_decay=1e-4)
    params, state, hand_epoch, order_of, hand_compile = hand_written_trainer(
        net, chunks, data.dt, args.batch, args.epochs, optimizer
    )
    geomjax_times, hand_times, geomjax_compile = [], [], []
    for r in range(args.rounds):
        _, history = geomjax.train(
            net, data, chunk_length=args.chunk, epochs=args.epochs, batch_size=args.batch, key=jax.random.key(r)
        )
        geomjax_times.append(float(np.min(history["seconds"])))
        geomjax_compile.append(history["compile_seconds"])
        p, s = params, state
        best = np.inf
        for k in jax.random.split(jax.random.key(r), args.epochs):
            start = time.perf_counter()
            p, s, values = hand_epoch(p, s, order_of(k))
            jax.block_until_ready(values)
            best = min(best, time.perf_counter() - start)
        hand_times.append(best)
        print(f"round {r + 1}: geomjax {1e3 * geomjax_times[-1]:.1f} ms/epoch, by hand {1e3 * best:.1f} ms/epoch")
    g, h = min(geomjax_times), min(hand_times)
    print(f"best epoch: geomjax {1e3 * g:.1f} ms, by hand {1e3 * h:.1f} ms, ratio {g / h:.2f}×")
    print(
        f"median of rounds: geomjax {1e3 * np.median(geomjax_times):.1f} ms, by hand {1e3 * np.median(hand_times):.1f} ms, "
        f"ratio {np.median(geomjax_times) / np.median(hand_times):.2f}×"
    )
    print(f"compile: geomjax {min(geomjax_compile):.1f} s (epoch program), by hand {hand_compile:.1f} s")


if __name__ == "__main__":
    main()
