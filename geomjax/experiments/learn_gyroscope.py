"""Finzi, Wang and Wilson (2020), learning an extended body: constrained Hamiltonian networks
(CHNN) against a neural ODE on their gyroscope, a symmetric top pinned at a point of its axle.

Data (`geomjax.models.gyroscope_trajectories`): the top as four points in R³ (its centre
of mass and the tips of its principal axes, `geomjax.models.RigidBodies`: six distance
constraints and a ball joint, k = 9), from random starts spinning at ≈ ±10.5 rad/s about
the axle, integrated by RK4 on the Dirac field at 40 substeps per observation (h = 5·10⁻⁴)
and observed as (q, q̇) every dt = 0.02 (theirs) for `steps` intervals.

Protocol and models: those of the chain experiment (`learn-chain-pendulum`): the CHNN
(H = ½pᵀ(LLᵀ ⊗ I₃)⁻¹p + V_θ(q), the top's known constraints) trained through RK4 on its
Dirac field and through RATTLE, against a neural ODE of about as many parameters, on chunks
of 5 observations of the first `size` trajectories; measured on held-out trajectories (the
geometric mean of ‖x̂ − x‖/‖x̂ + x‖ over them and the `steps` observation steps) and on long
rollouts (max|g|, the learned energy's drift). The CHNN's learned mass matrix LLᵀ ⊗ I₃ has
exactly the form of the top's 𝕄 ⊗ I₃ (a 4 × 4 matrix over its points), so the network can
represent the top's kinetic energy; its potential V_θ must learn the gravity term.
"""

import pathlib
import time

import jax

import geomjax

from . import register
from .learn_chain import CHUNK, learn_problem, report

NAME = "learn-gyroscope"


@register(NAME, "Finzi, Wang and Wilson (2020): constrained Hamiltonian networks vs a neural ODE on their gyroscope "
                "(a symmetric top as four points in space, pinned at its axle); rollout error vs training-set size, "
                "and long rollouts of a trained CHNN by RK4 and RATTLE",
          quick={"sizes": (6,), "test": 3, "epochs": 30, "width": 32, "depth": 2, "steps": 50, "long_steps": 300,
                 "batch_size": 16})
def run(out_dir: pathlib.Path, progress: bool, *, sizes=(10, 30, 100), test=30, steps=100, long_steps=5_000,
        epochs=150, width=256, depth=3, batch_size=200, seed=0, seeds=None) -> dict:
    """Train the three models on the gyroscope's trajectories for every training-set size
    of `sizes`; measure rollout errors on `test` held-out trajectories of `steps`
    observations, and long rollouts of `long_steps` steps.

    The quick configuration (a smoke run on a CPU) trains at one size on a 2×32 network;
    its numbers are real but not the paper's."""
    out_dir = pathlib.Path(out_dir)
    sizes = tuple(sorted(int(s) for s in sizes))
    long_steps = max(int(long_steps), int(steps))
    start = time.perf_counter()
    data = geomjax.models.gyroscope_trajectories(max(sizes) + test, steps=steps, key=jax.random.key(seed))
    data_s = time.perf_counter() - start
    result = learn_problem(data, "gyroscope", sizes=sizes, steps=steps, long_steps=long_steps, epochs=epochs,
                           width=width, depth=depth, batch_size=batch_size, seed=seed, seeds=seeds, progress=progress)
    out = report(NAME, out_dir, [result], steps=steps, long_steps=long_steps)
    out["setting"] = {
        "problem": "gyroscope", "parameters": result["parameters"], "data_s": data_s,
        "sizes": list(sizes), "test": test, "steps": steps, "dt": result["dt"], "chunk_length": CHUNK,
        "long_steps": long_steps, "epochs": epochs, "batch_size": batch_size, "mlp": f"{depth}x{width} tanh",
        "seeds": result["seeds"],
        "data": "gyroscope_trajectories: RK4 on the Dirac field, 40 substeps per observation (h = 5e-4)",
    }
    return out
