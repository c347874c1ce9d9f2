"""RMSProp (and its building blocks `ScaleByRms` and `ScaleByStddev`), the three
final classes of one abstract base, `AbstractRMS`."""

from typing import ClassVar, TYPE_CHECKING

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int32, PyTree

from .._checks import check_hyperparams
from .._core.base import AbstractOptimizer
from .._custom_types import Params, ScalarLike, ScalarOrSchedule, Updates
from .._kernels import ema, momentum_step
from .._misc import (
    abs_sq,
    compute_dtype,
    increment,
    out_dtype,
    pack,
    per_dtype,
    resolve,
    scalar,
    tree_map_unzip,
    typechecked,
    zero_count,
)
from .._quantized import buffers_like, dtype_of, read, Stored, write


# Abstract fields: type checkers see a `ClassVar` (as equinox does for its
# `AbstractClassVar`), so that their model of a final class's `__init__` takes its
# fields, in Optax's order, from the final class alone, as equinox does at run time.
if TYPE_CHECKING:
    from typing import ClassVar as AbstractVar
else:
    from equinox import AbstractVar


@typechecked
class RMSPropState(eqx.Module):
    """State of [`eqxopt.RMSProp`][], [`eqxopt.ScaleByRms`][] and
    [`eqxopt.ScaleByStddev`][]: the step count, the second moment `nu`, the first
    moment `mu` (only when centered, else `None`) and the momentum buffer `trace` (only
    with momentum, else `None`), one leaf per param.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        state = eqxopt.RMSProp(1e-3, centered=True).init(params)
        state.nu["w"], state.mu["w"]  # second and (centered) first moment
        assert state.trace is None  # no momentum buffer without momentum
        ```
    """

    count: Int32[Array, ""]
    nu: PyTree[Stored]
    mu: PyTree[Stored] | None
    trace: PyTree[Stored] | None


class AbstractRMS(AbstractOptimizer[RMSPropState]):
    r"""Divide by the root of a running (centered, where `centered`) second moment, for
    [`eqxopt.ScaleByRms`][], [`eqxopt.ScaleByStddev`][] and [`eqxopt.RMSProp`][]. Per
    leaf: $g / \sqrt{\hat\nu - \hat\mu^2 + \epsilon}$ (the $\mu$ term only when
    centered; $\epsilon$ outside the root unless `eps_in_sqrt`); where the final class
    has a `learning_rate`, then times $-\eta$ and through heavy-ball `momentum`."""

    decay: AbstractVar[ScalarLike]
    eps: AbstractVar[ScalarLike]
    initial_scale: AbstractVar[ScalarLike]
    eps_in_sqrt: AbstractVar[bool]
    centered: AbstractVar[bool]
    bias_correction: AbstractVar[bool]
    state_dtype: AbstractVar[object]

    def _param_buffers(self) -> dict[str, bool]:
        out = {"nu": True}
        if self.centered:
            out["mu"] = False
        if getattr(self, "momentum", None) is not None:
            out["trace"] = False
        return out

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=("eps", "initial_scale")
            + (("learning_rate",) if hasattr(self, "learning_rate") else ()),
            unit_interval=("decay",)
            + (("momentum",) if hasattr(self, "momentum") else ()),
        )

    def init(self, params: Params) -> RMSPropState:
        momentum = getattr(self, "momentum", None)
        return RMSPropState(
            zero_count(),
            buffers_like(params, self.state_dtype, "nu", True, self.initial_scale),
            buffers_like(params, self.state_dtype, "mu", False)
            if self.centered
            else None,
            None
            if momentum is None
            else buffers_like(params, self.state_dtype, "trace", False),
        )

    def update(self, grads: Updates, state: RMSPropState, params=None, **extra):
        learning_rate = getattr(self, "learning_rate", None)
        lr = None if learning_rate is None else resolve(learning_rate, state.count)
        momentum = getattr(self, "momentum", None)
        nesterov = getattr(self, "nesterov", False)
        centered = self.centered
        count = increment(state.count)

        def _constants(dtype):
            decay = scalar(self.decay, dtype)
            correction = None
            if self.bias_correction:
                correction = 1 - decay ** count.astype(dtype)
            neg_lr = None if lr is None else -scalar(lr, dtype)
            return decay, 1 - decay, correction, scalar(self.eps, dtype), neg_lr

        constants = per_dtype(_constants)  # traced once per update, not once per leaf

        def _leaf(g, nu, mu, trace, p):
            dtype = compute_dtype(
                g.dtype, dtype_of(nu), *(() if mu is None else (dtype_of(mu),))
            )
            decay, one_minus_decay, correction, eps, neg_lr = constants(dtype)
            g32 = g.astype(dtype)
            nu32 = ema(abs_sq(g32), read(nu, dtype), decay, one_minus_decay)
            nu_hat = nu32 if correction is None else nu32 / correction
            if centered:
                assert mu is not None  # `init` made it
                mu32 = ema(g32, read(mu, dtype), decay, one_minus_decay)
                mu_hat = mu32 if correction is None else mu32 / correction
                # >= 0 in exact arithmetic; clamped so that rounding (e.g. of a float16
                # `nu`, or at the first bias-corrected step) cannot make the root NaN.
                var = jnp.maximum(nu_hat - abs_sq(mu_hat), 0)
                mu = write(mu32, mu)
            else:
                var = nu_hat
            if self.eps_in_sqrt:
                scale = jax.lax.rsqrt(var + eps)
            else:
                scale = 1 / (jnp.sqrt(var) + eps)
            direction = scale * g32
            if neg_lr is not None:
                direction = direction * neg_lr
                direction, trace = momentum_step(direction, trace, momentum, nesterov)
            return pack(direction.astype(out_dtype(g, p)), write(nu32, nu), mu, trace)

        updates, nu, mu, trace = tree_map_unzip(
            _leaf,
            4,
            grads,
            state.nu,
            state.mu,
            state.trace,
            params,
            names=("grads", "state.nu", "state.mu", "state.trace", "params"),
        )
        return updates, RMSPropState(
            count,
            nu,
            mu if centered else None,
            None if state.trace is None else trace,
        )


class ScaleByRms(AbstractRMS):
    r"""Divide updates by the root of an exponential moving average of their squares:

    $$\nu_k = \rho\,\nu_{k-1} + (1-\rho)\,g_k^2, \qquad
      u_k = \frac{g_k}{\sqrt{\nu_k + \epsilon}}$$

    ($\epsilon$ outside the root with `eps_in_sqrt=False`; $\nu$ divided by
    $1-\rho^k$ with `bias_correction=True`). Matches `optax.scale_by_rms`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(
            eqxopt.ScaleByRms(decay=0.9), eqxopt.ScaleByLearningRate(1e-3)
        )
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        # RMSProp without momentum
        ```
    """

    decay: ScalarLike = 0.9
    eps: ScalarLike = 1e-8
    initial_scale: ScalarLike = 0.0
    eps_in_sqrt: bool = eqx.field(default=True, static=True)
    bias_correction: bool = eqx.field(default=False, static=True)
    state_dtype: object = eqx.field(default=None, static=True, kw_only=True)
    centered: ClassVar[bool] = False


class ScaleByStddev(AbstractRMS):
    r"""Divide updates by a running estimate of their standard deviation (centered
    RMS):

    $$\mu_k = \rho\,\mu_{k-1} + (1-\rho)\,g_k, \qquad
      \nu_k = \rho\,\nu_{k-1} + (1-\rho)\,g_k^2, \qquad
      u_k = \frac{g_k}{\sqrt{\nu_k - \mu_k^2 + \epsilon}}$$

    ($\epsilon$ outside the root with `eps_in_sqrt=False`; both moments bias-corrected
    with `bias_correction=True`). Matches `optax.scale_by_stddev`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(
            eqxopt.ScaleByStddev(decay=0.9), eqxopt.ScaleByLearningRate(1e-3)
        )
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        # centered RMSProp
        ```
    """

    decay: ScalarLike = 0.9
    eps: ScalarLike = 1e-8
    initial_scale: ScalarLike = 0.0
    eps_in_sqrt: bool = eqx.field(default=True, static=True)
    bias_correction: bool = eqx.field(default=False, static=True)
    state_dtype: object = eqx.field(default=None, static=True, kw_only=True)
    centered: ClassVar[bool] = True


class RMSProp(AbstractRMS):
    r"""RMSProp: divide the gradient by the root of a running average of its square.

    $$\nu_k = \rho\,\nu_{k-1} + (1-\rho)\,g_k^2, \qquad
      s_k = \frac{g_k}{\sqrt{\nu_k + \epsilon}}, \qquad u_k = -\eta_k\, s_k$$

    With `centered=True` the denominator is $\sqrt{\nu_k - \mu_k^2 + \epsilon}$, with
    $\mu_k = \rho\,\mu_{k-1} + (1-\rho)\,g_k$ (Graves, 2013). With `momentum` $\gamma$
    the scaled updates go through heavy-ball momentum, $t_k = -\eta_k s_k +
    \gamma\,t_{k-1}$, $u_k = t_k$ (with `nesterov`, $u_k = -\eta_k s_k + \gamma\,t_k$),
    as in Optax (the learning rate is applied before the momentum).
    `eps_in_sqrt=False` puts $\epsilon$ outside the root; `bias_correction=True`
    divides the moments by $1-\rho^k$. Matches `optax.rmsprop`.

    ??? cite "References"

        ```bibtex
        @misc{tieleman2012rmsprop,
            title={Lecture 6.5 - RMSProp: Divide the gradient by a running average of
                its recent magnitude},
            author={Tieleman, Tijmen and Hinton, Geoffrey},
            howpublished={COURSERA: Neural Networks for Machine Learning},
            year={2012}}

        @article{graves2013generating,
            title={Generating Sequences With Recurrent Neural Networks},
            author={Graves, Alex}, journal={arXiv:1308.0850}, year={2013}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.RMSProp(1e-3, decay=0.95, centered=True, momentum=0.9)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    decay: ScalarLike = 0.9
    eps: ScalarLike = 1e-8
    initial_scale: ScalarLike = 0.0
    eps_in_sqrt: bool = eqx.field(default=True, static=True)
    centered: bool = eqx.field(default=False, static=True)
    momentum: ScalarLike | None = None
    nesterov: bool = eqx.field(default=False, static=True)
    bias_correction: bool = eqx.field(default=False, static=True)
    state_dtype: object = eqx.field(default=None, static=True, kw_only=True)


_RMS_ARGS = r"""- `decay`: decay rate $\rho$ of the moving averages, in `[0, 1)`.
- `eps`: $\epsilon$, added inside the root (or outside with `eps_in_sqrt=False`).
- `initial_scale`: initial value of $\nu$ (`>= 0`).
- `eps_in_sqrt`: whether $\epsilon$ goes inside the root. (Static.)
"""
_STATE_DTYPE = """- `state_dtype`: dtype of every buffer; default the param's. (Static,
    keyword-only.)
"""
RMSProp.__init__.__doc__ = (
    "**Arguments:**\n\n"
    r"- `learning_rate`: $\eta$; a number, an array, or a schedule `count -> scalar`."
    "\n"
    + _RMS_ARGS
    + (
        "- `centered`: divide by the standard deviation instead of the RMS. "
        "(Static.)\n"
        "- `momentum`: heavy-ball decay $\\gamma$ in `[0, 1)`, or `None` (default) for "
        "none.\n"
        "- `nesterov`: use Nesterov momentum. (Static.)\n"
        "- `bias_correction`: divide the moments by $1-\\rho^k$. (Static.)\n"
    )
    + _STATE_DTYPE
)
_SCALE_DOC = (
    "**Arguments:**\n\n"
    + _RMS_ARGS
    + "- `bias_correction`: divide the moments by $1-\\rho^k$. (Static.)\n"
    + _STATE_DTYPE
)
ScaleByRms.__init__.__doc__ = _SCALE_DOC
ScaleByStddev.__init__.__doc__ = _SCALE_DOC
