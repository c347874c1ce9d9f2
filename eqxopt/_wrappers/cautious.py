"""Cautious: keep only the update entries that agree in sign with the gradient."""

from typing import Any

import jax.numpy as jnp

from .._core.base import AbstractOptimizer, child_update
from .._custom_types import Params, Updates
from .._misc import compute_dtype, out_dtype, tree_map


class Cautious(AbstractOptimizer):
    r"""Cautious optimizer (Liang et al. 2024): zero the entries of `optimizer`'s
    update that would not decrease the loss to first order, and rescale the rest.

    With $u$ the update of `optimizer` (to be added to the params) and $g$ the
    gradient, per leaf

    $$\phi = \mathbb 1[u \odot g < 0], \qquad
      u \leftarrow \frac{u \odot \phi}{\max\big(\operatorname{mean}(\phi),
      10^{-3}\big)},$$

    the mask and normalisation of the reference C-AdamW (`github.com/kyleliang919/
    C-Optim`, `c_adamw.py`: `mask = (exp_avg * grad > 0)`,
    `mask / mask.mean().clamp(min=1e-3)`). For Adam, $u = -\eta\,\hat m /
    (\sqrt{\hat v} + \epsilon)$ has the sign of $-m$, so $u g < 0$ is exactly the
    reference's $m g > 0$, and `Cautious(Adam(lr))` is C-Adam.

    The state is `optimizer`'s own state, unchanged: the mask only touches the
    updates.

    **Difference from the reference.** C-AdamW applies its decoupled weight decay
    outside the mask; here the mask sees `optimizer`'s whole update, so
    `Cautious(AdamW(lr, weight_decay=wd))` masks the decay term too (it differs from
    C-AdamW only where the decay flips an entry's sign).

    ??? cite "References"

        ```bibtex
        @article{liang2024cautious,
            title={Cautious Optimizers: Improving Training with One Line of Code},
            author={Liang, Kaizhao and Chen, Lizhang and Liu, Bo and Liu, Qiang},
            journal={arXiv:2411.16085}, year={2024}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Cautious(eqxopt.Adam(1e-3))
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        assert isinstance(state, eqxopt.AdamState)  # Adam's own state
        ```
    """

    optimizer: AbstractOptimizer

    def __check_init__(self):
        if not isinstance(self.optimizer, AbstractOptimizer):
            raise ValueError(
                "`Cautious(optimizer=...)` must be an eqxopt optimizer, got "
                f"{type(self.optimizer).__name__}."
            )

    def init(self, params: Params) -> Any:
        return self.optimizer.init(params)

    def update(self, grads: Updates, state: Any, params=None, **extra):
        updates, state = child_update(self.optimizer, "", grads, state, params, **extra)

        def _leaf(u, g, p):
            dtype = compute_dtype(u.dtype, g.dtype)
            u32 = u.astype(dtype)
            keep = (u32 * g.astype(dtype)) < 0
            mask = keep.astype(dtype)
            scale = jnp.maximum(jnp.mean(mask), jnp.asarray(1e-3, dtype))
            return (u32 * mask / scale).astype(out_dtype(u, p))

        updates = tree_map(
            _leaf, updates, grads, params, names=("updates", "grads", "params")
        )
        return updates, state

    def hyperparams(self, state: Any) -> dict[str, Any]:
        return {"optimizer": self.optimizer.hyperparams(state)}


Cautious.__init__.__doc__ = r"""**Arguments:**

- `optimizer`: the optimizer whose updates are masked (e.g. `eqxopt.Adam(1e-3)`).
"""
