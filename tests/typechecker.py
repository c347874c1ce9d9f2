"""The runtime type checker the suite runs over every annotated signature in eqxopt
(pyproject's `--jaxtyping-packages=eqxopt,tests.typechecker.typechecker`, as equinox
and optimistix run theirs).

It is beartype, with PEP 484's numeric tower (an `int` is a valid `float`, as a static
type checker reads `x: float`), except where eqxopt validates arguments itself: the
constructors of optimizers and schedules, `minimize`, `to_optax`, `from_optax`,
`state_shardings` and `abstract_state` must
raise a `ValueError` naming the field or argument for any wrong value, whatever its type
(design.md#errors), and the tests check exactly that error. Their bodies and every other
function are checked."""

import functools

from beartype import beartype, BeartypeConf


_beartype = beartype(conf=BeartypeConf(is_pep484_tower=True))

# Public entry points that check their own arguments (qualified names).
_VALIDATE_THEMSELVES = {
    "eqxopt._minimize.minimize.minimize",
    "eqxopt._interop.to_optax",
    "eqxopt._interop.from_optax",
    "eqxopt._sharding.state_shardings",
    "eqxopt._sharding.abstract_state",
}


def _validates_itself(instance) -> bool:
    import eqxopt

    kinds = (eqxopt.AbstractOptimizer, eqxopt.schedules.AbstractSchedule)
    return isinstance(instance, kinds)


def typechecker(fn):
    if f"{fn.__module__}.{fn.__qualname__}" in _VALIDATE_THEMSELVES:
        return fn
    checked = _beartype(fn)
    if not fn.__qualname__.endswith(".__init__"):
        return checked

    @functools.wraps(fn)
    def init(self, *args, **kwargs):
        if _validates_itself(self):
            return fn(self, *args, **kwargs)
        return checked(self, *args, **kwargs)

    return init
