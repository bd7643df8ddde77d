"""Parameter identification (`geomjax.fit`): do the standard errors mean what they say?

For each problem of `tests/test_fit.py` (the same systems, integrators, starts, horizons
and noise), 50 noisy synthetic datasets are made from the true parameters (Gaussian noise
of standard deviation σ added to the observations the fit predicts at the truth), and
all 50 are fitted in one `geomjax.fit` call (data of shape (D, B, T, m): one compiled
evaluation for all of them, one Levenberg–Marquardt per dataset). Printed, per problem
and parameter:

- coverage: the fraction of datasets where |fitted − true| ≤ 2·se (target ≥ 0.9; for
  Gaussian estimates with exact standard errors it is 0.954), and within 1·se (0.683);
- the spread of the fitted values (sample standard deviation over the datasets) against
  the mean standard error: 1 when the Gauss–Newton standard error is the true one;
- the mean fitted value minus the truth in standard errors (the bias, ±0.14 from chance
  alone over 50 datasets);
- the time of the whole call (CPU seconds of this process and wall seconds; the first
  call compiles), the iterations per fit, and σ̂ against σ.

Problems:

- spherical pendulum (`geomjax.models.spherical_pendulum(holonomic=True)`, RATTLE), g
  and ℓ from noisy positions of 3 trajectories (15 saves each, dt = 0.05, to t = 1.5),
  starts on the sphere of the fitted ℓ (x0 a function of the parameters), σ = 0.01;
- damped oscillator (`geomjax.models.damped_oscillator`, Herglotz order 2), α and m from
  noisy positions of 3 trajectories with known initial momenta (15 saves, dt = 0.2, to
  t = 6), σ = 0.01;
- knife edge on an incline (`geomjax.models.knife_edge`, discrete Lagrange–d'Alembert),
  m and the inertia J from noisy (x, y, φ) of 3 trajectories started by known impulses
  (10 saves, dt = 0.05, to t = 1), σ = 0.01.

Then the optimisers on the first pendulum dataset: `geomjax.fit`'s Levenberg–Marquardt,
`geomjax.fit` with `optax.adam`, and `optimistix.least_squares` with
`optimistix.LevenbergMarquardt` on the same residuals (written with `geomjax.integrate`
under `jax.vmap`, compiled by `equinox.filter_jit`): iterations, the first call (JAX's
caches cleared before it, so it compiles; geomjax's derivations of the system stay
cached for every row) and a later call (wall seconds), and the fitted values.

No figure is asserted here; `tests/test_fit.py::test_coverage_over_fifty_datasets`
(extended) asserts coverage ≥ 0.9 for every parameter. Run:
`python benchmarks/fit_coverage.py [--datasets 50] [--seed 0]`.
"""

import argparse
import datetime
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

import geomjax


# --------------------------------------------------------------------------------------
# Problems (as in tests/test_fit.py)


def positions(x):
    return x[:3]


def position(x):
    return x[:1]


ANGLES = np.array([[0.5, 0.0, 0.0, 1.0], [1.0, 0.3, 0.2, 0.5], [0.3, 1.0, 0.5, 0.0]])  # θ, φ, θ̇, φ̇


def pendulum_starts(params):
    length = params["length"]

    def one(a):
        th, ph, thd, phd = a[0], a[1], a[2], a[3]
        q = length * jnp.stack([jnp.sin(th) * jnp.cos(ph), jnp.sin(th) * jnp.sin(ph), -jnp.cos(th)])
        q_th = length * jnp.stack([jnp.cos(th) * jnp.cos(ph), jnp.cos(th) * jnp.sin(ph), jnp.sin(th)])
        q_ph = length * jnp.stack([-jnp.sin(th) * jnp.sin(ph), jnp.sin(th) * jnp.cos(ph), 0.0 * th])
        return jnp.concatenate([q, q_th * thd + q_ph * phd])

    return jax.vmap(one)(jnp.asarray(ANGLES))


def pendulum(params):
    model = geomjax.models.spherical_pendulum(g=params["g"], length=params["length"], holonomic=True)
    return geomjax.rattle(model.system)


def oscillator(params):
    model = geomjax.models.damped_oscillator(alpha=params["alpha"], m=params["m"])
    return geomjax.herglotz(model.contact, order=2)


def knife_edge(params):
    model = geomjax.models.knife_edge(m=params["m"], inertia=params["inertia"])
    return geomjax.dla(model.system)


def pushed(phi, push, twist):
    return np.array([0.0, 0.0, phi, push * np.cos(phi), push * np.sin(phi), twist])


class Problem:
    def __init__(self, title, make, truth, guess, x0, shape, noise, **run):
        self.title, self.make, self.truth, self.guess = title, make, truth, guess
        self.x0, self.shape, self.noise, self.run = x0, shape, noise, run

    def clean(self, fine: int = 1):
        """The observations predicted at the truth: a fit that evaluates its guess only, with
        `fine` steps for each step of the fit (the same observation times)."""
        zero = np.zeros(self.shape)
        run = dict(self.run, dt=self.run["dt"] / fine, save_every=fine * self.run["save_every"])
        return geomjax.fit(self.make, self.truth, self.x0, zero, max_steps=0, throw=False, **run).residuals

    def fit(self, data, **kwargs):
        return geomjax.fit(self.make, self.guess, self.x0, data, throw=False, **self.run, **kwargs)


PROBLEMS = {
    "spherical pendulum (RATTLE)": Problem(
        "spherical pendulum, RATTLE, dt = 0.05, 3 × 15 saves of q",
        pendulum,
        {"g": 9.81, "length": 1.3},
        {"g": 5.0, "length": 1.0},
        pendulum_starts,
        (3, 15, 3),
        0.01,
        dt=0.05,
        save_every=2,
        observe=positions,
    ),
    "damped oscillator (Herglotz)": Problem(
        "damped oscillator, Herglotz order 2, dt = 0.2, 3 × 15 saves of q",
        oscillator,
        {"alpha": 0.3, "m": 2.0},
        {"alpha": 0.1, "m": 1.0},
        np.array([[1.0, 1.0, 0.0], [0.0, 2.0, 0.0], [-0.5, -1.0, 0.0]]),
        (3, 15, 1),
        0.01,
        dt=0.2,
        save_every=2,
        observe=position,
    ),
    "knife edge (DLA)": Problem(
        "knife edge on an incline, discrete Lagrange–d'Alembert, dt = 0.05, 3 × 10 saves of (x, y, φ)",
        knife_edge,
        {"m": 2.0, "inertia": 0.5},
        {"m": 1.0, "inertia": 1.0},
        np.stack([pushed(0.3, 1.0, 2.0), pushed(-1.0, 2.0, -1.0), pushed(2.0, 0.5, 3.0)]),
        (3, 10, 3),
        0.01,
        dt=0.05,
        save_every=2,
        drift_tol=0.05,
        observe=positions,
    ),
}


def coverage(problem: Problem, datasets: int = 50, seed: int = 0, fine: int = 1) -> dict:
    """Fit `datasets` noisy datasets of `problem` in one call; the coverage per parameter.
    `fine` = 1: data made by the fit's own integrator at its own step (no integrator error
    in the fit, `step_check` off); `fine` > 1: data made at a step `fine` times finer (the
    integrator's error at the fit's step is in the fit, and `step_check` reports it)."""
    clean = problem.clean(fine)
    rng = np.random.default_rng(seed)
    data = clean[None] + problem.noise * rng.standard_normal((datasets,) + clean.shape)
    cpu, wall = time.process_time(), time.perf_counter()
    result = problem.fit(data, step_check=fine > 1)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    truth = np.concatenate([np.ravel(v) for v in jax.tree_util.tree_leaves(problem.truth)])
    values, errors = result.values(), result.errors()
    z = (values - truth) / errors
    biased = np.atleast_1d(np.asarray(result.result == geomjax.FIT_RESULTS.discretization_bias))
    ok = np.asarray(result.ok) | biased  # a flagged bias still has its numbers
    return {
        "biased": int(np.sum(biased)),
        "shift": None if result.step_shift is None else dict(zip(result.names, np.nanmean(result.step_shift, axis=0))),
        "names": result.names,
        "failed": int(np.sum(~ok)),
        "messages": sorted({result[i].message[:80] for i in np.flatnonzero(~ok)}),
        "coverage": dict(zip(result.names, np.mean(np.abs(z) <= 2, axis=0))),
        "coverage1": dict(zip(result.names, np.mean(np.abs(z) <= 1, axis=0))),
        "spread": dict(zip(result.names, values.std(axis=0, ddof=1) / errors.mean(axis=0))),
        "bias": dict(zip(result.names, z.mean(axis=0))),
        "truth": dict(zip(result.names, truth)),
        "mean_se": dict(zip(result.names, errors.mean(axis=0))),
        "iterations": (
            int(np.min(result.iterations)),
            float(np.mean(result.iterations)),
            int(np.max(result.iterations)),
        ),
        "sigma": float(np.mean(result.noise_scale)) / problem.noise,
        "cpu": cpu,
        "wall": wall,
    }


# --------------------------------------------------------------------------------------
# Optimisers on one dataset


def optimisers(problem: Problem, data):
    import equinox as eqx
    import optax
    import optimistix as optx

    rows = []

    def timed(label, call, iterations, values):
        jax.clear_caches()  # the first call compiles (geomjax's own derivations stay cached, for all rows)
        first = time.perf_counter()
        out = call()
        first = time.perf_counter() - first
        again = time.perf_counter()
        out = call()
        again = time.perf_counter() - again
        rows.append((label, iterations(out), first, again, values(out)))

    flat = lambda r: np.round(r.values(), 6).tolist()
    timed("geomjax.fit, Levenberg–Marquardt (default)", lambda: problem.fit(data), lambda r: int(r.iterations), flat)
    adam = optax.adam(0.05)
    timed("geomjax.fit, optax.adam(0.05)", lambda: problem.fit(data, optimizer=adam), lambda r: int(r.iterations), flat)

    names = sorted(problem.guess)
    run = dict(problem.run)
    observe = run.pop("observe")

    def residuals(theta, data):
        params = dict(zip(names, jnp.exp(theta)))
        target = problem.make(params)
        starts = problem.x0(params) if callable(problem.x0) else jnp.asarray(problem.x0)
        steps = data.shape[1] * run["save_every"]
        sol = jax.vmap(
            lambda x0: geomjax.integrate(
                target, x0, dt=run["dt"], steps=steps, save_every=run["save_every"], throw=False
            )
        )(starts)
        return (jax.vmap(jax.vmap(observe))(sol.xs[:, 1:]) - data).ravel()

    theta0 = jnp.log(jnp.array([problem.guess[n] for n in names]))
    solver = optx.LevenbergMarquardt(rtol=1e-8, atol=1e-8)
    solve = eqx.filter_jit(lambda d: optx.least_squares(residuals, solver, theta0, args=d, max_steps=100, throw=False))
    timed(
        "optimistix.least_squares, LevenbergMarquardt(rtol=atol=1e-8)",
        lambda: solve(jnp.asarray(data)),
        lambda s: int(s.stats["num_steps"]),
        lambda s: np.round(np.exp(np.asarray(s.value)), 6).tolist(),
    )
    return names, rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fine", type=int, default=16, help="data at a step this many times finer, for the second table")
    parser.add_argument("--no-optimisers", action="store_true")
    args = parser.parse_args()
    print(f"device: {jax.devices()[0].platform}, host {platform.node() or 'unknown'} with {os.cpu_count()} CPU cores")
    print(f"JAX {jax.__version__}, geomjax {geomjax.__version__}, date {datetime.date.today().isoformat()}")
    print(f"{args.datasets} noisy datasets per problem (seed {args.seed}), all fitted in one geomjax.fit call")
    print("coverage = fraction of datasets with |fitted − true| ≤ 2·se (target ≥ 0.9; 0.954 for exact Gaussian se)")
    print()
    for (name, problem), fine in ((item, fine) for fine in (1, args.fine) for item in PROBLEMS.items()):
        report = coverage(problem, args.datasets, args.seed, fine)
        source = ("data from the same integrator at the same step" if fine == 1 else
                  f"data from the same integrator at a {fine}× finer step (integrator error in the fit)")
        print(f"{name}: {problem.title}, σ = {problem.noise:g}; {source}")
        if fine > 1:
            shifts = ", ".join(f"{p} {v:+.2f}" for p, v in report["shift"].items())
            print(f"  step_check: {report['biased']} of {args.datasets} fits flagged discretization_bias "
                  f"(mean shift at dt/2 in se: {shifts})")
        lo, mean, hi = report["iterations"]
        print(
            f"  one call for {args.datasets} fits: {report['cpu']:.2f} s CPU, {report['wall']:.2f} s wall (compile "
            f"included); LM iterations per fit {lo}–{hi} (mean {mean:.1f}); failed fits {report['failed']}; "
            f"mean σ̂/σ = {report['sigma']:.3f}"
        )
        for message in report["messages"]:
            print(f"    {message}")
        print(
            f"  {'parameter':<10} {'true':>7} {'mean se':>9} {'|err| ≤ 2se':>12} {'|err| ≤ 1se':>12} "
            f"{'spread/se':>10} {'bias/se':>8}"
        )
        for p in report["names"]:
            print(
                f"  {p:<10} {report['truth'][p]:>7.4g} {report['mean_se'][p]:>9.3g} {report['coverage'][p]:>12.2f} "
                f"{report['coverage1'][p]:>12.2f} {report['spread'][p]:>10.2f} {report['bias'][p]:>+8.2f}"
            )
        print()

    if args.no_optimisers:
        return
    problem = PROBLEMS["spherical pendulum (RATTLE)"]
    clean = problem.clean()
    data = clean + problem.noise * np.random.default_rng(args.seed).standard_normal(clean.shape)
    names, rows = optimisers(problem, data)
    print(f"optimisers on one pendulum dataset (guess {problem.guess}; fitted values in the order {names}):")
    print(f"  {'optimiser':<62} {'iterations':>10} {'first call':>11} {'later call':>11}  fitted")
    for label, iterations, first, again, values in rows:
        print(f"  {label:<62} {iterations:>10d} {first:>10.2f}s {again:>10.3f}s  {values}")


if __name__ == "__main__":
    main()
