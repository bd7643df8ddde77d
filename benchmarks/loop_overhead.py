"""Per-step overhead of `geomjax.integrate` against a hand-written `lax.scan` Euler loop.

Spherical pendulum, feedback field (k = 50), explicit Euler, h = 1e-3: the hand loop of
`derived_vs_hand.py` against `geomjax.integrate` inside `jax.jit`, for one trajectory and
for `vmap` over 1024 initial states; prints the times, their ratios and the number of
kernels (fusions and other non-trivial instructions) in the innermost compiled loop body.

Run: `python benchmarks/loop_overhead.py [--steps N] [--batch B] [--batch-steps M] [--hlo]`.
"""

import re
import time

import jax
import jax.numpy as jnp
from _harness import size_arguments, sphere_states, timeit
from derived_vs_hand import K, derived_field, hand_field_wrap
from _harness import euler_loop

import geomjax

_TRIVIAL = ("parameter(", "get-tuple-element(", "tuple(", "constant(", "bitcast(", "copy(")


def while_bodies(text):
    """{body name: [instructions]} of every while loop in compiled HLO text."""
    comps, name, lines = {}, None, []
    for line in text.splitlines():
        m = re.match(r"^(?:ENTRY )?%([^\s(]+) \(.*\{$", line)
        if m:
            name, lines = m.group(1), []
            continue
        if line == "}" and name is not None:
            comps[name] = lines
            name = None
            continue
        if name is not None:
            lines.append(line.strip())
    bodies = set(re.findall(r"body=%?([\w.\-]+)", text))
    return {b: comps.get(b, []) for b in bodies}


def kernels(instrs):
    """Instructions of a loop body that do work (not parameters, tuples, constants)."""
    out = []
    for ins in instrs:
        rhs = ins.split("=", 1)[-1]
        if any(t in rhs for t in _TRIVIAL) and " fusion(" not in rhs:
            continue
        out.append(ins)
    return out


def report_hlo(label, fn, x, show=False):
    text = jax.jit(fn).lower(x).compile().as_text()
    bodies = while_bodies(text)
    counts = {b: (sum(" fusion(" in i for i in ins), len(kernels(ins))) for b, ins in bodies.items()}
    print(f"{label}: while bodies (fusions, non-trivial instrs): {sorted(counts.values())}")
    if show:
        for b, ins in bodies.items():
            print(f"--- {b}")
            for i in kernels(ins):
                print("   ", i[:200])
    return counts


def per_call(fn, x0, calls):
    """Mean time of one call of `fn(x0)` (its result ready), over `calls` calls."""
    t = time.perf_counter()
    for _ in range(calls):
        jax.block_until_ready(fn(x0).xs)
    return (time.perf_counter() - t) / calls


def fixed_cost(y, x0, h, call_steps, calls, repeat):
    """Per call: `integrate` called directly against the same run inside `jax.jit`."""
    for steps in call_steps:
        kw = dict(dt=h, steps=steps, save_every=steps)
        direct = lambda x, kw=kw: geomjax.integrate(y, x, **kw)  # noqa: E731
        jitted = jax.jit(lambda x, kw=kw: geomjax.integrate(y, x, **kw))
        per_call(direct, x0, 10)  # compile, and fill the start check's memo
        per_call(jitted, x0, 10)
        times = {"direct": [], "jit": []}
        for _ in range(repeat):
            times["direct"].append(per_call(direct, x0, calls))
            times["jit"].append(per_call(jitted, x0, calls))
        d, j = min(times["direct"]), min(times["jit"])
        diffs = sorted(a - b for a, b in zip(times["direct"], times["jit"]))
        verdict = "meets" if d - j <= 1e-4 else "misses"
        print(
            f"integrate called directly, {steps} steps: {d * 1e6:.1f} us per call, inside jit {j * 1e6:.1f} us:"
            f" +{(d - j) * 1e3:.3f} ms per call (rounds: {', '.join(f'{x * 1e3:.3f}' for x in diffs)});"
            f" target <= 0.1 ms: {verdict}"
        )


def main(argv=None):
    parser = size_arguments(__doc__.splitlines()[0])
    parser.add_argument("--hlo", action="store_true", help="print the loop bodies")
    parser.add_argument("--repeat", type=int, default=3, help="timing rounds (interleaved)")
    parser.add_argument("--call-steps", default="10,1000", help="steps of the runs timed per call")
    parser.add_argument("--calls", type=int, default=2000, help="calls per timing round")
    parser.add_argument("--only-calls", action="store_true", help="time only the fixed cost of a call")
    args = parser.parse_args(argv)
    h = 1e-3
    model = geomjax.models.spherical_pendulum()
    x0 = model.x0
    xs = sphere_states(args.batch, jax.random.PRNGKey(0))
    y = geomjax.feedback_field(model.system, x0, gains=K)
    call_steps = [int(v) for v in args.call_steps.split(",") if v]
    if args.only_calls:
        fixed_cost(y, x0, h, call_steps, args.calls, args.repeat)
        return

    def integ(steps):
        return lambda x: geomjax.integrate(y, x, dt=h, steps=steps, save_every=steps, throw=False).xs[-1]

    runs = {
        "hand loop": (
            jax.jit(euler_loop(hand_field_wrap, args.steps, h)),
            jax.jit(jax.vmap(euler_loop(hand_field_wrap, args.batch_steps, h))),
        ),
        "derived rhs loop": (
            jax.jit(euler_loop(derived_field, args.steps, h)),
            jax.jit(jax.vmap(euler_loop(derived_field, args.batch_steps, h))),
        ),
        "integrate in jit": (jax.jit(integ(args.steps)), jax.jit(jax.vmap(integ(args.batch_steps)))),
    }
    report_hlo("hand loop", euler_loop(hand_field_wrap, 1000, h), x0, args.hlo)
    report_hlo("integrate", integ(1000), x0, args.hlo)
    report_hlo("integrate vmap", jax.vmap(integ(1000)), xs, args.hlo)
    ref_s, ref_b = runs["hand loop"][0](x0), runs["hand loop"][1](xs)
    for name, (s, b) in runs.items():
        ds = float(jnp.max(jnp.abs(s(x0) - ref_s)))
        db = float(jnp.max(jnp.abs(b(xs) - ref_b)))
        print(f"{name}: max |Δx| vs hand single {ds:.1e}, vmap {db:.1e}")
    times = {name: ([], []) for name in runs}
    for _ in range(args.repeat):
        for name, (s, b) in runs.items():
            times[name][0].append(timeit(s, x0, repeat=5))
            times[name][1].append(timeit(b, xs, repeat=2))
    hs, hb = times["hand loop"]
    for name, (ts, tb) in times.items():
        rs = [t / r for t, r in zip(ts, hs)]
        rb = [t / r for t, r in zip(tb, hb)]
        print(
            f"{name:<18} single {min(ts) * 1e3:7.2f}-{max(ts) * 1e3:7.2f} ms ({min(ts) / args.steps * 1e9:5.1f} ns/step),"
            f" ratio {min(rs):.2f}-{max(rs):.2f} | vmap {min(tb) * 1e3:7.1f}-{max(tb) * 1e3:7.1f} ms,"
            f" ratio {min(rb):.2f}-{max(rb):.2f}"
        )
    fixed_cost(y, x0, h, call_steps, args.calls, args.repeat)


if __name__ == "__main__":
    main()
