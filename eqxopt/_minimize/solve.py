"""What [`eqxopt.minimize`][] and [`eqxopt.least_squares`][] share: the checks of
their arguments, which read what a solver declares (`AbstractSolver`'s class-level
facts) instead of testing its class."""

from typing import Any

import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from .._misc import is_param


# What each kind of problem is solved by, for the error of a solver given to the
# wrong entry point (`AbstractSolver.solves`).
_ENTRY_OF = {
    "loss": "`eqxopt.minimize`",
    "residuals": "`eqxopt.least_squares`",
    "constraints": "`eqxopt.minimize(..., constraints=...)`",
}


def check_solver(
    entry: str,
    name: str,
    solver: Any,
    solves: tuple[str, ...],
    expected: str,
    *,
    bounds: Any,
    y0: Any,
) -> str:
    """Check `solver` (the argument `name` of `entry`) against its declarations: the
    problem it solves (one of `solves`; else a `ValueError` saying it must be
    `expected`), whether it takes `bounds`, whether it takes complex `y0`. Returns
    the problem it solves."""
    cls = type(solver)
    kind = getattr(cls, "solves", None)
    if kind not in solves:
        where = _ENTRY_OF.get(kind) if isinstance(kind, str) else None
        raise ValueError(
            f"{entry}: `{name}` must be {expected}, got {cls.__name__}"
            + (f" (a solver of {kind}: use it with {where})" if where else "")
            + "."
        )
    if bounds is not None and cls.refuses_bounds:
        raise ValueError(
            f"{entry}: `{cls.__name__}` does not take `bounds` ({cls.refuses_bounds})."
        )
    if cls.real_only and any(
        jnp.iscomplexobj(x) for x in jtu.tree_leaves(y0) if is_param(x)
    ):
        raise ValueError(
            f"{entry}: `{cls.__name__}` takes real `y0` only; complex parameters are "
            f"not supported ({cls.real_only})."
        )
    return kind


def check_options(
    entry: str, max_steps: Any, adjoint: Any, adjoints: tuple[str, ...], **tols: Any
) -> None:
    """The checks of the options every solve takes: `max_steps`, `adjoint` (one of
    `adjoints`, the first the default) and the tolerances (each `>= 0`)."""
    if isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer)):
        raise ValueError(
            f"{entry}: `max_steps` must be an int >= 0, got {max_steps!r}."
        )
    if max_steps < 0:
        raise ValueError(f"{entry}: `max_steps` must be an int >= 0, got {max_steps}.")
    if adjoint not in adjoints:
        raise ValueError(
            f"{entry}: `adjoint` must be {adjoints[0]!r} or {adjoints[1]!r}, got "
            f"{adjoint!r}."
        )
    for name, tol in tols.items():
        if not float(tol) >= 0:
            raise ValueError(f"{entry}: `{name}` must be >= 0, got {tol}.")
