"""Every check of user input in one place: hyperparameters at construction
(design.md#protocol) and the arguments of `update` at trace time.

Concrete values are checked alike whatever their type (a Python number, a NumPy array,
a JAX array that is not a tracer); only tracers and schedules pass unchecked.
"""

import dataclasses
import typing
from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np

from ._custom_types import ScalarLike, ScalarOrSchedule


# Annotations of the fields that hold a scalar hyperparameter (or a schedule).
_SCALAR_TYPES = (ScalarLike, ScalarOrSchedule)
_OPTIONAL_SCALAR_TYPES = (ScalarLike | None, ScalarOrSchedule | None)


def _is_schedule(value) -> bool:
    return callable(value) and not isinstance(value, (jax.Array, np.ndarray, type))


def _fail(opt, name: str, rule: str, value) -> typing.NoReturn:
    raise ValueError(
        f"`{type(opt).__name__}({name}=...)` must be {rule}, got {value!r}."
    )


def concrete_scalar(opt, name: str, value) -> float | None:
    """The value of a scalar hyperparameter as a float, or `None` when it is a tracer
    or a schedule (checked where it is used). Anything that is not a real scalar - a
    string, `None`, a bool, a complex number, an array of shape other than `()` -
    raises a `ValueError` naming the field."""
    if isinstance(value, jax.core.Tracer) or _is_schedule(value):
        return None
    if isinstance(value, (bool, np.bool_)) or value is None or isinstance(value, str):
        _fail(opt, name, "a real scalar or a schedule", value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, (jax.Array, np.ndarray, np.generic)):
        dtype = np.dtype(value.dtype) if not _is_key(value) else None
        if (
            np.ndim(value) != 0
            or dtype is None
            or not (
                jnp.issubdtype(dtype, jnp.integer)
                or jnp.issubdtype(dtype, jnp.floating)
            )
        ):
            _fail(opt, name, "a real scalar (shape `()`) or a schedule", value)
        return float(value)
    _fail(opt, name, "a real scalar or a schedule", value)


def _is_key(value) -> bool:
    return jnp.issubdtype(value.dtype, jax.dtypes.extended)


def check_scalar_fields(opt: eqx.Module) -> None:
    """Check the type and shape of every field annotated as a scalar hyperparameter
    (`ScalarLike`, `ScalarOrSchedule`, optionally `| None`)."""
    for field in dataclasses.fields(opt):
        if field.type in _SCALAR_TYPES:
            concrete_scalar(opt, field.name, getattr(opt, field.name, None))
        elif field.type in _OPTIONAL_SCALAR_TYPES:
            value = getattr(opt, field.name, None)
            if value is not None:
                concrete_scalar(opt, field.name, value)


def _may_be_none(field: dataclasses.Field) -> bool:
    return field.default is None or field.type in _OPTIONAL_SCALAR_TYPES


def check_hyperparams(
    opt,
    *,
    nonnegative: Sequence[str] = (),
    positive: Sequence[str] = (),
    unit_interval: Sequence[str] = (),
    closed_unit_interval: Sequence[str] = (),
    positive_int: Sequence[str] = (),
    choices: dict[str, Sequence[Any]] | None = None,
) -> None:
    """Raise a `ValueError` naming the field for an invalid hyperparameter.

    The numeric fields named here must be real scalars (or schedules, or tracers) in
    the given range; `None` is allowed only where it is the field's default.
    """
    rules: list[tuple[Sequence[str], str, Callable[[float], bool]]] = [
        (nonnegative, ">= 0", lambda v: v >= 0),
        (positive, "> 0", lambda v: v > 0),
        (unit_interval, "in [0, 1)", lambda v: 0 <= v < 1),
        (closed_unit_interval, "in [0, 1]", lambda v: 0 <= v <= 1),
    ]
    fields = {f.name: f for f in dataclasses.fields(opt)}
    for names, rule, ok in rules:
        for name in names:
            value = getattr(opt, name)
            if value is None and name in fields and _may_be_none(fields[name]):
                continue
            v = concrete_scalar(opt, name, value)
            if v is not None and not ok(v):  # `not ok` also catches NaN
                _fail(opt, name, rule, value)
    for name in positive_int:
        v = getattr(opt, name)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            _fail(opt, name, "an integer >= 1", v)
    for name, allowed in (choices or {}).items():
        v = getattr(opt, name)
        if v not in allowed:
            _fail(opt, name, "one of " + ", ".join(repr(a) for a in allowed), v)


def need_params(opt, params, why: str = "") -> None:
    """A `ValueError` when an optimizer that reads the params is called without them."""
    if params is None:
        reason = f" ({why})" if why else ""
        raise ValueError(
            f"`{type(opt).__name__}.update` needs `params`{reason}: call "
            "`update(grads, state, params)`, or `step(model, grads, state)`."
        )


def need_extra(opt, extra: dict, *names: str) -> list:
    """The extra `update` arguments `names`, or an error naming the first missing."""
    for name in names:
        if extra.get(name) is None:
            raise ValueError(
                f"`{type(opt).__name__}.update` needs the extra argument `{name}=` "
                f"(e.g. `opt.update(grads, state, params, {name}=...)`; "
                "`eqxopt.minimize` passes it)."
            )
    return [extra[name] for name in names]
