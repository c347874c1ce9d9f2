"""The Adam family's shared parts: `AdamState`, the abstract bases
`AbstractAdamFamily` (every optimizer whose state is an `AdamState`; a subclass gives
its per-leaf rule) and `AbstractAdam` (Adam's own rule, also NAdam's), and the
argument docs the family's classes share."""

import abc
from collections.abc import Callable
from typing import TYPE_CHECKING

import equinox as eqx
from jaxtyping import Array, Int32, PyTree

from .._checks import check_hyperparams
from .._core.base import AbstractOptimizer
from .._custom_types import Params, ScalarLike, Updates
from .._kernels import (
    adaptive,
    betas,
    descent_of,
    ema,
    first_moment_hat,
    optional,
)
from .._misc import (
    abs_sq,
    compute_dtype,
    increment,
    out_dtype,
    pack,
    per_dtype,
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
class AdamState(eqx.Module):
    """State of [`eqxopt.Adam`][], [`eqxopt.AdamW`][], [`eqxopt.ScaleByAdam`][] and of
    Adam's relatives that keep the same two moments ([`eqxopt.NAdam`][],
    [`eqxopt.NAdamW`][], [`eqxopt.Adamax`][], [`eqxopt.AdamaxW`][],
    [`eqxopt.RAdam`][], [`eqxopt.AdaBelief`][], [`eqxopt.Yogi`][], [`eqxopt.Lamb`][]
    and their `ScaleBy*` blocks): the step count and the first and second moments
    (for Adamax the infinity norm, for AdaBelief the belief), one leaf per param.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        state = eqxopt.Adam(1e-3).init(params)
        assert state.count == 0  # int32 step count
        assert state.mu["w"].shape == (2, 3)  # first moment, like params["w"]
        assert state.nu["w"].dtype == params["w"].dtype  # second moment
        ```
    """

    count: Int32[Array, ""]
    mu: PyTree[Stored]
    nu: PyTree[Stored]


# Hyperparameters that must be >= 0, where a family member has them.
_NONNEGATIVE = (
    "learning_rate",
    "eps",
    "eps_root",
    "weight_decay",
    "initial_accumulator_value",
)


# A per-leaf rule of the family: `(g, m, v) -> (direction, m, v)`.
LeafRule = Callable[[Array, Array, Array], tuple[Array, Array, Array]]


class AbstractAdamFamily(AbstractOptimizer[AdamState]):
    r"""An optimizer whose state is an [`eqxopt.AdamState`][]: two moments per param,
    updated per leaf by the rule `_rule` the subclass gives, then turned into the
    update by the fields the final class declares: with `learning_rate`, $-\eta\,d$;
    with `weight_decay` and `mask` too, $-\eta\,(d + \lambda p)$ on the leaves `mask`
    selects; with neither (the `ScaleBy*` blocks), the direction $d$ itself (see
    `eqxopt._kernels.descent_of`). Both moments start at
    `initial_accumulator_value` where the class has one, else at 0.
    """

    b1: AbstractVar[ScalarLike]
    b2: AbstractVar[ScalarLike]
    eps: AbstractVar[ScalarLike]
    state_dtype: AbstractVar[object]

    # The first moment changes sign; the second (or infinity norm, or belief) does not.
    _state_buffers = {"mu": False, "nu": True}

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=tuple(n for n in _NONNEGATIVE if hasattr(self, n)),
            unit_interval=("b1", "b2"),
        )

    def init(self, params: Params) -> AdamState:
        value = getattr(self, "initial_accumulator_value", 0)
        return AdamState(
            zero_count(),
            buffers_like(params, self.state_dtype, "mu", False, value),
            buffers_like(params, self.state_dtype, "nu", True, value),
        )

    def update(self, grads: Updates, state: AdamState, params=None, **extra):
        finish, mask = descent_of(self, state.count, params)
        return adam_family_step(grads, state, params, self._rule, finish, mask)

    @abc.abstractmethod
    def _rule(self, t: Array) -> LeafRule:
        """The per-leaf rule at the 1-based step number `t` (a scalar of the compute
        dtype): `(g, m, v) -> (direction, m, v)`, in the compute dtype. Called once
        per update and dtype, so its scalars are traced once, not once per leaf."""


def adam_family_step(
    grads, state: AdamState, params, rule: Callable[[Array], LeafRule], finish, mask
):
    """One update of an optimizer whose state is an `AdamState`.

    Per leaf, in the compute dtype: `rule(t)(g, m, v) -> (direction, m, v)` with `t`
    the 1-based step number (`rule(t)` is built once per dtype), then `finish(direction,
    g, p, selected) -> update` (`selected` is the leaf's `mask` entry, `None` without a
    mask; no `finish` returns the direction). Buffers are read and stored back through
    `eqxopt._quantized` (their own dtype, or re-quantized), and updates returned in the
    param's dtype.
    """
    count = increment(state.count)
    rules = per_dtype(lambda dtype: rule(count.astype(dtype)))

    def _leaf(g, m, v, p, selected):
        dtype = compute_dtype(g.dtype, dtype_of(m), dtype_of(v))
        direction, m32, v32 = rules(dtype)(
            g.astype(dtype), read(m, dtype), read(v, dtype)
        )
        update = direction if finish is None else finish(direction, g, p, selected)
        return pack(update.astype(out_dtype(g, p)), write(m32, m), write(v32, v))

    updates, mu, nu = tree_map_unzip(
        _leaf,
        3,
        grads,
        state.mu,
        state.nu,
        params,
        mask,
        names=("grads", "state.mu", "state.nu", "params", "mask"),
    )
    return updates, AdamState(count, mu, nu)


def adam_moments(b1, b2, eps, eps_root, nesterov: bool = False):
    """Adam's rule `t -> (g, m, v) -> (direction, m, v)`, for `adam_family_step` (and
    Lamb's)."""

    def rule(t: Array) -> LeafRule:
        c = betas(b1, b2, t, nesterov)
        eps_, eps_root_ = scalar(eps, t.dtype), optional(eps_root, t.dtype)

        def moments(g, m, v):
            m = ema(g, m, c.b1, c.one_minus_b1)
            v = ema(abs_sq(g), v, c.b2, c.one_minus_b2)
            m_hat = first_moment_hat(m, g, c)
            return adaptive(m_hat, v / c.correction2, eps_, eps_root_), m, v

        return moments

    return rule


class AbstractAdam(AbstractAdamFamily):
    """Adam's rule, for [`eqxopt.ScaleByAdam`][], [`eqxopt.Adam`][],
    [`eqxopt.AdamW`][], [`eqxopt.NAdam`][] and [`eqxopt.NAdamW`][]."""

    eps_root: AbstractVar[ScalarLike]
    nesterov: AbstractVar[bool]

    def _rule(self, t: Array) -> LeafRule:
        moments = adam_moments(self.b1, self.b2, self.eps, self.eps_root, self.nesterov)
        return moments(t)


# --- argument docs shared by the family's `__init__` docstrings ---------------------

ARG_LR = (
    r"- `learning_rate`: $\eta$; a number, an array, or a schedule `count -> scalar`."
)
ARG_BETAS = r"- `b1`, `b2`: decay rates $\beta_1, \beta_2$ of the moments, in `[0, 1)`."
ARG_EPS = r"- `eps`: $\epsilon$, added to the denominator outside the root."
ARG_EPS_ROOT = r"- `eps_root`: $\epsilon_{\rm root}$, added inside the root."
ARG_SD = "- `state_dtype`: dtype of every moment buffer; default the param's. (Static"
ARG_SD_POS = ARG_SD + "; Optax's `mu_dtype`.)"
ARG_SD_KW = ARG_SD + ", keyword-only.)"
ARG_WD = (
    r"- `weight_decay`: $\lambda$ (multiplied by the learning rate); a number or a "
    "schedule."
)
ARG_MASK = "- `mask`: which leaves are decayed, as a filter spec; default all."
ARG_NESTEROV = (
    "- `nesterov`: use NAdam's look-ahead first moment. (Static, keyword-only.)"
)
ARG_BIAS = (
    "- `bias_correction_mu`, `bias_correction_nu`: whether to bias-correct the first "
    "moment, and the second before the maximum. (Static.)"
)
ARG_THRESHOLD = (
    r"- `threshold`: $\tau$, the smallest $\rho_k$ that turns rectification on."
)


def init_doc(*lines: str) -> str:
    """An `__init__` docstring: "**Arguments:**" and one bullet per line."""
    return "**Arguments:**\n\n" + "\n".join(lines) + "\n"
