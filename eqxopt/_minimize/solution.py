"""`RESULTS` and `Solution`: what [`eqxopt.minimize`][] returns."""

from typing import Any

import equinox as eqx
import numpy as np
from equinox._enum import EnumerationItem
from jax.core import Tracer
from jaxtyping import Array, ArrayLike, PyTree


class RESULTS(eqx.Enumeration):
    """How a call to [`eqxopt.minimize`][] ended.

    `eqxopt.RESULTS[sol.result]` is the message; `sol.result == RESULTS.successful` is
    a boolean array (usable under `jit`).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt


        def loss(y, args):
            return jnp.sum((y - 3.0) ** 2)


        sol = eqxopt.minimize(
            loss, eqxopt.SGD(0.01), jnp.zeros(2), max_steps=10, throw=False
        )
        assert sol.result == eqxopt.RESULTS.max_steps_reached  # 10 steps are too few
        print(eqxopt.RESULTS[sol.result])  # the message, with advice
        ```
    """

    successful = ""
    max_steps_reached = (
        "eqxopt.minimize: `RESULTS.max_steps_reached`: the maximum number of steps was "
        "reached before `max|grad| <= atol + rtol * |loss|` held. Increase "
        "`max_steps`, loosen `rtol`/`atol`, or use a better-suited optimizer (for a "
        "deterministic full-batch loss, `eqxopt.LBFGS()` usually needs far fewer steps "
        "than a first-order method)."
    )
    nonfinite = (
        "eqxopt.minimize: `RESULTS.nonfinite`: the loss or its gradient became "
        "non-finite (inf or NaN). Check that `fn` is finite at `y0` and in its "
        "neighbourhood; with a first-order optimizer lower the learning rate; "
        "reparameterize constrained parameters (e.g. optimize `log(x)` for a positive "
        "`x`); or enable float64 (`jax.config.update('jax_enable_x64', True)`) if "
        "values overflow."
    )
    linesearch_failed = (
        "eqxopt.minimize: `RESULTS.linesearch_failed`: the line search found no step "
        "with sufficient decrease, even along the steepest-descent direction. This "
        "usually means the tolerances are below what the floating-point precision "
        "allows (loosen `rtol`/`atol`, or enable float64), that `fn` is not smooth or "
        "not deterministic, or that its gradient is wrong (check custom derivatives). "
        "Increasing the line search's `max_steps` can help on badly scaled problems."
    )
    precision_limit = (
        "eqxopt.minimize: `RESULTS.precision_limit`: the solve stopped where no "
        "further decrease is possible in floating point (the steps round away: the "
        "line search could not move the point, several line-search steps in a row "
        "left the loss undecreased, or first-order steps in a row left the point, "
        "the optimizer's state and its hyperparameters unchanged), at a point that "
        "is not provably a minimum: `max|grad| <= atol + rtol * |loss|` does not "
        "hold. The tolerances are probably below what the precision allows: loosen "
        "`rtol`/`atol`, enable float64, or rescale the problem (its loss or its "
        "variables)."
    )


class _ResultItem(EnumerationItem):
    """A `RESULTS` item that prints as its name and message."""

    def __repr__(self):
        value = self._value
        if isinstance(value, Tracer):
            return "RESULTS.<traced>"
        names = {int(v._value): k for k, v in RESULTS._name_to_item.items()}
        value = np.asarray(value)
        if value.ndim > 0:  # batched, e.g. under `jax.vmap`
            lanes = ", ".join(names[int(v)] for v in value.reshape(-1))
            return f"RESULTS[{lanes}] (shape {value.shape})"
        name = names[int(value)]
        message = RESULTS._index_to_message[int(value)]
        return f"RESULTS.{name}" + (f": {message}" if message else "")

    __str__ = __repr__


def succeeded(item) -> bool:
    """Whether a concrete `RESULTS` item is `RESULTS.successful` (compared on the
    host: `item == RESULTS.successful` would compile a kernel)."""
    return int(np.asarray(item._value)) == int(RESULTS.successful._value)


def result_item(item) -> "RESULTS":
    """`item` as a `RESULTS` item that prints its name and message."""
    return _ResultItem(item._value, RESULTS)  # pyright: ignore


for _name, _item in list(RESULTS._name_to_item.items()):
    RESULTS._name_to_item[_name] = result_item(_item)


class Solution(eqx.Module):
    """The result of [`eqxopt.minimize`][].

    **Attributes:**

    - `value`: the final `y`.
    - `loss`: `fn(value, args)` (its first output with `has_aux=True`).
    - `aux`: the auxiliary output of `fn` at `value` (`None` without `has_aux`).
    - `state`: the optimizer's final state.
    - `result`: an [`eqxopt.RESULTS`][] item: `successful`, `max_steps_reached`,
        `nonfinite`, `linesearch_failed` or `precision_limit`; `print(sol.result)`
        shows its name and message.
    - `stats`: a dict with `num_steps` (updates applied, int32), `num_fevals` (calls
        of `fn`; value and gradient together count once; int32) and `history` (length
        `max_steps`: `history[i]` is the loss at the start of step `i`, NaN from
        `num_steps` on).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt


        def loss(y, args):
            return jnp.sum((y - args) ** 2)


        sol = eqxopt.minimize(loss, eqxopt.LBFGS(), jnp.zeros(3), args=jnp.arange(3.0))
        sol.value, sol.loss  # ~[0, 1, 2], ~0
        sol.stats["num_steps"], sol.stats["num_fevals"]  # int32 counts
        ```
    """

    value: PyTree[Any]
    loss: Array
    aux: Any
    state: Any
    result: RESULTS
    stats: dict[str, PyTree[ArrayLike]]
