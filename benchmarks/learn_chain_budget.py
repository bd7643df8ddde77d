"""The headline pair of learn-chain-pendulum at the paper's training budget: the CHNN
trained through RK4 and the paper's angle-coordinate neural ODE, on the 2-link planar
chain with 100 training trajectories (2000 chunks of 5), 50 held out, MLP 3×256, batches
of 200, for a given number of epochs (the paper's: 2000). The measure is the experiment's
(geometric mean over the held-out trajectories and 100 steps of ‖x̂ − x‖/‖x̂ + x‖); the
data, networks and helpers are the experiment's own (`geomjax.experiments.learn_chain`).

Run: `python benchmarks/learn_chain_budget.py EPOCHS angle,chnn [SEED]` (2000 epochs: about
50 minutes on a 2-core CPU).
"""

import json
import sys
import time

import jax
import numpy as np

import geomjax
from geomjax.experiments.learn_chain import CHUNK, _long_rollouts, _planar_angles

epochs = int(sys.argv[1])
which = sys.argv[2].split(",")
seed = int(sys.argv[3]) if len(sys.argv) > 3 else 0
steps, size, test, width, depth = 100, 100, 50, 256, 3
data = geomjax.chain_trajectories(2, size + test, steps=steps, space_dim=2, key=jax.random.key(seed))
angles = _planar_angles(data)
pool, held_out = data.split(size)
train_set, _ = pool.split(size)
n = data.n
net0 = geomjax.ConstrainedHamiltonianNetwork(n, data.constraints, space_dim=2, width_size=width, depth=depth, key=jax.random.key(seed + 1))
angle_width = geomjax.NeuralODE.width_for(geomjax.parameter_count(net0), n, depth)
angle0 = geomjax.NeuralODE(n, width_size=angle_width, depth=depth, key=jax.random.key(seed + 1))
out = {}
for name in which:
    t0 = time.perf_counter()
    if name == "angle":
        trained, hist = geomjax.train(angle0, angles[0](train_set.xs), dt=data.dt, method="rk4", epochs=epochs, chunk_length=CHUNK, batch_size=200, key=jax.random.key(seed + 2))
        long = angles[1](_long_rollouts(trained, angles[0](held_out.xs[:, :1])[:, 0], steps, data.dt, "rk4"))
    else:
        trained, hist = geomjax.train(net0, train_set, method="rk4", epochs=epochs, chunk_length=CHUNK, batch_size=200, key=jax.random.key(seed + 2))
        long = _long_rollouts(trained, held_out.xs[:, 0], steps, data.dt, "rk4")
    rel = np.asarray(geomjax.relative_error(long[:, 1:steps + 1], held_out.xs[:, 1:]))
    out[name] = {"error": float(np.exp(np.mean(np.log(rel)))), "seconds": time.perf_counter() - t0,
                 "s_per_epoch": float(np.median(hist["seconds"])), "final_loss": float(hist["loss"][-1])}
    print(name, out[name], flush=True)
print(json.dumps({"epochs": epochs, "seed": seed, **out}), flush=True)
