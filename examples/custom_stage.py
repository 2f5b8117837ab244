"""A new acceptance rule is its acceptance function: the capped rule, accept draft token
x with probability min(1, c p(x) / q(x)) for a c in (0, 1], in five lines.

The library derives the rest from `acceptance`: the division-free verdict, the exact
correction norm((p - min(q, c p))_+), pass probabilities, the quadrature's cuts, the
closed-form emission and the tree form. The rule declares nothing about exactness: it
is exact by construction (min(q, c p) <= p), and the entry points check that bound on
every row its correction is drawn from.

Lenient acceptance, min(1, p(x) / (l q(x))), is the same one method with t = p / l; it
accepts more than the target holds where p < q, so it says so: `exact = False`.
"""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

import eqx_specdec


# --8<-- [start:rule]
class Capped(eqx_specdec.AbstractThresholdRule):
    """Accepts x with probability min(1, c p(x) / q(x)), for c in (0, 1]."""
    c: Float[Array, ""]  # an array field: swept under jax.jit without recompiling
    def acceptance(self, p, q, context):
        return context.times(p, self.c)  # t = c p, in the rows' space (or log space)
# --8<-- [end:rule]


# --8<-- [start:lenient]
class MyLenientRatioTest(eqx_specdec.AbstractThresholdRule):
    """Accepts x with probability min(1, p(x) / (l q(x))), for l in (0, 1]."""
    exact: ClassVar[bool] = False  # it accepts min(q, p / l) > p where p < q
    lenience: Float[Array, ""] | float
    def acceptance(self, p, q, context):
        return context.times(p, 1 / jnp.asarray(self.lenience, p.dtype))
# --8<-- [end:lenient]


# --8<-- [start:use]
@eqx.filter_jit
def mean_accepted(verifier, inputs):
    out = eqx_specdec.speculative_accept(*inputs, verifier=verifier)
    return out["num_accepted"].mean()


if __name__ == "__main__":
    B, G, V = 256, 4, 100
    keys = jax.random.split(jax.random.key(0), 4)
    target_probs = jax.nn.softmax(2 * jax.random.normal(keys[0], (B, G + 1, V)), -1)
    draft_probs = jax.nn.softmax(2 * jax.random.normal(keys[1], (B, G, V)), -1)
    draft_tokens = jax.random.categorical(keys[2], jnp.log(draft_probs))
    uniforms = jax.random.uniform(keys[3], (B, G + 1))
    inputs = (draft_tokens, draft_probs, target_probs, uniforms[:, :G], uniforms[:, G])
    # At c = 1 the capped rule is the standard rule, bit for bit.
    standard = eqx_specdec.speculative_accept(*inputs)
    capped = eqx_specdec.speculative_accept(
        *inputs, verifier=eqx_specdec.Verifier(Capped(jnp.asarray(1.0)))
    )
    assert (standard["tokens"] == capped["tokens"]).all()
    # A sweep of c: one compilation.
    for c in (1.0, 0.5, 0.25):
        verifier = eqx_specdec.Verifier(Capped(jnp.asarray(c)))
        print(f"c = {c:.2f}: {float(mean_accepted(verifier, inputs)):.3f} accepted")
    # The same rule object on a tree: i.i.d. children tested against the residual.
    rule = Capped(jnp.asarray(0.5))
    tree = eqx_specdec.TreeVerifier(eqx_specdec.IIDCandidates(rule), tree=(-1, -1, 0))
    q = np.asarray(draft_probs[0, :, :3], np.float64)
    p = np.asarray(target_probs[0, :, :3], np.float64)
    q, p = q / q.sum(-1, keepdims=True), p / p.sum(-1, keepdims=True)
    result = eqx_specdec.evaluation.evaluate_verifier(tree, q[:4], p[:4])
    print(
        f"c = 0.50 on a tree of 3 nodes, V = 3 ({result.method}): distance from the "
        f"target {result.distance:.1e}, exact: {tree.exact}"
    )
    # Exact evaluation on a chain, at any vocabulary: in closed form.
    for verifier in (
        eqx_specdec.Verifier(rule),
        eqx_specdec.Verifier(MyLenientRatioTest(0.5)),
    ):
        result = eqx_specdec.evaluation.evaluate_verifier(
            verifier, draft_probs[0], target_probs[0], method="closed-form"
        )
        print(
            f"{type(verifier.ratio_test).__name__}, G = {G}, V = {V} ({result.method}): "
            f"distance {result.distance:.1e}, tokens per step "
            f"{result.tokens_per_step:.4f}, exact: {verifier.exact}"
        )
# --8<-- [end:use]
