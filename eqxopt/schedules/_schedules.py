"""Schedules: `count -> scalar` as Equinox Modules, numerically matching Optax 0.2.8.

Every schedule stores exactly what it was given (Python numbers, arrays, nested
schedules); nothing is converted to a JAX array at construction, so a schedule built
inside one trace can be used inside another. Step counts and boundaries are static
fields; values (`init_value`, `peak_value`, ...) are ordinary fields, so an array
passed there can be changed with `eqx.tree_at` without recompiling.

`__call__` computes in the promotion of float32 and the dtypes of the array-valued
hyperparameters, or in the default float dtype (float64 under `jax_enable_x64`) when
every hyperparameter is a Python number. The step count is cast explicitly, so every
schedule works under `jax_numpy_dtype_promotion("strict")`.
"""

import abc
import dataclasses
import functools as ft
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, overload
from typing_extensions import TypeIs

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike

from .._checks import concrete_scalar


# --- helpers ---


def _is_array(x) -> TypeIs[jax.Array | np.ndarray | np.bool_ | np.number]:
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


def _float_dtype(*values) -> np.dtype:
    """The dtype a schedule computes in (see the module docstring)."""
    dtypes = [x.dtype for x in values if _is_array(x)]
    dtypes = [d for d in dtypes if jnp.issubdtype(d, jnp.inexact)]
    if not dtypes:
        return np.dtype(jnp.result_type(float))
    with jax.numpy_dtype_promotion("standard"):
        dtype = ft.reduce(jnp.promote_types, dtypes, np.dtype(jnp.float32))
    return jax.dtypes.canonicalize_dtype(dtype)  # NumPy float64 without x64


@overload
def _value(x: ArrayLike, dtype) -> Array | int | float | complex: ...
@overload
def _value(x: None, dtype) -> None: ...
def _value(x: ArrayLike | None, dtype) -> Array | int | float | complex | None:
    """Python numbers pass through (weakly typed); arrays are cast to `dtype`."""
    if _is_array(x):
        return jnp.asarray(x).astype(dtype)
    return x


def _time(count: ArrayLike, dtype) -> Array:
    """The step count as a float of `dtype`: an explicit cast, for strict promotion."""
    return jnp.asarray(count).astype(dtype)


def _out(x, dtype) -> Array:
    return jnp.asarray(x).astype(dtype)


def _concrete(x) -> float | None:
    """A concrete scalar as a float, or `None` for tracers, non-scalars and others."""
    if isinstance(x, bool) or isinstance(x, jax.core.Tracer):
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if _is_array(x) and np.ndim(x) == 0:
        try:
            return float(x)
        except (TypeError, ValueError):
            return None
    return None


def _static_int(x: Any) -> Any:
    """Converter for static step counts: integral numbers become Python ints.

    Anything else is kept as it is, for `__check_init__` to reject with the field name
    (so the field is an `int` in every schedule that gets constructed).
    """
    if isinstance(x, jax.core.Tracer):
        raise TypeError(
            "eqxopt.schedules: step counts and boundaries are static and cannot be "
            "traced; pass a Python int."
        )
    if isinstance(x, bool):
        return x
    if _is_array(x) and np.ndim(x) == 0:
        x = np.asarray(x).item()
    try:
        return operator.index(x)  # pyright: ignore[reportArgumentType]  # duck-typed
    except TypeError:
        pass
    if isinstance(x, float) and x.is_integer():
        return int(x)
    return x  # rejected by `__check_init__`


@overload
def _static_float(x: ArrayLike) -> float: ...
@overload
def _static_float(x: None) -> None: ...
def _static_float(x: ArrayLike | None) -> float | None:
    """Converter for static fractions (`pct_start`, `timescale`): 0-d arrays become
    Python numbers. Anything else is kept as it is, for `__check_init__` to reject."""
    if isinstance(x, jax.core.Tracer):
        raise TypeError(
            "eqxopt.schedules: this field is static and cannot be traced; pass a "
            "Python number."
        )
    if _is_array(x) and np.ndim(x) == 0:
        return np.asarray(x).item()
    return x  # pyright: ignore[reportReturnType]  # rejected by `__check_init__`


def _static_ints(xs: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(_static_int(x) for x in xs)


def _scales(
    boundaries_and_scales: Mapping[Any, ArrayLike] | None,
) -> dict[Any, ArrayLike] | None:
    """Converter for `boundaries_and_scales`: a new dict, sorted by step, int keys."""
    if boundaries_and_scales is None:
        return None
    items = [(_static_int(k), v) for k, v in dict(boundaries_and_scales).items()]
    try:
        items = sorted(items, key=lambda kv: kv[0])
    except TypeError:
        pass  # non-numeric keys: rejected by `__check_init__`
    return dict(items)


def _fail(obj, name: str, rule: str, value) -> None:
    raise ValueError(
        f"`{type(obj).__name__}({name}=...)` must be {rule}, got {value!r}."
    )


def _check_int(obj, name: str, v, minimum: int | None = None) -> None:
    if isinstance(v, bool) or not isinstance(v, int):
        _fail(obj, name, "an integer number of steps", v)
    if minimum is not None and v < minimum:
        _fail(obj, name, "> 0" if minimum == 1 else f">= {minimum}", v)


def _check_value(obj, name: str, raw, rule: str, ok: Callable[[float], bool]):
    """Check a number if it is concrete; traced values pass through."""
    v = _concrete(raw)
    if v is not None and not ok(v):
        _fail(obj, name, rule, raw)


def _check_scales(obj, scales) -> None:
    if scales is None:
        return
    for step, scale in scales.items():
        _check_int(obj, "boundaries_and_scales", step)
        _check_value(obj, "boundaries_and_scales", scale, ">= 0", lambda s: s >= 0)


# The schedules below are built from these functions of a float step `t`. They follow
# the Optax implementation line by line (one exception, noted), so the numerics match.


def _polynomial(t, init_value, end_value, power, transition_steps, transition_begin):
    if transition_steps <= 0:
        return init_value
    t = jnp.clip(t - max(transition_begin, 0), 0, transition_steps)
    # Optax has `1 - t / T`; under `jit`, XLA turns that into `1 - t * (1 / T)`, which
    # can be -1e-17 at t = T (NaN for a fractional power). This is exactly 0 there.
    frac = (transition_steps - t) / transition_steps
    value = (init_value - end_value) * (frac**power) + end_value
    # The ends are selected, not computed: XLA folds the constants of that line (e.g.
    # `(a - b) / T` into one number), which took a warmup from 0 to -5.6e-17 (a
    # negative learning rate) at its first step under `jit`.
    value = jnp.where(t <= 0, init_value, value)
    return jnp.where(t >= transition_steps, end_value, value)


def _exponential(
    t, init_value, transition_steps, decay_rate, transition_begin, staircase, end_value
):
    if transition_steps <= 0:
        return init_value
    decreased = t - max(transition_begin, 0)
    p = decreased / transition_steps
    if staircase:
        p = jnp.floor(p)
    value = jnp.where(decreased <= 0, init_value, init_value * jnp.power(decay_rate, p))
    if end_value is not None:
        lower, upper = jnp.maximum(value, end_value), jnp.minimum(value, end_value)
        value = jnp.where(decay_rate < 1.0, lower, upper)
    return jnp.where(decay_rate == 0, init_value, value)  # Optax: 0 means constant


def _cosine(t, init_value, decay_steps, alpha, exponent):
    t = jnp.minimum(t, decay_steps)
    cosine_decay = 0.5 * (1 + jnp.cos(jnp.pi * t / decay_steps))
    decayed = (1 - alpha) * cosine_decay**exponent + alpha
    return init_value * decayed


def _join(schedules: Sequence[Callable], boundaries: Sequence[int], t):
    out = schedules[0](t)
    for boundary, schedule in zip(boundaries, schedules[1:]):
        out = jnp.where(t < boundary, out, schedule(t - boundary))
    return out


def _warmup_cosine(t, init_value, peak_value, warmup_steps, decay_steps, end, exponent):
    if _is_array(peak_value):
        safe_peak = jnp.where(peak_value == 0, 1, peak_value)
        alpha = jnp.where(peak_value == 0, 0.0, end / safe_peak)
    else:
        alpha = 0.0 if peak_value == 0.0 else end / peak_value
    warmup = ft.partial(
        _polynomial,
        init_value=init_value,
        end_value=peak_value,
        power=1,
        transition_steps=warmup_steps,
        transition_begin=0,
    )
    decay = ft.partial(
        _cosine,
        init_value=peak_value,
        decay_steps=decay_steps - warmup_steps,
        alpha=alpha,
        exponent=exponent,
    )
    return _join([warmup, decay], [warmup_steps], t)


# Each piece starts exactly at its `start` (the formulas give `end + (start - end)`
# there, a last bit away from it, e.g. 0.040000000000000036 for 0.04).
def _linear_interpolate(start, end, pct):
    return jnp.where(pct <= 0, start, (end - start) * pct + start)


def _cosine_interpolate(start, end, pct):
    return jnp.where(
        pct <= 0, start, end + (start - end) / 2.0 * (jnp.cos(jnp.pi * pct) + 1)
    )


_INTERPOLATE = {"linear": _linear_interpolate, "cosine": _cosine_interpolate}


def _piecewise_interpolate(t, interpolate_type, init_value, boundaries_and_scales):
    interpolate = _INTERPOLATE[interpolate_type]
    items = sorted((boundaries_and_scales or {}).items(), key=lambda kv: kv[0])
    bounds = [0] + [b for b, _ in items]
    values = [init_value]
    for _, scale in items:
        values.append(values[-1] * scale)
    out = jnp.where(bounds[-1] <= t, values[-1], 0)
    for i in range(len(items)):
        lo, hi = bounds[i], bounds[i + 1]
        pct = (t - lo) / max(hi - lo, 1)
        inside = jnp.logical_and(lo <= t, t < hi)
        out = out + jnp.where(inside, interpolate(values[i], values[i + 1], pct), 0)
    return out


# --- the schedules ---


_VALUE_FIELDS = ("value", "init_value", "peak_value", "end_value")
_SHAPE_FIELDS = (
    "alpha",
    "decay_rate",
    "div_factor",
    "final_div_factor",
    "exponent",
    "power",
)


class AbstractSchedule(eqx.Module):
    """Base class of all schedules: a Module mapping a step count to a scalar.

    Subclass it to write your own schedule; any callable `count -> scalar` is accepted
    wherever eqxopt takes a schedule.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt


        class InverseTime(eqxopt.schedules.AbstractSchedule):  # lr / (1 + k / k0)
            value: float
            k0: float

            def __call__(self, count):
                return self.value / (1 + jnp.asarray(count, jnp.float32) / self.k0)


        assert InverseTime(1e-2, 100.0)(100) == 5e-3
        opt = eqxopt.SGD(InverseTime(1e-2, 100.0))
        ```
    """

    def __check_init__(self):
        # Every schedule validates its own numbers (design.md#protocol): values are
        # step sizes or rates, so real scalars >= 0; the shape parameters are real
        # scalars. Tracers pass through. Each class checks its own ranges too.
        for field in dataclasses.fields(self):
            value = getattr(self, field.name, None)
            if value is None and field.default is None:
                continue  # an optional value left out
            if field.name in _VALUE_FIELDS:
                v = concrete_scalar(self, field.name, value)
                if v is not None and not v >= 0:
                    _fail(self, field.name, ">= 0", value)
            elif field.name in _SHAPE_FIELDS:
                concrete_scalar(self, field.name, value)

    @abc.abstractmethod
    def __call__(self, count: ArrayLike) -> Array:
        """**Arguments:**

        - `count`: the number of updates already applied, an int32 scalar (or a
            Python int).

        **Returns:**

        The value of the schedule at `count`, a floating scalar array.
        """


class Constant(AbstractSchedule):
    r"""A constant schedule, $v(t) = v$.

    !!! Example

        ```python
        import eqxopt

        schedule = eqxopt.schedules.Constant(1e-3)
        assert schedule(100) == schedule(0)  # Array(0.001)
        ```
    """

    value: ArrayLike

    def __call__(self, count: ArrayLike) -> Array:
        del count
        return _out(self.value, _float_dtype(self.value))


Constant.__init__.__doc__ = """**Arguments:**

- `value`: the value held throughout.
"""


class Polynomial(AbstractSchedule):
    r"""Polynomial transition from `init_value` $I$ to `end_value` $E$ with power $P$
    over `transition_steps` $T$ steps, starting at `transition_begin` $B$:

    $$v(t) = \begin{cases}
        I, & t < B \\
        (I - E) \left(1 - \frac{t - B}{T}\right)^P + E, & B \le t < B + T \\
        E, & t \ge B + T.
    \end{cases}$$

    As in Optax, `transition_steps <= 0` gives the constant $I$ and a negative
    `transition_begin` counts as $0$. Matches `optax.polynomial_schedule`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        schedule = eqxopt.schedules.Polynomial(1.0, 0.01, power=2, transition_steps=100)
        assert jnp.isclose(schedule(100), 0.01)
        ```
    """

    init_value: ArrayLike
    end_value: ArrayLike
    power: ArrayLike
    transition_steps: int = eqx.field(static=True, converter=_static_int)
    transition_begin: int = eqx.field(default=0, static=True, converter=_static_int)

    def __check_init__(self):
        _check_int(self, "transition_steps", self.transition_steps)
        _check_int(self, "transition_begin", self.transition_begin)

    def __call__(self, count: ArrayLike) -> Array:
        dtype = _float_dtype(self.init_value, self.end_value, self.power)
        value = _polynomial(
            _time(count, dtype),
            _value(self.init_value, dtype),
            _value(self.end_value, dtype),
            _value(self.power, dtype),
            self.transition_steps,
            self.transition_begin,
        )
        return _out(value, dtype)


Polynomial.__init__.__doc__ = """**Arguments:**

- `init_value`: the value before and at `transition_begin`.
- `end_value`: the value from `transition_begin + transition_steps` on.
- `power`: the power of the polynomial.
- `transition_steps`: the length of the transition; `<= 0` gives a constant schedule.
    (Static.)
- `transition_begin`: the step at which the transition starts. (Static.)
"""


class Linear(AbstractSchedule):
    r"""Linear transition from `init_value` $I$ to `end_value` $E$ over
    `transition_steps` $T$ steps, starting at `transition_begin` $B$:

    $$v(t) = I + (E - I) \operatorname{clip}\left(\frac{t - B}{T}, 0, 1\right).$$

    As in Optax, `transition_steps <= 0` gives the constant $I$. Matches
    `optax.linear_schedule` (a [`eqxopt.schedules.Polynomial`][] with power 1).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        schedule = eqxopt.schedules.Linear(0.0, 1e-3, transition_steps=1000)
        assert jnp.isclose(schedule(500), 5e-4)
        ```
    """

    init_value: ArrayLike
    end_value: ArrayLike
    transition_steps: int = eqx.field(static=True, converter=_static_int)
    transition_begin: int = eqx.field(default=0, static=True, converter=_static_int)

    def __check_init__(self):
        _check_int(self, "transition_steps", self.transition_steps)
        _check_int(self, "transition_begin", self.transition_begin)

    def __call__(self, count: ArrayLike) -> Array:
        dtype = _float_dtype(self.init_value, self.end_value)
        value = _polynomial(
            _time(count, dtype),
            _value(self.init_value, dtype),
            _value(self.end_value, dtype),
            1,
            self.transition_steps,
            self.transition_begin,
        )
        return _out(value, dtype)


Linear.__init__.__doc__ = """**Arguments:**

- `init_value`: the value before and at `transition_begin`.
- `end_value`: the value from `transition_begin + transition_steps` on.
- `transition_steps`: the length of the transition; `<= 0` gives a constant schedule.
    (Static.)
- `transition_begin`: the step at which the transition starts. (Static.)
"""


class ExponentialDecay(AbstractSchedule):
    r"""Exponential decay of `init_value` $I$ by `decay_rate` $r$ every
    `transition_steps` $T$ steps, starting at `transition_begin` $B$:

    $$v(t) = \begin{cases}
        I, & t \le B \\
        I \, r^{(t - B)/T}, & t > B
    \end{cases}$$

    With `staircase=True` the exponent is $\lfloor (t - B)/T \rfloor$. An `end_value`
    bounds the decay: from below when $r < 1$, from above otherwise. As in Optax,
    `transition_steps <= 0` or `decay_rate == 0` give the constant $I$, and a negative
    `transition_begin` counts as $0$. Matches `optax.exponential_decay`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        schedule = eqxopt.schedules.ExponentialDecay(
            1e-3, transition_steps=1000, decay_rate=0.5, end_value=1e-5
        )
        assert jnp.isclose(schedule(2000), 2.5e-4)  # halved twice
        ```
    """

    init_value: ArrayLike
    transition_steps: int = eqx.field(static=True, converter=_static_int)
    decay_rate: ArrayLike
    transition_begin: int = eqx.field(default=0, static=True, converter=_static_int)
    staircase: bool = eqx.field(default=False, static=True)
    end_value: ArrayLike | None = None

    def __check_init__(self):
        _check_int(self, "transition_steps", self.transition_steps)
        _check_int(self, "transition_begin", self.transition_begin)
        _check_value(self, "decay_rate", self.decay_rate, ">= 0", lambda r: r >= 0)

    def __call__(self, count: ArrayLike) -> Array:
        dtype = _float_dtype(self.init_value, self.decay_rate, self.end_value)
        value = _exponential(
            _time(count, dtype),
            _value(self.init_value, dtype),
            self.transition_steps,
            _value(self.decay_rate, dtype),
            self.transition_begin,
            self.staircase,
            _value(self.end_value, dtype),
        )
        return _out(value, dtype)


ExponentialDecay.__init__.__doc__ = """**Arguments:**

- `init_value`: the initial value.
- `transition_steps`: the number of steps over which the value is multiplied by
    `decay_rate`; `<= 0` gives a constant schedule. (Static.)
- `decay_rate`: the decay rate, `>= 0`; `0` gives a constant schedule.
- `transition_begin`: the step at which the decay starts. (Static.)
- `staircase`: if `True`, decay in discrete jumps every `transition_steps`. (Static.)
- `end_value`: optional bound: a floor when `decay_rate < 1`, a ceiling otherwise.
"""


class CosineDecay(AbstractSchedule):
    r"""Cosine decay of `init_value` $I$ over `decay_steps` $T$ steps, to
    $\alpha I$:

    $$v(t) = I \left((1 - \alpha)
        \left[\tfrac{1}{2}\left(1 + \cos\tfrac{\pi \min(t, T)}{T}\right)\right]^p
        + \alpha\right)$$

    where $p$ is the `exponent`. Matches `optax.cosine_decay_schedule`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        schedule = eqxopt.schedules.CosineDecay(1e-3, decay_steps=1000, alpha=0.1)
        assert jnp.isclose(schedule(1000), 1e-4)  # alpha * init_value at the end
        ```

    ??? cite "References"

        ```bibtex
        @inproceedings{loshchilov2017sgdr,
            title={SGDR: Stochastic Gradient Descent with Warm Restarts},
            author={Loshchilov, Ilya and Hutter, Frank}, booktitle={ICLR}, year={2017}}
        ```
    """

    init_value: ArrayLike
    decay_steps: int = eqx.field(static=True, converter=_static_int)
    alpha: ArrayLike = 0.0
    exponent: ArrayLike = 1.0

    def __check_init__(self):
        _check_int(self, "decay_steps", self.decay_steps, minimum=1)

    def __call__(self, count: ArrayLike) -> Array:
        dtype = _float_dtype(self.init_value, self.alpha, self.exponent)
        value = _cosine(
            _time(count, dtype),
            _value(self.init_value, dtype),
            self.decay_steps,
            _value(self.alpha, dtype),
            _value(self.exponent, dtype),
        )
        return _out(value, dtype)


CosineDecay.__init__.__doc__ = """**Arguments:**

- `init_value`: the initial value.
- `decay_steps`: the length of the decay, `> 0`. (Static.)
- `alpha`: the final value as a fraction of `init_value`.
- `exponent`: the power $p$ of the cosine factor.
"""


class WarmupCosineDecay(AbstractSchedule):
    r"""Linear warm-up from `init_value` $I$ to `peak_value` $P$ over
    `warmup_steps` $W$ steps, then cosine decay to `end_value` $E$ at step
    `decay_steps` $T$ (which includes the warm-up):

    $$v(t) = \begin{cases}
        I + (P - I)\,t / W, & t < W \\
        E + (P - E)
        \left[\tfrac{1}{2}\left(1 + \cos\tfrac{\pi \min(t - W, T - W)}{T - W}
        \right)\right]^p, & t \ge W
    \end{cases}$$

    where $p$ is the `exponent`. (When $P = 0$ the decay is $P$ times the cosine
    factor, i.e. $0$, as in Optax.) Matches `optax.warmup_cosine_decay_schedule`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        schedule = eqxopt.schedules.WarmupCosineDecay(
            init_value=0.0, peak_value=1e-3, warmup_steps=100, decay_steps=1000
        )
        assert jnp.isclose(schedule(100), 1e-3)  # the peak, after warmup
        ```
    """

    init_value: ArrayLike
    peak_value: ArrayLike
    warmup_steps: int = eqx.field(static=True, converter=_static_int)
    decay_steps: int = eqx.field(static=True, converter=_static_int)
    end_value: ArrayLike = 0.0
    exponent: ArrayLike = 1.0

    def __check_init__(self):
        _check_int(self, "warmup_steps", self.warmup_steps, minimum=0)
        _check_int(self, "decay_steps", self.decay_steps)
        if self.decay_steps <= self.warmup_steps:
            rule = f"> warmup_steps={self.warmup_steps} (it includes the warm-up)"
            _fail(self, "decay_steps", rule, self.decay_steps)

    def __call__(self, count: ArrayLike) -> Array:
        values = (self.init_value, self.peak_value, self.end_value, self.exponent)
        dtype = _float_dtype(*values)
        init_value, peak_value, end_value, exponent = (_value(v, dtype) for v in values)
        value = _warmup_cosine(
            _time(count, dtype),
            init_value,
            peak_value,
            self.warmup_steps,
            self.decay_steps,
            end_value,
            exponent,
        )
        return _out(value, dtype)


WarmupCosineDecay.__init__.__doc__ = """**Arguments:**

- `init_value`: the value at step 0.
- `peak_value`: the value at the end of the warm-up.
- `warmup_steps`: the length of the linear warm-up, `>= 0`. (Static.)
- `decay_steps`: the total length of the schedule, warm-up included, so the cosine
    decay lasts `decay_steps - warmup_steps > 0` steps. (Static.)
- `end_value`: the value from step `decay_steps` on.
- `exponent`: the power $p$ of the cosine factor.
"""


class WarmupConstant(AbstractSchedule):
    r"""Linear warm-up from `init_value` $I$ to `peak_value` $P$ over `warmup_steps`
    $W$ steps, then constant:

    $$v(t) = I + (P - I) \min(t / W, 1).$$

    As in Optax, `warmup_steps=0` gives the constant $I$ (not $P$). Matches
    `optax.warmup_constant_schedule`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        schedule = eqxopt.schedules.WarmupConstant(0.0, 1e-3, warmup_steps=100)
        assert jnp.isclose(schedule(50), 5e-4)
        ```
    """

    init_value: ArrayLike
    peak_value: ArrayLike
    warmup_steps: int = eqx.field(static=True, converter=_static_int)

    def __check_init__(self):
        _check_int(self, "warmup_steps", self.warmup_steps, minimum=0)

    def __call__(self, count: ArrayLike) -> Array:
        dtype = _float_dtype(self.init_value, self.peak_value)
        value = _polynomial(
            _time(count, dtype),
            _value(self.init_value, dtype),
            _value(self.peak_value, dtype),
            1,
            self.warmup_steps,
            0,
        )
        return _out(value, dtype)


WarmupConstant.__init__.__doc__ = """**Arguments:**

- `init_value`: the value at step 0.
- `peak_value`: the value from `warmup_steps` on.
- `warmup_steps`: the length of the linear warm-up, `>= 0`. (Static.)
"""


class WarmupExponentialDecay(AbstractSchedule):
    r"""Linear warm-up from `init_value` $I$ to `peak_value` $P$ over `warmup_steps`
    $W$ steps, then an [`eqxopt.schedules.ExponentialDecay`][] of $P$ on the steps
    counted from $W$:

    $$v(t) = \begin{cases}
        I + (P - I)\,t / W, & t < W \\
        \mathrm{ExponentialDecay}(P, T, r, B, \ldots)(t - W), & t \ge W.
    \end{cases}$$

    Matches `optax.warmup_exponential_decay_schedule`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        schedule = eqxopt.schedules.WarmupExponentialDecay(
            0.0, 1e-3, warmup_steps=100, transition_steps=1000, decay_rate=0.5
        )
        assert jnp.isclose(schedule(1100), 5e-4)
        ```
    """

    init_value: ArrayLike
    peak_value: ArrayLike
    warmup_steps: int = eqx.field(static=True, converter=_static_int)
    transition_steps: int = eqx.field(static=True, converter=_static_int)
    decay_rate: ArrayLike
    transition_begin: int = eqx.field(default=0, static=True, converter=_static_int)
    staircase: bool = eqx.field(default=False, static=True)
    end_value: ArrayLike | None = None

    def __check_init__(self):
        _check_int(self, "warmup_steps", self.warmup_steps, minimum=0)
        _check_int(self, "transition_steps", self.transition_steps)
        _check_int(self, "transition_begin", self.transition_begin)
        _check_value(self, "decay_rate", self.decay_rate, ">= 0", lambda r: r >= 0)

    def __call__(self, count: ArrayLike) -> Array:
        values = (self.init_value, self.peak_value, self.decay_rate, self.end_value)
        dtype = _float_dtype(*values)
        init_value, peak_value, decay_rate, end_value = (
            _value(v, dtype) for v in values
        )
        warmup = ft.partial(
            _polynomial,
            init_value=init_value,
            end_value=peak_value,
            power=1,
            transition_steps=self.warmup_steps,
            transition_begin=0,
        )
        decay = ft.partial(
            _exponential,
            init_value=peak_value,
            transition_steps=self.transition_steps,
            decay_rate=decay_rate,
            transition_begin=self.transition_begin,
            staircase=self.staircase,
            end_value=end_value,
        )
        value = _join([warmup, decay], [self.warmup_steps], _time(count, dtype))
        return _out(value, dtype)


WarmupExponentialDecay.__init__.__doc__ = """**Arguments:**

- `init_value`: the value at step 0.
- `peak_value`: the value at the end of the warm-up.
- `warmup_steps`: the length of the linear warm-up, `>= 0`. (Static.)
- `transition_steps`, `decay_rate`, `transition_begin`, `staircase`, `end_value`: as
    in [`eqxopt.schedules.ExponentialDecay`][], counted from the end of the warm-up.
"""


class PiecewiseConstant(AbstractSchedule):
    r"""`init_value` $I$ multiplied by every scale $s_i$ whose boundary $b_i$ has been
    reached:

    $$v(t) = I \prod_{i \,:\, t \ge b_i} s_i.$$

    Matches `optax.piecewise_constant_schedule`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        schedule = eqxopt.schedules.PiecewiseConstant(
            1.0, boundaries_and_scales={100: 0.1, 200: 0.1}
        )
        assert jnp.isclose(schedule(250), 0.01)
        ```
    """

    init_value: ArrayLike
    boundaries_and_scales: dict[int, ArrayLike] | None = eqx.field(
        default=None, converter=_scales
    )

    def __check_init__(self):
        _check_scales(self, self.boundaries_and_scales)

    def __call__(self, count: ArrayLike) -> Array:
        scales = self.boundaries_and_scales or {}
        dtype = _float_dtype(self.init_value, *scales.values())
        t = _time(count, dtype)
        value = _value(self.init_value, dtype)
        for boundary, scale in scales.items():
            value = jnp.where(t < boundary, value, _value(scale, dtype) * value)
        return _out(value, dtype)


PiecewiseConstant.__init__.__doc__ = """**Arguments:**

- `init_value`: the value before the first boundary.
- `boundaries_and_scales`: a dict `{step: scale}`; from `step` on the value is
    multiplied by `scale >= 0`. The steps are static; the scales are values.
"""


class PiecewiseInterpolate(AbstractSchedule):
    r"""Interpolation between the values $v_i = I \prod_{j \le i} s_j$ reached at the
    boundaries $b_i$ (with $b_0 = 0$, $v_0 = I$ the `init_value`):

    $$v(t) = \begin{cases}
        \operatorname{interp}\left(v_{i-1}, v_i,
            \frac{t - b_{i-1}}{\max(b_i - b_{i-1}, 1)}\right),
            & b_{i-1} \le t < b_i \\
        v_n, & t \ge b_n
    \end{cases}$$

    where $\operatorname{interp}(a, b, x)$ is $a + (b - a) x$ (`"linear"`) or
    $b + \tfrac{1}{2}(a - b)(1 + \cos \pi x)$ (`"cosine"`). As in Optax, the value is
    $0$ for $t < 0$. Matches `optax.piecewise_interpolate_schedule`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        schedule = eqxopt.schedules.PiecewiseInterpolate(
            "linear", 1.0, boundaries_and_scales={4: 0.1, 8: 0.01}
        )
        assert jnp.isclose(schedule(2), 0.55)  # halfway from 1.0 to 0.1
        ```
    """

    interpolate_type: Literal["linear", "cosine"] = eqx.field(static=True)
    init_value: ArrayLike
    boundaries_and_scales: dict[int, ArrayLike] | None = eqx.field(
        default=None, converter=_scales
    )

    def __check_init__(self):
        if self.interpolate_type not in _INTERPOLATE:
            rule = "'linear' or 'cosine'"
            _fail(self, "interpolate_type", rule, self.interpolate_type)
        _check_scales(self, self.boundaries_and_scales)

    def __call__(self, count: ArrayLike) -> Array:
        scales = self.boundaries_and_scales or {}
        dtype = _float_dtype(self.init_value, *scales.values())
        value = _piecewise_interpolate(
            _time(count, dtype),
            self.interpolate_type,
            _value(self.init_value, dtype),
            {b: _value(s, dtype) for b, s in scales.items()},
        )
        return _out(value, dtype)


PiecewiseInterpolate.__init__.__doc__ = """**Arguments:**

- `interpolate_type`: `"linear"` or `"cosine"`. (Static.)
- `init_value`: the value at step 0.
- `boundaries_and_scales`: a dict `{step: scale}`; the value reached at `step` is the
    previous one times `scale >= 0`. The steps are static; the scales are values.
"""


class Join(AbstractSchedule):
    r"""Several schedules one after another: from `boundaries[i - 1]` on, `schedules[i]`
    is called with the steps counted from that boundary:

    $$v(t) = s_i(t - b_{i-1}) \quad \text{for } b_{i-1} \le t < b_i,$$

    with $b_{-1} = 0$ (so `schedules[0]` sees $t$ itself). Any callable
    `count -> scalar` may be joined, Optax schedules included. Matches
    `optax.join_schedules`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        schedule = eqxopt.schedules.Join(
            [eqxopt.schedules.Linear(0.0, 1e-3, 100), eqxopt.schedules.Constant(1e-3)],
            boundaries=[100],
        )
        assert jnp.isclose(schedule(50), 5e-4) and jnp.isclose(schedule(500), 1e-3)
        ```
    """

    schedules: tuple[Callable[[ArrayLike], ArrayLike], ...] = eqx.field(converter=tuple)
    boundaries: tuple[int, ...] = eqx.field(static=True, converter=_static_ints)

    def __check_init__(self):
        if len(self.schedules) == 0:
            _fail(self, "schedules", "non-empty", self.schedules)
        if len(self.boundaries) != len(self.schedules) - 1:
            rule = f"of length len(schedules) - 1 = {len(self.schedules) - 1}"
            _fail(self, "boundaries", rule, self.boundaries)
        for boundary in self.boundaries:
            _check_int(self, "boundaries", boundary)

    def __call__(self, count: ArrayLike) -> Array:
        shifted = [0, *self.boundaries]
        outs = [
            jnp.asarray(s(count - b) if b else s(count))
            for s, b in zip(self.schedules, shifted)
        ]
        dtype = _float_dtype(*outs)
        out = outs[0].astype(dtype)
        for boundary, value in zip(self.boundaries, outs[1:]):
            out = jnp.where(jnp.asarray(count) < boundary, out, value.astype(dtype))
        return out


Join.__init__.__doc__ = """**Arguments:**

- `schedules`: a sequence of schedules (any callables `count -> scalar`).
- `boundaries`: the steps at which to switch to the next schedule, one fewer than
    `schedules`. (Static.)
"""


class SGDR(AbstractSchedule):
    r"""Stochastic gradient descent with warm restarts: consecutive
    [`eqxopt.schedules.WarmupCosineDecay`][] cycles, each lasting its `decay_steps`.

    $$v(t) = c_i\Big(t - \sum_{j < i} T_j\Big) \quad
        \text{for } \sum_{j < i} T_j \le t < \sum_{j \le i} T_j,$$

    where $c_i$ = `WarmupCosineDecay(**cosine_kwargs[i])` and $T_i$ its
    `decay_steps`. Matches `optax.sgdr_schedule`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        cycle = dict(init_value=0.0, peak_value=1e-3, warmup_steps=10, decay_steps=100)
        schedule = eqxopt.schedules.SGDR([cycle, cycle, cycle])
        assert jnp.isclose(schedule(110), 1e-3)  # the peak of the second cycle
        ```

    ??? cite "References"

        ```bibtex
        @inproceedings{loshchilov2017sgdr,
            title={SGDR: Stochastic Gradient Descent with Warm Restarts},
            author={Loshchilov, Ilya and Hutter, Frank}, booktitle={ICLR}, year={2017}}
        ```
    """

    schedules: tuple[WarmupCosineDecay, ...]
    boundaries: tuple[int, ...] = eqx.field(static=True)

    def __init__(self, cosine_kwargs: Iterable[dict[str, Any]]):
        self.schedules = tuple(WarmupCosineDecay(**kwargs) for kwargs in cosine_kwargs)
        ends = [0]
        for schedule in self.schedules:
            ends.append(ends[-1] + schedule.decay_steps)
        self.boundaries = tuple(ends[1:-1])

    def __check_init__(self):
        if len(self.schedules) == 0:
            _fail(self, "cosine_kwargs", "non-empty", list(self.schedules))

    def __call__(self, count: ArrayLike) -> Array:
        return Join(self.schedules, self.boundaries)(count)


SGDR.__init__.__doc__ = """**Arguments:**

- `cosine_kwargs`: an iterable of dicts, each the keyword arguments of one
    [`eqxopt.schedules.WarmupCosineDecay`][] cycle. The cycles are stored, as
    `WarmupCosineDecay` Modules, in the field `schedules`.
"""


def _check_one_cycle(self) -> None:
    _check_int(self, "transition_steps", self.transition_steps, minimum=1)
    _check_value(self, "div_factor", self.div_factor, "> 0", lambda d: d > 0)
    _check_value(
        self, "final_div_factor", self.final_div_factor, "> 0", lambda d: d > 0
    )
    if not isinstance(self.pct_start, (int, float)) or not 0 <= self.pct_start <= 1:
        _fail(self, "pct_start", "in [0, 1]", self.pct_start)


class CosineOneCycle(AbstractSchedule):
    r"""The one-cycle schedule with cosine phases. With $P$ the `peak_value`, $d$ the
    `div_factor` and $f$ the `final_div_factor`, it rises from $P/d$ to $P$ during the
    first `pct_start` of `transition_steps` $T$, then falls to $P/(d f)$ at $T$; both
    phases are cosine interpolations (see [`eqxopt.schedules.PiecewiseInterpolate`][]):

    $$v(t) = \mathrm{PiecewiseInterpolate}\left(\text{"cosine"}, P/d,
        \{\lfloor p_s T \rfloor: d,\ T: 1/(d f)\}\right)(t).$$

    Matches `optax.cosine_onecycle_schedule`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        schedule = eqxopt.schedules.CosineOneCycle(1000, peak_value=1e-2)
        assert jnp.isclose(schedule(300), 1e-2)  # the peak, 30% of the way
        ```

    ??? cite "References"

        ```bibtex
        @article{smith2017superconvergence,
            title={Super-Convergence: Very Fast Training of Neural Networks Using
                   Large Learning Rates},
            author={Smith, Leslie N. and Topin, Nicholay}, journal={arXiv:1708.07120},
            year={2017}}
        ```
    """

    transition_steps: int = eqx.field(static=True, converter=_static_int)
    peak_value: ArrayLike
    pct_start: float = eqx.field(default=0.3, static=True, converter=_static_float)
    div_factor: ArrayLike = 25.0
    final_div_factor: ArrayLike = 1e4

    def __check_init__(self):
        _check_one_cycle(self)

    def __call__(self, count: ArrayLike) -> Array:
        values = (self.peak_value, self.div_factor, self.final_div_factor)
        dtype = _float_dtype(*values)
        peak, div, final_div = (_value(v, dtype) for v in values)
        steps = self.transition_steps
        scales = {int(self.pct_start * steps): div, int(steps): 1.0 / (div * final_div)}
        value = _piecewise_interpolate(
            _time(count, dtype), "cosine", peak / div, scales
        )
        return _out(value, dtype)


CosineOneCycle.__init__.__doc__ = """**Arguments:**

- `transition_steps`: the length of the cycle, `> 0`. (Static.)
- `peak_value`: the maximum, reached at step `int(pct_start * transition_steps)`.
- `pct_start`: the fraction of the cycle spent rising, in `[0, 1]`. (Static.)
- `div_factor`: the initial value is `peak_value / div_factor`; `> 0`.
- `final_div_factor`: the final value is `peak_value / (div_factor *
    final_div_factor)`; `> 0`.
"""


class LinearOneCycle(AbstractSchedule):
    r"""The one-cycle schedule with three linear phases. With $P$ the `peak_value`,
    $d$ the `div_factor`, $f$ the `final_div_factor` and $T$ the `transition_steps`,
    it rises linearly from $P/d$ to $P$ until step $\lfloor p_s T \rfloor$, falls back
    to $P/d$ at step $\lfloor p_f T \rfloor$, then falls to $P/(d f)$ at step $T$:

    $$v(t) = \mathrm{PiecewiseInterpolate}\left(\text{"linear"}, P/d,
        \{\lfloor p_s T \rfloor: d,\ \lfloor p_f T \rfloor: 1/d,\ T: 1/f\}\right)(t).$$

    Matches `optax.linear_onecycle_schedule`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        schedule = eqxopt.schedules.LinearOneCycle(1000, peak_value=1e-2)
        assert jnp.isclose(schedule(300), 1e-2)  # the peak, 30% of the way
        ```

    ??? cite "References"

        ```bibtex
        @article{smith2017superconvergence,
            title={Super-Convergence: Very Fast Training of Neural Networks Using
                   Large Learning Rates},
            author={Smith, Leslie N. and Topin, Nicholay}, journal={arXiv:1708.07120},
            year={2017}}
        ```
    """

    transition_steps: int = eqx.field(static=True, converter=_static_int)
    peak_value: ArrayLike
    pct_start: float = eqx.field(default=0.3, static=True, converter=_static_float)
    pct_final: float = eqx.field(default=0.85, static=True, converter=_static_float)
    div_factor: ArrayLike = 25.0
    final_div_factor: ArrayLike = 1e4

    def __check_init__(self):
        _check_one_cycle(self)
        pct_final = self.pct_final
        if not isinstance(pct_final, (int, float)) or not (
            self.pct_start <= pct_final <= 1
        ):
            _fail(self, "pct_final", f"in [pct_start={self.pct_start}, 1]", pct_final)

    def __call__(self, count: ArrayLike) -> Array:
        values = (self.peak_value, self.div_factor, self.final_div_factor)
        dtype = _float_dtype(*values)
        peak, div, final_div = (_value(v, dtype) for v in values)
        steps = self.transition_steps
        scales = {  # a dict, as in Optax: a later step that collides overwrites
            int(self.pct_start * steps): div,
            int(self.pct_final * steps): 1.0 / div,
            steps: 1.0 / final_div,
        }
        value = _piecewise_interpolate(
            _time(count, dtype), "linear", peak / div, scales
        )
        return _out(value, dtype)


LinearOneCycle.__init__.__doc__ = """**Arguments:**

- `transition_steps`: the length of the cycle, `> 0`. (Static.)
- `peak_value`: the maximum, reached at step `int(pct_start * transition_steps)`.
- `pct_start`: the fraction of the cycle spent rising, in `[0, 1]`. (Static.)
- `pct_final`: the fraction of the cycle at whose end the value is back at
    `peak_value / div_factor`, in `[pct_start, 1]`. (Static.)
- `div_factor`: the initial value is `peak_value / div_factor`; `> 0`.
- `final_div_factor`: the final value is `peak_value / final_div_factor`; `> 0`.
"""


# --- schedules Optax lacks ---


_WSD_DECAY = {
    "linear": lambda x: 1 - x,
    "cosine": lambda x: 0.5 * (1 + jnp.cos(jnp.pi * x)),
    "sqrt": lambda x: 1 - jnp.sqrt(x),
}


class WarmupStableDecay(AbstractSchedule):
    r"""The warm-up/stable/decay ("WSD", "trapezoidal") schedule: a linear warm-up
    from `init_value` $I$ to `peak_value` $P$ over `warmup_steps` $W$ steps, a hold at
    $P$ for `stable_steps` $S$ steps, then a decay to `end_value` $E$ over
    `decay_steps` $D$ steps. With $t$ clipped below at $0$:

    $$v(t) = \begin{cases}
        I + (P - I)\, t / W, & t < W \\
        P, & W \le t < W + S \\
        E + (P - E)\, f\!\left(\frac{t - W - S}{D}\right), & W + S \le t < W + S + D \\
        E, & t \ge W + S + D
    \end{cases}$$

    where $f(x) = 1 - x$ (`decay_type="linear"`),
    $f(x) = \tfrac{1}{2}(1 + \cos \pi x)$ (`"cosine"`) or $f(x) = 1 - \sqrt{x}$
    (`"sqrt"`). Unlike in [`eqxopt.schedules.WarmupCosineDecay`][], `decay_steps` is
    the length of the decay phase alone; the schedule lasts $W + S + D$ steps.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        schedule = eqxopt.schedules.WarmupStableDecay(
            0.0, 1e-3, warmup_steps=100, stable_steps=800, decay_steps=100
        )
        assert jnp.isclose(schedule(500), 1e-3) and jnp.isclose(schedule(950), 5e-4)
        ```

    ??? cite "References"

        ```bibtex
        @article{hu2024minicpm,
            title={MiniCPM: Unveiling the Potential of Small Language Models with
                   Scalable Training Strategies},
            author={Hu, Shengding and others}, journal={arXiv:2404.06395},
            year={2024}}
        ```
    """

    init_value: ArrayLike
    peak_value: ArrayLike
    warmup_steps: int = eqx.field(static=True, converter=_static_int)
    stable_steps: int = eqx.field(static=True, converter=_static_int)
    decay_steps: int = eqx.field(static=True, converter=_static_int)
    end_value: ArrayLike = 0.0
    decay_type: Literal["linear", "cosine", "sqrt"] = eqx.field(
        default="linear", static=True
    )

    def __check_init__(self):
        for name in ("warmup_steps", "stable_steps", "decay_steps"):
            _check_int(self, name, getattr(self, name), minimum=0)
        if self.decay_type not in _WSD_DECAY:
            _fail(self, "decay_type", "'linear', 'cosine' or 'sqrt'", self.decay_type)

    def __call__(self, count: ArrayLike) -> Array:
        values = (self.init_value, self.peak_value, self.end_value)
        dtype = _float_dtype(*values)
        init, peak, end = (_value(v, dtype) for v in values)
        t = jnp.maximum(_time(count, dtype), 0)
        warmup, stable, decay = self.warmup_steps, self.stable_steps, self.decay_steps
        if warmup > 0:
            warm = init + (peak - init) * jnp.minimum(t / warmup, 1)
        else:
            warm = peak  # never used
        x = jnp.clip((t - warmup - stable) / max(decay, 1), 0, 1)
        decayed = end + (peak - end) * _WSD_DECAY[self.decay_type](x)
        value = jnp.where(
            t < warmup,
            warm,
            jnp.where(
                t < warmup + stable,
                peak,
                jnp.where(t < warmup + stable + decay, decayed, end),
            ),
        )
        return _out(value, dtype)


WarmupStableDecay.__init__.__doc__ = """**Arguments:**

- `init_value`: the value at step 0.
- `peak_value`: the value at the end of the warm-up and during the stable phase.
- `warmup_steps`: the length of the linear warm-up, `>= 0`. (Static.)
- `stable_steps`: the length of the stable phase, `>= 0`. (Static.)
- `decay_steps`: the length of the decay phase, `>= 0`. (Static.)
- `end_value`: the value from step `warmup_steps + stable_steps + decay_steps` on.
- `decay_type`: the shape $f$ of the decay: `"linear"`, `"cosine"` or `"sqrt"`.
    (Static.)
"""


class InverseSqrt(AbstractSchedule):
    r"""Linear warm-up, then inverse-square-root decay (the T5 "rsqrt" schedule).
    With $I$ the `init_value`, $W$ the `warmup_steps`, $\tau$ the `timescale` and $t$
    clipped below at $0$:

    $$v(t) = I \cdot \min\left(1, \frac{t}{W}\right)
        \cdot \sqrt{\frac{\tau}{\max(t, \tau)}}$$

    where the warm-up factor is $1$ when $W = 0$, and $\tau$ defaults to
    $\max(W, 1)$. So by default the value rises linearly to $I$ at step $W$ and then
    decays as $I \sqrt{W / t}$; with $W = 0$ and $\tau = 10^4$ it is T5's
    $1/\sqrt{\max(t, 10^4)}$ for $I = 0.01$. The value is continuous in $t$.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        schedule = eqxopt.schedules.InverseSqrt(1e-3, warmup_steps=100)
        assert jnp.isclose(schedule(50), 5e-4)  # linear warmup
        assert jnp.isclose(schedule(400), 5e-4)  # 1e-3 * sqrt(100 / 400)
        ```

    ??? cite "References"

        ```bibtex
        @article{raffel2020t5,
            title={Exploring the Limits of Transfer Learning with a Unified
                   Text-to-Text Transformer},
            author={Raffel, Colin and others}, journal={JMLR}, year={2020}}
        ```
    """

    init_value: ArrayLike
    warmup_steps: int = eqx.field(default=0, static=True, converter=_static_int)
    timescale: float | None = eqx.field(
        default=None, static=True, converter=_static_float
    )

    def __check_init__(self):
        _check_int(self, "warmup_steps", self.warmup_steps, minimum=0)
        if self.timescale is not None:
            v = self.timescale
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                _fail(self, "timescale", "a number > 0 or None", v)

    def __call__(self, count: ArrayLike) -> Array:
        dtype = _float_dtype(self.init_value)
        init = _value(self.init_value, dtype)
        t = jnp.maximum(_time(count, dtype), 0)
        warmup = self.warmup_steps
        tau = max(warmup, 1) if self.timescale is None else self.timescale
        ramp = jnp.minimum(t / warmup, 1) if warmup > 0 else 1
        value = init * ramp * jnp.sqrt(tau / jnp.maximum(t, tau))
        return _out(value, dtype)


InverseSqrt.__init__.__doc__ = """**Arguments:**

- `init_value`: the value at the end of the warm-up (when `timescale >= warmup_steps`).
- `warmup_steps`: the length of the linear warm-up from 0, `>= 0`. (Static.)
- `timescale`: the step $\\tau$ from which the decay starts; `> 0`, default
    `max(warmup_steps, 1)`. (Static.)
"""


# --- Optax's names ---

constant_schedule = Constant
polynomial_schedule = Polynomial
linear_schedule = Linear
exponential_decay = ExponentialDecay
cosine_decay_schedule = CosineDecay
warmup_cosine_decay_schedule = WarmupCosineDecay
warmup_constant_schedule = WarmupConstant
warmup_exponential_decay_schedule = WarmupExponentialDecay
piecewise_constant_schedule = PiecewiseConstant
piecewise_interpolate_schedule = PiecewiseInterpolate
join_schedules = Join
sgdr_schedule = SGDR
cosine_onecycle_schedule = CosineOneCycle
linear_onecycle_schedule = LinearOneCycle
