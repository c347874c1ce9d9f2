"""`eqxopt.verify`: trace `init` and a few updates abstractly and tabulate the state."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from .._misc import is_param
from .base import _init_problem, AbstractOptimizer, first_drift, StateDriftError


class StateLeaf(eqx.Module):
    """One row of a [`eqxopt.StateReport`][].

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        report = eqxopt.verify(eqxopt.Adam(1e-3), params)
        leaf = report.leaves[0]
        assert (leaf.path, leaf.dtype, leaf.shape) == (".count", "int32", ())
        assert not leaf.weak_type and leaf.nbytes == 4
        ```
    """

    path: str
    dtype: str
    shape: tuple[int, ...]
    weak_type: bool
    nbytes: int


class StateReport(eqx.Module):
    """Every leaf of an optimizer's state, as traced by [`eqxopt.verify`][].

    `str(report)` is a table of path, dtype, shape, weak type and bytes.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        report = eqxopt.verify(eqxopt.Adam(1e-3), params)
        assert report.optimizer == "Adam"
        assert len(report.leaves) == 5  # count, mu["b"], mu["w"], nu["b"], nu["w"]
        print(report)  # as a table
        ```
    """

    optimizer: str
    leaves: tuple[StateLeaf, ...]

    @property
    def nbytes(self) -> int:
        return sum(leaf.nbytes for leaf in self.leaves)

    def __str__(self) -> str:
        header = ("path", "dtype", "shape", "weak", "bytes")
        rows = [
            (
                "state" + leaf.path,
                leaf.dtype,
                str(leaf.shape),
                "yes" if leaf.weak_type else "no",
                f"{leaf.nbytes:,}",
            )
            for leaf in self.leaves
        ]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(5)]
        line = lambda r: "  ".join(
            c.rjust(w) if i == 4 else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths))
        ).rstrip()
        out = [f"State of {self.optimizer}: {len(rows)} leaves, {self.nbytes:,} bytes"]
        out += [line(header), line(tuple("-" * w for w in widths))]
        out += [line(r) for r in rows]
        return "\n".join(out)


def verify(opt: AbstractOptimizer, params: Any, steps: int = 2, **extra) -> StateReport:
    """Trace `opt.init(params)` and `steps` updates abstractly (nothing is computed).

    Raises [`eqxopt.StateDriftError`][] if any update changes the state's structure,
    shapes, dtypes or weak types, or if the initial state holds a weakly typed leaf
    (a weakly typed leaf would make a jitted step compile twice). Returns a
    [`eqxopt.StateReport`][].

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        report = eqxopt.verify(eqxopt.AdamW(1e-3, state_dtype=jnp.float32), params)
        print(report)  # one row per state leaf: path, dtype, shape, weak type, bytes
        ```
    """
    name = type(opt).__name__
    grads = jtu.tree_map(lambda p: p if is_param(p) else None, params)
    state = eqx.filter_eval_shape(opt.init, params)
    problem = _init_problem(state)  # for an `init` that escaped the wrapper's check
    if problem is not None:
        raise StateDriftError(name, *problem, culprit=name, method="init")
    first = state
    for _ in range(steps):
        _, new = eqx.filter_eval_shape(
            lambda o, g, s, p, e: o.update(g, s, p, **e),
            opt,
            grads,
            state,
            params,
            extra,
        )
        drift = first_drift(first, new)
        if drift is not None:
            raise StateDriftError(name, *drift, culprit=name)
        state = new
    rows = []
    for path, leaf in jtu.tree_flatten_with_path(first)[0]:
        if jnp.issubdtype(leaf.dtype, jax.dtypes.extended):  # a typed PRNG key
            data = jax.eval_shape(jax.random.key_data, leaf)
            dtype_name, nbytes = str(leaf.dtype), data.size * data.dtype.itemsize
        else:
            dtype = np.dtype(leaf.dtype)
            dtype_name = dtype.name
            nbytes = int(np.prod(leaf.shape, dtype=np.int64)) * dtype.itemsize
        rows.append(
            StateLeaf(
                path=jtu.keystr(path),
                dtype=dtype_name,
                shape=tuple(leaf.shape),
                weak_type=bool(getattr(leaf, "weak_type", False)),
                nbytes=int(nbytes),
            )
        )
    return StateReport(name, tuple(rows))
