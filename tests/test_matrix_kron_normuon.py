"""Kron, NorMuon and the Polar Express coefficients, against NumPy transcriptions of
their references (psgd-jax 0.2.9 `kron`; zichongli5/NorMuon `normuon_update`;
modded-nanogpt's `polar_express`), in float64, several steps; their routing, memory
and errors. (Dtype/scan/MultiSteps properties come from the registry:
tests/registry/matrix.py.)"""

import string
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
import pytest
import scipy.linalg

import eqxopt

from .helpers import random_like


# --- psgd-jax's kron, transcribed into NumPy -----------------------------------------

LETTERS = string.ascii_lowercase + string.ascii_uppercase


def np_init_q_exprs(shape, scale, max_size, min_ndim, mode):
    """`psgd_jax.kron._init_Q_exprs`: initial factors and einsum expressions."""
    if len(shape) == 0:
        return [scale * np.ones(())], (",->", [",->"], ",,->")
    scale = scale ** (1 / len(shape))
    if mode is None:
        dim_diag = [False] * len(shape)
    elif mode == "one_diag":
        dim_diag = [False] * len(shape)
        dim_diag[np.argsort(shape)[::-1][0]] = True
    else:
        dim_diag = [True] * len(shape)
    Q, exprGs = [], []
    piece1A, piece2A, piece3A = [], "", ""
    piece1P, piece2P, piece3P, piece4P = [], [], "", ""
    for i, (size, dim_d) in enumerate(zip(shape, dim_diag)):
        piece1 = "".join(
            LETTERS[i + 13] if j == i else LETTERS[j] for j in range(len(shape))
        )
        if size == 1 or size > max_size or len(shape) < min_ndim or dim_d:
            Q.append(scale * np.ones(size))
            piece1A.append(LETTERS[i])
            piece2A += LETTERS[i]
            piece3A += LETTERS[i]
            exprGs.append(piece1 + "," + piece1 + "->" + LETTERS[i + 13])
            piece1P.append(LETTERS[i + 13])
            piece2P.append(LETTERS[i + 13])
            piece3P += LETTERS[i + 13]
            piece4P += LETTERS[i + 13]
        else:
            Q.append(scale * np.eye(size))
            piece1A.append(LETTERS[i] + LETTERS[i + 13])
            piece2A += LETTERS[i + 13]
            piece3A += LETTERS[i]
            piece2 = "".join(
                LETTERS[i + 26] if j == i else LETTERS[j] for j in range(len(shape))
            )
            exprGs.append(
                piece1 + "," + piece2 + "->" + LETTERS[i + 13] + LETTERS[i + 26]
            )
            a, b, c = LETTERS[i], LETTERS[i + 13], LETTERS[i + 26]
            piece1P.append(a + b)
            piece2P.append(a + c)
            piece3P += c
            piece4P += b
    exprA = ",".join(piece1A) + "," + piece2A + "->" + piece3A
    exprP = ",".join(piece1P) + "," + ",".join(piece2P) + "," + piece3P + "->" + piece4P
    return Q, (exprA, exprGs, exprP)


def np_solve_right(X, A):
    """X @ inv(A), A upper triangular (`_solve_triangular_right`)."""
    flat = X.reshape(-1, X.shape[-1]) if X.ndim > 1 else X[None, :]
    out = scipy.linalg.solve_triangular(A, flat.T, trans=1, lower=False).T
    return out.reshape(X.shape)


def np_conj_b(Q, V):
    order = V.ndim
    p = list(range(order))
    conjB = np.transpose(V.conj(), p[1:] + p[:1])
    for i, q in enumerate(Q):
        conjB = conjB / q if q.ndim < 2 else np_solve_right(conjB, q)
        if i < order - 1:
            conjB = np.swapaxes(conjB, i, order - 1)
    return conjB


def np_norm_lower_bound(A):
    max_abs = np.max(np.abs(A))
    if not max_abs > 0:
        return max_abs
    A = A / max_abs
    aa = np.real(A * A.conj())
    s0, s1 = aa.sum(0), aa.sum(1)
    i, j = np.argmax(s0), np.argmax(s1)
    if s0[i] > s1[j]:
        x = A[:, i].conj() @ A
        return max_abs * np.linalg.norm((x / np.linalg.norm(x)) @ A.conj().T)
    x = A @ A[j].conj()
    return max_abs * np.linalg.norm(A.conj().T @ (x / np.linalg.norm(x)))


def np_update_precond(Q, G, conjB, exprs, lr):
    exprA, exprGs, _ = exprs
    A = np.einsum(exprA, *Q, G)
    out = []
    for i, q in enumerate(Q):
        term1 = np.einsum(exprGs[i], A, A.conj())
        term2 = np.einsum(exprGs[i], conjB.conj(), conjB)
        tmp = (term1 - term2) * lr
        tiny = np.finfo(np.float64).tiny
        if q.ndim < 2:
            tmp = tmp * q / (np.max(np.abs(term1 + term2)) + tiny)
            out.append(q - tmp)
        else:
            tmp = np.triu(tmp) / (np_norm_lower_bound(term1 + term2) + tiny)
            out.append(q - tmp @ q)
    return out


def np_precond_grad(Q, G, exprs):
    return np.einsum(exprs[-1], *[q.conj() for q in Q], *Q, G)


def np_balance(Q):
    norms = np.array([np.max(np.abs(q)) for q in Q])
    gmean = np.prod(norms) ** (1 / len(norms))
    return [q * (gmean / n) for q, n in zip(Q, norms)]


def ref_prob_schedule(
    n, max_prob=1.0, min_prob=0.03, decay=0.001, flat_start=500
) -> float:
    """`psgd_jax.kron.precond_update_prob_schedule()`, at psgd-jax's count `n`."""
    return float(
        min(max(max_prob * np.exp(-decay * (n - flat_start)), min_prob), max_prob)
    )


def psgd_draws(key, count, shapes):
    """psgd-jax's random draws at update `count` (0-based), from `key` in place of its
    `PRNGKey(5318008)`: `fold_in`, one split for the preconditioner update, then the
    balancing coin and one probe vector per leaf (float64 here)."""
    key = jr.fold_in(key, count)
    _, subkey = jr.split(key)
    key, sub = jr.split(subkey)
    balance = bool(jr.uniform(sub, dtype=jnp.float32) < 0.01)
    _, sub = jr.split(key)
    keys = jr.split(sub, len(shapes))
    vs = [np.asarray(jr.normal(k, s, jnp.float64)) for k, s in zip(keys, shapes)]
    return balance, vs


def np_kron(
    params,
    grads_seq,
    *,
    key,
    lr,
    b1=0.9,
    wd=0.0,
    prob: Any = ref_prob_schedule,
    precond_lr=0.1,
    init_scale=1.0,
    max_size=8192,
    min_ndim=2,
    mode=None,
    momentum_into=True,
    scanned=(),
    wd_mask=None,
):
    """psgd-jax 0.2.9 `kron` on a dict of float64 arrays; `scanned` names leaves
    mapped over their first axis. Returns (params, mu, Qs, update_counter)."""
    names = sorted(params)  # jax's dict flattening order
    params = {k: np.asarray(params[k], np.float64) for k in names}
    Qs, exprs = {}, {}
    for k in names:
        shape = params[k].shape[1:] if k in scanned else params[k].shape
        Q, e = np_init_q_exprs(shape, init_scale, max_size, min_ndim, mode)
        if k in scanned:
            Q = [np.stack([q] * params[k].shape[0]) for q in Q]
        Qs[k], exprs[k] = Q, e
    mu = {k: np.zeros_like(params[k]) for k in names}
    counter = 0
    for step, grads in enumerate(grads_seq):
        n = step + 1
        g = {k: np.asarray(grads[k], np.float64) for k in names}
        mu = {k: b1 * mu[k] + (1 - b1) * g[k] for k in names}
        mom = {k: mu[k] / (1 - b1**n) for k in names}
        p = float(prob) if isinstance(prob, (int, float)) else float(prob(n))
        counter += 1
        if counter >= 1 / p:
            counter = 0
            balance, vs = psgd_draws(key, step, [params[k].shape for k in names])
            if balance:
                Qs = {
                    k: (
                        [
                            np.stack(x)
                            for x in zip(*(np_balance(list(q)) for q in zip(*Qs[k])))
                        ]
                        if k in scanned
                        else np_balance(Qs[k])
                    )
                    if len(Qs[k]) > 1
                    else Qs[k]
                    for k in names
                }
            src = mom if momentum_into else g
            for k, v in zip(names, vs):
                h = (
                    src[k]
                    + np.sqrt(np.finfo(np.float32).eps) * np.mean(np.abs(src[k])) * v
                )
                if k in scanned:
                    layers = [
                        np_update_precond(
                            [q[i] for q in Qs[k]],
                            h[i],
                            np_conj_b([q[i] for q in Qs[k]], v[i]),
                            exprs[k],
                            precond_lr,
                        )
                        for i in range(h.shape[0])
                    ]
                    Qs[k] = [np.stack(x) for x in zip(*layers)]
                else:
                    conjB = np_conj_b(Qs[k], v)
                    Qs[k] = np_update_precond(Qs[k], h, conjB, exprs[k], precond_lr)
        for k in names:
            if k in scanned:
                u = np.stack(
                    [
                        np_precond_grad([q[i] for q in Qs[k]], mom[k][i], exprs[k])
                        for i in range(mom[k].shape[0])
                    ]
                )
            else:
                u = np_precond_grad(Qs[k], mom[k], exprs[k])
            u = u / max(1.0, np.sqrt(np.mean(u * u)) / 1.1)
            if wd > 0 and (wd_mask is None or k in wd_mask):
                u = u + wd * params[k]
            params[k] = params[k] - lr * u
    return params, mu, Qs, counter


KRON_SHAPES = {"w": (5, 3), "b": (5,), "s": (), "k": (2, 3, 4), "wide": (9, 2)}
REF_KEY = 5318008  # psgd-jax's fixed seed


def _params(shapes, seed=0):
    keys = jr.split(jr.key(seed), len(shapes))
    return {
        k: jr.normal(key, s, jnp.float64) for key, (k, s) in zip(keys, shapes.items())
    }


def _run(opt, params, grads_seq):
    state = opt.init(params)
    step = eqx.filter_jit(opt.step)
    for grads in grads_seq:
        params, state = step(params, grads, state)
    return params, state


def test_psgd_key_is_the_typed_key_of_the_same_seed():
    # psgd-jax draws from fold_in(PRNGKey(5318008), count); `key=5318008` gives the
    # same bits, so its draws are psgd-jax's.
    legacy = jr.PRNGKey(REF_KEY)
    typed = jr.key(REF_KEY)
    assert np.array_equal(jr.key_data(typed), legacy)
    assert np.array_equal(jr.key_data(jr.fold_in(typed, 7)), jr.fold_in(legacy, 7))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(b1=0.9, weight_decay=0.0),
        dict(b1=0.5, weight_decay=0.1, max_size_triangular=4),
        dict(memory_save_mode="one_diag", momentum_into_precond_update=False),
        dict(memory_save_mode="all_diag", preconditioner_init_scale=2.0),
        dict(min_ndim_triangular=1, preconditioner_lr=0.3),
    ],
    ids=["default", "wd_small_triangular", "one_diag_raw", "all_diag", "1d_triangular"],
)
def test_kron_matches_psgd_jax_with_probability_one(kwargs):
    params = _params(KRON_SHAPES)
    grads_seq = [random_like(jr.key(i + 1), params) for i in range(5)]
    opt = eqxopt.Kron(
        0.01, preconditioner_update_probability=1.0, key=REF_KEY, **kwargs
    )
    p, state = _run(opt, params, grads_seq)
    want_p, want_mu, want_q, counter = np_kron(
        params,
        grads_seq,
        key=jr.key(REF_KEY),
        lr=0.01,
        b1=kwargs.get("b1", 0.9),
        wd=kwargs.get("weight_decay", 0.0),
        prob=1.0,
        precond_lr=kwargs.get("preconditioner_lr", 0.1),
        init_scale=kwargs.get("preconditioner_init_scale", 1.0),
        max_size=kwargs.get("max_size_triangular", 8192),
        min_ndim=kwargs.get("min_ndim_triangular", 2),
        mode=kwargs.get("memory_save_mode"),
        momentum_into=kwargs.get("momentum_into_precond_update", True),
    )
    # float64 throughout; the two differ only in summation order (tensordot vs
    # einsum) and in the triangular solver, ~1e-15 relative per operation.
    for k in KRON_SHAPES:
        np.testing.assert_allclose(p[k], want_p[k], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(state.mu[k], want_mu[k], rtol=1e-12, atol=1e-14)
        assert len(state.Qs[k]) == len(want_q[k])
        for q, wq in zip(state.Qs[k], want_q[k]):
            np.testing.assert_allclose(q, wq, rtol=1e-9, atol=1e-12)
    assert int(state.update_counter) == counter == 0
    assert int(state.count) == 5


def _primitive_count(jaxpr, name: str) -> int:
    """How many times the primitive `name` is bound in a jaxpr, sub-jaxprs
    (`cond` branches, `vmap`-ed or `jit`-ted calls) included."""
    count = 0
    for eqn in jaxpr.eqns:
        count += eqn.primitive.name == name
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                sub = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's jaxpr
                if hasattr(sub, "eqns"):
                    count += _primitive_count(sub, name)
    return count


def test_kron_leaves_draw_psgd_jax_noise_in_one_call():
    # Every leaf's noise comes from one `vmap`-ed call over chunks of the draws: each
    # leaf's draw is still psgd-jax's (from its own key), and the program holds one
    # normal sampler, not one per leaf or per shape (the per-leaf copies were half of
    # the compiled program on a 63-leaf tree).
    shapes = {"a": (4, 3), "b": (4, 3), "c": (4, 3), "d": (5,), "e": (5,)}
    params = _params(shapes, seed=3)
    grads_seq = [random_like(jr.key(i + 1), params) for i in range(3)]
    opt = eqxopt.Kron(0.01, preconditioner_update_probability=1.0, key=REF_KEY)
    p, state = _run(opt, params, grads_seq)
    want_p, want_mu, want_q, _ = np_kron(
        params, grads_seq, key=jr.key(REF_KEY), lr=0.01, prob=1.0
    )
    for k in shapes:
        np.testing.assert_allclose(p[k], want_p[k], rtol=1e-9, atol=1e-12)
        for q, wq in zip(state.Qs[k], want_q[k]):
            np.testing.assert_allclose(q, wq, rtol=1e-9, atol=1e-12)
    jaxpr = jax.make_jaxpr(opt.update)(params, opt.init(params), params)
    assert _primitive_count(jaxpr.jaxpr, "erf_inv") == 1


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("kinds", [(2, 2), (1, 2), (2, 1), (1, 1)])
def test_kron_solves_a_matrix_leaf_as_psgd_jax(kinds, dtype):
    # A matrix leaf's two solves run on transposed views (no copies in XLA); each
    # factor triangular (2) or diagonal (1). The same values as psgd-jax's order of
    # moves and solves, to rounding.
    from eqxopt._matrix.kron import _conj_b

    rng = np.random.default_rng(0)

    def draw(*shape):
        x = rng.standard_normal(shape)
        return x + 1j * rng.standard_normal(shape) if dtype is np.complex128 else x

    m, n = 5, 3
    qs = [
        np.triu(draw(d, d)) + 3 * np.eye(d) if k == 2 else draw(d) + 3
        for d, k in zip((m, n), kinds)
    ]
    v = draw(m, n)
    with jax.enable_x64(True):
        got = jax.jit(_conj_b)([jnp.asarray(q) for q in qs], jnp.asarray(v))
        np.testing.assert_allclose(np.asarray(got), np_conj_b(qs, v), rtol=1e-12)


def test_kron_routing_of_1d_and_oversized_axes():
    opt = eqxopt.Kron(1e-3, max_size_triangular=4)
    state = opt.init(_params(KRON_SHAPES))
    shapes = {k: [q.shape for q in qs] for k, qs in state.Qs.items()}
    assert shapes == {
        "w": [(5,), (3, 3)],  # 5 > max_size_triangular: diagonal
        "b": [(5,)],  # rank 1 < min_ndim_triangular: diagonal
        "s": [()],  # a 0-d leaf: one scalar
        "k": [(2, 2), (3, 3), (4, 4)],
        "wide": [(9,), (2, 2)],
    }
    one_diag = eqxopt.Kron(1e-3, memory_save_mode="one_diag").init(
        {"w": jnp.ones((4, 4, 2))}
    )
    assert [q.shape for q in one_diag.Qs["w"]] == [(4, 4), (4,), (2, 2)]  # last largest


def _balancing_seed(steps) -> tuple[int, int]:
    """A seed whose balancing coin comes up at one of `steps` (found by search, so that
    the balancing path is certainly exercised)."""
    for seed in range(5000):
        for step in steps:
            if psgd_draws(jr.key(seed), step, [])[0]:
                return seed, step
    raise AssertionError("no balancing draw found")


def _prob(count):
    """0.75 for eqxopt counts 0 and 1, then 0.5: the preconditioner is updated when
    the counter reaches 1/p, i.e. at updates 1, 3 and 5."""
    return jnp.where(count < 2, 0.75, 0.5)


def test_kron_random_path_matches_psgd_jax_with_the_same_draws():
    # An update probability below 1 (psgd-jax 0.2.9 turns it into a counter), a
    # balancing draw, scanned layers, a weight-decay mask, and a key other than
    # psgd-jax's: the draws follow the key.
    seed, _ = _balancing_seed((1, 3, 5))
    shapes = {"w": (4, 3), "stack": (3, 2, 5), "b": (4,)}
    params = _params(shapes, seed=3)
    grads_seq = [random_like(jr.key(i + 10), params) for i in range(6)]
    opt = eqxopt.Kron(
        0.02,
        weight_decay=0.01,
        weight_decay_mask={"w": True, "stack": True, "b": False},
        preconditioner_update_probability=_prob,
        scanned_layers={"w": False, "stack": True, "b": False},
        key=jr.key(seed),
    )
    p, state = _run(opt, params, grads_seq)
    want_p, want_mu, want_q, counter = np_kron(
        params,
        grads_seq,
        key=jr.key(seed),
        lr=0.02,
        wd=0.01,
        wd_mask=("w", "stack"),
        prob=lambda n: float(_prob(n - 1)),  # psgd-jax's count n = eqxopt's + 1
        scanned=("stack",),
    )
    for k in shapes:
        np.testing.assert_allclose(p[k], want_p[k], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(state.mu[k], want_mu[k], rtol=1e-12, atol=1e-14)
        for q, wq in zip(state.Qs[k], want_q[k]):
            np.testing.assert_allclose(q, wq, rtol=1e-9, atol=1e-12)
    assert int(state.update_counter) == counter == 0
    # Scanned layers get their own factors: (3, 2, 2) and (3, 5, 5).
    assert [q.shape for q in state.Qs["stack"]] == [(3, 2, 2), (3, 5, 5)]


def test_kron_weight_decay_and_balancing_match_psgd_jax():
    seed, step = _balancing_seed(range(4))
    params = _params({"w": (4, 3), "k": (2, 3, 2)}, seed=5)
    grads_seq = [random_like(jr.key(i + 20), params) for i in range(step + 2)]
    opt = eqxopt.Kron(
        0.02, weight_decay=0.05, preconditioner_update_probability=1.0, key=seed
    )
    p, state = _run(opt, params, grads_seq)
    want_p, _, want_q, _ = np_kron(
        params, grads_seq, key=jr.key(seed), lr=0.02, wd=0.05, prob=1.0
    )
    for k in params:
        np.testing.assert_allclose(p[k], want_p[k], rtol=1e-9, atol=1e-12)
        for q, wq in zip(state.Qs[k], want_q[k]):
            np.testing.assert_allclose(q, wq, rtol=1e-9, atol=1e-12)


def test_kron_default_schedule_is_psgd_jax_shifted_to_eqxopt_counts():
    schedule = eqxopt.PrecondUpdateProbSchedule()
    for k in (0, 1, 498, 499, 500, 1000, 4000, 10_000):
        np.testing.assert_allclose(
            float(schedule(k)), ref_prob_schedule(k + 1), rtol=1e-6
        )
    opt = eqxopt.Kron(1e-3)
    assert opt.hyperparams(opt.init({"w": jnp.ones((2, 2))}))[
        "preconditioner_update_probability"
    ] == pytest.approx(1.0)


def test_kron_default_schedule_updates_every_step_then_less_often():
    # 1/p rounded up: at eqxopt count k the update happens when the counter reaches
    # ceil(1/p(k)); with p = 0.03 (late training) that is every 34 updates.
    params = {"w": jnp.ones((3, 2), jnp.float32)}
    opt = eqxopt.Kron(1e-3)
    state = opt.init(params)
    state = eqx.tree_at(lambda s: s.count, state, jnp.asarray(20_000, jnp.int32))
    step = eqx.filter_jit(opt.update)
    grads = {"w": jnp.ones((3, 2), jnp.float32)}
    counters = []
    for _ in range(35):
        _, state = step(grads, state, params)
        counters.append(int(state.update_counter))
    assert counters[:33] == list(range(1, 34)) and counters[33] == 0


# --- NorMuon ------------------------------------------------------------------------


def np_newton_schulz(v, coeffs=((3.4445, -4.7750, 2.0315),) * 5, eps=1e-7):
    tall = v.shape[0] > v.shape[1]
    x = v.T if tall else v
    x = x / (np.linalg.norm(x) + eps)
    for a, b, c in coeffs:
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def np_normuon(params, grads_seq, *, lr, momentum, beta2, wd, nesterov=True):
    """zichongli5/NorMuon `SingleDeviceNorMuon.step` (`normuon_update`), float64, on a
    dict of (out, in) matrices. Returns (params, momentum, second moments)."""
    params = {k: np.asarray(v, np.float64) for k, v in params.items()}
    mom = {k: np.zeros_like(v) for k, v in params.items()}
    second = {k: np.zeros_like(v[..., 0:1]) for k, v in params.items()}
    for grads in grads_seq:
        for k, p in params.items():
            g = np.asarray(grads[k], np.float64)
            mom[k] = mom[k] + (1 - momentum) * (g - mom[k])  # lerp_
            u = g + momentum * (mom[k] - g) if nesterov else mom[k]
            u = np_newton_schulz(u)
            vnorm = np.linalg.norm(u)
            v_mean = np.mean(u * u, axis=-1, keepdims=True)
            second[k] = second[k] + (1 - beta2) * (v_mean - second[k])
            u = u * (1 / (np.sqrt(second[k]) + 1e-10))
            u = u * (vnorm / (np.linalg.norm(u) + 1e-10))
            u = u * max(1, p.shape[-2] / p.shape[-1]) ** 0.5
            if wd:
                p = p * (1 - lr * wd)
            params[k] = p - lr * u
    return params, mom, second


@pytest.mark.parametrize("nesterov, wd", [(True, 0.0), (True, 0.1), (False, 0.05)])
def test_normuon_matches_reference(nesterov, wd):
    shapes = {"wide": (3, 7), "tall": (7, 3), "square": (5, 5)}
    params = _params(shapes, seed=1)
    grads_seq = [random_like(jr.key(i + 1), params) for i in range(4)]
    opt = eqxopt.NorMuon(
        0.02, momentum=0.9, beta2=0.8, nesterov=nesterov, weight_decay=wd
    )
    p, state = _run(opt, params, grads_seq)
    want_p, want_m, want_v = np_normuon(
        params, grads_seq, lr=0.02, momentum=0.9, beta2=0.8, wd=wd, nesterov=nesterov
    )
    # float64; the reference's p * (1 - lr wd) - lr u is our p + (-lr (u + wd p)):
    # equal up to rounding.
    for k in shapes:
        np.testing.assert_allclose(p[k], want_p[k], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(state.mu[k], want_m[k], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(state.nu[k], want_v[k], rtol=1e-10, atol=1e-14)


def test_normuon_defaults_are_the_reference_ones():
    opt = eqxopt.NorMuon()
    assert (opt.learning_rate, opt.momentum, opt.beta2, opt.weight_decay) == (
        0.02,
        0.95,
        0.95,
        0.0,
    )
    assert opt.nesterov and opt.ns_steps == 5 and opt.eps == 1e-7
    assert opt.norm_eps == 1e-10


def test_normuon_routes_like_muon_and_fallback_leaves_equal_adamw():
    params = {"w": jnp.ones((4, 3)), "b": jnp.linspace(-1.0, 1.0, 4), "s": jnp.ones(())}
    grads_seq = [random_like(jr.key(i), params) for i in range(3)]
    p, state = _run(eqxopt.NorMuon(0.01, weight_decay=0.1), params, grads_seq)
    assert state.nu["w"].shape == (4, 1) and state.nu["b"] is None
    alone = {"b": params["b"], "s": params["s"]}
    p_adamw, _ = _run(
        eqxopt.AdamW(0.01, weight_decay=0.1),  # pyright: ignore[reportCallIssue]
        alone,
        [{"b": g["b"], "s": g["s"]} for g in grads_seq],
    )
    for k in ("b", "s"):
        np.testing.assert_allclose(p[k], p_adamw[k], rtol=1e-14)


def test_normuon_batched_leaf_normalizes_each_matrix_by_rows():
    # A (2, 4, 3) leaf as a batch of two (out, in) matrices = two separate matrices.
    params = {"stack": jnp.ones((2, 4, 3), jnp.float64)}
    grads_seq = [random_like(jr.key(i), params) for i in range(3)]
    opt = eqxopt.NorMuon(0.02, matrix_mask=lambda p: p.ndim >= 2)
    p, state = _run(opt, params, grads_seq)
    assert state.nu["stack"].shape == (2, 4, 1)
    split = {f"m{i}": params["stack"][i] for i in range(2)}
    want, _, want_v = np_normuon(
        split,
        [{f"m{i}": g["stack"][i] for i in range(2)} for g in grads_seq],
        lr=0.02,
        momentum=0.95,
        beta2=0.95,
        wd=0.0,
    )
    for i in range(2):
        np.testing.assert_allclose(p["stack"][i], want[f"m{i}"], rtol=1e-10)
        np.testing.assert_allclose(state.nu["stack"][i], want_v[f"m{i}"], rtol=1e-10)


# --- Polar Express ------------------------------------------------------------------

# modded-nanogpt's table ("computed for num_iters=5, safety_factor=2e-2, cushion=2").
MODDED_NANOGPT = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)


def np_polar_express(g):
    """modded-nanogpt's `polar_express` (float64 instead of bfloat16)."""
    tall = g.shape[0] > g.shape[1]
    x = g.T if tall else g
    x = x / (np.linalg.norm(x) * (1 + 2e-2) + 1e-6)
    for a, b, c in MODDED_NANOGPT:
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


@pytest.mark.parametrize("shape", [(6, 10), (10, 6)])
def test_polar_express_coeffs_reproduce_modded_nanogpt(shape):
    g = np.asarray(jr.normal(jr.key(0), shape, jnp.float64))
    assert eqxopt.POLAR_EXPRESS_COEFFS[1:] == MODDED_NANOGPT[1:]
    s = max(1, shape[0] / shape[1]) ** 0.5
    want = -0.1 * s * np_polar_express(g)
    params = {"w": jnp.zeros(shape, jnp.float64)}
    scale = float(np.max(np.abs(want)))
    for eps, atol in [(1e-6 / 1.02, 1e-11 * scale), (1e-7, 1e-5 * scale)]:
        # eps = 1e-6/1.02 is the reference's normalization exactly (float64 rounding
        # only); the default 1e-7 moves X_0 by (1e-6 - 1.02e-7) / ||g|| ~ 1e-7
        # relative, which the iteration (slope ~8 at 0 in its first step, < 5 after)
        # amplifies to ~1e-6 of the update's scale (measured 1.1e-6): 1e-5 bounds it.
        opt = eqxopt.Muon(
            0.1,
            momentum=0.0,
            nesterov=False,
            ns_coeffs=eqxopt.POLAR_EXPRESS_COEFFS,
            eps=eps,
            fallback=eqxopt.SGD(0.1),
        )
        u, _ = opt.update({"w": jnp.asarray(g)}, opt.init(params), params)
        np.testing.assert_allclose(u["w"], want, rtol=0, atol=atol)
    # The result is close to orthogonal: singular values near 1.
    sv = np.linalg.svd(np_polar_express(g), compute_uv=False)
    assert np.all(np.abs(sv - 1) < 0.3)


# --- memory formulas, construction, errors ----------------------------------------


def _bytes(opt, params, prefix):
    report = eqxopt.verify(opt, params)
    return sum(leaf.nbytes for leaf in report.leaves if leaf.path.startswith(prefix))


@pytest.mark.parametrize("m, n", [(8, 5), (3, 12)])
def test_state_memory_matches_the_docstring_formulas(m, n):
    params = {"w": jnp.ones((m, n), jnp.bfloat16)}
    assert _bytes(eqxopt.Muon(0.02), params, ".mu") == m * n * 2
    assert _bytes(eqxopt.NorMuon(0.02), params, ".mu") == m * n * 2
    assert _bytes(eqxopt.NorMuon(0.02), params, ".nu") == m * 2
    kron = eqxopt.Kron(1e-3)
    assert _bytes(kron, params, ".mu") == m * n * 2
    assert _bytes(kron, params, ".Qs") == (m * m + n * n) * 2  # the param's dtype
    f32 = eqxopt.Kron(1e-3, precond_dtype=jnp.float32)
    assert _bytes(f32, params, ".Qs") == (m * m + n * n) * 4
    small = eqxopt.Kron(1e-3, max_size_triangular=min(m, n))
    big = max(m, n)
    assert _bytes(small, params, ".Qs") == (min(m, n) ** 2 + big) * 2
    report = eqxopt.verify(kron, params)
    rest = {leaf.path: leaf.nbytes for leaf in report.leaves}
    assert rest[".count"] == rest[".update_counter"] == 4 and rest[".key_data"] == 8


def test_built_inside_jit_leaks_no_tracer():
    # Optimizers built inside one trace and used outside it (or in another): any JAX
    # array created at construction would be a leaked tracer here.
    params = {"w": jnp.ones((4, 3)), "b": jnp.zeros(4)}
    built = []

    @jax.jit
    def build(x):
        built.extend(
            [
                eqxopt.Kron(1e-3, key=3),
                eqxopt.NorMuon(beta2=0.9),
                eqxopt.Muon(0.02, ns_coeffs=eqxopt.POLAR_EXPRESS_COEFFS),
            ]
        )
        return x

    build(1.0)
    for opt in built:
        assert not any(isinstance(x, jax.Array) for x in jtu.tree_leaves(opt))
        state = opt.init(params)
        eqx.filter_jit(opt.update)(random_like(jr.key(0), params), state, params)


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: eqxopt.Kron(-1.0), "learning_rate"),
        (lambda: eqxopt.Kron(1e-3, b1=1.0), "b1"),
        (lambda: eqxopt.Kron(1e-3, weight_decay=-0.1), "weight_decay"),
        (
            lambda: eqxopt.Kron(1e-3, preconditioner_update_probability=0.0),
            "preconditioner_update_probability",
        ),
        (
            lambda: eqxopt.Kron(1e-3, preconditioner_update_probability=1.5),
            "preconditioner_update_probability",
        ),
        (lambda: eqxopt.Kron(1e-3, max_size_triangular=0), "max_size_triangular"),
        (lambda: eqxopt.Kron(1e-3, min_ndim_triangular=-1), "min_ndim_triangular"),
        (lambda: eqxopt.Kron(1e-3, memory_save_mode="some"), "memory_save_mode"),
        (lambda: eqxopt.Kron(1e-3, preconditioner_lr=0.0), "preconditioner_lr"),
        (
            lambda: eqxopt.Kron(1e-3, preconditioner_init_scale=0.0),
            "preconditioner_init_scale",
        ),
        (lambda: eqxopt.Kron(1e-3, precond_dtype=jnp.int32), "precond_dtype"),
        (
            lambda: eqxopt.Kron(1e-3, precond_update_precision="fast"),
            "precond_update_precision",
        ),
        (lambda: eqxopt.Kron(1e-3, key="seed"), "key"),
        (lambda: eqxopt.NorMuon(0.02, beta2=1.0), "beta2"),
        (lambda: eqxopt.NorMuon(0.02, norm_eps=-1.0), "norm_eps"),
        (lambda: eqxopt.NorMuon(0.02, momentum=-0.1), "momentum"),
        (lambda: eqxopt.NorMuon(0.02, ns_coeffs=((1.0, 2.0, 3.0),) * 4), "ns_coeffs"),
        (lambda: eqxopt.NorMuon(0.02, scale_rule="rms"), "scale_rule"),
        (lambda: eqxopt.PrecondUpdateProbSchedule(min_prob=0.0), "min_prob"),
    ],
)
def test_bad_options_raise_value_error_naming_field(make, field):
    with pytest.raises(ValueError, match=rf"\({field}=\.\.\.\)"):
        make()


def test_kron_update_checks_its_inputs():
    params = {"w": jnp.ones((3, 2))}
    opt = eqxopt.Kron(1e-3, weight_decay=0.1)
    state = opt.init(params)
    with pytest.raises(ValueError, match="needs `params`"):
        opt.update(params, state)
    with pytest.raises(ValueError, match="shape"):
        opt.update({"w": jnp.ones((2, 3))}, state, {"w": jnp.ones((2, 3))})
