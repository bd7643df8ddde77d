"""Gain tuning (`geomjax.tune_gains`): one iteration (value and gradient of the objective)
against the forward sweep alone, memory with and without checkpointing, and a whole
`tune_gains` call against the same number of forward sweeps.

What is timed (everything in the same run, ratios against rows measured here):

- iteration: what `tune_gains` runs per optax step, its own loss (the tuner's
  `_objective(...).members` on `_with_theta(field, θ)`, the failed-member rule, `has_aux`)
  under `jax.jit(jax.value_and_grad(...))`: one `geomjax.sweep` over B initial states of N
  steps with `save_every = N/10` (the tuner's default), reverse mode through it with
  `checkpoint=True` (the default), the objective "invariants" (log₁₀ RMS drift of F);
- forward: the same loss under `jax.jit`, no gradient (the same sweep and objective);
- sweep(): the public `geomjax.sweep(build, zipped(x0=states), ...)` call with the same
  run settings (outside jit), for scale.

First call = trace + compile + one run; run = best of `--repeat` later calls (in rounds,
one call of each row per round; a call over 2 s is timed once); compile = first − run.
The ratio iteration / forward is reported for the run times and the compile times.

Problems: spherical pendulum feedback field (K = 50), explicit Euler and RK4; the double
pendulum `geomjax.models.planar_chain(2, gravity=9.81)` feedback field (K = 2, well
inside the stability bound at the starts used), explicit Euler and RK4; dt = 1e-3.

Memory: the iteration compiled with `checkpoint=True` and `False`; XLA's
`memory_analysis()` of the compiled executable (temporary, argument and output bytes;
"temp / (B·N)" = bytes per member per step) and, in a subprocess per configuration, the
resident bytes the first call of the compiled executable adds at its peak (compiled
first; then `/proc/self/clear_refs` resets VmHWM, one call, VmHWM minus the VmRSS before
the call), with the forward call's as the baseline (not in `--quick`). A configuration
whose analysis predicts more than a quarter of the available memory is not run.

Why: for a few configurations, the iteration split into the forward and backward halves
of `jax.vjp`; the compiled HLO's loops (fusions and elementwise instructions executed
per iteration, reductions); where the time goes by loop (`jax.profiler`, per XLA thunk,
summed by the loop body that holds it); what-ifs written with the public API: the gains
passed as per-member values of the sweep (their cotangent then accumulates per member
instead of being summed over the members at every step), the component-major layout, and
the spherical pendulum's field written by hand on six (B,) arrays with the same loss,
checkpointing and saves, with and without checkpointing (the XLA CPU reverse-mode floor
for this field).

XLA's CPU fusion: the iteration against the forward for the tuner's loss and the same loss
by hand (spherical pendulum, Euler and RK4), with XLA's default fusion and, in a subprocess,
with `xla_cpu_use_multi_output_fusion=true` added to `XLA_FLAGS`, and the instructions one
step of the forward and backward per-step loops executes: how far the reverse-mode cost on
the CPU is XLA's recomputation of shared intermediates, and what the option does elsewhere.

On a shared 2-core host XLA's multi-threaded CPU runtime makes the backward loop's large
fusions sensitive to other load; `--single-thread` reruns everything with
`XLA_FLAGS=--xla_cpu_multi_thread_eigen=false` pinned to one core, for steadier ratios.

No timing is asserted. Run: `python benchmarks/tuning.py [--quick] [--single-thread] [--repeat 5]`.
"""

import argparse
import collections
import glob
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from _harness import sphere_states

import geomjax
from geomjax._config import with_backend_option
from geomjax._tuning.tune import (
    _differentiation, _initial_theta, _invariant_drift, _loss_and_grad, _loss_and_grad_forward, _objective, _penalised,
    _with_theta,
)

DT = 1e-3
SLOW = 2.0  # seconds: a call this long is timed once
PENDULUM_K = 50.0
CHAIN_K = 2.0


# --------------------------------------------------------------------------------------
# Problems


def chain_states(n, key):
    """n double-pendulum states on the constraint set: link angles and rates uniform in
    (−1, 1); positions and momenta from the angles as `planar_chain` makes its x0."""
    ka, kw = jax.random.split(key)
    theta = jax.random.uniform(ka, (n, 2), minval=-1.0, maxval=1.0)
    omega = jax.random.uniform(kw, (n, 2), minval=-1.0, maxval=1.0)
    d = jnp.stack([jnp.sin(theta), -jnp.cos(theta)], axis=-1)  # (n, links, 2), ℓ = 1
    ddot = omega[..., None] * jnp.stack([jnp.cos(theta), jnp.sin(theta)], axis=-1)
    q = jnp.cumsum(d, axis=1).reshape(n, -1)
    p = jnp.cumsum(ddot, axis=1).reshape(n, -1)  # m = 1
    return jnp.concatenate([q, p], axis=1)


def check_chain_states():
    """The construction above against `planar_chain`'s own x0 for one start."""
    xs = chain_states(1, jax.random.PRNGKey(7))
    key_a, key_w = jax.random.split(jax.random.PRNGKey(7))
    theta = jax.random.uniform(key_a, (1, 2), minval=-1.0, maxval=1.0)[0]
    omega = jax.random.uniform(key_w, (1, 2), minval=-1.0, maxval=1.0)[0]
    x0 = geomjax.models.planar_chain(2, gravity=9.81, angles=theta, angular_velocities=omega).x0
    return float(jnp.max(jnp.abs(xs[0] - x0)))


class Problem:
    def __init__(self, key, title, model, gains, method, states):
        self.key, self.title, self.model, self.method, self.states = key, title, model, method, states
        self.field = geomjax.feedback_field(model.system, model.x0, gains)


def problems():
    pendulum = geomjax.models.spherical_pendulum()
    chain = geomjax.models.planar_chain(2, gravity=9.81)
    return {
        "pendulum-euler": Problem("pendulum-euler", f"spherical pendulum, K = {PENDULUM_K:g}, Euler", pendulum,
                                  PENDULUM_K, "euler", sphere_states),
        "pendulum-rk4": Problem("pendulum-rk4", f"spherical pendulum, K = {PENDULUM_K:g}, RK4", pendulum,
                                PENDULUM_K, "rk4", sphere_states),
        "chain2-euler": Problem("chain2-euler", f"double pendulum (planar_chain(2), g = 9.81), K = {CHAIN_K:g}, Euler",
                                chain, CHAIN_K, "euler", chain_states),
        "chain2-rk4": Problem("chain2-rk4", f"double pendulum (planar_chain(2), g = 9.81), K = {CHAIN_K:g}, RK4",
                              chain, CHAIN_K, "rk4", chain_states),
    }


# --------------------------------------------------------------------------------------
# The tuner's loss, as `tune_gains` builds it


class Case:
    """One (problem, N, B, checkpoint): the tuner's loss, θ, the states and the references."""

    def __init__(self, problem, steps, batch, checkpoint=True):
        self.problem, self.steps, self.batch, self.checkpoint = problem, steps, batch, checkpoint
        field = problem.field
        self.kind = "vector" if np.ndim(field.gains) == 1 else "matrix"  # tune_gains' default
        self.obj = _objective("invariants", dt=DT, steps=steps, method=problem.method, save_every=None,
                              checkpoint=checkpoint)
        self.theta = _initial_theta(field, self.kind, False, field.system.dim)
        self.states = problem.states(batch, jax.random.PRNGKey(0))
        self.refs = self.obj.references(field, self.states)
        self.args = (self.theta, self.states, self.refs)
        obj, kind = self.obj, self.kind

        # tune_gains' own compiled loss (the stability constraint inside the parametrisation
        # included) and its value-and-gradient program
        bound = geomjax.stability_interval(problem.method)
        extra = (kind, False, 0.9, bound)

        def loss(theta, states, refs):
            return _penalised(obj, field, theta, (states, states, refs), extra)

        self.loss = loss
        self.forward = jax.jit(loss)
        self.iteration = jax.jit(jax.value_and_grad(loss, has_aux=True))  # = _loss_and_grad's program
        build = lambda x0: (field, x0)  # one function object: the sweep's compiled program is reused
        run = dict(obj.run)
        run.pop("checkpoint")
        self.sweep_call = lambda theta, states, refs: geomjax.sweep(build, geomjax.zipped(x0=states), **run).xs

    def label(self):
        return f"{self.problem.key:<15}{self.steps:>7}{self.batch:>6}"


# --------------------------------------------------------------------------------------
# Timing


def interleaved(fns, args, repeat):
    """[(first call [s], best later call [s], output of the first call)] per function."""
    firsts, outs = [], []
    for fn in fns:
        start = time.perf_counter()
        outs.append(jax.block_until_ready(fn(*args)))
        firsts.append(time.perf_counter() - start)
    best = [np.inf] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            if np.isfinite(best[i]) and best[i] > SLOW:
                continue
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            best[i] = min(best[i], time.perf_counter() - start)
    return list(zip(firsts, best, outs))


def time_case(case, repeat):
    (f_first, f_run, f_out), (i_first, i_run, i_out), (_, s_run, _) = interleaved(
        [case.forward, case.iteration, case.sweep_call], case.args, repeat
    )
    (value, failed), _ = i_out
    if abs(float(value) - float(f_out[0])) > 1e-12 * max(1.0, abs(float(value))):
        print(f"  (!) the forward and the iteration disagree on the objective: {float(f_out[0])} vs {float(value)}")
    return dict(
        f_first=f_first, f_run=f_run, f_compile=max(f_first - f_run, 0.0),
        i_first=i_first, i_run=i_run, i_compile=max(i_first - i_run, 0.0), s_run=s_run,
        value=float(value), failed=int(failed),
    )


def print_timing_header():
    print(f"{'problem':<15}{'N':>7}{'B':>6}{'fwd first':>10}{'compile':>9}{'run':>9}{'ns/m-s':>8}"
          f"{'iter first':>11}{'compile':>9}{'run':>9}{'ns/m-s':>8}{'run x':>7}{'compile x':>10}"
          f"{'sweep()':>9}{'failed':>7}{'objective':>10}")


def print_timing_row(case, t):
    per = 1e9 / (case.batch * case.steps)
    print(f"{case.label()}{t['f_first']:>10.3f}{t['f_compile']:>9.3f}{t['f_run']:>9.4f}{t['f_run'] * per:>8.2f}"
          f"{t['i_first']:>11.3f}{t['i_compile']:>9.3f}{t['i_run']:>9.4f}{t['i_run'] * per:>8.2f}"
          f"{t['i_run'] / t['f_run']:>7.1f}{t['i_compile'] / max(t['f_compile'], 1e-9):>10.2f}"
          f"{t['s_run']:>9.4f}{t['failed']:>7}{t['value']:>10.4f}", flush=True)


# --------------------------------------------------------------------------------------
# Memory


def analysis(compiled):
    m = compiled.memory_analysis()
    if m is None:
        return None
    return dict(temp=m.temp_size_in_bytes, arg=m.argument_size_in_bytes, out=m.output_size_in_bytes,
                alias=m.alias_size_in_bytes)


def proc_status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return None


def rss_child(spec):
    """In a subprocess: compile, reset the peak, call once; print the bytes the call added
    at its peak (VmHWM after − VmRSS before) as JSON."""
    key, steps, batch, what = spec.split(":")
    problem = problems()[key]
    case = Case(problem, int(steps), int(batch), checkpoint=(what != "grad-nockpt"))
    fn = (case.forward if what == "forward" else case.iteration).lower(*case.args).compile()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        print(json.dumps({"error": "cannot reset the peak (/proc/self/clear_refs)"}))
        return
    before = proc_status("VmRSS")
    jax.block_until_ready(fn(*case.args))  # the first call of the compiled executable
    peak = proc_status("VmHWM")
    print(json.dumps({"before": before, "peak": peak, "delta": peak - before}))


def available_bytes():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def run_children(specs, parallel=2, flag="--rss-child", xla_flags=None, extra=()):
    """{spec: dict} from one subprocess per spec (`tuning.py FLAG spec ...extra`), `parallel`
    at a time, with `XLA_FLAGS` replaced by `xla_flags` where given."""
    here = os.path.abspath(__file__)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(os.path.dirname(here)), env.get("PYTHONPATH")]))
    if xla_flags is not None:
        env["XLA_FLAGS"] = xla_flags
    results, pending = {}, list(specs)
    running = []
    while pending or running:
        while pending and len(running) < parallel:
            spec = pending.pop(0)
            proc = subprocess.Popen([sys.executable, here, flag, spec, *extra], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=env)
            running.append((spec, proc))
        spec, proc = running.pop(0)
        out, err = proc.communicate()
        try:
            results[spec] = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            results[spec] = {"error": (err.strip().splitlines() or ["no output"])[-1][:100]}
    return results


def memory_section(problem, sizes, rss, cases):
    print()
    print("=" * 120)
    print(f"memory of one iteration (value and gradient), {problem.title}; save_every = N/10")
    print("  XLA memory_analysis() of the compiled executable: temp = temporary buffers (what the")
    print("  gradient keeps and works in), arg/out = arguments/outputs; 'B/(m·s)' = temp / (B·N), bytes")
    print("  per member per step; 'B/(m·bs)' = temp / (B·save_every), per member per step of one save block")
    print("  (with checkpointing one block's steps are stored at a time). RSS: the resident bytes the first")
    print("  call of the compiled executable adds at its peak, in a fresh process (VmHWM after clear_refs −")
    print("  VmRSS before the call); the forward call's for comparison.")
    limit = available_bytes() / 4
    rows = []
    specs = []
    for steps, batch in sizes:
        entry = {"steps": steps, "batch": batch}
        for ck in (True, False):
            case = cases.get((problem.key, steps, batch)) if ck else None
            case = case or Case(problem, steps, batch, checkpoint=ck)
            entry[ck] = analysis(case.iteration.lower(*case.args).compile())
            if ck:
                entry["forward"] = analysis(case.forward.lower(*case.args).compile())
        rows.append(entry)
        if rss:
            for what, ck in (("forward", True), ("grad-ckpt", True), ("grad-nockpt", False)):
                a = entry["forward"] if what == "forward" else entry[ck]
                if a is not None and a["temp"] + a["arg"] + a["out"] < limit:
                    specs.append(f"{problem.key}:{steps}:{batch}:{what}")
    measured = run_children(specs) if specs else {}

    def rss_of(entry, what):
        r = measured.get(f"{problem.key}:{entry['steps']}:{entry['batch']}:{what}")
        if r is None:
            return "not run" if rss else "-"
        if "error" in r:
            return "error"
        return f"{r['delta'] / 2**20:.1f} MiB"

    print(f"{'N':>7}{'B':>6}  {'checkpoint':<11}{'temp [MiB]':>12}{'arg+out [KiB]':>14}{'B/(m·s)':>9}"
          f"{'B/(m·bs)':>9}{'x ckpt':>8}{'RSS peak of a call':>20}")
    out = []
    for entry in rows:
        base = entry[True]["temp"] if entry[True] else None
        for label, key, what in (("forward", "forward", "forward"), ("True", True, "grad-ckpt"),
                                 ("False", False, "grad-nockpt")):
            a = entry[key]
            if a is None:
                print(f"{entry['steps']:>7}{entry['batch']:>6}  {label:<11}  memory_analysis() not available")
                continue
            per = a["temp"] / (entry["batch"] * entry["steps"])
            ratio = a["temp"] / base if base else float("nan")
            per_block = a["temp"] / (entry["batch"] * max(1, entry["steps"] // 10))
            print(f"{entry['steps']:>7}{entry['batch']:>6}  {label:<11}{a['temp'] / 2**20:>12.2f}"
                  f"{(a['arg'] + a['out']) / 1024:>14.1f}{per:>9.2f}{per_block:>9.1f}{ratio:>8.2f}"
                  f"{rss_of(entry, what):>20}")
            out.append((entry["steps"], entry["batch"], label, a["temp"], per))
    print(f"  (RSS runs skipped where the analysis predicts more than a quarter of the available memory,"
          f" {limit / 2**30:.1f} GiB)")
    return out


# --------------------------------------------------------------------------------------
# Why: split, HLO loops, profile, what-ifs


SKIP_OPS = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast"}


def parse_hlo(text):
    """{computation name: [instruction lines]} of an HLO module's text."""
    comps, cur = {}, None
    for line in text.splitlines():
        if not line.startswith(" ") and line.rstrip().endswith("{") and "(" in line:
            name = line.split()[1] if line.startswith("ENTRY") else line.split()[0]
            cur = name.lstrip("%")
            comps[cur] = []
        elif line.startswith("}"):
            cur = None
        elif cur is not None and "=" in line:
            comps[cur].append(line)
    return comps


def op_of(line):
    rhs = line.split("=", 1)[1]
    rhs = re.sub(r"^\s*\([^=]*?\)\s", " ", rhs)  # a tuple-shaped result
    m = re.search(r"\s([a-z][a-z0-9\-_]*)\(", rhs)
    return m.group(1) if m else "?"


def name_of(line):
    return line.split("=", 1)[0].replace("ROOT", "").strip().lstrip("%")


def executed(comps, name):
    """Elementwise/array instructions one execution of computation `name` runs (fusions
    counted by the instructions of their fused computation; nested loops not counted)."""
    n = 0
    for line in comps[name]:
        op = op_of(line)
        called = re.search(r"calls=%?([\w.\-]+)", line)
        if op == "fusion" and called:
            n += executed(comps, called.group(1))
        elif op not in SKIP_OPS and op != "while":
            n += 1
    return n


def loop_kind(op_name):
    if "rematted_computation" in op_name:
        return "recompute"
    if "transpose(" in op_name:
        return "backward"
    if "jvp(" in op_name:
        return "forward (linearised)"
    return "forward"


def hlo_loops(text):
    """The innermost loops (per-step bodies) and the outer ones: kind, fusions,
    instructions per iteration, reductions, and the body's name."""
    comps = parse_hlo(text)
    loops = []
    for comp, lines in comps.items():
        for line in lines:
            if op_of(line) != "while":
                continue
            body = re.search(r"body=%?([\w.\-]+)", line).group(1)
            meta = re.search(r'op_name="([^"]*)"', line)
            ops = collections.Counter(op_of(x) for x in comps[body])
            reductions = 0
            for x in comps[body]:
                called = re.search(r"calls=%?([\w.\-]+)", x)
                inner = comps[called.group(1)] if op_of(x) == "fusion" and called else [x]
                reductions += any(op_of(y).startswith("reduce") for y in inner)
            loops.append(dict(body=body, kind=loop_kind(meta.group(1) if meta else ""), inner=ops["while"] == 0,
                              fusions=ops["fusion"], thunks=sum(v for k, v in ops.items() if k not in SKIP_OPS),
                              instructions=executed(comps, body), reductions=reductions))
    return comps, loops


def loop_cells(loops):
    return "; ".join(f"{lp['kind']}: {lp['fusions']} fusions, {lp['instructions']} instr/iter, "
                     f"{lp['reductions']} reductions" for lp in loops if lp["inner"])


def profile_by_loop(fn, args, comps):
    """{computation: (thunk seconds, thunk calls)} of one call of `fn`, from jax.profiler."""
    from jax.profiler import ProfileData

    where = {name_of(line): comp for comp, lines in comps.items() for line in lines}
    jax.block_until_ready(fn(*args))
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            jax.block_until_ready(fn(*args))
        path = glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True)[0]
        data = ProfileData.from_file(path)
    total, calls, thunk = collections.Counter(), collections.Counter(), collections.Counter()
    for plane in data.planes:
        for line in plane.lines:
            for event in line.events:
                comp = where.get(event.name)
                if comp is not None and not event.name.startswith("while"):
                    total[comp] += event.duration_ns * 1e-9
                    calls[comp] += 1
                    thunk[event.name] += event.duration_ns * 1e-9
    return total, calls, thunk


def hot_thunks(comps, body, thunk_time, count=4):
    """The costliest instructions of a loop body: (name, result shape, fused instructions,
    pads + concatenates + transposes inside, reductions inside, seconds)."""
    rows = []
    for line in comps[body]:
        name = name_of(line)
        if name not in thunk_time:
            continue
        shape = line.split("=", 1)[1].strip().split(" ")[0]
        called = re.search(r"calls=%?([\w.\-]+)", line)
        inner = comps.get(called.group(1), []) if called else []
        ops = collections.Counter(op_of(x) for x in inner)
        layout_ops = ops["pad"] + ops["concatenate"] + ops["transpose"]
        reduces = sum(v for k, v in ops.items() if k.startswith("reduce"))
        rows.append((name, shape, executed(comps, called.group(1)) if called else 1, layout_ops, reduces,
                     thunk_time[name]))
    return sorted(rows, key=lambda r: -r[-1])[:count]


def variant_loss(case, per_member=True, layout="auto"):
    """The tuner's objective through the public `geomjax.sweep`, with the gains swept as
    per-member values (`per_member`) or closed over as the tuner does, and a layout."""
    field, kind, run = case.problem.field, case.kind, dict(case.obj.run)

    def loss(theta, states, refs):
        tuned = _with_theta(field, theta, kind, False)
        if per_member:
            k = jnp.broadcast_to(tuned.gains, (states.shape[0],) + tuned.gains.shape)
            build = lambda x0, k: (eqx.tree_at(lambda f: f.gains, tuned, k), x0)
            grid = geomjax.zipped(x0=states, k=k)
        else:
            build, grid = (lambda x0: (tuned, x0)), geomjax.zipped(x0=states)
        result = geomjax.sweep(build, grid, layout=layout, **run)
        ok = result.ok
        xs = jnp.where(ok[:, None, None], result.xs, states[:, None, :])
        values = jnp.log10(jax.vmap(_invariant_drift(tuned))(xs, states, refs) + 1e-300)
        ok = ok & jnp.isfinite(values)
        worst = jax.lax.stop_gradient(jnp.max(jnp.where(ok, values, -jnp.inf)))
        return jnp.mean(jnp.where(ok, values, worst + 2.0)), jnp.sum(~ok)

    return loss


def hand_pendulum_loss(steps, checkpoint, step_checkpoint=True, method="euler"):
    """The spherical pendulum's feedback field (Chang, Perlmutter and Vankerschaver (2022) eqs. (7)–(8), m = g = 1, gains
    k1..k4 = e^θ, as the tuner's vector gains) by hand on six (B,) arrays, explicit Euler or
    classical RK4 (`method`) in `lax.scan`, saves every N/10 steps, each block and each step
    under `jax.checkpoint` as the driver does, and the mean over the members of log₁₀ RMS
    drift of (|q|², q·p, H, J) at the saves. No status, no checks; the gains are shared by
    the members (as in the tuner)."""

    def quantities(q1, q2, q3, p1, p2, p3):
        return (q1 * q1 + q2 * q2 + q3 * q3, q1 * p1 + q2 * p2 + q3 * p3,
                0.5 * (p1 * p1 + p2 * p2 + p3 * p3) + q3, q1 * p2 - q2 * p1)

    def field(s, targets, gains):
        q1, q2, q3, p1, p2, p3 = s
        f10, f20, h0, j0 = targets
        k1, k2, k3, k4 = gains
        pp = p1 * p1 + p2 * p2 + p3 * p3
        f1 = q1 * q1 + q2 * q2 + q3 * q3
        f2 = q1 * p1 + q2 * p2 + q3 * p3
        df1, df2, dh, dj = f1 - f10, f2 - f20, 0.5 * pp + q3 - h0, q1 * p2 - q2 * p1 - j0
        r = f2 / f1
        a, b = 1.0 - k2 * df2, r + 2.0 * k1 * df1
        c, d, kj = (q3 - pp) / f1 - k2 * df2, r - k3 * dh, k4 * dj
        dq = (a * p1 - b * q1 - kj * p2, a * p2 - b * q2 + kj * p1, a * p3 - b * q3 - k3 * dh)
        dp = (d * p1 + c * q1 + kj * q2, d * p2 + c * q2 - kj * q1, d * p3 + c * q3 - 1.0)
        return dq + dp

    def axpy(s, k, c):
        return tuple(x + c * v for x, v in zip(s, k))

    def step(s, targets, gains):
        f = lambda y: field(y, targets, gains)
        if method == "euler":
            return axpy(s, f(s), DT)
        k1 = f(s)
        k2 = f(axpy(s, k1, DT / 2))
        k3 = f(axpy(s, k2, DT / 2))
        k4 = f(axpy(s, k3, DT))
        return tuple(x + DT / 6 * (a + 2 * b + 2 * c + d) for x, a, b, c, d in zip(s, k1, k2, k3, k4))

    block_len = max(1, steps // 10)

    def loss(theta, states, refs):
        del refs
        gains = tuple(jnp.exp(theta["gains"][i]) for i in range(4))
        s0 = tuple(states[:, i] for i in range(6))
        targets = quantities(*s0)
        one = lambda s: step(s, targets, gains)
        if checkpoint and step_checkpoint:
            one = jax.checkpoint(one, prevent_cse=False)

        def block(s, _):
            s, _ = jax.lax.scan(lambda s, _: (one(s), None), s, None, length=block_len)
            return s, s

        if checkpoint:
            block = jax.checkpoint(block, prevent_cse=False)
        _, saves = jax.lax.scan(block, s0, None, length=steps // block_len)
        dev = sum((a - b) ** 2 for a, b in zip(quantities(*saves), targets))
        values = jnp.log10(jnp.sqrt(jnp.mean(dev, axis=0)))
        return jnp.mean(values), jnp.zeros((), jnp.int64)

    return loss


def why_section(case, repeat, profile=True, what_ifs=True, no_checkpoint_hand=True):
    print()
    print("=" * 120)
    print(f"why: {case.problem.title}, N = {case.steps}, B = {case.batch}, checkpoint=True")
    theta, states, refs = case.args
    loss = lambda th: case.loss(th, states, refs)
    vjp_forward = jax.jit(lambda th: jax.vjp(loss, th, has_aux=True))
    _, pullback, _ = vjp_forward(theta)
    vjp_backward = jax.jit(lambda pb, ct: pb(ct))
    cotangent = jnp.ones(())
    timed = interleaved([case.forward, case.iteration], case.args, repeat)
    (_, f_run, _), (_, i_run, _) = timed
    halves = interleaved([vjp_forward], (theta,), repeat) + interleaved([vjp_backward], (pullback, cotangent), repeat)
    (_, vf_run, _), (_, vb_run, _) = halves
    residuals = sum(np.asarray(leaf).nbytes for leaf in jax.tree_util.tree_leaves(pullback))
    per = 1e9 / (case.batch * case.steps)
    print(f"  forward (jit of the loss)            {f_run * 1e3:9.2f} ms  {f_run * per:6.2f} ns per member-step   1.0x")
    print(f"  iteration (value_and_grad)           {i_run * 1e3:9.2f} ms  {i_run * per:6.2f} ns per member-step"
          f"  {i_run / f_run:5.1f}x")
    print(f"    forward half (jax.vjp, residuals)  {vf_run * 1e3:9.2f} ms  {vf_run * per:6.2f} ns per member-step"
          f"  {vf_run / f_run:5.1f}x   residuals kept {residuals / 2**10:.0f} KiB")
    print(f"    backward half (the pullback)       {vb_run * 1e3:9.2f} ms  {vb_run * per:6.2f} ns per member-step"
          f"  {vb_run / f_run:5.1f}x")

    f_text = case.forward.lower(*case.args).compile().as_text()
    i_text = case.iteration.lower(*case.args).compile().as_text()
    f_comps, f_loops = hlo_loops(f_text)
    i_comps, i_loops = hlo_loops(i_text)
    prof = f_prof = None
    if profile:
        try:
            prof = profile_by_loop(case.iteration, case.args, i_comps)
            f_prof = profile_by_loop(case.forward, case.args, f_comps)
        except Exception as err:  # the profiler is optional
            print(f"  (jax.profiler not usable here: {type(err).__name__}: {err})")
    print("  loops of the compiled programs (innermost = the per-step loops); 'instr/iter' = elementwise and")
    print("  array instructions one iteration executes, fusions counted by their fused instructions;")
    print("  'reductions' = fusions or ops that reduce; 'profiled' = XLA thunk time of one iteration call in")
    print("  that loop's body (jax.profiler; the profiler adds overhead per thunk, so shares, not absolutes)")
    print(f"  {'program':<10}{'loop':<22}{'inner':>6}{'fusions':>8}{'thunks':>7}{'instr/iter':>11}{'reductions':>11}"
          f"{'profiled [ms]':>14}{'calls':>8}")
    rows = [("forward", lp) for lp in f_loops] + [("iteration", lp) for lp in i_loops]
    for program, lp in rows:
        t, n = ("", "")
        p = prof if program == "iteration" else f_prof
        if p is not None:
            t, n = f"{p[0][lp['body']] * 1e3:.2f}", f"{p[1][lp['body']]}"
        print(f"  {program:<10}{lp['kind']:<22}{str(lp['inner']):>6}{lp['fusions']:>8}{lp['thunks']:>7}"
              f"{lp['instructions']:>11}{lp['reductions']:>11}{t:>14}{n:>8}")
    if prof is not None:
        total = sum(prof[0].values())
        print(f"  profiled thunk time: iteration {total * 1e3:.1f} ms, forward {sum(f_prof[0].values()) * 1e3:.1f} ms"
              f" (a loop with 0 calls did not run: the forward's exact per-step loop reruns a failed block only)")
        hottest = max((lp for lp in i_loops if lp["inner"]), key=lambda lp: prof[0][lp["body"]])
        print(f"  costliest instructions of the hottest loop ({hottest['kind']}, per-step): name, result, instructions"
              f" fused, pad/concatenate/transpose inside, reductions inside, profiled time")
        for name, shape, n_instr, layout_ops, reduces, secs in hot_thunks(i_comps, hottest["body"], prof[2]):
            print(f"    {name:<34}{shape:<22}{n_instr:>6}{layout_ops:>5}{reduces:>5}{secs * 1e3:>10.2f} ms")
    f_inner = [lp for lp in f_loops if lp["inner"]]
    i_inner = [lp for lp in i_loops if lp["inner"]]
    summary = dict(f_run=f_run, i_run=i_run, vf=vf_run, vb=vb_run,
                   f_instr=[lp["instructions"] for lp in f_inner], i_inner=i_inner)
    if not what_ifs:
        return summary
    print(f"  the tuner's iteration, per-step loops: {loop_cells(i_loops)}")
    print("  what-ifs (public API, same objective, same N, B, checkpoint=True, save_every = N/10):")
    variants = [("gains as per-member values of the sweep", variant_loss(case)),
                ("layout='component' (gains shared)", variant_loss(case, per_member=False, layout="component"))]
    if case.problem.key == "pendulum-euler":
        variants.append(("hand-written field on (B,) arrays", hand_pendulum_loss(case.steps, True)))
        if no_checkpoint_hand:
            variants.append(("hand-written, no checkpointing", hand_pendulum_loss(case.steps, False)))
    _, ref_grad = case.iteration(*case.args)
    for label, var in variants:
        fwd, it = jax.jit(var), jax.jit(jax.value_and_grad(var, has_aux=True))
        (_, vf, _), (_, vi, out) = interleaved([fwd, it], case.args, repeat)
        grad = out[1]["gains"]
        diff = float(jnp.max(jnp.abs(grad - ref_grad["gains"])) / jnp.max(jnp.abs(ref_grad["gains"])))
        print(f"    {label:<42} forward {vf * 1e3:8.2f} ms, iteration {vi * 1e3:8.2f} ms = {vi / vf:5.1f}x its forward,"
              f" {vi / f_run:5.1f}x the tuner's forward; gradient vs the tuner's: {diff:.1e} relative")
        _, loops = hlo_loops(it.lower(*case.args).compile().as_text())
        print(f"      its per-step loops: {loop_cells(loops)}")
        summary[label] = (vf, vi)
    return summary


# --------------------------------------------------------------------------------------
# XLA's fusion on the CPU: the reverse-mode floor, and multi-output fusion

MULTI_OUTPUT_FUSION = "xla_cpu_use_multi_output_fusion"


def fusion_rows(specs, repeat):
    """{spec: {variant: [forward run, iteration run, gradient]}} in this process, for specs
    'problem:N:B': the tuner's loss and, for the spherical pendulum, the same loss by hand
    on (B,) arrays (`hand_pendulum_loss`, same method)."""
    probs, rows = problems(), {}
    for spec in specs:
        key, steps, batch = spec.split(":")
        case = Case(probs[key], int(steps), int(batch))
        variants = {"tuner": (case.forward, case.iteration)}
        if key.startswith("pendulum"):
            hand = hand_pendulum_loss(case.steps, True, method=probs[key].method)
            variants["by hand"] = (jax.jit(hand), jax.jit(jax.value_and_grad(hand, has_aux=True)))
        rows[spec] = {}
        for label, (fwd, it) in variants.items():
            (_, f_run, _), (_, i_run, out) = interleaved([fwd, it], case.args, repeat)
            _, loops = hlo_loops(it.lower(*case.args).compile().as_text())
            per_step = {kind: max([lp["instructions"] for lp in loops if lp["inner"] and lp["kind"] == kind] or [0])
                        for kind in ("forward (linearised)", "backward")}
            rows[spec][label] = [f_run, i_run, np.asarray(out[1]["gains"]).tolist(), per_step["forward (linearised)"],
                                 per_step["backward"]]
    return rows


def fusion_section(specs, repeat):
    """The iteration against the forward with XLA's default CPU fusion and with multi-output
    fusion on (a subprocess: XLA reads its flags when the CPU backend starts)."""
    print()
    print("=" * 120)
    print("the reverse-mode floor and XLA's CPU fusion: one iteration / the forward, the tuner and the same loss by")
    print("  hand on (B,) arrays (spherical pendulum), with XLA's default fusion (this process) and with")
    print(f"  {MULTI_OUTPUT_FUSION}=true added to XLA_FLAGS (a subprocess). Without it, XLA's CPU backend fuses")
    print("  each cheap shared intermediate into every consumer and recomputes it there; with it, shared")
    print("  intermediates are computed once and written as extra outputs. run [ms]; x = iteration / forward;")
    print("  instr f/b = instructions one step executes in the iteration's forward / backward per-step loop;")
    print("  grad diff = max relative difference of the gains' gradient between the two processes")
    here = fusion_rows(specs, repeat)
    flags = with_backend_option(os.environ.get("XLA_FLAGS", ""), MULTI_OUTPUT_FUSION, "true")
    child = run_children([",".join(specs)], parallel=1, flag="--fusion-child", xla_flags=flags,
                         extra=("--repeat", str(repeat)))[",".join(specs)]
    if "error" in child:
        print(f"  (the subprocess failed: {child['error']})")
        return
    print(f"  {'':<38}{'default fusion':^38}   {'multi-output fusion':^38}")
    print(f"  {'problem':<15}{'N':>6}{'B':>6}  {'variant':<9}" + f"{'fwd':>9}{'iter':>10}{'x':>7}{'instr f/b':>12}   " * 2
          + f"{'iter/default':>12}{'grad diff':>11}")
    for spec in specs:
        key, steps, batch = spec.split(":")
        for label, (f0, i0, g0, a0, b0) in here[spec].items():
            f1, i1, g1, a1, b1 = child[spec][label]
            g0, g1 = np.asarray(g0), np.asarray(g1)
            diff = float(np.max(np.abs(g1 - g0)) / max(np.max(np.abs(g0)), 1e-300))
            print(f"  {key:<15}{steps:>6}{batch:>6}  {label:<9}{f0 * 1e3:>9.2f}{i0 * 1e3:>10.2f}{i0 / f0:>7.1f}"
                  f"{f'{a0}/{b0}':>12}   {f1 * 1e3:>9.2f}{i1 * 1e3:>10.2f}{i1 / f1:>7.1f}{f'{a1}/{b1}':>12}   "
                  f"{i1 / i0:>12.2f}{diff:>11.1e}", flush=True)


# --------------------------------------------------------------------------------------
# A whole tune_gains call


COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")
events = []
jax.monitoring.register_event_duration_secs_listener(lambda event, duration, **kw: events.append((event, duration)))


def tune_section(problem, steps, batch, iterations, repeat, n_calls=2):
    print()
    print("=" * 120)
    case = Case(problem, steps, batch)
    print(f"geomjax.tune_gains(..., iterations={iterations}) ({iterations + 1} value-and-gradient evaluations, "
          f"the start included), {problem.title}, N = {steps}, B = {batch}")
    timed = interleaved([case.forward, case.iteration, case.sweep_call], case.args, repeat)
    (_, f_run, _), (_, i_run, i_out), (_, s_run, _) = timed
    calls, compiling = [], []
    tuned = None
    for _ in range(n_calls):
        events.clear()
        start = time.perf_counter()
        tuned = geomjax.tune_gains(problem.field, case.states, dt=DT, steps=steps, method=problem.method,
                                   iterations=iterations)
        calls.append(time.perf_counter() - start)
        compiling.append(sum(d for e, d in events if e in COMPILE_EVENTS))
    k = iterations + 1
    for i, (c, comp) in enumerate(zip(calls, compiling)):
        print(f"  tune_gains call {i + 1}: {c:.3f} s, of which tracing, lowering and compiling {comp:.3f} s"
              f" (jax.monitoring); without them {c - comp:.3f} s")
    last, rest = calls[-1], calls[-1] - compiling[-1]
    print(f"  {k} x forward (jit of the loss, steady):  {k * f_run:.3f} s  -> tune_gains = {last / (k * f_run):.1f}x,"
          f" without compiling {rest / (k * f_run):.1f}x")
    print(f"  {k} x geomjax.sweep() call (steady):       {k * s_run:.3f} s  -> tune_gains = {last / (k * s_run):.1f}x,"
          f" without compiling {rest / (k * s_run):.1f}x")
    print(f"  {k} x iteration (steady):                  {k * i_run:.3f} s  -> the rest of the call without compiling"
          f" (stability projection, optax, history): {rest - k * i_run:.3f} s")
    first = float(tuned.history["objective"][0])
    print(f"  objective at the start: tune_gains {first:.6f}, the loss timed here {float(i_out[0][0]):.6f}"
          f" (stability projection {'not ' if tuned.history['stability_fraction'][0] < 0.9 else ''}active);"
          f" after: {tuned.objective_after:.4f}")
    return dict(calls=calls, compiling=compiling, f_run=f_run, i_run=i_run, s_run=s_run, k=k)


# --------------------------------------------------------------------------------------


def modes_section(probs, configs, repeat):
    """gains="scalar" (one parameter): the iteration in forward mode and in reverse mode,
    against the forward run, from the tuner's own compiled programs, and the mode
    tune_gains' differentiation="auto" takes (forward for ≤ 3 parameters, except methods of
    several stages on large fields). Returns the ratios of the mode "auto" takes."""
    print()
    print("=" * 120)
    print('one iteration with gains="scalar" (1 parameter): forward mode vs reverse mode, and the one '
          'tune_gains\' "auto" takes')
    print(f"{'problem':<15}{'N':>7}{'B':>6}{'fwd run':>10}{'forward-mode':>14}{'x':>7}{'reverse-mode':>14}{'x':>7}"
          f"{'|grad diff|':>13}{'auto':>9}")
    ratios = []
    for key, steps, batch in configs:
        problem = probs[key]
        field = problem.field
        obj = _objective("invariants", dt=DT, steps=steps, method=problem.method, save_every=None, checkpoint=True)
        theta = _initial_theta(field, "scalar", False, field.system.dim)
        states = problem.states(batch, jax.random.PRNGKey(0))
        refs = obj.references(field, states)
        extra = ("scalar", False, 0.9, geomjax.stability_interval(problem.method))
        args = (obj, field, theta, (states, states, refs), extra)
        forward = eqx.filter_jit(_penalised)
        (_, f_run, _), (_, fm_run, fm), (_, rm_run, rm) = interleaved(
            [forward, _loss_and_grad_forward, _loss_and_grad], args, repeat)
        diff = float(jnp.abs(fm[1]["gains"] - rm[1]["gains"]))
        auto = _differentiation("auto", theta, field, problem.method, states[0])
        ratios.append((fm_run if auto == "forward" else rm_run) / f_run)
        print(f"{key:<15}{steps:>7}{batch:>6}{f_run:>10.4f}{fm_run:>14.4f}{fm_run / f_run:>7.1f}{rm_run:>14.4f}"
              f"{rm_run / f_run:>7.1f}{diff:>13.1e}{auto:>9}", flush=True)
    return ratios


def header(args):
    import jaxlib

    device = jax.devices()[0]
    print(f"device: {device.platform} / {device.device_kind} ({jax.device_count()} device(s)), host "
          f"{platform.node() or '?'} with {os.cpu_count()} CPU cores")
    print(f"JAX {jax.__version__}, jaxlib {jaxlib.__version__}, geomjax {geomjax.__version__}, "
          f"x64 {jax.config.read('jax_enable_x64')}, date {time.strftime('%Y-%m-%d %H:%M')}")
    try:
        load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        load = "?"
    print(f"host load average at the start: {load} (other processes share the CPU: times are best-of)")
    print(f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; CPU affinity {sorted(os.sched_getaffinity(0))}"
          + (" (--single-thread)" if args.single_thread else ""))
    print(f"dt = {DT:g}; objective 'invariants'; save_every = N/10; best of {args.repeat} calls after the first"
          + ("; --quick" if args.quick else ""))
    print(f"double-pendulum starts vs planar_chain's own x0 for the same angles: {check_chain_states():.1e}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few configurations (under a minute on 2 cores)")
    parser.add_argument("--repeat", type=int, help="timed calls after the first (best is reported)")
    parser.add_argument("--no-rss", action="store_true", help="skip the subprocess peak-RSS measurements")
    parser.add_argument("--single-thread", action="store_true",
                        help="rerun with XLA_FLAGS=--xla_cpu_multi_thread_eigen=false on one core (sched_setaffinity)")
    parser.add_argument("--rss-child", help=argparse.SUPPRESS)
    parser.add_argument("--fusion-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.single_thread and os.environ.get("GEOMJAX_BENCH_SINGLE") != "1":
        env = dict(os.environ, GEOMJAX_BENCH_SINGLE="1")
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        argv = sys.argv[1:] if argv is None else list(argv)
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__)] + argv, env)
    if args.rss_child:
        rss_child(args.rss_child)
        return
    args.repeat = args.repeat or (2 if args.quick else 5)
    if args.fusion_child:
        warnings.filterwarnings("ignore", category=UserWarning)
        print(json.dumps(fusion_rows(args.fusion_child.split(","), args.repeat)))
        return
    warnings.filterwarnings("ignore", category=UserWarning)
    probs = problems()
    if args.quick:
        configs = [("pendulum-euler", 1000, 16), ("pendulum-euler", 1000, 256)]
        memory_sizes = [(1000, 256)]
        why = [("pendulum-euler", 1000, 256, False)]
        tunes = [("pendulum-euler", 1000, 256, 3, 2)]
        fusion = ["pendulum-rk4:1000:256"]
    else:
        configs = [("pendulum-euler", n, b) for n in (1000, 10000) for b in (16, 256, 4096)]
        configs += [("pendulum-rk4", n, b) for n, b in ((1000, 16), (1000, 256), (1000, 4096), (10000, 256))]
        configs += [("chain2-euler", n, b) for n, b in ((1000, 16), (1000, 256), (1000, 4096), (10000, 256))]
        configs += [("chain2-rk4", 1000, b) for b in (16, 256)]
        memory_sizes = [(1000, 16), (1000, 256), (1000, 4096), (10000, 256), (10000, 4096)]
        why = [("pendulum-euler", 1000, 256, True), ("pendulum-euler", 1000, 4096, True),
               ("chain2-euler", 1000, 256, True)]
        tunes = [("pendulum-euler", 1000, 256, 5, 2), ("pendulum-euler", 10000, 256, 5, 2)]
        fusion = [f"{key}:1000:{b}" for key in ("pendulum-euler", "pendulum-rk4") for b in (16, 256, 4096)]
        fusion += ["chain2-euler:1000:256", "chain2-rk4:1000:256"]
    header(args)

    print()
    print("=" * 120)
    print("one tuning iteration (value and gradient, checkpoint=True) vs the forward sweep (same loss, no gradient)")
    print("  fwd/iter first = first call [s] (trace + compile + run); compile = first − run; run = best call [s];")
    print("  ns/m-s = run per member-step [ns]; run x = iteration run / forward run; compile x = the same for")
    print("  compile; sweep() = the public geomjax.sweep call (outside jit) with the same settings, run [s];")
    print("  failed = members that failed (count as the worst + 2 decades); objective = mean log10 RMS drift")
    print_timing_header()
    timings, cases = [], {}
    started = time.perf_counter()
    for key, steps, batch in configs:
        case = cases[(key, steps, batch)] = Case(probs[key], steps, batch)
        t = time_case(case, args.repeat)
        print_timing_row(case, t)
        timings.append((case, t))

    print(f"(section: {time.perf_counter() - started:.0f} s)")

    started = time.perf_counter()
    mode_ratios = modes_section(probs, configs, args.repeat)
    print(f"(section: {time.perf_counter() - started:.0f} s)")

    started = time.perf_counter()
    memory_section(probs["pendulum-euler"], memory_sizes, rss=not (args.no_rss or args.quick), cases=cases)
    if args.quick:
        print("  (--quick: no RSS subprocesses; the full run measures them)")
    print(f"(section: {time.perf_counter() - started:.0f} s)")

    for key, steps, batch, full in why:
        started = time.perf_counter()
        case = cases.get((key, steps, batch)) or Case(probs[key], steps, batch)
        why_section(case, args.repeat, profile=True, what_ifs=True, no_checkpoint_hand=full)
        print(f"(section: {time.perf_counter() - started:.0f} s)")

    started = time.perf_counter()
    fusion_section(fusion, min(args.repeat, 3))
    print(f"(section: {time.perf_counter() - started:.0f} s)")

    for key, steps, batch, iterations, n_calls in tunes:
        started = time.perf_counter()
        tune_section(probs[key], steps, batch, iterations, args.repeat, n_calls)
        print(f"(section: {time.perf_counter() - started:.0f} s)")

    print()
    print("=" * 120)
    try:
        load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        load = "?"
    print(f"(host load average at the end: {load})")
    ratios = [(t["i_run"] / t["f_run"], case) for case, t in timings]
    compile_ratios = [t["i_compile"] / max(t["f_compile"], 1e-9) for _, t in timings]
    worst, worst_case = max(ratios, key=lambda r: r[0])
    best, best_case = min(ratios, key=lambda r: r[0])
    print(f"iteration run / forward run: {best:.1f}x ({best_case.problem.key}, N = {best_case.steps}, B = "
          f"{best_case.batch}) to {worst:.1f}x ({worst_case.problem.key}, N = {worst_case.steps}, B = "
          f"{worst_case.batch}); compile: {min(compile_ratios):.1f}-{max(compile_ratios):.1f}x; target <= 4x")
    print(f'gains="scalar", the mode tune_gains\' "auto" takes: iteration / forward '
          f"{min(mode_ratios):.1f}-{max(mode_ratios):.1f}x")
    print(f"tuning iteration / forward sweep: {worst:.1f}x (worst over the configurations, default vector gains, reverse mode)")


if __name__ == "__main__":
    main()
