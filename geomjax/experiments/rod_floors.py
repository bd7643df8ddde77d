"""Hand-written RATTLE steps for rod networks: the floors geomjax's sparse solves are measured
against (`benchmarks/constraint_scaling.py`, the `scaling` experiment).

Written for the models of `geomjax.models._rod_networks` only (edge lists, rod lengths,
inverse masses; pinned particles as infinite masses, which gives the same motion as the
models' pin constraints), with G, Gᵀ and the entries of G M⁻¹Gᵀ in closed form:

- `cg_floor`: the position multipliers by the chord iteration ν ← ν + A₀⁻¹g(q₁(ν)),
  A₀ = G(q)M⁻¹G(q)ᵀ by Jacobi-preconditioned CG to a relative `INNER_RTOL`, the velocity
  multipliers by PCG to 1e−14, the update test of geomjax's chord iteration on what moves
  the positions, |M⁻¹GᵀΔν| ≤ 1e−13(1 + |q|);
  `warm=True` starts both from the previous step's multipliers (carried in the loop);
- `shake_floor`: coloured SHAKE (positions) and RATTLE (velocities) sweeps: nonlinear
  Gauss–Seidel over the rods, a colour of rods sharing no particle updated at once,
  over-relaxation ω = 1.5, until max|g| ≤ 1e−14 and max|G M⁻¹p| ≤ 1e−13 max|M⁻¹p|;
- `banded_floor`: block-banded Cholesky of A in reverse Cuthill–McKee order (scipy's
  where installed), blocks of max(band, 16), the chord iteration with exact solves.

Each returns `(step, extra)`: `step(q, p, *extra) -> (q, p, *extra)`, run by `scan_run`.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import geomjax
from geomjax._field import derived
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
            return nu, k + 1, jnp.max(jnp.abs(inv * g_t(d0, delta))) <= 1e-13 * (1 + jnp.max(jnp.abs(q)))

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


def _rcm(rows, cols, m):
    """Reverse Cuthill–McKee order of the graph with edges (rows, cols): scipy's, or
    geomjax's own where scipy is not installed."""
    try:
        from scipy.sparse import csr_matrix
        from scipy.sparse.csgraph import reverse_cuthill_mckee
    except ImportError:
        from geomjax._solve.block_cholesky import rcm_order
        from geomjax.internal.sparsity import Pattern

        dense = np.eye(m, dtype=bool)
        dense[rows, cols] = True
        return rcm_order(Pattern.from_dense(dense))
    adjacency = csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(m, m))
    return np.asarray(reverse_cuthill_mckee(adjacency, symmetric_mode=True), np.int64)


def _banded_gram(net, diag):
    """(factor, solve) of A = G M⁻¹Gᵀ by block-banded Cholesky: A's entries in closed form,
    A_ee' = ±(d_e·d_e') m_k⁻¹ for rods e, e' sharing particle k, in scipy's reverse
    Cuthill–McKee order, cut into blocks of max(band, 16). `factor(d)` from the rod vectors
    d, `solve(factors, r)`."""
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
    order = _rcm(pairs[:, 0], pairs[:, 1], m)
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

    return factor, solve


def banded_floor(model):
    """Hand-written RATTLE with block-banded Cholesky solves (`_banded_gram`); the chord
    iteration with exact solves."""
    net = network(model)
    rods, g, g_dot, g_t, diag, inv = _ops(net)
    grad_u = potential_gradient(model)
    h = H_STEP
    free = inv > 0
    m = len(net["a"])
    factor, solve = _banded_gram(net, diag)

    def step(q, p):
        kick = p - 0.5 * h * grad_u(q)
        q_free = q + h * inv * kick
        d0 = rods(q)
        f0 = factor(d0)

        def body(c):
            nu, k, _ = c
            delta = solve(f0, g(q_free - inv * g_t(d0, nu)))
            nu = nu + delta
            return nu, k + 1, jnp.max(jnp.abs(inv * g_t(d0, delta))) <= 1e-13 * (1 + jnp.max(jnp.abs(q)))

        nu, _, _ = lax.while_loop(lambda c: (c[1] < 50) & ~c[2], body, (jnp.zeros(m), 0, False))
        q1 = q_free - inv * g_t(d0, nu)
        p_free = kick - g_t(d0, nu) / h - 0.5 * h * grad_u(q1)
        d1 = rods(q1)
        mu = solve(factor(d1), g_dot(d1, inv * p_free))
        return q1, jnp.where(free, p_free - g_t(d1, mu), 0.0)

    return step, ()


def dirac_field_floor(model, solver: str = "banded"):
    """The Dirac field of a rod network written by hand, x = (q, p) ↦ ẋ, with A = G M⁻¹Gᵀ
    solved by `_banded_gram` (`solver="banded"`) or by Jacobi-PCG to 1e−14 (`"CG"`).

    With f = (g, G v), v = M⁻¹p, C = {fᵢ, fⱼ} = [[0, A], [−A, D]], D = W M⁻¹Gᵀ − G M⁻¹Wᵀ
    (W: the rows of G with the rod vectors d_e replaced by v_a − v_b), h = −Df·X_H:
    h₁ = −G v, h₂ = −|v_a − v_b|² + G M⁻¹∇U; Cᵀc = h gives c₂ = −A⁻¹h₁,
    c₁ = A⁻¹(h₂ + D c₂); then q̇ = v − M⁻¹Gᵀc₂, ṗ = −∇U + Gᵀc₁ + Wᵀc₂ (pinned
    particles: infinite masses, ṗ = 0)."""
    net = network(model)
    rods, g, g_dot, g_t, diag, inv = _ops(net)
    grad_u = potential_gradient(model)
    free = inv > 0
    n = model.system.dim // 2
    m = len(net["a"])
    if solver == "banded":
        factor, solve = _banded_gram(net, diag)

        def solver_at(d):
            factors = factor(d)
            return lambda r: solve(factors, r)
    else:

        def solver_at(d):
            apply = lambda v: g_dot(d, inv * g_t(d, v))  # noqa: E731
            inv_diag = 1.0 / diag(d)
            return lambda r: _pcg(apply, r, inv_diag, 1e-14, jnp.zeros(m))

    def field(x):
        q, p = x[:n], x[n:]
        v = inv * p
        d, dv = rods(q), rods(v)
        gu = grad_u(q)
        a_inverse = solver_at(d)
        c2 = a_inverse(g_dot(d, v))  # −A⁻¹h₁
        d_c2 = g_dot(dv, inv * g_t(d, c2)) - g_dot(d, inv * g_t(dv, c2))
        c1 = a_inverse(-jnp.sum(dv * dv, axis=1) + g_dot(d, inv * gu) + d_c2)
        q_dot = v - inv * g_t(d, c2)
        p_dot = jnp.where(free, -gu + g_t(d, c1) + g_t(dv, c2), 0.0)
        return jnp.concatenate([q_dot, p_dot])

    return field


def field_floor_scan(field, method: str, steps: int, h: float):
    """`steps` explicit Euler or RK4 steps of the hand-written `field` in a `lax.scan`."""

    def step(x):
        if method == "euler":
            return x + h * field(x)
        k1 = field(x)
        k2 = field(x + 0.5 * h * k1)
        k3 = field(x + 0.5 * h * k2)
        k4 = field(x + h * k3)
        return x + h / 6.0 * (k1 + 2.0 * k2 + 2.0 * k3 + k4)

    return lambda x0: lax.scan(lambda x, _: (step(x), None), x0, None, length=steps)[0]


def field_scan(field, method: str, steps: int, h: float):
    """`steps` of geomjax's explicit step (`method`: "euler" or "rk4") on `field`, in the
    same plain `lax.scan` as the floors."""
    tableau = geomjax.EULER if method == "euler" else geomjax.RK4
    step = geomjax.explicit_rk(field, tableau)

    def run(x0):
        z, _ = lax.scan(lambda z, _: (step.advance(0.0, z, h, None)[0], None), step.split(x0), None, length=steps)
        return step.merge(z)

    return run


def check_field_floors(model, steps: int = 50):
    """The hand-written Dirac fields against geomjax's (RK4, `steps` steps): q and the free
    p within 1e−10."""
    n = model.system.dim // 2
    free = np.repeat(network(model)["inv"] > 0, network(model)["dim"])
    ref = np.asarray(jax.jit(field_scan(geomjax.dirac_field(model.system), "rk4", steps, H_STEP))(model.x0))
    for solver in ("banded", "CG"):
        out = np.asarray(jax.jit(field_floor_scan(dirac_field_floor(model, solver), "rk4", steps, H_STEP))(model.x0))
        err = max(np.abs(out[:n] - ref[:n]).max(), np.abs((out[n:] - ref[n:])[free]).max())
        assert err < 1e-10, f"{model.name}: Dirac field floor ({solver}) differs from geomjax by {err:.3g}"
        print(f"  check {model.name}: Dirac field floor ({solver}) agrees with geomjax to {err:.1e} after {steps} RK4 steps")


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


def floors(model, iterative=True):
    out = {"banded": banded_floor(model)}
    if iterative:
        out.update({"CG warm": cg_floor(model, True), "CG cold": cg_floor(model, False), "SHAKE": shake_floor(model)})
    return out


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


def dense_dirac_field(system):
    """The Dirac field with C formed densely (one pullback per constraint, LAPACK): what
    geomjax's derivation costs without the sparsity (the comparison for the fields)."""
    s = system.structure
    return lambda x: s.merge(derived.dirac_vector(derived.dense_constraint_data(system, s.split(x))))
