"""A new acceptance rule as one stage: lenient verification, accept if u * l * q(x) < p(x).

Lenience `l` in (0, 1] accepts more draft tokens than the standard rule (l = 1) at the
cost of exactness. Only the ratio test changes; the rest of the pipeline is reused.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Integer

import eqx_specdec


class LenientRatioTest(eqx_specdec.AbstractRatioTest):
    lenience: Float[Array, ""]  # an array field: sweeping it does not recompile

    def __check_init__(self):
        if not (0 < self.lenience <= 1):
            raise ValueError(f"`lenience` must lie in (0, 1], got {self.lenience}.")

    def __call__(
        self,
        draft_tokens: Integer[Array, " gamma"],
        draft_probs: Float[Array, "gamma vocab"],
        target_probs: Float[Array, "gamma+1 vocab"],
        accept_uniforms: Float[Array, " gamma"],
    ) -> eqx_specdec.Verdict:
        index = draft_tokens[:, None]
        p_x = jnp.take_along_axis(target_probs[:-1], index, axis=1)[:, 0]
        q_x = jnp.take_along_axis(draft_probs, index, axis=1)[:, 0]
        return eqx_specdec.Verdict(accept_uniforms * self.lenience * q_x < p_x)


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
    # Check the new stage: at l = 1 it must reproduce the standard verifier exactly.
    standard = eqx_specdec.speculative_accept(*inputs)
    lenient = eqx_specdec.speculative_accept(
        *inputs, verifier=eqx_specdec.Verifier(LenientRatioTest(jnp.asarray(1.0)))
    )
    assert (standard["tokens"] == lenient["tokens"]).all()
    for lenience in (1.0, 0.5, 0.25):
        ratio_test = LenientRatioTest(jnp.asarray(lenience))
        accepted = mean_accepted(eqx_specdec.Verifier(ratio_test=ratio_test), inputs)
        print(f"lenience {lenience:.2f}: {float(accepted):.3f} draft tokens accepted")
