"""Compile time and run time against the number of constraints: the planar chain of N links.

Model: `geomjax.models.planar_chain(N)` (m = ℓ = g = 1), N point masses in R² joined by rigid
links, k = N position constraints g_i = ½(|q_i − q_{i−1}|² − ℓ²) and 2N second-class
constraints f = (g, G M⁻¹p). For each N and each method

- Dirac field (`geomjax.dirac_field`) with explicit Euler and with RK4,
- feedback field (`geomjax.feedback_field`, gains k = 10, L = I) with Euler and RK4,
- RATTLE (`geomjax.rattle`),

the script times one `jax.jit`-ed run of `steps` steps (h = 1e−3) in four versions:

- geomjax:    `geomjax.integrate(field or step, x, dt=h, steps=S, method=...)`, everything
              derived by autodiff from H and g; from N = 4 on the fields take the sparse
              path of `geomjax._field.derived` (C's pattern read off the jaxpr, block form
              [[0, A], [−Aᵀ, D]] with A tridiagonal, `tridiagonal_solve_pair`: one
              plain-JAX Thomas factorization with a growth check for both solves);
- hand dense: the same field / step written by hand in vectorised jnp for the chain, with
              G = Dg in closed form, C = {f_i, f_j} assembled as a dense 2N × 2N matrix by
              matmuls and `jnp.linalg.solve` (RATTLE: 3 Newton iterations, dense solves);
- hand tri:   the same using the chain's structure: every Gram matrix is tridiagonal, the
              multipliers come from two `jax.lax.linalg.tridiagonal_solve` calls (formula in
              `tri_dirac_parts`; LAPACK gtsv custom calls on the CPU);
- hand thomas: the same formulas with the tridiagonal solves by the Thomas algorithm in
              plain jnp, written in this file (`thomas_solve`: unrolled for N ≤ 8, two
              `lax.scan` sweeps above; no pivoting, no checks). The reference for the
              targets of issue 25: geomjax's fields ≤ 1.5× and RATTLE ≤ 2× it, compile ≤ 2 s;
              the summary at the end prints those ratios and the growth exponents;
- hand derived: the floor for any field derived by autodiff (fields only): the same
              derivation geomjax makes from H and f (jvp/vjp products with fixed colour
              seeds, `thomas_solve`), written by hand for the chain (`derived_dirac`),
              without pattern detection or checks, run by `geomjax.integrate`. The summary
              also times the three field versions interleaved in one process.

The hand versions run in a `lax.scan` over the (q, p) pieces (`_harness.scan_loop`), the
same loop shape `geomjax.integrate` uses. Reported per case: trace+lower time, XLA compile
time (`jax.jit(f).lower(x0)` and `.compile()` timed separately), the first call, and the
best of `--repeat` warm runs as ns/step. A geomjax case whose lower+compile takes more than
`--compile-limit` seconds (default 60) makes the script skip the larger N for that method
and version; so does a predicted compile (last time × last growth factor) above
`--predict-limit` seconds. Each geomjax case runs in its own process, killed after
`--case-timeout` seconds (default 150; then the larger N are skipped too).

Before timing, the script checks (and asserts): the tridiagonal formulas (both solves)
against the dense ones (1e−10), and geomjax's Dirac field, feedback field and one RATTLE step against the
hand dense versions (1e−10 relative).

Run: `python benchmarks/chain_scaling.py [--links 1,2,3,4,6,8,9,12,16,24,32] [--steps 2000] [--quick]`.
"""

import argparse
import functools
import json
import math
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from _harness import scan_loop

import geomjax

H = 1e-3
GAIN = 10.0
MASS = LENGTH = GRAVITY = 1.0
NEWTON_ITERS = 3


# --------------------------------------------------------------------------------------
# Chain geometry, vectorised. Points are (N, 2) arrays; q_0 = 0 is the pivot.


def points(flat):
    return flat.reshape(-1, 2)


def links(pts):
    """d_i = q_i − q_{i−1}, q_0 = 0."""
    return jnp.diff(pts, axis=0, prepend=jnp.zeros((1, 2), pts.dtype))


def gravity_gradient(pts):
    """∇U for U = m g Σ y_i, as (N, 2) points."""
    return jnp.zeros_like(pts).at[:, 1].set(MASS * GRAVITY)


def constraint_values(d):
    return 0.5 * (jnp.sum(d * d, axis=1) - LENGTH**2)


def energy(q, p):
    return 0.5 * (p @ p) / MASS + MASS * GRAVITY * jnp.sum(points(q)[:, 1])


# --------------------------------------------------------------------------------------
# Hand dense: rows of the Jacobians as dense (N, 2N) matrices, C as a dense matrix.


def dense_rows(a):
    """The (N, 2N) matrix whose row i has a_i in the block of mass i and −a_i in block i−1.

    G = Dg is `dense_rows(d)` (d the link vectors); ∂h/∂q for h = G M⁻¹p is `dense_rows(u)`
    with u_i = v_i − v_{i−1}, v = p/m.
    """
    n = a.shape[0]
    pattern = jnp.eye(n, dtype=a.dtype) - jnp.eye(n, k=-1, dtype=a.dtype)
    return (pattern[:, :, None] * a[:, None, :]).reshape(n, 2 * n)


def dense_parts(q, p):
    """F_q, F_p (Jacobians of f = (g, G M⁻¹p)), C = {f, f}, a = {f, H}, f, ∇U, v."""
    n = q.shape[0] // 2
    d = links(points(q))
    v = p / MASS
    u = links(points(v))
    grad_u = gravity_gradient(points(q)).reshape(-1)
    gq = dense_rows(d)
    fq = jnp.concatenate([gq, dense_rows(u)])
    fp = jnp.concatenate([jnp.zeros((n, 2 * n), q.dtype), gq / MASS])
    c = fq @ fp.T - fp @ fq.T
    a = fq @ v - fp @ grad_u
    f = jnp.concatenate([constraint_values(d), jnp.sum(d * u, axis=1)])
    return fq, fp, c, a, f, grad_u, v


def dense_dirac(q, p):
    """X = X_H − Σ c_j X_{f_j}, C c = {f, H}; X_F = (∂F/∂p, −∂F/∂q)."""
    fq, fp, c, a, _, grad_u, v = dense_parts(q, p)
    mult = jnp.linalg.solve(c, a)
    return v - fp.T @ mult, -grad_u + fq.T @ mult


def dense_feedback(x0):
    """Y = X − ∇V, V = ½ k |F − F₀|², F = (f, H)."""
    n2 = x0.shape[0] // 2
    target = _quantities_dense(x0[:n2], x0[n2:])

    def field(q, p):
        fq, fp, c, a, f, grad_u, v = dense_parts(q, p)
        mult = jnp.linalg.solve(c, a)
        w = GAIN * (jnp.concatenate([f, jnp.atleast_1d(energy(q, p))]) - target)
        wf, wh = w[:-1], w[-1]
        # the feedback term is a gradient (L = I), not a Hamiltonian vector field:
        dq = v - fp.T @ mult - (fq.T @ wf + wh * grad_u)
        dp = -grad_u + fq.T @ mult - (fp.T @ wf + wh * v)
        return dq, dp

    return field


def _quantities_dense(q, p):
    d = links(points(q))
    u = links(points(p / MASS))
    return jnp.concatenate([constraint_values(d), jnp.sum(d * u, axis=1), jnp.atleast_1d(energy(q, p))])


def dense_rattle(q, p):
    """RATTLE with ν = h²λ/2: p½ = p − (h/2)∇U − Gᵀν/h, q₁ = q + h p½/m, g(q₁) = 0 (3 Newton
    steps, Jacobian −G(q₁)M⁻¹G(q)ᵀ), then p₁ = p_free − (h/2)G(q₁)ᵀμ with G(q₁)M⁻¹p₁ = 0."""
    g0 = dense_rows(links(points(q)))
    kick = p - 0.5 * H * gravity_gradient(points(q)).reshape(-1)
    nu = jnp.zeros(g0.shape[0], q.dtype)
    for _ in range(NEWTON_ITERS):
        q1 = q + H * (kick - g0.T @ nu / H) / MASS
        d1 = links(points(q1))
        jac = -dense_rows(d1) @ g0.T / MASS
        nu = nu - jnp.linalg.solve(jac, constraint_values(d1))
    p_half = kick - g0.T @ nu / H
    q1 = q + H * p_half / MASS
    g1 = dense_rows(links(points(q1)))
    p_free = p_half - 0.5 * H * gravity_gradient(points(q1)).reshape(-1)
    mu = jnp.linalg.solve(0.5 * H * g1 @ g1.T / MASS, g1 @ p_free / MASS)
    return q1, p_free - 0.5 * H * g1.T @ mu


# --------------------------------------------------------------------------------------
# Hand tridiagonal. A tridiagonal matrix is a triple (dl, d, du) as in tridiagonal_solve:
# dl[i] = T[i, i−1] (dl[0] = 0), d[i] = T[i, i], du[i] = T[i, i+1] (du[-1] = 0).


def cross_gram(a, b):
    """R_a M⁻¹ R_bᵀ for R_a = `dense_rows(a)`, R_b = `dense_rows(b)`: tridiagonal.

    (R_a R_bᵀ)_ii = a_i·b_i (i = 1) or 2 a_i·b_i (i ≥ 2; both blocks i and i−1 overlap),
    (R_a R_bᵀ)_{i,i+1} = −a_i·b_{i+1} (block i), (R_a R_bᵀ)_{i,i−1} = −a_i·b_{i−1}.
    """
    dot = jnp.sum(a * b, axis=1)
    diag = dot * jnp.ones_like(dot).at[1:].set(2.0)
    up = -jnp.sum(a[:-1] * b[1:], axis=1)
    low = -jnp.sum(a[1:] * b[:-1], axis=1)
    zero = jnp.zeros((1,), a.dtype)
    return jnp.concatenate([zero, low]) / MASS, diag / MASS, jnp.concatenate([up, zero]) / MASS


def tri_matvec(t, x):
    dl, d, du = t
    zero = jnp.zeros((1,), x.dtype)
    return d * x + dl * jnp.concatenate([zero, x[:-1]]) + du * jnp.concatenate([x[1:], zero])


def tri_solve(t, b):
    dl, d, du = t
    return jax.lax.linalg.tridiagonal_solve(dl, d, du, b[:, None])[:, 0]


THOMAS_UNROLL = 8  # the hand Thomas solve is written out up to this size, a `lax.scan` above


def thomas_solve(t, b):
    """T x = b by the Thomas algorithm (no pivoting: the chain's Gram matrices are SPD), in
    plain jnp: unrolled at trace time for N ≤ 8, two `lax.scan` sweeps above.

    Forward: w_i = dl_i / c_{i−1}, c_i = d_i − w_i du_{i−1}, y_i = b_i − w_i y_{i−1} (c_0 = d_0,
    y_0 = b_0); backward: x_{N−1} = y_{N−1}/c_{N−1}, x_i = (y_i − du_i x_{i+1}) / c_i.
    """
    dl, d, du = t
    n = d.shape[0]
    if n <= THOMAS_UNROLL:
        c, y = [d[0]], [b[0]]
        for i in range(1, n):
            w = dl[i] / c[-1]
            c.append(d[i] - w * du[i - 1])
            y.append(b[i] - w * y[-1])
        x = [y[-1] / c[-1]]
        for i in range(n - 2, -1, -1):
            x.append((y[i] - du[i] * x[-1]) / c[i])
        return jnp.stack(x[::-1])

    def forward(carry, row):
        c_prev, y_prev = carry
        dl_i, d_i, du_prev, b_i = row
        w = dl_i / c_prev
        c_i, y_i = d_i - w * du_prev, b_i - w * y_prev
        return (c_i, y_i), (c_i, y_i)

    _, (c, y) = jax.lax.scan(forward, (d[0], b[0]), (dl[1:], d[1:], du[:-1], b[1:]))

    def backward(x_next, row):
        c_i, y_i, du_i = row
        x_i = (y_i - du_i * x_next) / c_i
        return x_i, x_i

    last = y[-1] / c[-1]
    _, x = jax.lax.scan(
        backward, last, (jnp.concatenate([d[:1], c[:-1]]), jnp.concatenate([b[:1], y[:-1]]), du[:-1]), reverse=True
    )
    return jnp.concatenate([x, last[None]])


def rows_transpose(a, lam):
    """R_aᵀλ as (N, 2) points: block j gets λ_j a_j − λ_{j+1} a_{j+1}."""
    y = lam[:, None] * a
    return y - jnp.concatenate([y[1:], jnp.zeros((1, 2), y.dtype)])


def tri_dirac_parts(q, p, solve=tri_solve):
    """Multipliers of the Dirac field from two tridiagonal solves.

    With f = (g, h), h = G M⁻¹p, and R_a as in `dense_rows`: G = R_d, ∂h/∂q = R_u,
    ∂h/∂p = R_d/m, ∂g/∂p = 0. The canonical brackets give

        {g_i, g_j} = 0,  {g_i, h_j} = (G M⁻¹Gᵀ)_ij = A_ij,  {h_i, g_j} = −A_ij,
        {h_i, h_j} = B_ij = P_ij − P_ji,  P = R_u M⁻¹ R_dᵀ,

    so C = [[0, A], [−A, B]], A = `cross_gram(d, d)` symmetric tridiagonal, B antisymmetric
    tridiagonal. The right side a = {f, H} = (a_g, a_h) has a_g = G M⁻¹p = h and
    a_h,i = |u_i|² − d_i·(∇U_i − ∇U_{i−1})/m. C (λ, μ) = (a_g, a_h) is

        A μ = a_g,           −A λ + B μ = a_h,

    i.e. μ = A⁻¹ a_g, then λ = A⁻¹ (B μ − a_h): two tridiagonal solves, no dense C. With
    X_{g_j} = (0, −G_jᵀ) and X_{h_j} = (G_jᵀ/m, −R_u,jᵀ), X = X_H − Σλ_j X_{g_j} − Σμ_j X_{h_j} is

        q̇ = v − Gᵀμ/m,   ṗ = −∇U + Gᵀλ + R_uᵀμ.
    """
    d = links(points(q))
    v = p / MASS
    u = links(points(v))
    grad_u = gravity_gradient(points(q))
    a_mat = cross_gram(d, d)
    p_dl, _, p_du = cross_gram(u, d)
    # B = P − Pᵀ: B[i, i+1] = P[i, i+1] − P[i+1, i], B[i, i−1] = −B[i−1, i].
    b_du = p_du - jnp.concatenate([p_dl[1:], jnp.zeros((1,), q.dtype)])
    b_dl = jnp.concatenate([jnp.zeros((1,), q.dtype), -b_du[:-1]])
    b_mat = (b_dl, jnp.zeros_like(b_du), b_du)
    h_vals = jnp.sum(d * u, axis=1)
    a_h = jnp.sum(u * u, axis=1) - jnp.sum(d * links(grad_u), axis=1) / MASS
    mu = solve(a_mat, h_vals)
    lam = solve(a_mat, tri_matvec(b_mat, mu) - a_h)
    return d, u, v, grad_u, lam, mu, h_vals


def tri_dirac(q, p, solve=tri_solve):
    d, u, v, grad_u, lam, mu, _ = tri_dirac_parts(q, p, solve)
    dq = v - rows_transpose(d, mu).reshape(-1) / MASS
    dp = -grad_u.reshape(-1) + (rows_transpose(d, lam) + rows_transpose(u, mu)).reshape(-1)
    return dq, dp


def tri_feedback(x0, solve=tri_solve):
    n2 = x0.shape[0] // 2
    target = _quantities_dense(x0[:n2], x0[n2:])
    n = n2 // 2

    def field(q, p):
        d, u, v, grad_u, lam, mu, h_vals = tri_dirac_parts(q, p, solve)
        f = jnp.concatenate([constraint_values(d), h_vals, jnp.atleast_1d(energy(q, p))])
        w = GAIN * (f - target)
        wg, wh, we = w[:n], w[n:-1], w[-1]
        # ∇V = Σ w_i ∇f_i + w_H ∇H: ∇_q = Gᵀw_g + R_uᵀw_h + w_H ∇U, ∇_p = Gᵀw_h/m + w_H v;
        # Y = X − ∇V (q̇ loses ∇_qV, ṗ loses ∇_pV).
        dq = v - we * grad_u.reshape(-1) - (rows_transpose(d, mu / MASS + wg) + rows_transpose(u, wh)).reshape(-1)
        dp = -grad_u.reshape(-1) + (rows_transpose(d, lam - wh / MASS) + rows_transpose(u, mu)).reshape(-1) - we * v
        return dq, dp

    return field


def tri_rattle(q, p, solve=tri_solve):
    """`dense_rattle` with the tridiagonal Newton matrix −G(q₁)M⁻¹G(q)ᵀ and G(q₁)M⁻¹G(q₁)ᵀ."""
    d0 = links(points(q))
    kick = p - 0.5 * H * gravity_gradient(points(q)).reshape(-1)
    nu = jnp.zeros(d0.shape[0], q.dtype)
    for _ in range(NEWTON_ITERS):
        q1 = q + H * (kick - rows_transpose(d0, nu).reshape(-1) / H) / MASS
        d1 = links(points(q1))
        dl, dd, du = cross_gram(d1, d0)
        nu = nu + solve((dl, dd, du), constraint_values(d1))
    p_half = kick - rows_transpose(d0, nu).reshape(-1) / H
    q1 = q + H * p_half / MASS
    d1 = links(points(q1))
    p_free = p_half - 0.5 * H * gravity_gradient(points(q1)).reshape(-1)
    mu = solve(cross_gram(d1, d1), jnp.sum(d1 * links(points(p_free)), axis=1) / MASS) * (2.0 / H)
    return q1, p_free - 0.5 * H * rows_transpose(d1, mu).reshape(-1)


# --------------------------------------------------------------------------------------
# Hand derived: the floor for a field derived by autodiff. The same derivation geomjax
# makes, written by hand for this problem and nothing more: ∇H by `jax.grad`, f = (g, ġ)
# linearized, the columns k..m−1 of C = Df J Dfᵀ from 3 products Df J Dfᵀ s with fixed
# colour seeds (column k+i in seed i mod 3: A and D are tridiagonal), h = −Df X_H, the
# multipliers from two `thomas_solve`s (A, then Aᵀ), X = X_H − J Dfᵀc. No closed-form G,
# no pattern detection, no checks. Run by `geomjax.integrate`, so it differs from the
# geomjax version only in how the field is derived.


def derived_dirac(system, n2):
    """x ↦ X(x), the Dirac field of `system` (the chain's H and f) derived as above."""
    ham, f_of = system.hamiltonian, system.constraint_functions
    k = n2 // 2
    seeds = np.zeros((3, 2 * k))
    seeds[np.arange(k) % 3, k + np.arange(k)] = 1.0
    rows = np.arange(k)

    def sym(g):  # J∇: (∂/∂p, −∂/∂q)
        return jnp.concatenate([g[n2:], -g[:n2]])

    def diagonal(compressed, offset):  # entries (i, i + offset) of a tridiagonal block
        j = rows + offset
        return jnp.where((j >= 0) & (j < k), compressed[j % 3, rows], 0.0)

    def field(z):
        x_h = sym(jax.grad(ham)(z))
        _, f_jvp = jax.linearize(f_of, z)
        f_t = jax.linear_transpose(f_jvp, z)
        compressed = jax.vmap(lambda e: f_jvp(sym(f_t(e)[0])))(seeds)  # (3, m)
        top, bottom = compressed[:, :k], compressed[:, k:]
        a = tuple(diagonal(top, o) for o in (-1, 0, 1))
        dl_d, d_d, du_d = (diagonal(bottom, o) for o in (-1, 0, 1))
        h = -f_jvp(x_h)
        # Cᵀc = h with C = [[0, A], [−Aᵀ, D]], Dᵀ = −D: −A c₂ = h₁, Aᵀc₁ = h₂ + D c₂.
        c2 = -thomas_solve(a, h[:k])
        zero = jnp.zeros(1, z.dtype)
        d_c2 = d_d * c2 + dl_d * jnp.concatenate([zero, c2[:-1]]) + du_d * jnp.concatenate([c2[1:], zero])
        a_t = (jnp.concatenate([zero, a[2][:-1]]), a[1], jnp.concatenate([a[0][1:], zero]))
        c1 = thomas_solve(a_t, h[k:] + d_c2)
        return x_h - sym(f_t(jnp.concatenate([c1, c2]))[0])

    return field


def derived_feedback(system, x0):
    """Y = X − ∇V, V = ½k|(f, H) − (f, H)(x₀)|² (L = I), with X from `derived_dirac`."""
    ham, f_of = system.hamiltonian, system.constraint_functions
    dirac = derived_dirac(system, x0.shape[0] // 2)
    target = jnp.concatenate([f_of(x0), jnp.atleast_1d(ham(x0))])

    def field(z):
        w = GAIN * (jnp.concatenate([f_of(z), jnp.atleast_1d(ham(z))]) - target)
        _, f_vjp = jax.vjp(f_of, z)
        return dirac(z) - (f_vjp(w[:-1])[0] + w[-1] * jax.grad(ham)(z))

    return field


# --------------------------------------------------------------------------------------
# Loops


def euler(field):
    def step(q, p):
        dq, dp = field(q, p)
        return q + H * dq, p + H * dp

    return step


def rk4(field):
    def step(q, p):
        k1 = field(q, p)
        k2 = field(q + 0.5 * H * k1[0], p + 0.5 * H * k1[1])
        k3 = field(q + 0.5 * H * k2[0], p + 0.5 * H * k2[1])
        k4 = field(q + H * k3[0], p + H * k3[1])
        return (
            q + H / 6 * (k1[0] + 2 * k2[0] + 2 * k3[0] + k4[0]),
            p + H / 6 * (k1[1] + 2 * k2[1] + 2 * k3[1] + k4[1]),
        )

    return step


METHODS = ["dirac euler", "dirac rk4", "feedback euler", "feedback rk4", "rattle"]
VERSIONS = ["hand dense", "hand tri", "hand thomas", "hand derived", "geomjax"]  # references first, for the ratios


def make_run(method, version, model, steps):
    """x0 ↦ x_steps for one method and version."""
    sys, x0 = model.system, model.x0
    n2 = x0.shape[0] // 2
    kind, _, scheme = method.partition(" ")
    if version == "geomjax":
        if kind == "rattle":
            target, scheme = geomjax.rattle(sys), "euler"  # method is ignored for steps
        elif kind == "dirac":
            target = geomjax.dirac_field(sys)
        else:
            target = geomjax.feedback_field(sys, x0, gains=GAIN)
        return lambda x: geomjax.integrate(target, x, dt=H, steps=steps, method=scheme, save_every=steps).xs[-1]
    if version == "hand derived":
        if kind == "rattle":
            return None  # a step, not a field: no derived floor
        field = derived_dirac(sys, n2) if kind == "dirac" else derived_feedback(sys, x0)
        return lambda x: geomjax.integrate(field, x, dt=H, steps=steps, method=scheme, save_every=steps).xs[-1]
    dense = version == "hand dense"
    solve = thomas_solve if version == "hand thomas" else tri_solve
    if kind == "rattle":
        step = dense_rattle if dense else functools.partial(tri_rattle, solve=solve)
    else:
        if kind == "dirac":
            field = dense_dirac if dense else functools.partial(tri_dirac, solve=solve)
        else:
            field = dense_feedback(x0) if dense else tri_feedback(x0, solve)
        step = euler(field) if scheme == "euler" else rk4(field)
    return scan_loop(step, steps, n2)


# --------------------------------------------------------------------------------------
# Checks


def _rel(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def check(n, tol=1e-10, with_geomjax=True):
    """Assert tri == dense and geomjax == dense at x0 and at a state off S; return the errors.

    `with_geomjax=False` checks only the hand versions (geomjax's fields compile slowly at
    large N; the timed runs still print their final-state difference from hand dense).
    """
    model = geomjax.models.planar_chain(n, mass=MASS, length=LENGTH, gravity=GRAVITY)
    sys, x0 = model.system, model.x0
    off = x0 + 1e-3 * jnp.asarray(np.random.default_rng(n).normal(size=x0.shape))
    cat = lambda qp: jnp.concatenate(qp)
    errs = {}
    for name, x in [("x0", x0), ("off S", off)]:
        q, p = x[: 2 * n], x[2 * n :]
        dense = cat(dense_dirac(q, p))
        errs[f"tri dirac {name}"] = _rel(cat(tri_dirac(q, p)), dense)
        errs[f"thomas dirac {name}"] = _rel(cat(tri_dirac(q, p, thomas_solve)), dense)
        errs[f"derived dirac {name}"] = _rel(derived_dirac(sys, 2 * n)(x), dense)
        if with_geomjax:
            errs[f"geomjax dirac {name}"] = _rel(geomjax.dirac_field(sys)(x), dense)
        fb_dense = cat(dense_feedback(x0)(q, p))
        errs[f"tri feedback {name}"] = _rel(cat(tri_feedback(x0)(q, p)), fb_dense)
        errs[f"thomas feedback {name}"] = _rel(cat(tri_feedback(x0, thomas_solve)(q, p)), fb_dense)
        errs[f"derived feedback {name}"] = _rel(derived_feedback(sys, x0)(x), fb_dense)
        if with_geomjax:
            errs[f"geomjax feedback {name}"] = _rel(geomjax.feedback_field(sys, x0, gains=GAIN)(x), fb_dense)
    q, p = x0[: 2 * n], x0[2 * n :]
    rattle_dense = cat(dense_rattle(q, p))
    errs["tri rattle step"] = _rel(cat(tri_rattle(q, p)), rattle_dense)
    errs["thomas rattle step"] = _rel(cat(tri_rattle(q, p, thomas_solve)), rattle_dense)
    if with_geomjax:
        errs["geomjax rattle step"] = _rel(geomjax.rattle(sys)(x0, H), rattle_dense)
    bad = {k: v for k, v in errs.items() if not v <= tol}
    assert not bad, f"N = {n}: disagreement above {tol:g}: {bad}"
    return errs


# --------------------------------------------------------------------------------------
# Timing


def time_case(run, x0, steps, repeat):
    t = time.perf_counter()
    lowered = jax.jit(run).lower(x0)
    t_lower = time.perf_counter() - t
    t = time.perf_counter()
    compiled = lowered.compile()
    t_compile = time.perf_counter() - t
    t = time.perf_counter()
    out = jax.block_until_ready(compiled(x0))
    t_first = time.perf_counter() - t
    best = math.inf
    for _ in range(repeat if t_first < 5.0 else 1):  # one warm run when a run takes seconds
        t = time.perf_counter()
        jax.block_until_ready(compiled(x0))
        best = min(best, time.perf_counter() - t)
    return dict(lower=t_lower, compile=t_compile, first=t_first, ns=best / steps * 1e9, out=out)


def run_isolated(method, n, args):
    """Time a geomjax case in a child process, killed after `args.case_timeout` seconds.

    XLA compilation cannot be interrupted in-process, and geomjax's compile time jumps
    (not smoothly) at some N, so each geomjax case runs in its own interpreter.
    Returns the result dict, or a string saying why there is none.
    """
    cmd = [
        sys.executable,
        __file__,
        "--single",
        f"{method}|{n}",
        "--steps",
        str(args.steps),
        "--repeat",
        str(args.repeat),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.case_timeout)
    except subprocess.TimeoutExpired:
        return f"killed after {args.case_timeout:g} s (compile or run too slow)"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return f"failed: {(proc.stderr.strip().splitlines() or ['?'])[-1][:100]}"
    r = json.loads(lines[-1][len("RESULT ") :])
    r["out"] = jnp.asarray(r["out"])
    return r


def single(spec, steps, repeat):
    """Child-process entry of `run_isolated`: time one geomjax case, print it as JSON."""
    method, n = spec.split("|")
    model = geomjax.models.planar_chain(int(n), mass=MASS, length=LENGTH, gravity=GRAVITY)
    r = time_case(make_run(method, "geomjax", model, steps), model.x0, steps, repeat)
    r["out"] = np.asarray(r["out"]).tolist()
    print("RESULT " + json.dumps(r), flush=True)


def print_floors(fields, ns, steps):
    """The interleaved timings of `interleaved` for each field method and N ≥ 4, as a table."""
    print()
    print("fields against the floors, interleaved in one process (best of 9 runs of each, ns/step):")
    print("closed form = hand thomas (closed-form G, no autodiff); derived = hand derived (the same")
    print("autodiff derivation as geomjax written by hand, run by geomjax.integrate). A derived field")
    print("can reach the derived floor, not the closed form (target: geomjax <= 1.5 x closed form):")
    print(f"{'method':<15}{'N':>3}{'closed form':>13}{'derived':>9}{'geomjax':>9}{'/closed':>9}{'/derived':>9}")
    for method in fields:
        for n in [n for n in ns if n >= 4]:
            interleaved(method, n, steps)


def interleaved(method, n, steps, repeat=9):
    """Print the closed-form hand, derived hand and geomjax fields' ns/step, timed in turn."""
    model = geomjax.models.planar_chain(n, mass=MASS, length=LENGTH, gravity=GRAVITY)
    compiled = [
        jax.jit(make_run(method, v, model, steps)).lower(model.x0).compile()
        for v in ("hand thomas", "hand derived", "geomjax")
    ]
    best = [math.inf] * 3
    for _ in range(repeat):
        for i, c in enumerate(compiled):
            t = time.perf_counter()
            jax.block_until_ready(c(model.x0))
            best[i] = min(best[i], time.perf_counter() - t)
    closed, derived, gj = (b / steps * 1e9 for b in best)
    print(
        f"{method:<15}{n:>3}{closed:>13.0f}{derived:>9.0f}{gj:>9.0f}{gj / closed:>9.2f}{gj / derived:>9.2f}", flush=True
    )


def slope(ns, ts, n_min=4):
    pts = [(math.log(n), math.log(t)) for n, t in zip(ns, ts) if n >= n_min and t > 0]
    if len(pts) < 2:
        return None
    x, y = np.array(pts).T
    return float(np.polyfit(x, y, 1)[0])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--links", default="1,2,3,4,6,8,9,12,16,24,32", help="comma-separated numbers of links N")
    parser.add_argument("--steps", type=int, default=2000, help="steps per timed run")
    parser.add_argument("--repeat", type=int, default=5, help="warm runs (the best is reported)")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of " + ", ".join(METHODS))
    parser.add_argument("--compile-limit", type=float, default=60.0, help="skip larger N after a compile this slow [s]")
    parser.add_argument(
        "--check-links", type=int, default=8, help="check geomjax's fields against hand dense up to this N"
    )
    parser.add_argument(
        "--predict-limit", type=float, default=120.0, help="skip N whose predicted compile exceeds this [s]"
    )
    parser.add_argument(
        "--case-timeout",
        type=float,
        default=150.0,
        help="kill a geomjax case (own process) after this many seconds and skip larger N",
    )
    parser.add_argument("--quick", action="store_true", help="N = 1, 2, 4 and 200 steps")
    parser.add_argument(
        "--floors-only", action="store_true", help="only the interleaved closed-form / derived / geomjax field timings"
    )
    parser.add_argument("--single", help=argparse.SUPPRESS)  # internal: one geomjax case
    args = parser.parse_args(argv)
    if args.single:
        return single(args.single, args.steps, args.repeat)
    if args.quick:
        args.links, args.steps, args.repeat = "1,2,4", 200, 3
    ns = [int(s) for s in args.links.split(",")]
    methods = [m.strip() for m in args.methods.split(",")]
    print(
        f"planar chain, h = {H:g}, {args.steps} steps, k = {GAIN:g}; device {jax.devices()[0]}; jax {jax.__version__}"
    )

    if args.floors_only:
        print_floors([m for m in methods if m != "rattle"], ns, args.steps)
        return None
    for n in ns:
        errs = check(n, with_geomjax=n <= args.check_links)
        gj = [v for k, v in errs.items() if k.startswith("geomjax")]
        print(
            f"checks N = {n:>2}: worst relative disagreement {max(errs.values()):.1e} "
            f"(geomjax vs dense: {f'{max(gj):.1e}' if gj else 'not checked'})",
            flush=True,
        )

    results = {}  # (method, version) -> {n: dict}
    skipped = {}
    header = (
        f"{'method':<15}{'version':<12}{'N':>3}{'lower s':>9}{'compile s':>10}{'1st run s':>10}"
        f"{'ns/step':>11}{'/dense':>8}{'/tri':>8}{'/thomas':>8}{'/derived':>9}{'|Δx| vs dense':>15}"
    )
    print()
    print(header, flush=True)
    for method in methods:
        for n in ns:
            model = geomjax.models.planar_chain(n, mass=MASS, length=LENGTH, gravity=GRAVITY)
            row = {}
            for version in VERSIONS:
                key = (method, version)
                res = results.setdefault(key, {})
                if key in skipped:
                    print(f"{method:<15}{version:<12}{n:>3}  {skipped[key]}", flush=True)
                    continue
                if version == "geomjax":
                    r = run_isolated(method, n, args)
                elif make_run(method, version, model, args.steps) is None:
                    continue
                else:
                    try:
                        r = time_case(make_run(method, version, model, args.steps), model.x0, args.steps, args.repeat)
                    except Exception as e:  # report and go on
                        r = f"failed: {type(e).__name__}: {str(e)[:80]}"
                if isinstance(r, str):
                    print(f"{method:<15}{version:<12}{n:>3}  {r}", flush=True)
                    skipped[key] = f"skipped ({r.split(':')[0]} at smaller N)"
                    continue
                res[n] = row[version] = r
                total = r["lower"] + r["compile"]
                dense, tri, thomas = row.get("hand dense"), row.get("hand tri"), row.get("hand thomas")
                derived = row.get("hand derived")
                ratio = lambda ref, w=8: f"{r['ns'] / ref['ns']:>{w}.2f}" if ref else f"{'':>{w}}"
                dx = float(jnp.max(jnp.abs(r["out"] - dense["out"]))) if dense else float("nan")
                print(
                    f"{method:<15}{version:<12}{n:>3}{r['lower']:>9.2f}{r['compile']:>10.2f}{r['first']:>10.3f}"
                    f"{r['ns']:>11.0f}{ratio(dense)}{ratio(tri)}{ratio(thomas)}{ratio(derived, 9)}{dx:>15.1e}",
                    flush=True,
                )
                if total > args.compile_limit:
                    skipped[key] = (
                        f"skipped (compile > {args.compile_limit:g} s at smaller N: {total:.0f} s at N = {n})"
                    )
                else:
                    done = sorted(res)
                    if len(done) >= 2:
                        prev = res[done[-2]]["lower"] + res[done[-2]]["compile"]
                        predicted = total * max(total / prev, 1.0)
                        if predicted > args.predict_limit:
                            skipped[key] = (
                                f"skipped (predicted compile {predicted:.0f} s > {args.predict_limit:g} s "
                                f"from {prev:.1f} s -> {total:.1f} s)"
                            )

    print()
    print("geomjax / hand thomas (run time per step; targets: fields <= 1.5, RATTLE <= 2), and geomjax's")
    print("lower + compile time in s (target <= 2 s); '*' marks a missed target:")
    for method in methods:
        gj, th = results.get((method, "geomjax"), {}), results.get((method, "hand thomas"), {})
        target = 2.0 if method == "rattle" else 1.5
        cells = []
        for n in sorted(set(gj) & set(th)):
            ratio = gj[n]["ns"] / th[n]["ns"]
            total = gj[n]["lower"] + gj[n]["compile"]
            cells.append(
                f"N={n}: {ratio:.2f}{'*' if ratio > target else ''} ({total:.1f}{'*' if total > 2.0 else ''} s)"
            )
        print(f"{method:<15}" + ", ".join(cells))

    if not args.quick:
        print_floors([m for m in methods if m != "rattle"], ns, args.steps)

    print()
    print("growth exponents, least-squares log-log slope over N >= 4 (t ~ N^a):")
    print(f"{'method':<15}{'version':<12}{'a(compile)':>11}{'a(run)':>8}  N measured")
    for (method, version), res in results.items():
        done = sorted(res)
        if not done:
            continue
        a_c = slope(done, [res[n]["lower"] + res[n]["compile"] for n in done])
        a_r = slope(done, [res[n]["ns"] for n in done])
        fmt = lambda a: f"{a:>.2f}" if a is not None else "-"
        print(f"{method:<15}{version:<12}{fmt(a_c):>11}{fmt(a_r):>8}  {done}")


if __name__ == "__main__":
    main()
