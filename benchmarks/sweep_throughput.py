"""Throughput of `geomjax.sweep` (trajectory-steps/s) against `vmap` of `geomjax.integrate`
and a batch written by hand, on the CPU or a GPU.

A run of B members for N steps does B·N trajectory-steps; throughput = B·N / run time, the
best of `--repeat` calls after a first call (compile time = first call − best call); the
timed calls of a table's rows go in rounds, one call of each row per round, and a row
whose call takes over 2 s is timed once. The steps are chosen so that every run does about
`--work` trajectory-steps (times a cost factor per problem). Batch sizes: 1e2 … 1e5 on the
CPU, 1e3 … 1e6 on a GPU (`jax.default_backend()`), or `--batches`.

Rows (all measured in the same run; ratios are against the first row, measured here):

- vmap of integrate: `jax.jit(jax.vmap(x ↦ geomjax.integrate(Y(x), x, ..., throw=False)))`
  returning the final states and the per-run statuses (so the monitoring is not dead code)
  with the member's feedback field Y(x) built inside `vmap` (its targets are the member's
  own, as in the sweep); RATTLE's step is the same for every member and built once.
- sweep: `geomjax.sweep(build, geomjax.zipped(x0=xs), ...)` with layout "batch" or
  "component" (the loop carries one (B,) array per scalar of the state) and 1 or 8 steps
  per loop iteration, "component-pieces" (the loop carries (n, B) pieces: the component
  layout before rows) with 8, and "auto" (what it picks for the problem on this backend is
  printed above its table); the whole call is timed (building the members, the start
  check, the loop, the per-member status and drift errors, assembling the `SweepResult`).
- hand, component / hand, batch (pendulum Euler only): Chang, Perlmutter and Vankerschaver (2022) eqs. (7)–(8) (m = g = 1,
  k1..k4 = K) written on six arrays q1, q2, q3, p1, p2, p3 of shape (B,) in plain scalar
  arithmetic, explicit Euler in a `lax.scan`; "component" runs it on the (B,) arrays,
  "batch" `vmap`s it over the rows of a (B, 6) state. No status, no checks.

Under each batch size: what a sweep call costs whatever its steps (the same call with 16
steps), and "sweep auto"'s throughput net of that fixed cost (the loop's own speed).

Targets (issue 24, GPU, B ≥ 1e6, through the public API): pendulum Euler 1e11, RK4
2.4e10, RATTLE 1e10, knife edge 1.1e10 trajectory-steps/s; the summary prints each
problem's best "sweep auto" over them. On the CPU the check is that "sweep auto" is at
least 0.95× vmap of integrate at every batch size (printed too).

Problems: (1) spherical pendulum feedback field, explicit Euler (the headline); (2) the
same field, RK4; (3) RATTLE on the holonomic spherical pendulum; (4) the knife edge's
nonholonomic feedback field, explicit Euler.

Memory per member: the compiled sweep program (the whole `geomjax.sweep` under `jax.jit`,
layout "auto") is lowered and compiled, and its `memory_analysis()` (argument + output +
temporary buffers − aliased) divided by the members; the largest batch is the device's
memory (GPU: `bytes_limit` of `memory_stats()`; CPU: physical RAM) over the bytes per
member added by one more member (the slope between the two largest batches measured).

No timing is asserted. Run: `python benchmarks/sweep_throughput.py [--quick] [--batches
1000 10000] [--work 2e7] [--repeat 3]`.
"""

import argparse
import functools
import json
import os
import platform
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from _harness import sphere_states

import geomjax

DT = 1e-3
K = 50.0  # pendulum feedback gains k1..k4
KNIFE_GAINS = (10.0, 10.0, 10.0)  # k_J, k_H, k_pφ
# Sweep rows: (label, layout, unroll).
SWEEP_ROWS = [
    ("sweep batch, unroll 1", "batch", 1),
    ("sweep batch, unroll 8", "batch", 8),
    ("sweep component, unroll 1", "component", 1),
    ("sweep component, unroll 8", "component", 8),
    ("sweep component-pieces, unroll 8", "component-pieces", 8),
    ("sweep auto", "auto", "auto"),
]
REFERENCE = "vmap of integrate"
# GPU targets, trajectory-steps/s at B ≥ 1e6 (module docstring).
TARGETS = {"euler": 1e11, "rk4": 2.4e10, "rattle": 1e10, "knife": 1.1e10}
SLOW = 2.0  # seconds: a row whose timed call takes longer is not timed again


# --------------------------------------------------------------------------------------
# Problems: how a member is built, its initial states, method (None for a step) and relative cost


class Problem:
    def __init__(self, key, title, build, states, method, cost, per_member):
        self.key, self.title, self.build, self.states = key, title, build, states
        self.method, self.cost, self.per_member = method, cost, per_member


def pendulum_build(x0):
    model = geomjax.models.spherical_pendulum()
    return geomjax.feedback_field(model.system, x0, gains=K), x0


@functools.cache
def rattle_step():
    # Built from concrete values even when first called inside a trace (the build of a
    # sweep member): a cached step holding the tracers of that trace would leak them
    # into every later program.
    with jax.ensure_compile_time_eval():
        return geomjax.rattle(geomjax.models.spherical_pendulum(holonomic=True).system)


def rattle_build(x0):
    return rattle_step(), x0


def knife_build(x0):
    model = geomjax.models.knife_edge()
    return geomjax.feedback_field(model.system, x0, gains=jnp.asarray(KNIFE_GAINS)), x0


def knife_states(n, key):
    """n knife-edge states on the constraint set (momentum along the blade): a random
    position, heading, speed along the blade and spin."""
    kx, kphi, kv, kw = jax.random.split(key, 4)
    model = geomjax.models.knife_edge()
    m, inertia = model.params["m"], model.params["inertia"]
    xy = jax.random.normal(kx, (n, 2))
    phi = jax.random.uniform(kphi, (n,), minval=-np.pi, maxval=np.pi)
    v = jax.random.normal(kv, (n,))
    spin = 1.0 + jax.random.uniform(kw, (n,))
    return jnp.stack([xy[:, 0], xy[:, 1], phi, m * v * jnp.cos(phi), m * v * jnp.sin(phi), inertia * spin], axis=1)


PROBLEMS = {
    "euler": Problem(
        "euler", "(1) spherical pendulum, feedback field (K = 50), explicit Euler", pendulum_build,
        sphere_states, "euler", 1.0, "field built per member inside vmap",
    ),
    "rk4": Problem(
        "rk4", "(2) spherical pendulum, feedback field (K = 50), RK4", pendulum_build, sphere_states, "rk4", 0.25,
        "field built per member inside vmap",
    ),
    "rattle": Problem(
        "rattle", "(3) RATTLE, holonomic spherical pendulum", rattle_build, sphere_states, None, 0.25,
        "one step for all members, built outside vmap",
    ),
    "knife": Problem(
        "knife", "(4) knife edge, nonholonomic feedback field (gains 10), explicit Euler", knife_build,
        knife_states, "euler", 0.25, "field built per member inside vmap",
    ),
}


# --------------------------------------------------------------------------------------
# The compared runs: each maps the (B, 6) initial states to the (B, 6) final states


def vmap_integrate(problem, steps):
    if problem.key == "rattle":
        step = rattle_step()  # the same for every member: built once, outside vmap

        def one(x):
            sol = geomjax.integrate(step, x, dt=DT, steps=steps, save_every=steps, throw=False)
            return sol.xs[-1], sol.status
    else:

        def one(x):
            field, _ = problem.build(x)  # inside vmap: the field's targets are the member's own
            sol = geomjax.integrate(
                field, x, dt=DT, steps=steps, method=problem.method, save_every=steps, throw=False
            )
            return sol.xs[-1], sol.status  # the status, as the sweep returns it

    return jax.jit(jax.vmap(one))


def sweep_run(problem, steps, layout, unroll, whole=False):
    method = {} if problem.method is None else {"method": problem.method}  # a step takes no method

    def run(xs):
        result = geomjax.sweep(
            problem.build, geomjax.zipped(x0=xs), dt=DT, steps=steps, layout=layout, unroll=unroll, **method
        )
        return result if whole else (result.xs[:, -1], result.status)

    return run


def hand_targets(q1, q2, q3, p1, p2, p3):
    """F₀ = (|q|², q·p, H, J) at the initial state, for m = g = 1."""
    return (
        q1 * q1 + q2 * q2 + q3 * q3,
        q1 * p1 + q2 * p2 + q3 * p3,
        0.5 * (p1 * p1 + p2 * p2 + p3 * p3) + q3,
        q1 * p2 - q2 * p1,
    )


def hand_euler_step(state, targets, h):
    """One explicit Euler step of Chang, Perlmutter and Vankerschaver (2022) eqs. (7)–(8), m = g = 1, k1..k4 = K, on the six
    scalars (or six arrays of members) of the state; plain arithmetic, no stacking."""
    q1, q2, q3, p1, p2, p3 = state
    f10, f20, h0, j0 = targets
    pp = p1 * p1 + p2 * p2 + p3 * p3
    f1 = q1 * q1 + q2 * q2 + q3 * q3
    f2 = q1 * p1 + q2 * p2 + q3 * p3
    df1 = f1 - f10
    df2 = f2 - f20
    dh = 0.5 * pp + q3 - h0
    dj = q1 * p2 - q2 * p1 - j0
    r = f2 / f1
    # q̇ = a·p − b·q − K ΔH e3 − K ΔJ (p × e3),   p × e3 = (p2, −p1, 0)
    a = 1.0 - K * df2
    b = r + 2.0 * K * df1
    # ṗ = d·p + c·q − e3 − K ΔJ (e3 × q),   e3 × q = (−q2, q1, 0)
    c = (q3 - pp) / f1 - K * df2
    d = r - K * dh
    kj = K * dj
    dq1 = a * p1 - b * q1 - kj * p2
    dq2 = a * p2 - b * q2 + kj * p1
    dq3 = a * p3 - b * q3 - K * dh
    dp1 = d * p1 + c * q1 + kj * q2
    dp2 = d * p2 + c * q2 - kj * q1
    dp3 = d * p3 + c * q3 - 1.0
    return (
        q1 + h * dq1, q2 + h * dq2, q3 + h * dq3,
        p1 + h * dp1, p2 + h * dp2, p3 + h * dp3,
    )


def hand_component(steps, unroll):
    """The hand-written field on six (B,) arrays (component-major), Euler in a scan."""

    @jax.jit
    def run(xs):
        state = tuple(xs[:, i] for i in range(6))
        targets = hand_targets(*state)
        body = lambda s, _: (hand_euler_step(s, targets, DT), None)
        end, _ = jax.lax.scan(body, state, None, length=steps, unroll=unroll)
        return jnp.stack(end, axis=1)

    return run


def hand_batch(steps, unroll):
    """The same field `vmap`ped over the rows of a (B, 6) state (batch-major)."""

    def member(x, targets):
        return jnp.stack(hand_euler_step(tuple(x[i] for i in range(6)), targets, DT))

    @jax.jit
    def run(xs):
        targets = jax.vmap(lambda x: jnp.stack(hand_targets(*(x[i] for i in range(6)))))(xs)
        body = lambda x, _: (jax.vmap(lambda y, t: member(y, tuple(t[i] for i in range(4))))(x, targets), None)
        end, _ = jax.lax.scan(body, xs, None, length=steps, unroll=unroll)
        return end

    return run


# --------------------------------------------------------------------------------------
# Timing, memory, printing


def interleaved(fns, xs, repeat):
    """[(first call [s], best of `repeat` later calls [s], output of the first call)] for
    each of `fns` on `xs`; the timed calls go in rounds (one call of each per round), so
    that a change of load on the host hits all of them alike."""
    firsts, outs = [], []
    for fn in fns:
        start = time.perf_counter()
        outs.append(jax.block_until_ready(fn(xs)))
        firsts.append(time.perf_counter() - start)
    best = [np.inf] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            if np.isfinite(best[i]) and best[i] > SLOW:
                continue  # a call this long is timed once: the run dominates its noise
            start = time.perf_counter()
            jax.block_until_ready(fn(xs))
            best[i] = min(best[i], time.perf_counter() - start)
    return list(zip(firsts, best, outs))


def steps_for(work, batch, cost):
    """Steps so that batch·steps ≈ work·cost, a multiple of 8 (the unrolled loops), ≥ 16."""
    steps = max(16, int(round(work * cost / batch)))
    return 8 * max(2, round(steps / 8))


def sweep_memory(problem, batch, steps):
    """memory_analysis() of the whole sweep (layout "auto") compiled for `batch` members:
    bytes of (arguments + outputs + temporaries − aliased), and the reported peak."""
    xs = problem.states(batch, jax.random.PRNGKey(1))
    run = sweep_run(problem, steps, "auto", "auto")
    stats = jax.jit(run).lower(xs).compile().memory_analysis()
    if stats is None:
        return None, None
    total = (
        stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes - stats.alias_size_in_bytes
    )
    return total, getattr(stats, "peak_memory_in_bytes", None)


def available_memory():
    """(bytes, where from): the GPU's bytes_limit, or the host's physical RAM."""
    device = jax.devices()[0]
    if device.platform != "cpu":
        stats = device.memory_stats() or {}
        if "bytes_limit" in stats:
            return stats["bytes_limit"], f"{device.platform} memory_stats()['bytes_limit']"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "physical RAM (os.sysconf)"


def header():
    device = jax.devices()[0]
    import jaxlib

    print(f"device: {device.platform} / {device.device_kind} ({jax.device_count()} device(s)), host "
          f"{platform.node() or '?'} with {os.cpu_count()} CPU cores")
    print(f"JAX {jax.__version__}, jaxlib {jaxlib.__version__}, geomjax {geomjax.__version__}, "
          f"x64 {jax.config.read('jax_enable_x64')}, date {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"host load average at the start: {load_average()} (other processes share the CPU: times are best-of)")


def load_average():
    try:
        return ", ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "?"


def fmt_rate(r):
    return f"{r:.3e}"


def auto_choice(problem):
    """(layout, unroll) that "auto" picks for `problem` on this backend, as the sweep
    records it in its result (a 4-member, 16-step sweep)."""
    result = sweep_run(problem, 16, "auto", "auto", whole=True)(problem.states(4, jax.random.PRNGKey(2)))
    definition = json.loads(result.definition)
    return definition["layout"], definition["unroll"]


def run_problem(problem, batches, args, hand_rows, sweep_rows):
    print()
    print("=" * 116)
    layout, unroll = auto_choice(problem)
    print(f"{problem.title}; dt = {DT:g}; vmap of integrate: {problem.per_member}")
    print(f"'sweep auto' on this backend = layout {layout!r}, unroll {unroll}")
    print(f"{'row':<28}{'B':>8}{'steps':>8}{'first [s]':>11}{'compile [s]':>12}{'run [s]':>10}"
          f"{'traj-steps/s':>14}{'x vmap':>8}{'ok':>15}{'max|dx|':>10}")
    results = []  # (label, batch, rate, ratio)
    for batch in batches:
        steps = steps_for(args.work, batch, problem.cost)
        xs = problem.states(batch, jax.random.PRNGKey(0))
        rows = [(REFERENCE, vmap_integrate(problem, steps))]
        rows += [(label, sweep_run(problem, steps, layout, unroll)) for label, layout, unroll in sweep_rows]
        if hand_rows:
            rows += [(f"hand, component, unroll {u}", hand_component(steps, u)) for u in (1, 8)]
            rows += [(f"hand, batch (vmap), unroll {u}", hand_batch(steps, u)) for u in (1, 8)]
        timed = interleaved([fn for _, fn in rows], xs, args.repeat)
        ref_rate = ref_end = None
        for (label, _), (first, best, out) in zip(rows, timed):
            end, status = out if isinstance(out, tuple) else (out, None)
            rate = batch * steps / best
            if ref_rate is None:
                ref_rate, ref_end = rate, end
            ok = "-" if status is None else f"{int(jnp.sum(status == 0))}/{batch}"
            diff = float(jnp.max(jnp.abs(end - ref_end)))
            print(f"{label:<28}{batch:>8}{steps:>8}{first:>11.3f}{max(first - best, 0.0):>12.3f}{best:>10.4f}"
                  f"{fmt_rate(rate):>14}{rate / ref_rate:>8.2f}{ok:>15}{diff:>10.1e}", flush=True)
            results.append((label, batch, rate, rate / ref_rate))
        if not args.quick or problem.key == "euler":
            auto_best = min(best for (label, _), (_, best, _) in zip(rows, timed) if label == "sweep auto")
            fixed_cost(problem, xs, steps, args.repeat, ref_rate, auto_best)
        print("-" * 116)
    return results


def fixed_cost(problem, xs, steps, repeat, ref_rate, auto_best):
    """Print what a sweep call costs whatever its steps: the same call with 16 steps (the
    members built, start check, monitoring at the start and end, errors, the result), and
    sweep auto's throughput net of that cost (from the best time of the full-length call
    here and in its table row, `auto_best`)."""
    (_, short, _), (_, full, _) = interleaved(
        [sweep_run(problem, 16, "auto", "auto"), sweep_run(problem, steps, "auto", "auto")], xs, repeat
    )
    batch = xs.shape[0]
    net = batch * (steps - 16) / max(min(full, auto_best) - short, 1e-12)
    print(f"  sweep auto, fixed cost per call: {1e3 * short:.1f} ms (a 16-step call); "
          f"net of it: {net:.3e} traj-steps/s ({net / ref_rate:.2f}x vmap)")


def report_memory(problems, batches, args):
    avail, source = available_memory()
    print()
    print("=" * 116)
    print("memory per member of the compiled sweep program (layout 'auto'):")
    print("  the whole geomjax.sweep call is jitted, lowered and compiled for B members, and its")
    print("  memory_analysis() gives argument + output + temp − alias bytes (the buffers XLA assigns;")
    print("  the program's executable code is not counted); 'per member' = that / B, 'marginal' =")
    print("  its growth per added member between the two largest B measured (the fixed part removed);")
    print("  'XLA peak' is memory_analysis().peak_memory_in_bytes as reported (it appears to leave out")
    print("  the arguments and outputs), not used for the estimate.")
    print(f"  largest batch = available memory / marginal bytes per member, available = {avail / 2**30:.1f} GiB"
          f" ({source});")
    print("  an upper bound: it ignores what else lives on the device (other programs, the caller's")
    print("  arrays, the allocator's fragmentation), and the sweep itself runs grids of more than")
    print("  2^20 members in chunks of 2^20 (`chunk_size`), each chunk one such program, so a grid")
    print("  larger than this still runs if its chunks (and the concatenated results) fit.")
    print(f"{'problem':<10}{'B':>10}{'steps':>8}{'bytes':>14}{'bytes/member':>14}{'XLA peak':>14}"
          f"{'marginal':>10}{'largest batch':>15}")
    out = {}
    for problem in problems:
        sizes = batches[-2:] if len(batches) > 1 else batches
        measured = []
        for batch in sizes:
            steps = steps_for(args.work, batch, problem.cost)
            total, peak = sweep_memory(problem, batch, steps)
            if total is None:
                print(f"{problem.key:<10}{batch:>10}  memory_analysis() not available on this backend")
                continue
            measured.append((batch, total))
            if len(measured) == 2:
                (b0, t0), (b1, t1) = measured
                marginal = (t1 - t0) / (b1 - b0)
            else:
                marginal = total / batch
            largest = int(avail // marginal) if marginal > 0 else 0
            peak_s = "-" if peak is None else f"{peak:,}"
            print(f"{problem.key:<10}{batch:>10}{steps:>8}{total:>14,}{total / batch:>14.1f}{peak_s:>14}"
                  f"{marginal:>10.1f}{largest:>15.3e}", flush=True)
            out[problem.key] = (marginal, largest)
    device = jax.devices()[0]
    if device.platform != "cpu":
        stats = device.memory_stats() or {}
        peak, limit = stats.get("peak_bytes_in_use"), stats.get("bytes_limit")
        if peak is not None and limit is not None:
            print(f"  device memory_stats() after the runs: peak_bytes_in_use {peak:,} of bytes_limit {limit:,}"
                  " (the whole process, every program and array so far)")
    return out


def summary(all_results, memory):
    print()
    print("=" * 116)
    print("summary: throughput of each row / vmap of integrate at the same B (< 1: slower than vmap of integrate)")
    best_euler = None
    for key, results in all_results.items():
        sizes = sorted({r[1] for r in results})
        labels = list(dict.fromkeys(r[0] for r in results if r[0] != REFERENCE))
        ratio = {(r[0], r[1]): r[3] for r in results}
        print(f"  {PROBLEMS[key].title}")
        print(f"    {'B':<34}" + "".join(f"{b:>10}" for b in sizes))
        ref = {r[1]: r[2] for r in results if r[0] == REFERENCE}
        print(f"    {REFERENCE + ' [traj-steps/s]':<34}" + "".join(f"{ref[b]:>10.2e}" for b in sizes))
        for label in labels:
            cells = "".join(f"{ratio[(label, b)]:>10.2f}" if (label, b) in ratio else f"{'-':>10}" for b in sizes)
            print(f"    {label:<34}{cells}")
    print("  best sweep-API row per problem:")
    for key, results in all_results.items():
        sweeps = [r for r in results if r[0].startswith("sweep")]
        label, batch, rate, ratio = max(sweeps, key=lambda r: r[2])
        line = f"    {key:<7} {label} at B = {batch}: {rate:.3e} traj-steps/s, {ratio:.2f}x vmap of integrate"
        hands = [r for r in results if r[0].startswith("hand, component") and r[1] == batch]
        if hands:
            hand = max(hands, key=lambda r: r[2])
            line += f", {rate / hand[2]:.2f}x the best hand-written component row ({hand[0]}: {hand[2]:.3e})"
        if key in memory:
            line += f"; {memory[key][0]:.0f} bytes/member, largest batch ~{memory[key][1]:.2e}"
        print(line)
        if key == "euler":
            best_euler = rate
    gpu = jax.default_backend() != "cpu"
    print("  targets (GPU, B >= 1e6): best 'sweep auto' / target" + ("" if gpu else " (a GPU target: for scale only on the CPU)"))
    for key, results in all_results.items():
        autos = [r for r in results if r[0] == "sweep auto"]
        if key in TARGETS and autos:
            label, batch, rate, ratio = max(autos, key=lambda r: r[2])
            print(f"    {key:<7} {rate:.3e} at B = {batch} / {TARGETS[key]:.1e} = {rate / TARGETS[key]:.3f}")
    if not gpu:
        print("  CPU check, 'sweep auto' >= 0.95x vmap of integrate at every B:")
        for key, results in all_results.items():
            autos = [r for r in results if r[0] == "sweep auto"]
            if autos:
                worst = min(autos, key=lambda r: r[3])
                verdict = "yes" if worst[3] >= 0.95 else "NO"
                print(f"    {key:<7} {verdict}: lowest {worst[3]:.2f}x at B = {worst[1]}")
    if best_euler is None:
        print("  (the pendulum Euler problem was not run: no best throughput)")
        best_euler = float("nan")
    print(f"best trajectory-steps/s: {best_euler:.2e}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one batch size, few rows (under a minute on 2 cores)")
    parser.add_argument("--batches", type=int, nargs="+", help="batch sizes (default: by backend)")
    parser.add_argument("--work", type=float, help="trajectory-steps per run for pendulum Euler (default: by backend)")
    parser.add_argument("--repeat", type=int, help="timed calls after the first (best is reported)")
    parser.add_argument("--problems", nargs="+", choices=list(PROBLEMS), help="problems to run (default: all)")
    args = parser.parse_args(argv)

    gpu = jax.default_backend() != "cpu"
    if args.quick:
        batches = args.batches or [1000]
        work = args.work or 1e6
        repeat = args.repeat or 2
    else:
        batches = args.batches or ([10**3, 10**4, 10**5, 10**6] if gpu else [10**2, 10**3, 10**4, 10**5])
        work = args.work or (2e8 if gpu else 2e7)
        repeat = args.repeat or 5
    args.work, args.repeat = work, repeat
    problems = [PROBLEMS[k] for k in (args.problems or list(PROBLEMS))]
    # geomjax warns about sweeps of fewer than a few thousand members on a GPU: measured here on purpose.
    warnings.filterwarnings("ignore", message="a sweep of")

    header()
    print(f"batches {batches}; work per run ≈ {work:.0e} trajectory-steps × cost factor "
          f"(euler 1, rk4 1/4, rattle 1/4, knife 1/4); best of {repeat} calls after the first"
          + ("; --quick" if args.quick else ""))
    print("throughput = B × steps / run [s]; compile = first call − best call; 'x vmap' = throughput /"
          " vmap-of-integrate throughput at the same B; 'ok' = members with status success;")
    print("max|dx| = largest difference of the final states from the vmap-of-integrate row's.")
    print("'sweep auto' is the same compiled program as the row of the layout and unroll it picks"
          " (its compile time is then ~0)")

    all_results = {}
    for problem in problems:
        if args.quick and problem.key != "euler":
            rows = [r for r in SWEEP_ROWS if r[1] == "auto"]
        else:
            rows = SWEEP_ROWS
        all_results[problem.key] = run_problem(problem, batches, args, problem.key == "euler", rows)
    mem_problems = problems if not args.quick else problems[:1]
    memory = report_memory(mem_problems, batches, args)
    print(f"(host load average at the end of the runs: {load_average()})")
    summary(all_results, memory)


if __name__ == "__main__":
    main()
