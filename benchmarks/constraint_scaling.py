"""RATTLE on large sparse constraint graphs: geomjax against hand-written sparse floors.

Models (`geomjax.models`): the planar cloth n × n (rods on the grid's edges, two pinned
corners), the random tree of rods in space, the closed ring of rods, the box of rigid
triatomic molecules. For each size, in one process and interleaved rounds (best kept):

- geomjax:      `geomjax.rattle(model.system)` (defaults: the pattern of G M⁻¹Gᵀ read off the
                jaxpr; matrix-free Jacobi-preconditioned CG and a chord iteration for a
                sparse graph of ≥ 16 constraints), its `advance` in a plain `lax.scan`;
- integrate:    the same step through `geomjax.integrate` (start checks, status, monitoring;
                one save at the end), timed end to end after a first call;
- banded / krylov: geomjax with its sparse plan forced: the block Cholesky of the RCM-ordered
                G M⁻¹Gᵀ (`structured="banded"`) or Jacobi-preconditioned CG (`"krylov"`, up to
                `--krylov-max` constraints); the default picks the first when the RCM band is at most
                `geomjax._step.rattle.MAX_DIRECT_BAND`;
- dense:        `geomjax.rattle(model.system, structured=False)` (k jvps, LAPACK LU), up to
                `--dense-max` constraints: where the switch to the sparse path pays;
- floor banded: RATTLE written by hand with block-banded Cholesky solves: A's entries in closed
                form (±(d_e·d_f)/m_k for rods sharing particle k), scipy's reverse Cuthill–McKee
                order, blocks of max(band, 16), the chord iteration with exact solves;
- floor CG warm / CG cold (up to `--floor-max` constraints): RATTLE written by hand for rod networks (edge lists, G and Gᵀ as
                gathers and scatter-adds, the Jacobi diagonal |d_e|²(1/m_a + 1/m_b) in closed
                form, pinned particles as infinite masses): the position multipliers by the
                chord iteration ν ← ν + A₀⁻¹g(q₁(ν)), A₀ = G(q)M⁻¹G(q)ᵀ by PCG to a relative
                1e−3, the velocity multipliers by PCG to 1e−14, stopping on the same update test as
                geomjax (|Δν| ≤ 1e−13(1 + |ν|)); "warm" starts both from the previous step's
                multipliers (carried in the loop), "cold" from zero;
- floor SHAKE (up to `--floor-max`):  RATTLE by coloured SHAKE/RATTLE sweeps (nonlinear Gauss–Seidel over the rods,
                rods of one colour share no particle so a colour is one vectorised update; over-
                relaxation ω = 1.5), position sweeps until max|g| ≤ 1e−14, velocity sweeps until
                max|G M⁻¹p| ≤ 1e−13 max|M⁻¹p|.

Before timing, every floor is checked against geomjax on the smallest size of each model
(100 steps, ≤ 1e−10 in q and p). Printed per case: µs per step, compile time
(lower + compile of the scan) and the compiled program's temporary memory; then
geomjax ÷ best floor, integrate ÷ scan, and the growth exponents d log(cost)/d log(m).

Run: `python benchmarks/constraint_scaling.py [--quick] [--cloth 4,8,16,32] [--tree 64,256,1024]
[--ring 64,256,1024] [--water 2,4,6] [--rounds 3]`.
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import geomjax
from geomjax._solve.krylov import INNER_RTOL

H_STEP = 2e-3


# ----------------------------------------------------------------------------- the networks
def network(model):
    """Edges, lengths, pins, inverse masses (pins: 0) and dimension of a rod-network model."""
    con, ham = model.system.holonomic, model.system.hamiltonian
    inv = np.asarray(ham.inverse_mass, np.float64).copy()
    inv[con.pins.array] = 0.0
    return dict(a=con.edges.array[:, 0], b=con.edges.array[:, 1], length=np.asarray(con.lengths),
                inv=inv, dim=con.dim, pins=con.pins.array)


def potential_gradient(model):
    n = model.system.dim // 2
    zero = jnp.zeros(n)
    return jax.grad(lambda q: model.system.hamiltonian(jnp.concatenate([q, zero])))


def _ops(net):
    a, b, dim = net["a"], net["b"], net["dim"]
    inv = jnp.asarray(np.repeat(net["inv"], dim))
    inv_pts = jnp.asarray(net["inv"])
    length2 = jnp.asarray(net["length"] ** 2)

    def rods(q):
        pts = q.reshape(-1, dim)
        return pts[a] - pts[b]

    def g(q):
        d = rods(q)
        return 0.5 * (jnp.sum(d * d, axis=1) - length2)

    def g_dot(d, v):
        vv = v.reshape(-1, dim)
        return jnp.sum(d * (vv[a] - vv[b]), axis=1)

    def g_t(d, lam):
        f = d * lam[:, None]
        out = jnp.zeros((inv_pts.shape[0], dim), d.dtype).at[a].add(f).at[b].add(-f)
        return out.reshape(-1)

    def diag(d):
        return jnp.sum(d * d, axis=1) * (inv_pts[a] + inv_pts[b])

    return rods, g, g_dot, g_t, diag, inv


def _pcg(apply, b, inv_diag, rtol, x0):
    target = (rtol * jnp.linalg.norm(b)) ** 2
    r = b - apply(x0)
    z = inv_diag * r

    def cond(c):
        return (c[4] > target) & (c[5] < 10 * b.shape[0] + 50)

    def body(c):
        x, r, z, d, _, k = c
        ad = apply(d)
        rz = r @ z
        alpha = rz / (d @ ad)
        x, r = x + alpha * d, r - alpha * ad
        zn = inv_diag * r
        return x, r, zn, zn + (r @ zn) / rz * d, r @ r, k + 1

    return lax.while_loop(cond, body, (x0, r, z, z, r @ r, 0))[0]


def cg_floor(model, warm: bool):
    """The hand-written chord + Jacobi-PCG RATTLE: `(q, p, ν, μ) ↦ (q, p, ν, μ)`."""
    net = network(model)
    rods, g, g_dot, g_t, diag, inv = _ops(net)
    grad_u = potential_gradient(model)
    h = H_STEP
    free = inv > 0

    def step(q, p, nu, mu):
        nu, mu = (nu, mu) if warm else (jnp.zeros_like(nu), jnp.zeros_like(mu))
        kick = p - 0.5 * h * grad_u(q)
        q_free = q + h * inv * kick
        d0 = rods(q)
        a0 = lambda v: g_dot(d0, inv * g_t(d0, v))
        inv_d0 = 1.0 / diag(d0)

        def cond(c):
            return (c[1] < 50) & ~c[2]

        def body(c):
            nu, k, _ = c
            r = g(q_free - inv * g_t(d0, nu))
            delta = _pcg(a0, r, inv_d0, INNER_RTOL, jnp.zeros_like(r))
            nu = nu + delta
            return nu, k + 1, jnp.max(jnp.abs(delta)) <= 1e-13 * (1 + jnp.max(jnp.abs(nu)))

        nu, _, _ = lax.while_loop(cond, body, (nu, 0, False))
        q1 = q_free - inv * g_t(d0, nu)
        p_half = kick - g_t(d0, nu) / h
        p_free = p_half - 0.5 * h * grad_u(q1)
        d1 = rods(q1)
        a1 = lambda v: g_dot(d1, inv * g_t(d1, v))
        mu = _pcg(a1, g_dot(d1, inv * p_free), 1.0 / diag(d1), 1e-14, mu)
        p1 = jnp.where(free, p_free - g_t(d1, mu), 0.0)
        return q1, p1, nu, mu

    m = len(net["a"])
    return step, (jnp.zeros(m), jnp.zeros(m))


def _edge_colors(net):
    """Greedy colouring of the rods: rods of one colour share no particle."""
    colors = np.full(len(net["a"]), -1)
    used = [set() for _ in range(len(net["inv"]))]
    for e, (i, j) in enumerate(zip(net["a"], net["b"])):
        c = 0
        while c in used[i] or c in used[j]:
            c += 1
        colors[e] = c
        used[i].add(c)
        used[j].add(c)
    return colors


def shake_floor(model, omega: float = 1.5):
    """Hand-written RATTLE by coloured SHAKE (positions) and RATTLE (velocities) sweeps."""
    net = network(model)
    rods, g, g_dot, g_t, diag, inv = _ops(net)
    dim = net["dim"]
    grad_u = potential_gradient(model)
    h = H_STEP
    free = inv > 0
    colors = _edge_colors(net)
    groups = [np.flatnonzero(colors == c) for c in range(colors.max() + 1)]
    a_all, b_all = net["a"], net["b"]
    inv_pts = jnp.asarray(net["inv"])
    length2 = jnp.asarray(net["length"] ** 2)

    def sweep_positions(q, d0):
        pts = q.reshape(-1, dim)
        for e in groups:
            a, b = a_all[e], b_all[e]
            d = pts[a] - pts[b]
            w = inv_pts[a] + inv_pts[b]
            gamma = omega * (jnp.sum(d * d, axis=1) - length2[e]) / (2 * jnp.sum(d * d0[e], axis=1) * w)
            shift = gamma[:, None] * d0[e]
            pts = pts.at[a].add(-inv_pts[a][:, None] * shift).at[b].add(inv_pts[b][:, None] * shift)
        return pts.reshape(-1)

    def sweep_velocities(p, d1):
        pts = p.reshape(-1, dim)
        for e in groups:
            a, b = a_all[e], b_all[e]
            v = inv_pts[:, None] * pts
            rate = jnp.sum(d1[e] * (v[a] - v[b]), axis=1)
            mu = omega * rate / (jnp.sum(d1[e] * d1[e], axis=1) * (inv_pts[a] + inv_pts[b]))
            shift = mu[:, None] * d1[e]
            pts = pts.at[a].add(-shift).at[b].add(shift)
        return pts.reshape(-1)

    def step(q, p):
        kick = p - 0.5 * h * grad_u(q)
        q_free = q + h * inv * kick
        d0 = rods(q)
        q1 = lax.while_loop(lambda c: (jnp.max(jnp.abs(g(c[0]))) > 1e-14) & (c[1] < 10_000),
                            lambda c: (sweep_positions(c[0], d0), c[1] + 1), (q_free, 0))[0]
        p_half = jnp.where(free, (q1 - q) / (h * jnp.where(free, inv, 1.0)), 0.0)
        p_free = p_half - 0.5 * h * grad_u(q1)
        d1 = rods(q1)
        vscale = jnp.max(jnp.abs(inv * p_free)) + 1e-300
        p1 = lax.while_loop(
            lambda c: (jnp.max(jnp.abs(g_dot(d1, inv * c[0]))) > 1e-13 * vscale) & (c[1] < 10_000),
            lambda c: (sweep_velocities(c[0], d1), c[1] + 1), (p_free, 0))[0]
        return q1, jnp.where(free, p1, 0.0)

    return step, ()


def banded_floor(model):
    """Hand-written RATTLE with block-banded Cholesky solves: A's entries in closed form,
    A_ee' = ±(d_e·d_e') m_k⁻¹ for rods e, e' sharing particle k, in scipy's reverse
    Cuthill–McKee order, cut into blocks of max(band, 16); chord iteration with exact solves."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    net = network(model)
    rods, g, g_dot, g_t, diag, inv = _ops(net)
    grad_u = potential_gradient(model)
    h = H_STEP
    free = inv > 0
    a, b, inv_pts = net["a"], net["b"], net["inv"]
    m = len(a)
    # rod pairs (e, f, sign, particle) coupled through a free particle, e ≠ f, and the diagonal
    ends = np.concatenate([np.stack([np.arange(m), a, np.ones(m)], 1), np.stack([np.arange(m), b, -np.ones(m)], 1)])
    ends = ends[inv_pts[ends[:, 1].astype(int)] > 0].astype(np.int64)
    by_particle = {}
    for e, k, sgn in ends:
        by_particle.setdefault(k, []).append((e, sgn))
    pairs = np.array([(e, f, se * sf, k) for k, lst in by_particle.items() for e, se in lst for f, sf in lst if e != f],
                     np.int64).reshape(-1, 4)
    adjacency = csr_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(m, m))
    order = np.asarray(reverse_cuthill_mckee(adjacency, symmetric_mode=True), np.int64)
    pos = np.empty(m, np.int64)
    pos[order] = np.arange(m)
    band = int(np.max(np.abs(pos[pairs[:, 0]] - pos[pairs[:, 1]]))) if len(pairs) else 0
    s = max(band, 16)
    nb = -(-m // s)
    pe, pf = pos[pairs[:, 0]], pos[pairs[:, 1]]
    lower = pe // s >= pf // s  # entries of the diagonal and sub-diagonal blocks
    pr = pairs[lower]
    pe, pf = pe[lower], pf[lower]
    kind = pe // s - pf // s  # 0: diagonal block, 1: sub-diagonal block
    dpos = pos

    def blocks(d):
        vals = pr[:, 2] * jnp.sum(d[pr[:, 0]] * d[pr[:, 1]], axis=1) * inv_pts[pr[:, 3]]
        out = jnp.zeros((2, nb, s, s), d.dtype).at[kind, pe // s, pe % s, pf % s].add(vals)
        out = out.at[0, dpos // s, dpos % s, dpos % s].add(diag(d))
        pad = np.arange(m, nb * s)
        return out.at[0, pad // s, pad % s, pad % s].set(1.0)

    def factor(d):
        blk = blocks(d)
        tri = jax.scipy.linalg.solve_triangular

        def body(c_prev, xs):
            dk, lk = xs
            w = tri(c_prev, lk.T, lower=True).T
            ck = jnp.linalg.cholesky(dk - w @ w.T)
            return ck, (ck, w)

        c0 = jnp.linalg.cholesky(blk[0, 0])
        _, (cs, ws) = lax.scan(body, c0, (blk[0, 1:], blk[1, 1:]))
        return jnp.concatenate([c0[None], cs]), jnp.concatenate([jnp.zeros((1, s, s)), ws])

    def solve(fac, r):
        cs, ws = fac
        tri = jax.scipy.linalg.solve_triangular
        rhs = jnp.zeros(nb * s).at[:m].set(r[order]).reshape(nb, s)
        _, ys = lax.scan(lambda y, xs: (lambda v: (v, v))(tri(xs[0], xs[2] - xs[1] @ y, lower=True)),
                         jnp.zeros(s), (cs, ws, rhs))
        wn = jnp.concatenate([ws[1:], jnp.zeros((1, s, s))])
        _, xs_ = lax.scan(lambda x, xs: (lambda v: (v, v))(tri(xs[0], xs[2] - xs[1].T @ x, lower=True, trans=1)),
                          jnp.zeros(s), (cs, wn, ys), reverse=True)
        return jnp.zeros(m).at[order].set(xs_.reshape(-1)[:m])

    def step(q, p):
        kick = p - 0.5 * h * grad_u(q)
        q_free = q + h * inv * kick
        d0 = rods(q)
        f0 = factor(d0)

        def body(c):
            nu, k, _ = c
            delta = solve(f0, g(q_free - inv * g_t(d0, nu)))
            nu = nu + delta
            return nu, k + 1, jnp.max(jnp.abs(delta)) <= 1e-13 * (1 + jnp.max(jnp.abs(nu)))

        nu, _, _ = lax.while_loop(lambda c: (c[1] < 50) & ~c[2], body, (jnp.zeros(m), 0, False))
        q1 = q_free - inv * g_t(d0, nu)
        p_free = kick - g_t(d0, nu) / h - 0.5 * h * grad_u(q1)
        d1 = rods(q1)
        mu = solve(factor(d1), g_dot(d1, inv * p_free))
        return q1, jnp.where(free, p_free - g_t(d1, mu), 0.0)

    return step, ()


# ----------------------------------------------------------------------------- loops and timing
def scan_run(step, extra, steps, n):
    def run(x0):
        def body(carry, _):
            return step(*carry), None

        carry, _ = lax.scan(body, (x0[:n], x0[n:]) + tuple(extra), None, length=steps)
        return jnp.concatenate([carry[0], carry[1]])

    return run


def geomjax_scan(model, steps, structured=True):
    step = geomjax.rattle(model.system, structured=structured)

    def run(x0):
        z, _ = lax.scan(lambda z, _: (step.advance(0.0, z, H_STEP, None)[0], None), step.split(x0), None,
                        length=steps)
        return step.merge(z)

    return run


def compiled(run, x0):
    t = time.perf_counter()
    exe = jax.jit(run).lower(x0).compile()
    seconds = time.perf_counter() - t
    mem = exe.memory_analysis()
    temp = getattr(mem, "temp_size_in_bytes", float("nan")) if mem is not None else float("nan")
    return exe, seconds, temp


def best_time(fn, x0, rounds):
    jax.block_until_ready(fn(x0))
    best = np.inf
    for _ in range(rounds):
        t = time.perf_counter()
        jax.block_until_ready(fn(x0))
        best = min(best, time.perf_counter() - t)
    return best


def build(kind, size):
    if kind == "cloth":
        return geomjax.models.cloth(size)
    if kind == "tree":
        return geomjax.models.rod_tree(size)
    if kind == "ring":
        return geomjax.models.rod_ring(size)
    return geomjax.models.water_box(size)


def check_floors(model):
    """Every floor against geomjax after 100 steps (q and the free p within 1e−10)."""
    n = model.system.dim // 2
    free = np.repeat(network(model)["inv"] > 0, network(model)["dim"])
    ref = np.asarray(jax.jit(geomjax_scan(model, 100))(model.x0))
    for name, (step, extra) in floors(model).items():
        out = np.asarray(jax.jit(scan_run(step, extra, 100, n))(model.x0))
        err = max(np.abs(out[:n] - ref[:n]).max(), np.abs((out[n:] - ref[n:])[free]).max())
        # SHAKE stops on residuals (|g|, |G M⁻¹p|), not on multipliers: on the ill-conditioned
        # ring its velocity sweeps leave differences up to ~1e−8 after 100 steps
        bound = 1e-7 if name == "SHAKE" else 1e-10
        assert err < bound, f"{model.name}: floor {name} differs from geomjax by {err:.3g}"
        print(f"  check {model.name}: {name} agrees with geomjax to {err:.1e} after 100 steps")


def floors(model, iterative=True):
    out = {"banded": banded_floor(model)}
    if iterative:
        out.update({"CG warm": cg_floor(model, True), "CG cold": cg_floor(model, False), "SHAKE": shake_floor(model)})
    return out


def steps_for(m):
    return 200 if m < 300 else 50 if m < 3000 else 10


def run_case(kind, size, args):
    model = build(kind, size)
    n = model.system.dim // 2
    m = int(model.system.holonomic(model.x0[:n]).shape[0])
    steps = steps_for(m)
    rows = {}
    cases = {"geomjax": geomjax_scan(model, steps)}
    for other in ("banded", "krylov"):
        cases[other] = geomjax_scan(model, steps, structured=other)
    if m <= args.dense_max:
        cases["dense"] = geomjax_scan(model, steps, structured=False)
    if m > args.krylov_max:
        del cases["krylov"]
    for name, (step, extra) in floors(model, m <= args.floor_max).items():
        cases["floor " + name] = scan_run(step, extra, steps, n)
    exes = {}
    for name, run in cases.items():
        exe, seconds, temp = compiled(run, model.x0)
        exes[name] = exe
        rows[name] = dict(compile=seconds, temp=temp, us=np.inf)
    for _ in range(args.rounds):  # interleaved
        for name, exe in exes.items():
            rows[name]["us"] = min(rows[name]["us"], best_time(exe, model.x0, 1) / steps * 1e6)
    step = geomjax.rattle(model.system)
    integ = lambda x0: geomjax.integrate(step, x0, dt=H_STEP, steps=steps, save_every=steps).xs
    t = time.perf_counter()
    jax.block_until_ready(integ(model.x0))
    first = time.perf_counter() - t
    rows["integrate"] = dict(compile=first, temp=float("nan"), us=best_time(integ, model.x0, args.rounds) / steps * 1e6)
    return m, rows


def exponent(ms, costs):
    ms, costs = np.log(np.asarray(ms, float)), np.log(np.asarray(costs, float))
    return float(np.polyfit(ms, costs, 1)[0]) if len(ms) > 1 else float("nan")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cloth", default="4,8,16,32,48")
    parser.add_argument("--tree", default="64,256,1024,4096")
    parser.add_argument("--ring", default="64,256,1024,4096")
    parser.add_argument("--water", default="2,4,6,8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dense-max", type=int, default=600)
    parser.add_argument("--floor-max", type=int, default=1200,
                        help="largest m for the iterative floors (CG, SHAKE): their iterations grow with the "
                             "condition number, a ring of 4096 rods takes seconds a step")
    parser.add_argument("--krylov-max", type=int, default=2100, help="largest m for geomjax's forced CG path")
    parser.add_argument("--quick", action="store_true", help="small sizes only")
    args = parser.parse_args()
    if args.quick:
        args.cloth, args.tree, args.ring, args.water, args.rounds = "4,8", "64,256", "64,256", "2,3", 2
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, h = {H_STEP}; µs per step, best of "
          f"{args.rounds} interleaved rounds")
    summary = {}
    for kind in ("cloth", "tree", "ring", "water"):
        sizes = [int(s) for s in getattr(args, kind).split(",") if s]
        if not sizes:
            continue
        check_floors(build(kind, sizes[0]))
        for size in sizes:
            m, rows = run_case(kind, size, args)
            best = min((r["us"], k) for k, r in rows.items() if k.startswith("floor"))
            line = "  ".join(f"{k} {r['us']:9.1f}" for k, r in rows.items())
            print(f"{kind:5s} {size:5d} m={m:6d}  {line}")
            comp = "  ".join(f"{k} {r['compile']:.2f}s" for k, r in rows.items())
            mem = "  ".join(f"{k} {r['temp'] / 1e6:.2f}MB" for k, r in rows.items() if np.isfinite(r["temp"]))
            print(f"      compile: {comp}\n      temp memory: {mem}")
            print(f"      geomjax / best floor ({best[1]}) = {rows['geomjax']['us'] / best[0]:.2f}; integrate / scan = "
                  f"{rows['integrate']['us'] / rows['geomjax']['us']:.2f}"
                  + (f"; dense / geomjax = {rows['dense']['us'] / rows['geomjax']['us']:.1f}" if "dense" in rows else ""))
            summary.setdefault(kind, []).append((m, rows))
    print("\ngrowth exponents d log(µs per step) / d log(m):")
    for kind, cases in summary.items():
        ms = [m for m, _ in cases]
        names = [k for k in cases[0][1] if all(k in r for _, r in cases)]
        print(f"  {kind:5s} " + "  ".join(f"{k} {exponent(ms, [r[k]['us'] for _, r in cases]):.2f}" for k in names))


if __name__ == "__main__":
    main()
