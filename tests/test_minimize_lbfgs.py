"""L-BFGS: the Optax failure rebuilt (x64 counters in a scan carry), typed state,
trace-once, Optax parity on a quadratic, and failure handling."""

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.lax as lax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import optax
import pytest

import eqxopt


def rosenbrock(y):
    return jnp.sum(100.0 * (y[1:] - y[:-1] ** 2) ** 2 + (1.0 - y[:-1]) ** 2)


def _check_dtypes(state, float_dtype):
    for path, leaf in jtu.tree_flatten_with_path(state)[0]:
        dt = np.dtype(leaf.dtype)
        assert not getattr(jax.typeof(leaf), "weak_type", False), path
        if jnp.issubdtype(dt, jnp.integer):
            assert dt == np.dtype(jnp.int32), (jtu.keystr(path), dt)
        elif jnp.issubdtype(dt, jnp.floating):
            assert dt == np.dtype(float_dtype), (jtu.keystr(path), dt)


def _lbfgs_step(opt, carry):
    """One step that reuses the line search's value and gradient (one evaluation per
    step when the unit step is accepted)."""
    y, state, value, grad = carry
    updates, state = opt.update(grad, state, y, value=value, value_fn=rosenbrock)
    ls = state.linesearch_state
    return eqx.apply_updates(y, updates), state, ls.value, ls.grad


def test_optax_x64_scan_failure_rebuilt():
    """Optax < 0.2.5 broke here (an int64 counter became int32 inside the zoom line
    search and `lax.scan` rejected its carry): x64 is on in the tests."""
    assert jax.config.read("jax_enable_x64")
    opt = eqxopt.LBFGS()
    y0 = jnp.array([-1.2, 1.0, -1.2, 1.0])
    value, grad = jax.value_and_grad(rosenbrock)(y0)
    carry = (y0, opt.init(y0), value, grad)

    def body(carry, _):
        return _lbfgs_step(opt, carry), None

    run_lax = jax.jit(lambda c: lax.scan(body, c, None, length=80)[0])
    run_eqxi = jax.jit(
        lambda c: eqxi.scan(body, c, None, length=80, kind="checkpointed")[0]
    )
    for run in (run_lax, run_eqxi):
        y, state, value, _ = run(carry)
        _check_dtypes(state, jnp.float64)
        assert state.count.dtype == jnp.int32 and int(state.count) == 80
        assert state.linesearch_state.num_evals.dtype == jnp.int32
        assert jnp.allclose(y, 1.0, rtol=0, atol=1e-8), y
        assert bool(jnp.all(jnp.isfinite(y)))

    sol = eqxopt.minimize(
        lambda y, args: rosenbrock(y), opt, y0, rtol=0.0, atol=1e-10, max_steps=200
    )
    _check_dtypes(sol.state, jnp.float64)
    assert sol.stats["num_steps"].dtype == jnp.int32
    assert sol.stats["num_fevals"].dtype == jnp.int32
    assert jnp.allclose(sol.value, 1.0, rtol=0, atol=1e-8)


def test_jitted_step_traces_once():
    opt = eqxopt.LBFGS()
    y = jnp.array([-1.2, 1.0])
    value, grad = jax.value_and_grad(rosenbrock)(y)
    carry = (y, opt.init(y), value, grad)
    traces = 0

    @jax.jit
    def step(carry):
        nonlocal traces
        traces += 1
        return _lbfgs_step(opt, carry)

    for _ in range(3):
        carry = step(carry)
    assert traces == 1


def test_float32_params_under_x64_have_no_float64_state():
    opt = eqxopt.LBFGS(memory_size=3)
    y = jnp.array([-1.2, 1.0], jnp.float32)
    loss = lambda p: rosenbrock(p.astype(jnp.float32))
    state = opt.init(y)
    _check_dtypes(state, jnp.float32)
    value, grad = jax.value_and_grad(loss)(y)
    updates, state = jax.jit(
        lambda s: opt.update(grad, s, y, value=value, value_fn=loss)
    )(state)
    _check_dtypes(state, jnp.float32)
    assert updates.dtype == jnp.float32


def _quadratic(p):
    a = jnp.array([[3.0, 0.5, 0.0], [0.5, 2.0, 0.3], [0.0, 0.3, 1.0]])
    return 0.5 * p @ a @ p - jnp.array([1.0, -2.0, 0.5]) @ p


def test_first_iterates_match_optax_on_a_quadratic():
    # |g0| > 1 here, where eqxopt's unit-length first step equals Optax's; on a
    # quadratic every interpolation lands on the exact minimiser along the line.
    p = jnp.array([2.0, -1.0, 3.0])
    ours, ref = eqxopt.LBFGS(), optax.lbfgs()

    @jax.jit
    def step_ours(p, s):
        v, g = jax.value_and_grad(_quadratic)(p)
        u, s = ours.update(g, s, p, value=v, value_fn=_quadratic)
        return p + u, s

    @jax.jit
    def step_ref(p, s):
        with jax.numpy_dtype_promotion("standard"):
            v, g = jax.value_and_grad(_quadratic)(p)
            u, s = ref.update(g, s, p, value=v, grad=g, value_fn=_quadratic)
        return p + u, s

    s_ours, s_ref = ours.init(p), ref.init(p)
    p_ours = p_ref = p
    for _ in range(4):
        p_ours, s_ours = step_ours(p_ours, s_ours)
        p_ref, s_ref = step_ref(p_ref, s_ref)
        assert jnp.allclose(p_ours, p_ref, rtol=1e-10, atol=1e-12), (p_ours, p_ref)


def test_fixed_step_matches_optax():
    p = jnp.array([2.0, -1.0, 3.0])
    ours = eqxopt.LBFGS(memory_size=2, learning_rate=0.2, linesearch=None)
    ref = optax.lbfgs(memory_size=2, learning_rate=0.2, linesearch=None)

    @jax.jit
    def step(p_ours, s_ours, p_ref, s_ref):
        u, s_ours = ours.update(jax.grad(_quadratic)(p_ours), s_ours, p_ours)
        with jax.numpy_dtype_promotion("standard"):
            v, s_ref = ref.update(jax.grad(_quadratic)(p_ref), s_ref, p_ref)
        return p_ours + u, s_ours, p_ref + v, s_ref

    carry = (p, ours.init(p), p, ref.init(p))
    for _ in range(6):
        carry = step(*carry)
        assert jnp.allclose(carry[0], carry[2], rtol=1e-10, atol=1e-12)


def test_skips_pairs_with_negative_curvature():
    opt = eqxopt.LBFGS(memory_size=3, learning_rate=0.1, linesearch=None)
    p = jnp.array([1.0, 2.0])
    state = opt.init(p)
    _, state = opt.update(jnp.array([1.0, 1.0]), state, p)
    # The gradient grows against the step: <s, y> < 0, so the pair is dropped.
    _, state = opt.update(jnp.array([3.0, 3.0]), state, p - 0.1)
    assert bool(jnp.all(state.rho_memory == 0)) and int(state.head) == 0
    _, state = opt.update(jnp.array([0.5, 0.5]), state, p - 0.2)
    assert int(state.head) == 1 and float(state.rho_memory[0]) > 0


def test_line_search_failure_is_reported_and_safe():
    loss = lambda p: jnp.sum(p**2)
    # A wrong gradient (the sign is flipped): no step along its "descent" direction
    # decreases the loss. The first failure (steepest descent) sets `failed`.
    opt = eqxopt.LBFGS(linesearch=eqxopt.Zoom(max_steps=5))
    p = jnp.array([1.0, -1.0])
    updates, state = opt.update(
        -jax.grad(loss)(p), opt.init(p), p, value=loss(p), value_fn=loss
    )
    assert bool(state.failed)
    result = state.linesearch_state.result
    assert result == eqxopt.LineSearchResult.max_steps_reached
    assert jnp.array_equal(updates, jnp.zeros(2))


def test_failure_with_memory_restarts_from_steepest_descent():
    loss = lambda p: jnp.sum(p**2) + jnp.sum(p**4)
    opt = eqxopt.LBFGS(memory_size=3)
    p = jnp.array([1.0, -0.5])
    state = opt.init(p)
    value, grad = jax.value_and_grad(loss)(p)
    updates, state = opt.update(grad, state, p, value=value, value_fn=loss)
    p = p + updates
    assert int(state.head) == 1
    # A nonsensical gradient for the next call: the search fails along the L-BFGS
    # direction; the memory is cleared and `failed` stays False.
    updates, state = opt.update(
        -jax.grad(loss)(p), state, p, value=loss(p), value_fn=loss
    )
    assert not bool(state.failed) and bool(jnp.all(state.rho_memory == 0))
    assert jnp.array_equal(updates, jnp.zeros(2))


def test_hyperparams_and_errors():
    opt = eqxopt.LBFGS(learning_rate=0.5, linesearch=eqxopt.Backtracking(c1=0.01))
    state = opt.init(jnp.ones(2))
    hp = opt.hyperparams(state)
    assert hp["learning_rate"] == 0.5 and hp["linesearch"]["c1"] == 0.01
    with pytest.raises(ValueError, match=r"\(memory_size=\.\.\.\)"):
        eqxopt.LBFGS(memory_size=0)
    with pytest.raises(ValueError, match="linesearch"):
        eqxopt.LBFGS(linesearch=eqxopt.Adam(1e-3))  # pyright: ignore
    with pytest.raises(ValueError, match="value_fn"):
        eqxopt.LBFGS().update(jnp.ones(2), state, jnp.ones(2))


def test_backtracking_lbfgs_converges():
    opt = eqxopt.LBFGS(linesearch=eqxopt.Backtracking())
    sol = eqxopt.minimize(
        lambda y, args: rosenbrock(y), opt, jnp.array([-1.2, 1.0]), max_steps=300
    )
    assert jnp.allclose(sol.value, 1.0, atol=1e-5)


def _optimistix_rosenbrock(y, args):
    """optimistix's least-squares Rosenbrock (its tests/helpers.py, `rosenbrock`), as
    the sum of squares of its residuals."""
    residuals = (100 * (y[1:] - y[:-1]), args - y[:-1])
    return sum(jnp.sum(r**2) for r in residuals)


def test_first_step_into_a_steep_valley_is_cheap():
    # From [1.5, 1.5] the gradient is [1, 0] and the unit first step overshoots the
    # minimiser along it (t* = 1/20002) by four orders of magnitude. The zoom tries the
    # interpolated minimiser where it is (not clamped 5% away from the interval's end,
    # which took 4 trials to get there): 2 evaluations, as scipy's L-BFGS-B. The second
    # step moves along the valley's floor (the curvature condition needs a step ~5000
    # times the first trial): bracketing extrapolates as MINPACK's dcsrch (the step
    # grows about 4-fold per trial; doubling took 12 trials, now 7). Issue 16, 8c: the
    # solve took 26 evaluations, then 19 (1 + 5 + 12 + 1); now 1 + 2 + 7 + 1 = 11, as
    # scipy's L-BFGS-B, whose trial points it matches.
    y0, args = jnp.array([1.5, 1.5]), jnp.asarray(1.0)
    opt = eqxopt.LBFGS()
    value, grad = jax.value_and_grad(_optimistix_rosenbrock)(y0, args)
    _, state = opt.update(
        grad,
        opt.init(y0),
        y0,
        value=value,
        value_fn=lambda y: _optimistix_rosenbrock(y, args),
    )
    assert state.linesearch_state.result == eqxopt.LineSearchResult.successful
    assert int(state.linesearch_state.num_evals) == 2
    sol = eqxopt.minimize(_optimistix_rosenbrock, opt, y0, args)
    assert jnp.allclose(sol.value, 1.0)
    assert int(sol.stats["num_steps"]) == 3 and int(sol.stats["num_fevals"]) == 11


def test_steep_valley_trial_points_are_scipys():
    # The same 11 points as scipy's L-BFGS-B (MINPACK's dcsrch), in the same order:
    # the start, two trials of the first search, seven of the second (the step grows
    # about 4-fold per trial along the valley's floor), one of the third.
    import scipy.optimize

    y0, args = jnp.array([1.5, 1.5]), jnp.asarray(1.0)
    ours = []

    def fn(y, args):
        jax.debug.callback(lambda y: ours.append(np.asarray(y)), y, ordered=True)
        return _optimistix_rosenbrock(y, args)

    eqxopt.minimize(fn, eqxopt.LBFGS(), y0, args)
    value_and_grad = jax.jit(jax.value_and_grad(_optimistix_rosenbrock))
    theirs = []

    def fun(y):
        theirs.append(y.copy())
        value, grad = value_and_grad(jnp.asarray(y), args)
        return float(value), np.asarray(grad)

    scipy.optimize.minimize(fun, np.asarray(y0), jac=True, method="L-BFGS-B")
    assert len(ours) == len(theirs) == 11
    # Up to rounding (the two-loop recursion vs. scipy's compact form).
    np.testing.assert_allclose(np.stack(ours), np.stack(theirs), rtol=1e-7, atol=1e-12)
