"""SOAP and Shampoo against NumPy transcriptions of their reference implementations.

`_NumpySOAP` transcribes the authors' `soap.py` (github nikhilvyas/SOAP) line by line
(torch ops as NumPy ops, float64); `_NumpyShampoo` transcribes `distributed_shampoo`
(optax-shampoo 0.0.6, the data-parallel path). Both run in float64 here, and eqxopt
runs with float64 params (x64 is on in this test suite), so the comparisons are tight.

Eigenbases are unique only up to the sign of each column, and an eigenvalue that
repeats (e.g. the zero eigenvalues of a rank-deficient first factor) has no unique
eigenvectors at all; SOAP's update is invariant to column signs but not to a rotation
inside a repeated eigenspace. The trees compared below therefore have factor matrices
of full rank from the first step on: square matrices and 3-D tensors (each of whose
unfoldings `(d, prod(other dims))` has `d <= prod(other dims)`).
"""

import dataclasses
import itertools
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
import pytest

import eqxopt
from eqxopt._matrix import linalg as _matrix


# --- the toolbox ------------------------------------------------------------------


def _soap_merge_dims(shape, max_precond_dim):
    """SOAP's `merge_dims`, transcribed."""
    new_shape, curr_shape = [], 1
    for sh in shape:
        temp_shape = curr_shape * sh
        if temp_shape > max_precond_dim:
            if curr_shape > 1:
                new_shape.append(curr_shape)
                curr_shape = sh
            else:
                new_shape.append(sh)
                curr_shape = 1
        else:
            curr_shape = temp_shape
    if curr_shape > 1 or len(new_shape) == 0:
        new_shape.append(curr_shape)
    return tuple(new_shape)


def _shampoo_merge_small_dims(shape, max_dim):
    """distributed Shampoo's `merge_small_dims`, transcribed."""
    if shape and np.all(np.array(shape) == 1):
        return (1,)
    out, product = [], 1
    for d in shape:
        if product * d <= max_dim:
            product *= d
        else:
            if product > 1:
                out.append(product)
            product = d
    if product > 1:
        out.append(product)
    return tuple(out)


def test_merge_dims_is_both_references_rule():
    # Every shape of rank 1-4 over these sizes: SOAP's and Shampoo's merge rules and
    # the toolbox's agree (SOAP's only differs for rank 0, where it never merges).
    for rank in range(1, 5):
        for shape in itertools.product((1, 2, 3, 5, 7, 11), repeat=rank):
            for max_dim in (1, 3, 6, 10, 30):
                got = _matrix.merge_dims(shape, max_dim)
                assert got == _shampoo_merge_small_dims(shape, max_dim)
                assert got == _soap_merge_dims(shape, max_dim)


def test_inverse_pth_root_newton_matches_eigh():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(6, 10))
    a = jnp.asarray(a @ a.T)
    for p in (2, 4, 8):
        newton, error = _matrix.matrix_inverse_pth_root(a, p)
        exact = _matrix.eigh_inverse_pth_root(a, p)
        # The Newton iteration stops once max|M - I| <= 1e-6 (the reference's
        # error_tolerance), so the root is exact to about that, relatively.
        assert float(error) <= 1e-6
        np.testing.assert_allclose(
            newton, exact, rtol=0, atol=1e-6 * np.abs(exact).max()
        )
        # And it is what it claims to be: (A + eps I)^(-1/p), eps relative to
        # lambda_max.
        lam = np.linalg.eigvalsh(np.asarray(a))
        eps = 1e-6 * lam.max()
        w, u = np.linalg.eigh(np.asarray(a) + eps * np.eye(6))
        np.testing.assert_allclose(exact, (u * w ** (-1 / p)) @ u.T, rtol=1e-9)


def test_bases_and_projection():
    rng = np.random.default_rng(1)
    a = rng.normal(size=(5, 9))
    a = a @ a.T
    q = np.asarray(_matrix.eigh_basis(jnp.asarray(a)))
    est = np.diag(q.T @ a @ q)
    assert np.all(np.diff(est) < 0)  # descending, as SOAP's flip of eigh's order
    np.testing.assert_allclose(q.T @ q, np.eye(5), atol=1e-12)
    # One power iteration + QR from a shuffled basis: sorted back, still orthogonal.
    perm = np.array([3, 0, 4, 1, 2])
    new, order = _matrix.qr_power_basis(jnp.asarray(a), jnp.asarray(q[:, perm]))
    np.testing.assert_array_equal(perm[np.asarray(order)], np.arange(5))
    np.testing.assert_allclose(np.abs(np.diag(np.asarray(new).T @ q)), 1, atol=1e-6)
    x = rng.normal(size=(2, 3, 4))
    bases = [np.linalg.qr(rng.normal(size=(n, n)))[0] for n in (2, 3, 4)]
    y = _matrix.project(
        jnp.asarray(x), [jnp.asarray(bases[0]), None, jnp.asarray(bases[2])]
    )
    np.testing.assert_allclose(
        y, np.einsum("abc,ai,ck->ibk", x, bases[0], bases[2]), rtol=1e-12
    )
    back = _matrix.project_back(y, [jnp.asarray(bases[0]), None, jnp.asarray(bases[2])])
    np.testing.assert_allclose(back, x, rtol=1e-12, atol=1e-12)


def test_block_partition_and_views():
    part = _matrix.BlockPartition((5, 7), 3)
    x = jnp.arange(35.0).reshape(5, 7)
    blocks = part.partition(x)
    assert [b.shape for b in blocks] == part.block_shapes
    assert part.block_shapes == [(3, 3), (3, 3), (3, 1), (2, 3), (2, 3), (2, 1)]
    assert (part.merge(blocks) == x).all()
    view = _matrix.matrix_view((4, 3, 8), dimension_numbers=((0, 2), 1))
    assert view.view_shape == (1, 3, 32) and view.preconditioned == (False, True, True)
    z = jnp.arange(96.0).reshape(4, 3, 8)
    assert (view.from_view(view.to_view(z)) == z).all()
    assert _matrix.matrix_view((5,), max_dim=4).preconditioned == (False,)
    assert _matrix.matrix_view((5, 3), max_dim=4).preconditioned == (False, True)
    assert _matrix.matrix_view((3,), precondition_1d=False).preconditioned == (False,)


def test_every_k_does_not_recompile():
    traces = []

    @jax.jit
    def f(count, k):
        traces.append(None)
        return _matrix.every_k(count, k, lambda x: x + 1, lambda x: x, jnp.float32(0))

    assert [float(f(jnp.int32(c), jnp.int32(3))) for c in range(4)] == [1, 0, 0, 1]
    assert float(f(jnp.int32(4), jnp.int32(2))) == 1
    assert len(traces) == 1


def test_cond_passes_matrices_flat_and_gives_lax_conds_values():
    # `cond` flattens every matrix across the branch boundary (one layout for
    # XLA:CPU to choose) and shapes the results back: values, structure, dtypes and
    # `None` leaves as `lax.cond`'s, for either branch.
    operands = (
        {"m": jnp.arange(6.0).reshape(2, 3), "none": None},
        [jnp.arange(24, dtype=jnp.int32).reshape(2, 3, 4), jnp.float32(2)],
    )

    def refresh(tree, rest):
        return {"m": tree["m"].T @ tree["m"], "none": None}, [rest[0] + 1, rest[1] * 3]

    def keep(tree, rest):
        return {"m": jnp.zeros((3, 3)), "none": None}, rest

    for pred in (True, False):
        run = lambda p, *ops: _matrix.cond(p, refresh, keep, *ops)
        got = jax.jit(run)(pred, *operands)
        want = jax.lax.cond(pred, refresh, keep, *operands)
        assert jtu.tree_structure(got) == jtu.tree_structure(want)
        for a, b in zip(jtu.tree_leaves(got), jtu.tree_leaves(want)):
            assert a.shape == b.shape and a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)


# --- SOAP -------------------------------------------------------------------------


class _NumpySOAP:
    """The reference `soap.py`, one param, transcribed (`torch` -> NumPy)."""

    def __init__(
        self,
        lr=3e-3,
        betas=(0.95, 0.95),
        shampoo_beta=-1,
        eps=1e-8,
        weight_decay=0.01,
        precondition_frequency=10,
        max_precond_dim=10000,
        merge_dims=False,
        precondition_1d=False,
        normalize_grads=False,
        correct_bias=True,
    ):
        self.g: dict[str, Any] = dict(
            lr=lr,
            betas=betas,
            shampoo_beta=shampoo_beta,
            eps=eps,
            weight_decay=weight_decay,
            precondition_frequency=precondition_frequency,
            max_precond_dim=max_precond_dim,
            merge_dims=merge_dims,
            precondition_1d=precondition_1d,
            normalize_grads=normalize_grads,
            correct_bias=correct_bias,
        )
        self.state: dict[str, Any] = {}

    def step(self, p, grad):
        group, state = self.g, self.state
        if "step" not in state:
            state["step"] = 0
        if "exp_avg" not in state:
            state["exp_avg"] = np.zeros_like(grad)
            state["exp_avg_sq"] = np.zeros_like(grad)
        if "Q" not in state:
            self.init_preconditioner(grad, state)
            self.update_preconditioner(grad, state)
            return p
        grad_projected = self.project(grad, state)
        beta1, beta2 = group["betas"]
        state["step"] += 1
        state["exp_avg"] = beta1 * state["exp_avg"] + (1 - beta1) * grad_projected
        state["exp_avg_sq"] = (
            beta2 * state["exp_avg_sq"] + (1 - beta2) * grad_projected**2
        )
        denom = np.sqrt(state["exp_avg_sq"]) + group["eps"]
        step_size = group["lr"]
        if group["correct_bias"]:
            bias_correction1 = 1.0 - beta1 ** state["step"]
            bias_correction2 = 1.0 - beta2 ** state["step"]
            step_size = step_size * bias_correction2**0.5 / bias_correction1
        norm_grad = self.project_back(state["exp_avg"] / denom, state)
        if group["normalize_grads"]:
            norm_grad = norm_grad / (1e-30 + np.mean(norm_grad**2) ** 0.5)
        p = p - step_size * norm_grad
        if group["weight_decay"] > 0.0:
            p = p + p * (-group["lr"] * group["weight_decay"])
        self.update_preconditioner(grad, state)
        return p

    def merge(self, grad):
        return grad.reshape(_soap_merge_dims(grad.shape, self.g["max_precond_dim"]))

    def init_preconditioner(self, grad, state):
        g = self.g
        sb = g["shampoo_beta"] if g["shampoo_beta"] >= 0 else g["betas"][1]
        state["GG"] = []
        if grad.ndim == 1:
            if not g["precondition_1d"] or grad.shape[0] > g["max_precond_dim"]:
                state["GG"].append([])
            else:
                state["GG"].append(np.zeros((grad.shape[0], grad.shape[0])))
        else:
            if g["merge_dims"]:
                grad = self.merge(grad)
            for sh in grad.shape:
                if sh > g["max_precond_dim"]:
                    state["GG"].append([])
                else:
                    state["GG"].append(np.zeros((sh, sh)))
        state["Q"] = None
        state["shampoo_beta"] = sb

    def project(self, grad, state):
        original_shape = grad.shape
        if self.g["merge_dims"]:
            grad = self.merge(grad)
        for mat in state["Q"]:
            if len(mat) > 0:
                grad = np.tensordot(grad, mat, axes=([0], [0]))
            else:
                grad = np.transpose(grad, list(range(1, grad.ndim)) + [0])
        return grad.reshape(original_shape)

    def project_back(self, grad, state):
        original_shape = grad.shape
        if self.g["merge_dims"]:
            grad = self.merge(grad)
        for mat in state["Q"]:
            if len(mat) > 0:
                grad = np.tensordot(grad, mat, axes=([0], [1]))
            else:
                grad = np.transpose(grad, list(range(1, grad.ndim)) + [0])
        return grad.reshape(original_shape)

    def update_preconditioner(self, grad, state):
        g = self.g
        if state["Q"] is not None:
            state["exp_avg"] = self.project_back(state["exp_avg"], state)
        w = 1 - state["shampoo_beta"]
        if grad.ndim == 1:
            if g["precondition_1d"] and grad.shape[0] <= g["max_precond_dim"]:
                gg = state["GG"][0]
                state["GG"][0] = gg + w * (np.outer(grad, grad) - gg)
        else:
            new_grad = self.merge(grad) if g["merge_dims"] else grad
            for idx, sh in enumerate(new_grad.shape):
                if sh <= g["max_precond_dim"]:
                    axes = [*itertools.chain(range(idx), range(idx + 1, new_grad.ndim))]
                    outer = np.tensordot(new_grad, new_grad, axes=(axes, axes))
                    gg = state["GG"][idx]
                    state["GG"][idx] = gg + w * (outer - gg)
        if state["Q"] is None:
            state["Q"] = self.get_orthogonal_matrix(state["GG"])
        if state["step"] > 0 and state["step"] % g["precondition_frequency"] == 0:
            state["Q"] = self.get_orthogonal_matrix_QR(state)
        if state["step"] > 0:
            state["exp_avg"] = self.project(state["exp_avg"], state)

    def get_orthogonal_matrix(self, mats):
        final = []
        for m in mats:
            if len(m) == 0:
                final.append([])
                continue
            _, q = np.linalg.eigh(m + 1e-30 * np.eye(m.shape[0]))
            final.append(np.flip(q, 1))
        return final

    def get_orthogonal_matrix_QR(self, state):
        exp_avg_sq = state["exp_avg_sq"]
        orig_shape = exp_avg_sq.shape
        if self.g["merge_dims"]:
            exp_avg_sq = self.merge(exp_avg_sq)
        final = []
        for ind, (m, o) in enumerate(zip(state["GG"], state["Q"])):
            if len(m) == 0:
                final.append([])
                continue
            est_eig = np.diag(o.T @ m @ o)
            sort_idx = np.argsort(-est_eig, kind="stable")
            exp_avg_sq = np.take(exp_avg_sq, sort_idx, axis=ind)
            o = o[:, sort_idx]
            q, _ = np.linalg.qr(m @ o)
            final.append(q)
        state["exp_avg_sq"] = exp_avg_sq.reshape(orig_shape)
        return final


def _numpy_soap(**kwargs) -> _NumpySOAP:
    ref = dict(kwargs)
    b1, b2 = ref.pop("b1", 0.95), ref.pop("b2", 0.95)
    if "learning_rate" in ref:
        ref["lr"] = ref.pop("learning_rate")
    if ref.get("shampoo_beta") is None:
        ref["shampoo_beta"] = -1
    return _NumpySOAP(betas=(b1, b2), **ref)


def _run_reference(make_ref, params, grads_seq):
    leaves, treedef = jtu.tree_flatten(params)
    refs = [make_ref() for _ in leaves]
    values = [np.asarray(x, np.float64) for x in leaves]
    history = []
    for grads in grads_seq:
        g_leaves = treedef.flatten_up_to(grads)
        values = [
            r.step(v, np.asarray(g, np.float64))
            for r, v, g in zip(refs, values, g_leaves)
        ]
        history.append(jtu.tree_unflatten(treedef, values))
    return history


def _run_eqxopt(opt, params, grads_seq):
    state = opt.init(params)
    step = eqx.filter_jit(opt.step)
    history = []
    for grads in grads_seq:
        params, state = step(params, grads, state)
        history.append(params)
    return history, state


def _grads_seq(params, steps, seed=0):
    keys = jr.split(jr.key(seed), steps)
    return [
        jtu.tree_map(
            lambda p, k=k: jr.normal(jr.fold_in(k, p.size), p.shape, p.dtype), params
        )
        for k in keys
    ]


# Full-rank trees (see the module docstring): every factor matrix an axis gets is of
# full rank from the first gradient on. "v" is 1-D and "s" a scalar (plain Adam
# unless `precondition_1d`); "long" has an axis longer than `max_precond_dim`, which
# gets no factor (its other axis does).
_SOAP_SHAPES = {"w": (4, 4), "t": (2, 3, 4), "v": (5,), "s": ()}

_SOAP_CONFIGS = {
    "default": (dict(precondition_frequency=3), _SOAP_SHAPES),
    "oversized_and_1d": (
        dict(
            learning_rate=1e-2,
            b1=0.9,
            b2=0.99,
            precondition_frequency=2,
            max_precond_dim=4,
            precondition_1d=True,  # "v" (5,) is still too long: plain Adam
            weight_decay=0.1,
        ),
        _SOAP_SHAPES | {"long": (3, 6)},
    ),
    "merge_normalize_nobias": (
        dict(
            precondition_frequency=2,
            merge_dims=True,  # (2, 2, 4) -> (4, 4); (4, 4) stays
            max_precond_dim=4,
            normalize_grads=True,
            correct_bias=False,
            shampoo_beta=0.8,
            weight_decay=0.0,
        ),
        {"w": (4, 4), "t": (2, 2, 4), "v": (5,), "s": ()},
    ),
}


def _params(shapes, dtype=jnp.float64):
    keys = jr.split(jr.key(42), len(shapes))
    return {
        name: jr.normal(k, shape, jnp.float32).astype(dtype)
        for k, (name, shape) in zip(keys, sorted(shapes.items()))
    }


@pytest.mark.parametrize("name", sorted(_SOAP_CONFIGS))
def test_soap_matches_reference(name):
    kwargs, shapes = _SOAP_CONFIGS[name]
    params = _params(shapes)
    steps = 9  # covers the eigh step, and QR refreshes at t = 2, 3, 4, 6, 8
    grads_seq = _grads_seq(params, steps)
    expected = _run_reference(lambda: _numpy_soap(**kwargs), params, grads_seq)
    got, _ = _run_eqxopt(eqxopt.SOAP(**kwargs), params, grads_seq)
    for k, (e, g) in enumerate(zip(expected, got)):
        # float64 throughout; eigh/QR from different LAPACK drivers differ in the
        # last bits and in column signs (which SOAP's update does not see), and the
        # reference's per-step round trip Q Q^T adds rounding: 1e-9 relative to the
        # params' scale after 9 steps.
        for path_e, path_g in zip(jtu.tree_leaves(e), jtu.tree_leaves(g)):
            np.testing.assert_allclose(
                np.asarray(path_g), path_e, rtol=1e-9, atol=1e-10, err_msg=f"step {k}"
            )


def test_soap_first_step_and_routing():
    params = _params(_SOAP_SHAPES | {"long": (3, 6)})
    opt = eqxopt.SOAP(max_precond_dim=5, precondition_1d=True)
    state = opt.init(params)
    # (3, 6) with max_precond_dim=5: only the first axis gets a factor.
    assert state.bases["long"][1] is None and state.bases["long"][0].shape == (3, 3)
    assert state.bases["v"][0].shape == (5, 5)  # precondition_1d=True
    assert state.bases["s"] is None  # a scalar is never preconditioned
    assert eqxopt.SOAP().init(params).bases["v"] is None  # precondition_1d=False
    grads = _grads_seq(params, 1)[0]
    new, state = opt.step(params, grads, state)
    assert isinstance(state, eqxopt.SOAPState)
    assert eqx.tree_equal(new, params)  # the first step makes no update
    assert int(state.count) == 1
    # ... but sets the bases to the factors' eigenvectors.
    l0 = np.asarray(state.preconditioners["w"][0])
    np.testing.assert_allclose(
        l0, (1 - 0.95) * np.asarray(grads["w"] @ grads["w"].T), rtol=1e-12
    )
    q = np.asarray(state.bases["w"][0])
    d = q.T @ l0 @ q
    np.testing.assert_allclose(d - np.diag(np.diag(d)), 0, atol=1e-12)


# --- Shampoo ----------------------------------------------------------------------


def _np_power_iteration(matrix, num_iters=100, error_tolerance=1e-6):
    v = np.random.RandomState(1729).uniform(-1.0, 1.0, matrix.shape[-1])
    i, s, run = 0, 0.0, True
    while i < num_iters and run:
        v = v / np.linalg.norm(v)
        s_v = matrix @ v
        s_new = v @ s_v
        i, v, run, s = i + 1, s_v, abs(s_new - s) > error_tolerance, s_new
    return v / np.linalg.norm(v), s


def _np_mat_power(mat_m, p):
    power = np.eye(mat_m.shape[0])
    while p > 0:
        if p % 2 == 1:
            power = mat_m @ power
        p //= 2
        mat_m = mat_m @ mat_m
    return power


def _np_matrix_inverse_pth_root(
    matrix,
    p,
    num_iters=100,
    ridge_epsilon=1e-6,
    error_tolerance=1e-6,
    relative_matrix_epsilon=True,
):
    n = matrix.shape[0]
    alpha = -1.0 / p
    identity = np.eye(n)
    if relative_matrix_epsilon:
        _, max_ev = _np_power_iteration(matrix)
    else:
        max_ev = 1.0
    ridge_epsilon = ridge_epsilon * max(max_ev, 1e-6)
    max_error_ratio = 1.2
    if n == 1:
        return (matrix + ridge_epsilon) ** alpha, 0.0
    damped = matrix + ridge_epsilon * identity
    z = (1 + p) / (2 * np.linalg.norm(damped))
    mat_m = damped * z
    error = np.max(np.abs(mat_m - identity))
    mat_h = identity * z ** (1.0 / p)
    old_mat_h, i, error_ratio = mat_h, 0, True  # True == 1.0 as in the reference
    while i < num_iters and error > error_tolerance and error_ratio < max_error_ratio:
        mat_m_i = (1 - alpha) * identity + alpha * mat_m
        new_mat_m = _np_mat_power(mat_m_i, p) @ mat_m
        new_mat_h = mat_h @ mat_m_i
        new_error = np.max(np.abs(new_mat_m - identity))
        i, mat_m, old_mat_h, mat_h = i + 1, new_mat_m, mat_h, new_mat_h
        error, error_ratio = new_error, new_error / error
    error = np.max(np.abs(mat_m - identity))
    converged = error_ratio < max_error_ratio
    return (mat_h if converged else old_mat_h), error


@dataclasses.dataclass
class _NumpyShampoo:
    """`distributed_shampoo` (optax-shampoo 0.0.6), data-parallel path, one param."""

    learning_rate: float
    block_size: int = 1024
    beta1: float = 0.9
    beta2: float = 0.999
    diagonal_epsilon: float = 1e-10
    matrix_epsilon: float = 1e-6
    weight_decay: float = 0.0
    start_preconditioning_step: int = 5
    preconditioning_compute_steps: int = 1
    statistics_compute_steps: int = 1
    best_effort_shape_interpretation: bool = True
    graft_type: str = "sgd"
    nesterov: bool = True
    exponent_override: int = 0
    inverse_failure_threshold: float = 0.1
    moving_average_for_momentum: bool = False
    skip_preconditioning_dim_size_gt: int = 4096
    clip_by_scaled_gradient_norm: float | None = None
    relative_matrix_epsilon: bool = True
    merge_small_dims_block_size: int = 4096
    preconditioner_type: str = "all"
    skip_preconditioning_rank_lt: int = 1
    decoupled_learning_rate: bool = True
    decoupled_weight_decay: bool = False

    # Preconditioner / BlockPartitioner
    def _shapes(self, shape):
        transformed = tuple(shape)
        if self.best_effort_shape_interpretation:
            transformed = _shampoo_merge_small_dims(
                shape, self.merge_small_dims_block_size
            )
        splits, split_sizes = [], []
        for i, d in enumerate(transformed):
            if 0 < self.block_size < d:
                nsplit = (d - 1) // self.block_size
                indices = (np.arange(nsplit) + 1) * self.block_size
                sizes = np.ones(nsplit + 1, dtype=np.int64) * self.block_size
                sizes[-1] = d - indices[-1]
                splits.append((i, indices))
                split_sizes.append(sizes)
            else:
                split_sizes.append(np.array([d]))
        return transformed, splits, split_sizes

    def _partition(self, x, shape):
        transformed, splits, _ = self._shapes(shape)
        tensors = [x.reshape(transformed)]
        for i, indices in splits:
            tensors = [t2 for t in tensors for t2 in np.split(t, indices, axis=i)]
        return tensors

    def _merge(self, parts, shape):
        _, splits, _ = self._shapes(shape)
        for i, indices in reversed(splits):
            n = len(indices) + 1
            parts = [
                np.concatenate(parts[k : k + n], axis=i)
                for k in range(0, len(parts), n)
            ]
        return parts[0].reshape(shape)

    def _should_precondition_dims(self, shape):
        rank = len(self._shapes(shape)[2])
        if self.preconditioner_type == "all" or rank <= 1:
            return [True] * rank
        return [True] * (rank - 1) + [False]

    def _skip(self, shape):
        return len(shape) < self.skip_preconditioning_rank_lt or any(
            s > self.skip_preconditioning_dim_size_gt for s in shape
        )

    def init(self, param):
        stats, precs = [], []
        if not self._skip(param.shape):
            _, _, split_sizes = self._shapes(param.shape)
            flags = self._should_precondition_dims(param.shape)
            for t in itertools.product(*split_sizes):
                for d, f in zip(t, flags):
                    if f:
                        stats.append(self.matrix_epsilon * np.eye(d))
                        precs.append(np.eye(d))
        return dict(
            diagonal_statistics=np.zeros_like(param),
            statistics=stats,
            preconditioners=precs,
            diagonal_momentum=np.zeros_like(param),
            momentum=np.zeros_like(param),
        )

    def update(self, grad, state, param, step):
        # _compute_stats
        w1 = self.beta2
        w2 = self.beta2 if self.beta2 == 1.0 else 1.0 - self.beta2
        if not self._skip(param.shape):
            if step % self.statistics_compute_steps == 0:
                flags = self._should_precondition_dims(param.shape)
                new, index = [], 0
                for g in self._partition(grad, param.shape):
                    for axis in range(sum(flags)):
                        axes = [i for i in range(g.ndim) if i != axis]
                        gram = np.tensordot(g, g, axes=(axes, axes))
                        new.append(w1 * state["statistics"][index] + w2 * gram)
                        index += 1
                state["statistics"] = new
            # _compute_preconditioners
            flags = self._should_precondition_dims(param.shape)
            exponent = self.exponent_override or 2 * sum(flags)
            new_precs = []
            for stat, prev in zip(state["statistics"], state["preconditioners"]):
                if step % self.preconditioning_compute_steps == 0:
                    root, error = _np_matrix_inverse_pth_root(
                        stat,
                        exponent,
                        ridge_epsilon=self.matrix_epsilon,
                        relative_matrix_epsilon=self.relative_matrix_epsilon,
                    )
                else:
                    root, error = stat, self.inverse_failure_threshold
                skip = np.isnan(error) or error >= self.inverse_failure_threshold
                new_precs.append(prev if skip else root)
            state["preconditioners"] = new_precs
        # _transform_grad
        sgd_update = grad
        if self.graft_type in ("adagrad", "adagrad_normalized"):
            scaled_grad = grad
            if self.graft_type == "adagrad_normalized":
                scaled_grad = grad / (np.linalg.norm(grad) + 1e-16)
            state["diagonal_statistics"] = state["diagonal_statistics"] + scaled_grad**2
            grafting_update = scaled_grad / (
                np.sqrt(state["diagonal_statistics"]) + self.diagonal_epsilon
            )
        elif self.graft_type in ("rmsprop", "rmsprop_normalized"):
            scaled_grad = grad
            if self.graft_type == "rmsprop_normalized":
                scaled_grad = grad / (np.linalg.norm(grad) + 1e-16)
            state["diagonal_statistics"] = (
                w1 * state["diagonal_statistics"] + w2 * scaled_grad**2
            )
            rmsprop_update = scaled_grad / (
                np.sqrt(state["diagonal_statistics"]) + self.diagonal_epsilon
            )
            if self.clip_by_scaled_gradient_norm:
                scaled_grad_norm = np.linalg.norm(rmsprop_update) / np.sqrt(
                    float(rmsprop_update.size)
                )
                clipping_denom = max(
                    1.0, scaled_grad_norm / self.clip_by_scaled_gradient_norm
                )
                rmsprop_update = rmsprop_update / clipping_denom
            grafting_update = rmsprop_update
        elif self.graft_type == "sgd":
            grafting_update = sgd_update
        else:
            grafting_update = np.ones_like(sgd_update) * np.sign(sgd_update)
        lr = self.learning_rate
        if not self.decoupled_learning_rate:
            grafting_update = grafting_update * lr
        if not self._skip(param.shape):
            flags = self._should_precondition_dims(param.shape)
            n = sum(flags)
            out = []
            for i, g in enumerate(self._partition(grad, param.shape)):
                precs = state["preconditioners"][i * n : (i + 1) * n]
                pg = g
                for j, f in enumerate(flags):
                    if f:
                        pg = np.tensordot(pg, precs[j], axes=([0], [0]))
                    else:
                        pg = np.transpose(pg, (*range(1, g.ndim), 0))
                out.append(pg)
            precond_grad = self._merge(out, param.shape)
        else:
            precond_grad = grafting_update
        multiplier = np.linalg.norm(grafting_update) / (
            np.linalg.norm(precond_grad) + 1e-16
        )
        shampoo_update = precond_grad * multiplier
        shampoo_update_with_wd, grafting_update_with_wd = (
            shampoo_update,
            grafting_update,
        )
        if self.weight_decay != 0 and not self.decoupled_weight_decay:
            shampoo_update_with_wd = shampoo_update + self.weight_decay * param
            grafting_update_with_wd = grafting_update + self.weight_decay * param
        w = (1.0 - self.beta1) if self.moving_average_for_momentum else 1.0
        shampoo_mom = state["momentum"] * self.beta1 + w * shampoo_update_with_wd
        graft_mom = (
            state["diagonal_momentum"] * self.beta1 + w * grafting_update_with_wd
        )
        run_shampoo = float(step >= self.start_preconditioning_step)
        momentum_update = run_shampoo * shampoo_mom + (1.0 - run_shampoo) * graft_mom
        wd_update = (
            run_shampoo * shampoo_update_with_wd
            + (1.0 - run_shampoo) * grafting_update_with_wd
        )
        nesterov_momentum_update = momentum_update
        if self.nesterov:
            nesterov_momentum_update = w * wd_update + self.beta1 * momentum_update
        if self.weight_decay != 0 and self.decoupled_weight_decay:
            nesterov_momentum_update = (
                nesterov_momentum_update + lr * self.weight_decay * param
            )
        momentum_multiplier = lr if self.decoupled_learning_rate else 1.0
        state["diagonal_momentum"], state["momentum"] = graft_mom, shampoo_mom
        return -1.0 * momentum_multiplier * nesterov_momentum_update


def _numpy_shampoo(**kwargs):
    ref = dict(kwargs)
    for ours, theirs in (("b1", "beta1"), ("b2", "beta2")):
        if ours in ref:
            ref[theirs] = ref.pop(ours)
    return _NumpyShampoo(**ref)


def _run_shampoo_reference(kwargs, params, grads_seq):
    leaves, treedef = jtu.tree_flatten(params)
    refs = [_numpy_shampoo(**kwargs) for _ in leaves]
    values = [np.asarray(x, np.float64) for x in leaves]
    states = [r.init(v) for r, v in zip(refs, values)]
    history = []
    for step, grads in enumerate(grads_seq):
        g_leaves = treedef.flatten_up_to(grads)
        values = [
            v + r.update(np.asarray(g, np.float64), s, v, step)
            for r, v, g, s in zip(refs, values, g_leaves, states)
        ]
        history.append(jtu.tree_unflatten(treedef, values))
    return history


# Leaves: "w" (6, 5) is merged (30 <= merge_small_dims_block_size) into one vector
# unless `best_effort_shape_interpretation=False`; "big" (12, 10) is cut into blocks
# with block_size=4 (after merging small dims at 8, so it stays (12, 10)); "t" is 3-D;
# "huge" has an axis longer than skip_preconditioning_dim_size_gt in some configs;
# "s" is a scalar (rank 0: never preconditioned).
_SHAMPOO_SHAPES = {"w": (6, 5), "big": (12, 10), "t": (2, 3, 4), "b": (7,), "s": ()}

_SHAMPOO_CONFIGS = {
    "default": dict(learning_rate=1e-2, block_size=4, merge_small_dims_block_size=8),
    "adagrad_wd_nonesterov": dict(
        learning_rate=3e-2,
        block_size=5,
        b2=1.0,
        graft_type="adagrad",
        nesterov=False,
        weight_decay=1e-2,
        start_preconditioning_step=2,
        preconditioning_compute_steps=3,
        skip_preconditioning_dim_size_gt=11,  # "big" (12, 10): grafting only
        best_effort_shape_interpretation=False,
    ),
    "rmsprop_normalized_decoupled": dict(
        learning_rate=1e-2,
        block_size=6,
        b1=0.5,
        b2=0.9,
        graft_type="rmsprop_normalized",
        decoupled_weight_decay=True,
        weight_decay=0.1,
        statistics_compute_steps=2,
        moving_average_for_momentum=True,
        exponent_override=2,
        start_preconditioning_step=1,
    ),
    "rmsprop_clip_input_coupled_lr": dict(
        learning_rate=1e-2,
        block_size=8,
        graft_type="rmsprop",
        clip_by_scaled_gradient_norm=0.5,
        preconditioner_type="input",
        decoupled_learning_rate=False,
        relative_matrix_epsilon=False,
        matrix_epsilon=1e-4,
        best_effort_shape_interpretation=False,
        start_preconditioning_step=0,
    ),
    "sqrt_n": dict(
        learning_rate=1e-2,
        graft_type="SQRT_N",
        start_preconditioning_step=3,
        skip_preconditioning_rank_lt=2,  # the vector gets the grafting update
    ),
}


@pytest.mark.parametrize("name", sorted(_SHAMPOO_CONFIGS))
def test_shampoo_matches_reference(name):
    kwargs = _SHAMPOO_CONFIGS[name]
    params = _params(_SHAMPOO_SHAPES)
    steps = 8  # past start_preconditioning_step, several compute steps
    grads_seq = _grads_seq(params, steps)
    ref_kwargs = dict(kwargs)
    if "graft_type" in ref_kwargs:
        ref_kwargs["graft_type"] = ref_kwargs["graft_type"].lower()
    expected = _run_shampoo_reference(ref_kwargs, params, grads_seq)
    got, _ = _run_eqxopt(eqxopt.Shampoo(**kwargs), params, grads_seq)
    for k, (e, g) in enumerate(zip(expected, got)):
        # float64 on both sides, the same iterations in the same order: only
        # summation order differs (XLA's dots vs NumPy's BLAS). The coupled Newton
        # iteration amplifies it a little (its stopping test compares an error to
        # 1e-6, which could flip an iteration count; it did not here).
        for leaf_e, leaf_g in zip(jtu.tree_leaves(e), jtu.tree_leaves(g)):
            np.testing.assert_allclose(
                np.asarray(leaf_g), leaf_e, rtol=1e-9, atol=1e-11, err_msg=f"step {k}"
            )


# --- state memory: the docstrings' formulas -----------------------------------------


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_soap_state_bytes_formula(dtype):
    # An (m, n) matrix with both axes preconditioned, one with n > max_precond_dim.
    m, n = 6, 4
    b = np.dtype(dtype).itemsize
    opt = eqxopt.SOAP(max_precond_dim=8)
    report = eqxopt.verify(opt, {"w": jnp.zeros((m, n), dtype)})
    assert report.nbytes == 4 + 2 * m * n * b + 2 * (m * m + n * n) * b
    report = eqxopt.verify(opt, {"w": jnp.zeros((m, 10), dtype)})  # 10 > 8: no R
    assert report.nbytes == 4 + 2 * m * 10 * b + 2 * m * m * b
    # precond_dtype changes the factors' bytes only.
    opt = eqxopt.SOAP(precond_dtype=jnp.float32)
    report = eqxopt.verify(opt, {"w": jnp.zeros((m, n), dtype)})
    assert report.nbytes == 4 + 2 * m * n * b + 2 * (m * m + n * n) * 4


@pytest.mark.parametrize("graft_type", ["sgd", "rmsprop"])
def test_shampoo_state_bytes_formula(graft_type):
    # (100, 70) is not merged (7000 > 4096); blocks of 32: rows 32+32+32+4, columns
    # 32+32+6, so 4 x 3 blocks, each with a row and a column factor.
    m, n, bs = 100, 70, 32
    rows, cols = [32, 32, 32, 4], [32, 32, 6]
    opt = eqxopt.Shampoo(1e-3, block_size=bs, graft_type=graft_type)
    report = eqxopt.verify(opt, {"w": jnp.zeros((m, n), jnp.float32)})
    factors = 2 * sum(r * r + c * c for r in rows for c in cols)
    diagonal = m * n if graft_type == "rmsprop" else 0
    assert report.nbytes == 4 + 4 * (factors + 2 * m * n + diagonal)
    # Without blocking: 2 (m^2 + n^2).
    report = eqxopt.verify(
        eqxopt.Shampoo(1e-3, block_size=1024), {"w": jnp.zeros((m, n), jnp.float32)}
    )
    assert report.nbytes == 4 + 4 * (2 * (m * m + n * n) + 2 * m * n)


def test_construction_creates_no_arrays_under_jit():
    @jax.jit
    def make_and_init(lr, p):
        return eqxopt.SOAP(lr).init(p), eqxopt.Shampoo(lr, block_size=2).init(p)

    # Built inside one trace, used in another: nothing may leak.
    opts = []

    @jax.jit
    def build(lr):
        opts.append((eqxopt.SOAP(3e-3), eqxopt.Shampoo(1e-3)))
        return lr

    build(1.0)
    soap, shampoo = opts[0]
    params = {"w": jnp.ones((3, 3))}
    grads = {"w": jnp.full((3, 3), 0.5)}
    for opt in (soap, shampoo):
        state = opt.init(params)
        jax.jit(opt.update)(grads, state, params)
    make_and_init(1e-3, params)


# The whole state, every kind of leaf, for the five matrix optimizers: what
# `eqxopt.verify` reports is each docstring's "State memory" formula, term by term.
# "w" is a matrix that Shampoo does not merge (70 * 64 > 4096); "v" one that it merges
# into a vector of 35; "b" a vector (SOAP: plain Adam; Kron: a diagonal factor; Muon:
# the fallback); "s" a scalar (Shampoo: not preconditioned, rank 0 < 1).
_MEMORY_TREE = {"w": (70, 64), "v": (5, 7), "b": (4,), "s": ()}


def _size(shape):
    return int(np.prod(shape, dtype=np.int64))


def _soap_bytes(bs, bp):
    total = 4  # the count
    for shape in _MEMORY_TREE.values():
        if len(shape) == 2:  # 2 m n b_s + 2 (m^2 + n^2) b_p
            m, n = shape
            total += 2 * m * n * bs + 2 * (m * m + n * n) * bp
        else:  # 1-D (precondition_1d=False) and 0-D: plain Adam's two moments
            total += 2 * _size(shape) * bs
    return total


def _shampoo_bytes(bs, bp, graft_type):
    total = 4  # the count
    # Views: "w" stays (70, 64) (one block per axis at block_size=1024); "v" merges
    # into (35,), "b" is (4,): one factor each; "s" has none.
    factor_sizes = {"w": (70, 64), "v": (35,), "b": (4,), "s": ()}
    diagonal = graft_type in ("adagrad", "rmsprop")
    for name, shape in _MEMORY_TREE.items():
        total += 2 * sum(d * d for d in factor_sizes[name]) * bp  # statistics, roots
        total += (2 + diagonal) * _size(shape) * bs  # momenta (+ diagonal statistics)
    return total


def _kron_bytes(bs, bp):
    total = 4 + 4 + 8  # count, update_counter, threefry key data
    for shape in _MEMORY_TREE.values():
        total += _size(shape) * bs  # the momentum
        if len(shape) == 2:  # both axes triangular: m^2 + n^2
            total += sum(d * d for d in shape) * bp
        elif len(shape) == 1:  # fewer than min_ndim_triangular=2 axes: diagonal
            total += shape[0] * bp
        else:  # a 0-d leaf: one scalar
            total += bp
    return total


def _muon_bytes(bs, normuon):
    total = 4 + 5 * 3 * bs  # count, (ns_steps, 3) coefficients (the params' dtype)
    fallback = 4  # AdamW's count
    for shape in _MEMORY_TREE.values():
        if len(shape) == 2:  # m n (+ m for NorMuon's row moments)
            m, n = shape
            total += (m * n + (m if normuon else 0)) * bs
        else:  # AdamW's two moments
            fallback += 2 * _size(shape) * bs
    return total + fallback


_MEMORY_CASES = {
    "soap": (lambda **kw: eqxopt.SOAP(**kw), lambda bs, bp: _soap_bytes(bs, bp)),
    "shampoo": (
        lambda **kw: eqxopt.Shampoo(1e-3, **kw),
        lambda bs, bp: _shampoo_bytes(bs, bp, "sgd"),
    ),
    "shampoo_rmsprop": (
        lambda **kw: eqxopt.Shampoo(1e-3, graft_type="rmsprop", **kw),
        lambda bs, bp: _shampoo_bytes(bs, bp, "rmsprop"),
    ),
    "kron": (lambda **kw: eqxopt.Kron(1e-3, **kw), lambda bs, bp: _kron_bytes(bs, bp)),
    "muon": (lambda **kw: eqxopt.Muon(0.02), lambda bs, bp: _muon_bytes(bs, False)),
    "normuon": (
        lambda **kw: eqxopt.NorMuon(0.02),
        lambda bs, bp: _muon_bytes(bs, True),
    ),
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", sorted(_MEMORY_CASES))
def test_state_bytes_match_the_docstring_formulas(name, dtype):
    make, formula = _MEMORY_CASES[name]
    dtype = jnp.dtype(dtype)
    params = {k: jnp.zeros(s, dtype) for k, s in _MEMORY_TREE.items()}
    bs = dtype.itemsize  # state_dtype: the params' by default
    # Factors in the params' dtype by default; float32 ones for bfloat16 params, as
    # the docstrings advise (Muon and NorMuon have no factors).
    kw = {} if dtype == jnp.float32 else {"precond_dtype": jnp.float32}
    bp = 4 if kw else bs
    report = eqxopt.verify(make(**kw), params)
    assert report.nbytes == formula(bs, bp), str(report)
