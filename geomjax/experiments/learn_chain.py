"""Finzi, Wang and Wilson (2020), learning chain pendulums: constrained Hamiltonian networks
(CHNN) against a neural ODE, and what RATTLE adds on long rollouts.

Data (`geomjax.chain_trajectories`): geomjax's own chains of equal unit masses and rods
(g = 9.81), from random starts on the constraint set, integrated by RK4 on the Dirac field
at 30 substeps per observation (h = 10⁻³: the observations are good to about 10⁻⁹ for
two links) and observed as (q, q̇) every dt = 0.03 for `steps` intervals.

Protocol (theirs): the first `max(sizes)` trajectories are the training pool, the others
are held out; for each training-set size in `sizes` the first that many trajectories are cut
into chunks of 5 observations and a model is trained on them (`geomjax.train`: AdamW
3·10⁻³ with a cosine schedule, mean absolute error of the chunk rollouts). Models, all of
about the same number of parameters (`NeuralODE.sized_like`):

- the neural ODE ẋ = f_θ(x), trained and rolled out by RK4;
- the CHNN (H = ½pᵀM⁻¹p + V_θ(q), the chain's known constraints g) trained through RK4
  on its Dirac field (their method), rolled out the same way;
- the CHNN trained through RATTLE (`geomjax.rattle`), rolled out by RATTLE.

Measured: their rollout error, the geometric mean over the held-out trajectories and the
`steps` observation steps of ‖x̂ − x‖/‖x̂ + x‖ (`geomjax.rollout_error`'s measure, taken
from the first `steps` steps of the long rollouts below), and its ratio to
the neural ODE's at the same size (figure 1: error vs the number of training trajectories).

Long rollouts: every model, at every size, is rolled out from the held-out starts for
`long_steps` observation steps (100× or more the horizon of a training chunk) by the method
it was trained with; the table gives the largest constraint violation max|g(q)| and the
largest change of the model's own learned energy |H_θ(x_t) − H_θ(x_0)| over them (the
neural ODE has no energy). Figure 2 takes the CHNN trained through RK4 at the largest size
and rolls it out both by RK4 on its Dirac field and by RATTLE: the constraint violation
and the learned energy error over time (the largest over the held-out starts).
"""

import pathlib
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import geomjax
from geomjax._system.legendre import solve_gradient
from geomjax.models._trajectories import observed_runs

from . import register
from ._common import _figure, _marked, _positive, _save, _title

NAME = "learn-chain-pendulum"

CHUNK = 5  # observations per training chunk (theirs)
MODELS = ("neural ODE", "second-order neural ODE", "CHNN (RK4)", "CHNN (RATTLE)")
#: The paper's baseline for planar chains: a neural ODE on the link angles and their rates.
ANGLE_MODEL = "angle neural ODE"
STYLES = {
    "neural ODE": {"color": "tab:gray"},
    "second-order neural ODE": {"color": "tab:olive"},
    "angle neural ODE": {"color": "tab:purple"},
    "CHNN (RK4)": {"color": "tab:blue"},
    "CHNN (RATTLE)": {"color": "tab:red"},
    "rolled out by RK4": {"color": "tab:blue"},
    "rolled out by RATTLE": {"color": "tab:red"},
}
# (links, space dimension) of the chains of the default run
DEFAULT_CHAINS = ((2, 2), (3, 2), (2, 3))


def _chain_name(links, space_dim):
    return f"{links}-link {'planar' if space_dim == 2 else 'spatial'} chain"


@eqx.filter_jit
def _long_rollouts(model, starts, steps, dt, method):
    return jax.vmap(lambda x0: geomjax.rollout(model, x0, steps, dt, method))(starts)


def _violation(constraints, xs, n):
    """max over the held-out starts of |g(q_t)| at every saved step, shape (steps + 1,)."""
    g = jax.vmap(jax.vmap(constraints))(xs[..., :n])
    return np.asarray(jnp.max(jnp.abs(g).reshape(g.shape[0], g.shape[1], -1), axis=(0, 2)))


def _energy_error(model, xs):
    """max over the starts of |H_θ(x_t) − H_θ(x_0)| of the network's own energy, (steps + 1,)."""
    h = jax.vmap(jax.vmap(lambda x: model.hamiltonian(model.to_canonical(x))))(xs)
    return np.asarray(jnp.max(jnp.abs(h - h[:, :1]), axis=0))


def _worst(a):
    a = np.asarray(a, dtype=float)
    return float("inf") if not np.all(np.isfinite(a)) else float(np.max(a))


def _tenth(a, which):
    """The largest entry of the first (`which` = 0) or last (-1) tenth of the saved steps
    after the start."""
    a = np.asarray(a)[1:]
    k = max(1, len(a) // 10)
    return _worst(a[:k] if which == 0 else a[-k:])


def _one_chain(links, space_dim, *, sizes, test, steps, seed, **training):
    sizes = tuple(sorted(int(s) for s in sizes))
    start = time.perf_counter()
    data = geomjax.chain_trajectories(links, max(sizes) + test, steps=steps, space_dim=space_dim,
                                      key=jax.random.key(seed))
    angles = _planar_angles(data) if space_dim == 2 else None
    out = learn_problem(data, _chain_name(links, space_dim), sizes=sizes, steps=steps, seed=seed, angles=angles,
                        **training)
    return out | {"links": links, "space_dim": space_dim, "data_s": time.perf_counter() - start}


def learn_problem(data, problem, *, sizes, steps, long_steps, epochs, width, depth, batch_size, seed, progress,
                  seeds=None, angles=None):
    """Train the `MODELS` on the first `size` trajectories of `data`, for each of `sizes`
    and each seed of `seeds` (default: `seed` alone; the seed sets the networks'
    initialisation and the minibatches, the data stay), and measure them on the
    trajectories after the first `max(sizes)` (held out): rollout errors (per seed), long
    rollouts (constraint violation, learned-energy error), the perturbation floor (the true
    system from the held-out starts moved by 10⁻⁴, `_perturbation_floor`), and figure 2's
    rollouts of the RK4-trained CHNN at the largest size by RK4 and by RATTLE. `angles`:
    (to angles, to Cartesian) maps of the observed states of a planar chain, for the
    paper's baseline, a neural ODE on the link angles (`ANGLE_MODEL`), trained on the data
    in angles and rolled out there, its rollouts measured in Cartesian coordinates."""
    seeds = (seed,) if seeds is None else tuple(int(s) for s in seeds)
    pool, held_out = data.split(max(sizes))
    n = data.n
    models = MODELS if angles is None else (ANGLE_MODEL,) + MODELS
    errors = {m: [[] for _ in sizes] for m in models}
    found = {}
    trained_rk4 = parameters = None
    for s in seeds:
        net0 = geomjax.ConstrainedHamiltonianNetwork(n, data.constraints, space_dim=data.space_dim, width_size=width,
                                                     depth=depth, key=jax.random.key(s + 1))
        node0 = geomjax.NeuralODE.sized_like(net0, key=jax.random.key(s + 1))
        second0 = geomjax.NeuralODE.sized_like(net0, order=2, key=jax.random.key(s + 1))
        if angles is not None:  # on (θ, θ̇) ∈ R^(2N), about as many parameters
            angle_dim = n  # N angles and N rates for the 2N Cartesian coordinates of a planar chain
            angle_width = geomjax.NeuralODE.width_for(geomjax.parameter_count(net0), angle_dim, depth)
            angle0 = geomjax.NeuralODE(angle_dim, width_size=angle_width, depth=depth, key=jax.random.key(s + 1))
        parameters = parameters or {"CHNN": geomjax.parameter_count(net0), "neural ODE": geomjax.parameter_count(node0),
                                    "neural ODE width": node0.network.width_size,
                                    "second-order neural ODE": geomjax.parameter_count(second0)}
        for i, size in enumerate(sizes):
            train_set, _ = pool.split(size)
            for name in models:
                if name == ANGLE_MODEL:
                    t0 = time.perf_counter()
                    trained, history = geomjax.train(angle0, angles[0](train_set.xs), dt=data.dt, method="rk4",
                                                     epochs=epochs, chunk_length=CHUNK, batch_size=batch_size,
                                                     key=jax.random.key(s + 2),
                                                     progress=f"{problem} {name} {size} seed {s}" if progress else False)
                    train_s = time.perf_counter() - t0
                    starts = angles[0](held_out.xs[:, :1])[:, 0]
                    long = angles[1](_long_rollouts(trained, starts, long_steps, data.dt, "rk4"))
                else:
                    model, method = {"neural ODE": (node0, "rk4"), "second-order neural ODE": (second0, "rk4"),
                                     "CHNN (RK4)": (net0, "rk4"), "CHNN (RATTLE)": (net0, "rattle")}[name]
                    t0 = time.perf_counter()
                    trained, history = geomjax.train(model, train_set, method=method, epochs=epochs, chunk_length=CHUNK,
                                                     batch_size=batch_size, key=jax.random.key(s + 2),
                                                     progress=f"{problem} {name} {size} seed {s}" if progress else False)
                    train_s = time.perf_counter() - t0
                    long = _long_rollouts(trained, held_out.xs[:, 0], long_steps, data.dt, method)
                # geomjax.rollout_error's measure, from the first `steps` steps of the same rollouts
                rel = np.asarray(geomjax.relative_error(long[:, 1 : steps + 1], held_out.xs[:, 1:]))
                errors[name][i].append(float(np.exp(np.mean(np.log(rel)))))
                energy = float("nan") if "neural ODE" in name else _worst(_energy_error(trained, long))
                f = found.setdefault((size, name), {"violation": [], "energy": [], "loss": [], "train_s": []})
                f["violation"].append(_worst(_violation(data.constraints, long, n)))
                f["energy"].append(energy)
                f["loss"].append(float(history["loss"][-1]))
                f["train_s"].append(train_s)
                if name == "CHNN (RK4)" and size == max(sizes) and s == seeds[0]:
                    trained_rk4 = trained
    floor = _perturbation_floor(data, held_out, steps)
    rows = []
    for i, size in enumerate(sizes):
        node_error = _geometric_mean(errors["neural ODE"][i])
        for name in models:
            f, e = found[(size, name)], errors[name][i]
            rows.append({
                "problem": problem,
                "model": name,
                "train trajectories": size,
                "train chunks": size * ((steps + 1) // CHUNK),
                "rollout error": _geometric_mean(e),
                "seeds": len(e),
                "lowest of seeds": min(e),
                "highest of seeds": max(e),
                "ratio to neural ODE": _geometric_mean(e) / node_error,
                "perturbation floor": floor,
                "long max |phi|": max(f["violation"]),
                "long max |dH_theta|": max(f["energy"]),
                "final loss": float(np.mean(f["loss"])),
                "train [s]": float(np.mean(f["train_s"])),
            })
    # figure 2's rollouts: the RK4-trained CHNN (first seed), by RK4 and by RATTLE
    long = {}
    for label, method in (("rolled out by RK4", "rk4"), ("rolled out by RATTLE", "rattle")):
        xs = _long_rollouts(trained_rk4, held_out.xs[:, 0], long_steps, data.dt, method)
        long[label] = {"violation": _violation(data.constraints, xs, n), "energy": _energy_error(trained_rk4, xs)}
    return {
        "chain": problem, "sizes": list(sizes), "seeds": list(seeds),
        "models": list(models), "errors": {m: [_geometric_mean(e) for e in errors[m]] for m in models},
        "seed_errors": errors, "floor": floor, "rows": rows, "long": long, "dt": data.dt, "parameters": parameters,
    }


def _planar_angles(data):
    """(to angles, to Cartesian) for the observed states (q, q̇) of a planar chain hanging
    from the origin: link vectors d_i = q_i − q_{i−1} = ℓ_i(sin θ_i, −cos θ_i), θ̇_i =
    (d_i × ḋ_i)/ℓ_i²; back, q_i = Σ_{j≤i} d_j and q̇_i = Σ_{j≤i} ℓ_jθ̇_j(cos θ_j, sin θ_j). The
    angles of each trajectory are unwrapped along its time axis (no jump of 2π inside a
    training chunk). The lengths ℓ_i are read off the first observation."""
    n_links = data.n // 2
    first = np.asarray(data.xs[0, 0, : data.n]).reshape(n_links, 2)
    lengths = jnp.asarray(np.linalg.norm(np.diff(first, axis=0, prepend=np.zeros((1, 2))), axis=1))

    def links(flat):
        points = flat.reshape(flat.shape[:-1] + (n_links, 2))
        return jnp.diff(points, axis=-2, prepend=jnp.zeros_like(points[..., :1, :]))

    def to_angles(xs):  # (B, T, 4N) → (B, T, 2N)
        d, dd = links(xs[..., : data.n]), links(xs[..., data.n :])
        theta = jnp.unwrap(jnp.arctan2(d[..., 0], -d[..., 1]), axis=1)
        rate = (d[..., 0] * dd[..., 1] - d[..., 1] * dd[..., 0]) / lengths**2
        return jnp.concatenate([theta, rate], axis=-1)

    def to_cartesian(states):  # (B, T, 2N) → (B, T, 4N)
        theta, rate = states[..., :n_links], states[..., n_links:]
        d = lengths[:, None] * jnp.stack([jnp.sin(theta), -jnp.cos(theta)], axis=-1)
        dd = (lengths * rate)[..., None] * jnp.stack([jnp.cos(theta), jnp.sin(theta)], axis=-1)
        q, v = jnp.cumsum(d, axis=-2), jnp.cumsum(dd, axis=-2)
        return jnp.concatenate([q.reshape(q.shape[:-2] + (-1,)), v.reshape(v.shape[:-2] + (-1,))], axis=-1)

    return to_angles, to_cartesian


def _geometric_mean(values) -> float:
    return float(np.exp(np.mean(np.log(np.asarray(values, dtype=float)))))


#: The size of the start perturbation of the floor (Finzi, Wang and Wilson's).
PERTURBATION = 1e-4


def _perturbation_floor(data, held_out, steps) -> float:
    """The rollout error (the same measure) of the true system itself from the held-out
    starts moved by `PERTURBATION` in a random direction (fixed key) and projected back onto
    the constraint set (`geomjax.project_holonomic`): what a perfect model measures from
    starts known to 10⁻⁴ (the runs: RK4 on the data's Dirac field, 30 substeps per
    observation). Where the data hold velocities they are read off the runs' momenta
    as q̇ = ∂H/∂p."""
    starts = held_out.xs[:, 0]
    n = data.n
    direction = jax.random.normal(jax.random.key(12345), starts.shape)
    moved = starts + PERTURBATION * direction / jnp.linalg.norm(direction, axis=1, keepdims=True)
    system = data.system
    if data.observed == "velocity":  # the runs need (q, p): p from q̇ through the Legendre map of H, p = 𝕄q̇
        momenta = jax.vmap(lambda x: _momenta_of(system, x, n))(moved)
        moved = jnp.concatenate([moved[:, :n], momenta], axis=1)
    moved = jax.vmap(lambda x: geomjax.project_holonomic(system, x))(moved)  # back onto S, as the data's starts
    xs = observed_runs(system, moved, data.dt, steps, 30, "rk4")
    if data.observed == "velocity":
        xs = jnp.concatenate([xs[..., :n], jax.vmap(jax.vmap(jax.grad(system.hamiltonian)))(xs)[..., n:]], axis=-1)
    rel = np.asarray(geomjax.relative_error(xs[:, 1 : steps + 1], held_out.xs[:, 1 : steps + 1]))
    return _geometric_mean(rel)


def _momenta_of(system, x, n):
    """p with ∂H/∂p(q, p) = q̇ (the inverse Legendre map; one linear solve, H being
    quadratic in p for the mechanical systems of the data)."""
    hamiltonian = lambda q, p: system.hamiltonian(jnp.concatenate([q, p]))  # noqa: E731
    return solve_gradient(hamiltonian, x[:n], x[n:], quadratic=True)


def _error_figure(path, results, steps):
    k = len(results)
    fig, axes = _figure(1, k, size=(4.6 * k + 1.8, 4.0), sharex=False)
    for ax, res in zip(axes[0], results):
        for i, name in enumerate(res["models"]):
            ax.plot(res["sizes"], res["errors"][name], label=name,
                    **_marked(STYLES[name], i, len(res["models"]), len(res["sizes"])) | {"markevery": 1})
            if len(res["seeds"]) > 1:  # the spread over the seeds
                spread = res["seed_errors"][name]
                ax.fill_between(res["sizes"], [min(e) for e in spread], [max(e) for e in spread],
                                color=STYLES[name]["color"], alpha=0.15, linewidth=0)
        ax.axhline(res["floor"], color="black", linestyle=":", linewidth=1.0,
                   label="true system, start moved by 1e-4")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"training trajectories (× {(steps + 1) // CHUNK} chunks of {CHUNK})")
        ax.set_title(res["chain"], fontsize=11)
        ax.grid(True, which="major", alpha=0.3)
    seeds = len(results[0]["seeds"])
    over = f", {seeds} seeds: band lowest-highest" if seeds > 1 else ""
    axes[0, 0].set_ylabel(f"rollout error ({steps} steps,\ngeometric mean{over})")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize="small")
    return _save(fig, path)


def _long_figure(path, res, dt, chunk_steps):
    fig, axes = _figure(2, 1, size=(8.4, 6.0))
    labels = list(res["long"])
    for row, (key, ylabel) in enumerate((("violation", "max |g(q)|"), ("energy", r"max $|H_\theta(x_t) - H_\theta(x_0)|$"))):
        ax = axes[row, 0]
        for i, label in enumerate(labels):
            y = res["long"][label][key]
            ts = dt * np.arange(len(y))
            ax.plot(ts[1:], _positive(y[1:]), label=label, **_marked(STYLES[label], i, len(labels), len(ts)))
        ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.3)
    axes[1, 0].set_xlabel("t")
    handles, names = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncols=2, fontsize="small")
    steps = len(res["long"][labels[0]]["violation"]) - 1
    _title(fig, None, f"{res['chain']}: the CHNN trained through RK4 ({max(res['sizes'])} trajectories), "
                      f"{steps} steps = {steps // chunk_steps}x a training chunk, worst of the held-out starts", 11.0)
    return _save(fig, path)


@register(NAME, "Finzi, Wang and Wilson (2020): constrained Hamiltonian networks vs a neural ODE on chain pendulums; "
                "rollout error vs training-set size (CHNN through RK4 and RATTLE), and long rollouts of a "
                "trained CHNN by RK4 and RATTLE (constraint and learned-energy errors)",
          quick={"chains": ((1, 2),), "sizes": (8,), "test": 4, "epochs": 40, "width": 32, "depth": 2,
                 "steps": 50, "long_steps": 400, "batch_size": 16})
def run(out_dir: pathlib.Path, progress: bool, *, chains=DEFAULT_CHAINS, sizes=(10, 30, 100), test=50, steps=100,
        long_steps=10_000, epochs=150, width=256, depth=3, batch_size=200, seed=0, seeds=None) -> dict:
    """Train the three models on each chain of `chains` ((links, space dimension) pairs)
    for every training-set size; measure rollout errors on `test` held-out trajectories
    of `steps` observations, and long rollouts of `long_steps` steps. `batch_size`:
    chunks per optimizer step (theirs: 200).

    The quick configuration (a smoke run in seconds on a CPU: every `geomjax.train` call
    compiles its epoch anew, a few seconds each) trains at one size only, on a 1-link chain
    with a 2×32 network; its numbers are real but not the paper's."""
    out_dir = pathlib.Path(out_dir)
    long_steps = max(int(long_steps), int(steps))  # the rollout error is read off the long rollouts' first steps
    results = [_one_chain(links, space_dim, sizes=sizes, test=test, steps=steps, long_steps=long_steps, epochs=epochs,
                          width=width, depth=depth, batch_size=batch_size, seed=seed, seeds=seeds, progress=progress)
               for links, space_dim in chains]
    out = report(NAME, out_dir, results, steps=steps, long_steps=long_steps)
    out["setting"] = {
        "chains": [{"links": r["links"], "space_dim": r["space_dim"], "parameters": r["parameters"],
                    "data_s": r["data_s"]} for r in results],
        "sizes": list(sizes), "test": test, "steps": steps, "dt": results[0]["dt"], "chunk_length": CHUNK,
        "long_steps": long_steps, "epochs": epochs, "batch_size": batch_size, "mlp": f"{depth}x{width} tanh",
        "seeds": results[0]["seeds"],
        "data": "chain_trajectories: RK4 on the Dirac field, 30 substeps per observation (h = 1e-3)",
    }
    return out


def report(name, out_dir, results, *, steps, long_steps) -> dict:
    """The figures, table rows, findings and metrics of `learn_problem`'s `results` (one per
    problem), the figures written to `out_dir` under the experiment's `name`."""
    chunk_steps = CHUNK - 1
    figures = [_error_figure(out_dir / f"{name}_fig1_error_vs_size.png", results, steps)]
    for res in results:
        slug = res["chain"].replace(" ", "_")
        figures.append(_long_figure(out_dir / f"{name}_fig2_long_rollouts_{slug}.png", res, results[0]["dt"], chunk_steps))
    summary = [row for res in results for row in res["rows"]]
    findings = []
    for res in results:
        ratios = {model: [e_n / e for e, e_n in zip(res["errors"][model], res["errors"]["neural ODE"])]
                  for model in res["models"] if model != "neural ODE"}
        sizes = ", ".join(str(s) for s in res["sizes"])
        for model, r in ratios.items():
            findings.append(f"{res['chain']}: rollout error of the neural ODE / the {model}'s = "
                            + ", ".join(f"{x:.3g}" for x in r)
                            + f" with {sizes} training trajectories ({(steps + 1) // CHUNK} chunks of {CHUNK} each) "
                            + f"({res['errors'][model][-1]:.2e} against {res['errors']['neural ODE'][-1]:.2e} at {res['sizes'][-1]}).")
        lr = res["long"]
        rattle_run, rk4_run = lr["rolled out by RATTLE"], lr["rolled out by RK4"]
        findings.append(
            f"{res['chain']}, {long_steps} steps ({long_steps // chunk_steps}x a training chunk) of the CHNN trained "
            f"through RK4: RATTLE keeps max|g| at {_worst(rattle_run['violation']):.1e} and its learned "
            f"energy error at {_worst(rattle_run['energy']):.1e} (largest over the first tenth of the steps "
            f"{_tenth(rattle_run['energy'], 0):.1e}, over the last {_tenth(rattle_run['energy'], -1):.1e}); RK4 ends with "
            f"max|g| {rk4_run['violation'][-1]:.1e} (over the first tenth {_tenth(rk4_run['violation'], 0):.1e}) "
            f"and its energy error grows from {_tenth(rk4_run['energy'], 0):.1e} over the first tenth "
            f"to {_tenth(rk4_run['energy'], -1):.1e} over the last.")
    return {
        "rollout_errors": {r["chain"]: {"sizes": r["sizes"], **r["errors"], "perturbation floor": r["floor"],
                                        "seeds": r["seeds"], "per seed": r["seed_errors"]} for r in results},
        "long_rollouts": {r["chain"]: {k: {"max_violation": _worst(v["violation"]), "max_energy_error": _worst(v["energy"]),
                                           "final_violation": float(v["violation"][-1]),
                                           "energy_error_first_tenth": _tenth(v["energy"], 0),
                                           "energy_error_last_tenth": _tenth(v["energy"], -1)}
                                       for k, v in r["long"].items()} for r in results},
        "figures": [p.name for p in figures],
        "summary": summary,
        "findings": findings,
    }
