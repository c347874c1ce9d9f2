"""SAM: sharpness-aware minimisation, as a wrapper of an outer and an adversarial
optimizer."""

from typing import Any, Generic

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array, Inexact, Int32, PyTree

from .._checks import check_hyperparams, need_extra, need_params
from .._core.base import AbstractOptimizer, child_update, scalar_hyperparams
from .._custom_types import Params, State, Updates
from .._misc import (
    compute_dtype,
    out_dtype,
    sharded_like,
    tree_map,
    typechecked,
    zero_count,
)


@typechecked
class SAMState(eqx.Module, Generic[State]):
    """State of [`eqxopt.SAM`][]: the number of adversarial steps since the last outer
    step, the outer optimizer's state, the adversarial optimizer's state, and (in the
    default transparent mode) the params of the last outer step, `cache`, one leaf per
    param (`None` with `opaque_mode=True`).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.SAM(eqxopt.SGD(1e-2), eqxopt.SGD(5e-2))
        state = opt.init(params)
        params, state = opt.step(params, grads, state)  # an adversarial step
        assert state.steps_since_sync == 1
        state.cache["w"]  # the params to come back to at the outer step
        ```
    """

    steps_since_sync: Int32[Array, ""]
    opt_state: State
    adv_state: Any
    cache: PyTree[Inexact[Array, "..."]] | None


def _holds_buffers(state) -> bool:
    """Whether `state` has an array leaf of more than one element (a buffer shaped
    like a param, a factored moment, ...), rather than only counters and scalars."""
    return any(eqx.is_array(x) and x.size > 1 for x in jtu.tree_leaves(state))


class SAM(AbstractOptimizer[SAMState]):
    r"""SAM (sharpness-aware minimisation): take `sync_period - 1` adversarial steps
    with `adv_optimizer` (ascent: its updates are negated), then one step of
    `optimizer` from the params of the previous outer step, using the gradient at the
    adversarial point.

    With the drop-in SAM of the paper (`sync_period=2`,
    `adv_optimizer = Chain(Normalize(), SGD(rho))`), the two calls are

    $$\tilde x_k = x_k + \rho\,\frac{g(x_k)}{\|g(x_k)\|}, \qquad
      x_{k+1} = x_k + \mathrm{optimizer}\big(g(\tilde x_k)\big).$$

    In the default *transparent* mode each `update` call is one of those steps, so
    the caller computes the gradient at the adversarial params in between. With
    `opaque_mode=True` one `update` does the whole cycle and needs the extra argument
    `grad_fn=` (`(params, i) -> grads`, called `sync_period - 1` times), as Optax's.

    Matches `optax.contrib.sam`, except that the transparent mode never lets a NaN
    from the unused optimizer through (Optax runs both and blends them by multiplying
    by 0 and 1). When either optimizer keeps buffers in its state (momentum, Adam's
    moments), only the optimizer that the step needs runs (a `lax.cond`); otherwise
    both run and the step selects one (a `where`, cheaper than a `lax.cond` when
    there is no state to skip). Both inner optimizers are called with the extra
    `update` arguments.

    ??? cite "References"

        ```bibtex
        @inproceedings{foret2021sharpness,
            title={Sharpness-aware Minimization for Efficiently Improving
                Generalization},
            author={Foret, Pierre and Kleiner, Ariel and Mobahi, Hossein and
                Neyshabur, Behnam},
            booktitle={ICLR}, year={2021}}
        ```

    !!! Example

        ```python
        import jax
        import jax.numpy as jnp

        import eqxopt


        def loss(params):
            return jnp.sum(params["w"] ** 2) + jnp.sum(params["b"] ** 2)


        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        opt = eqxopt.SAM(eqxopt.SGD(1e-2), eqxopt.SGD(5e-2), opaque_mode=True)
        state = opt.init(params)
        grad_fn = jax.tree_util.Partial(lambda p, i: jax.grad(loss)(p))
        grads = jax.grad(loss)(params)
        params, state = opt.step(params, grads, state, grad_fn=grad_fn)
        ```
    """

    optimizer: AbstractOptimizer
    adv_optimizer: AbstractOptimizer
    sync_period: int = eqx.field(default=2, static=True)
    reset_state: bool = eqx.field(default=True, static=True)
    opaque_mode: bool = eqx.field(default=False, static=True)
    batch_axis_name: str | None = eqx.field(default=None, static=True)

    def __check_init__(self):
        for name in ("optimizer", "adv_optimizer"):
            if not isinstance(getattr(self, name), AbstractOptimizer):
                raise ValueError(
                    f"`SAM({name}=...)` must be an eqxopt optimizer, got "
                    f"{type(getattr(self, name)).__name__}."
                )
        check_hyperparams(self, positive_int=("sync_period",))

    def init(self, params: Params) -> SAMState:
        # A copy, not the params' own buffers, so that (params, state) can be donated.
        cache = None if self.opaque_mode else tree_map(lambda p: jnp.copy(p), params)
        return SAMState(
            zero_count(),
            self.optimizer.init(params),
            self.adv_optimizer.init(params),
            cache,
        )

    def update(self, grads: Updates, state: SAMState, params=None, **extra):
        need_params(self, params)
        if self.opaque_mode:
            return self._opaque(grads, state, params, extra)
        return self._transparent(grads, state, params, extra)

    def _transparent(self, grads, state: SAMState, params, extra):
        first = state.steps_since_sync == 0
        last = state.steps_since_sync == self.sync_period - 1

        def _outer(_):
            updates, opt_state = child_update(
                self.optimizer,
                ".opt_state",
                grads,
                state.opt_state,
                state.cache,
                **extra,
            )

            # Back to the params of the previous outer step, then its update. (Both
            # steps' updates are sharded like the params: the cache and the
            # optimizers' buffers may be split further, by `shard_over`.)
            def _leaf(c, p, u):
                dtype = compute_dtype(c.dtype, p.dtype, u.dtype)
                new = c.astype(dtype) - p.astype(dtype) + u.astype(dtype)
                return sharded_like(new.astype(out_dtype(u, p)), p)

            updates = tree_map(
                _leaf,
                state.cache,
                params,
                updates,
                names=("state.cache", "params", "updates"),
            )
            adv_state = state.adv_state
            if self.reset_state:
                adv_state = jtu.tree_map(
                    sharded_like, self.adv_optimizer.init(params), adv_state
                )
            return updates, opt_state, adv_state

        def _adversarial(_):
            updates, adv_state = child_update(
                self.adv_optimizer,
                ".adv_state",
                grads,
                state.adv_state,
                params,
                **extra,
            )
            updates = tree_map(
                lambda u, p: sharded_like((-u).astype(out_dtype(u, p)), p),
                updates,
                params,
            )
            return updates, state.opt_state, adv_state

        # Which of the two steps to compute. With a state buffer in either optimizer
        # (momentum, Adam's moments), a `lax.cond` runs only the step that this call
        # needs, so the other optimizer's buffers are neither read nor written: on
        # CPU at 1M params (`benchmarks/update.py`, three runs) 0.55-0.8x Optax's
        # step time (which runs both), against 0.7-1.0x when computing both and
        # selecting, which also copies more param-sized buffers; and on an
        # accelerator, for a large model, the traffic saved grows with the model
        # while the `cond`'s cost (a launch, the predicate) does not. Without
        # state buffers (the paper's SAM: `Normalize`, SGD), both steps are a few
        # elementwise operations on arrays that the step reads anyway; computed
        # both and selected, they fuse with the caller's `apply_updates` into one
        # pass over the params, where a `cond` writes the update to a buffer of its
        # own and reads it back: 1.1-1.55x Optax's time with the `cond`, 0.9-1.0x
        # with the selection. The selection is a `where`, not Optax's blend by 0 and 1,
        # so a NaN in the unused step does not leak. (A stateless but expensive
        # step, e.g. a matrix function of the gradient, would run on every call.)
        if _holds_buffers(state.opt_state) or _holds_buffers(state.adv_state):
            updates, opt_state, adv_state = lax.cond(last, _outer, _adversarial, None)
        else:
            updates, opt_state, adv_state = jtu.tree_map(
                lambda a, b: jnp.where(last, a, b), _outer(None), _adversarial(None)
            )
        cache = tree_map(
            lambda c, p: jnp.where(first, sharded_like(p.astype(c.dtype), c), c),
            state.cache,
            params,
            names=("state.cache", "params"),
        )
        steps = jnp.where(last, 0, state.steps_since_sync + 1).astype(jnp.int32)
        return updates, SAMState(steps, opt_state, adv_state, cache)

    def _opaque(self, grads, state: SAMState, params, extra):
        (grad_fn,) = need_extra(self, extra, "grad_fn")
        adv_params, adv_updates, adv_state = params, grads, state.adv_state
        for i in range(self.sync_period - 1):
            adv_updates, adv_state = child_update(
                self.adv_optimizer,
                ".adv_state",
                adv_updates,
                adv_state,
                adv_params,
                **extra,
            )
            adv_updates = tree_map(
                lambda u, p: (-u).astype(out_dtype(u, p)), adv_updates, adv_params
            )
            adv_params = eqx.apply_updates(adv_params, adv_updates)
            adv_updates = grad_fn(adv_params, i)
            if self.batch_axis_name is not None:
                adv_updates = jax.lax.pmean(adv_updates, axis_name=self.batch_axis_name)
        if self.reset_state:
            adv_state = self.adv_optimizer.init(params)
        updates, opt_state = child_update(
            self.optimizer, ".opt_state", adv_updates, state.opt_state, params, **extra
        )
        return updates, SAMState(zero_count(), opt_state, adv_state, None)

    def hyperparams(self, state: SAMState) -> dict[str, Any]:
        hp = scalar_hyperparams(self, None)
        hp["optimizer"] = self.optimizer.hyperparams(state.opt_state)
        hp["adv_optimizer"] = self.adv_optimizer.hyperparams(state.adv_state)
        return hp


SAM.__init__.__doc__ = r"""**Arguments:**

- `optimizer`: the outer optimizer.
- `adv_optimizer`: the adversarial optimizer, whose updates are negated (e.g.
    `Chain(Normalize(), SGD(rho))`).
- `sync_period`: one outer step every `sync_period` calls (the other calls are
    adversarial steps); default `2`. (Static.)
- `reset_state`: reset the adversarial optimizer's state after each outer step.
    (Static.)
- `opaque_mode`: run the whole cycle in one `update`, which then needs the extra
    argument `grad_fn=` (`(params, i) -> grads`). (Static.)
- `batch_axis_name`: with `opaque_mode`, `lax.pmean` the adversarial gradients over
    this named axis. (Static.)
"""
