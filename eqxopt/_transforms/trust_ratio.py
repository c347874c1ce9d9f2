r"""`ScaleByTrustRatio`: scale each update by the layer-wise trust ratio
$\|p\| / \|u\|$ (You et al. 2017; the building block of LARS and LAMB)."""

from .._checks import check_hyperparams, need_params
from .._core.base import AbstractOptimizer, EmptyState
from .._custom_types import Params, ScalarLike, Updates
from .._kernels import trust_ratio
from .._misc import (
    compute_dtype,
    out_dtype,
    tree_map,
)


class ScaleByTrustRatio(AbstractOptimizer[EmptyState]):
    r"""Rescale each param leaf's update by its trust ratio:

    $$u \mapsto u \cdot \frac{c\,\max(\|p\|, n_{\min})}{\max(\|u\|, n_{\min}) +
      \epsilon}$$

    with norms over the whole leaf (a layer), and $u$ unchanged where either norm is
    zero. Needs `params`. Used by [`eqxopt.Lamb`][] and [`eqxopt.Lars`][]; matches
    `optax.scale_by_trust_ratio`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(
            eqxopt.ScaleByAdam(),
            eqxopt.ScaleByTrustRatio(),
            eqxopt.ScaleByLearningRate(1e-3),
        )
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        # each leaf's step scaled by ||p|| / ||u||, as in LAMB
        ```
    """

    min_norm: ScalarLike = 0.0
    trust_coefficient: ScalarLike = 1.0
    eps: ScalarLike = 0.0

    def __check_init__(self):
        check_hyperparams(self, nonnegative=("min_norm", "trust_coefficient", "eps"))

    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    def update(self, grads: Updates, state: EmptyState, params=None, **extra):
        need_params(self, params)

        def _leaf(g, p):
            u = g.astype(compute_dtype(g.dtype, p.dtype))
            u = trust_ratio(u, p, self.min_norm, self.trust_coefficient, self.eps)
            return u.astype(out_dtype(g, p))

        return tree_map(_leaf, grads, params, names=("grads", "params")), state


ScaleByTrustRatio.__init__.__doc__ = r"""**Arguments:**

- `min_norm`: $n_{\min}$, the floor of both norms.
- `trust_coefficient`: $c$, the trust ratio's multiplier.
- `eps`: $\epsilon$ in the trust ratio's denominator.
"""
