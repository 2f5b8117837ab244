"""The record a ratio test hands to the rest of the pipeline."""

import equinox as eqx
import jax.numpy as jnp
from beartype import beartype
from jaxtyping import jaxtyped

from .._custom_types import PassedRow, ScaleRow


@jaxtyped(typechecker=beartype)
class Verdict(eqx.Module):
    """What a ratio test hands to the rest of the pipeline, for one row.

    A ratio test decides, position by position, whether a draft token passes its test.
    Most rules stop there; rules that carry a running state from one position to the next
    (block verification scales the residual by its clipped cumulative ratio $P_n$) also
    say how the residual at each position is formed, through `residual_scale`:

    $$r_n = \\operatorname{norm}\\big((c_n\\, p_n - q_n)_+\\big)$$

    with $c_n$ = `residual_scale[n]`. The standard rule has $c_n = 1$.

    **Arguments:**

    - `passed`: boolean of shape `(G,)`; `passed[i]` says whether draft token `i`
        passed its test. A prefix counter turns these into the number of accepted tokens.
    - `residual_scale`: float of shape `(G,)`, the factor $c_n$ above. Defaults to
        ones (float32), the standard residual $(p_n - q_n)_+$.
    - `rule`: the [`eqx_specdec.AbstractThresholdRule`][] that decided, if any (set by
        the threshold rules themselves): the residual is then its derived correction
        $(c_n\\, p_n - \\min(q_n, t_n))_+$, with $t_n$ the rule's acceptance on row
        $n$, so that the correction sees the very instance (and parameters) that
        decided. Default `None`: $q_n$ is subtracted whole.
    """

    passed: PassedRow
    residual_scale: ScaleRow
    rule: eqx.Module | None

    def __init__(
        self,
        passed: PassedRow,
        residual_scale: ScaleRow | None = None,
        rule: eqx.Module | None = None,
    ):
        self.passed = passed
        if residual_scale is None:
            residual_scale = jnp.ones(passed.shape, jnp.float32)
        self.residual_scale = residual_scale
        self.rule = rule
