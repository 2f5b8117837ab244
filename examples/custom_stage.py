"""A new acceptance rule as one stage, written from scratch: lenient verification,
accept draft token x when u * l * q(x) < p(x).

Lenience `l` in (0, 1] accepts more draft tokens than the standard rule (l = 1) at the
cost of exactness. Only the ratio test changes; the rest of the pipeline is reused.

Besides `__call__`, the stage implements the capabilities of its abstract base, so that
everything the library does with its own rules works with this one too:

- `pass_probabilities`: the decoding loop's theoretical acceptance;
- `quadrature_breakpoints`: exact quadrature in `evaluate_verifier`;
- `vocab_parallel = True`: its `__call__` reads the vocabulary only through its
  `RowContext`, so `ShardedVerifier` runs it unchanged on a slice of the vocabulary.

The `RowContext` also says whether the rows hold probabilities or log-probabilities
(the entry point knows from its input's type): `context.gather` returns values in the
rows' space, so the test is written once for both.
"""

# --8<-- [start:stage]
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Integer

import eqx_specdec


class MyLenientRatioTest(eqx_specdec.AbstractRatioTest):
    exact: ClassVar[bool] = False  # lossy for lenience < 1
    vocab_parallel: ClassVar[bool] = True  # it reduces only through its context
    reads: ClassVar[str] = "draft tokens"  # only p(x) and q(x): the checks validate those
    lenience: Float[Array, ""] | float  # an array: sweeping it does not recompile
    def __check_init__(self):
        if not isinstance(self.lenience, jax.core.Tracer) and not (
            0 < self.lenience <= 1
        ):
            raise ValueError(f"`lenience` must lie in (0, 1], got {self.lenience}.")
    def __call__(
        self,
        draft_tokens: Integer[Array, " G"],
        draft_probs: Float[Array, "G V"] | None,
        target_probs: Float[Array, "G+1 V"],
        accept_uniforms: Float[Array, " G"],
        context: eqx_specdec.RowContext,
    ) -> eqx_specdec.Verdict:
        # p(x) and q(x), from the shard that owns x when the vocabulary is split.
        p_x, q_x = context.gather(draft_tokens, draft_probs, target_probs)
        u = accept_uniforms.astype(p_x.dtype)
        lenience = jnp.asarray(self.lenience, p_x.dtype)
        if context.log_space:  # logits given: log u + log l < log p - log q
            return eqx_specdec.Verdict(jnp.log(u) + jnp.log(lenience) < p_x - q_x)
        return eqx_specdec.Verdict(u * lenience * q_x < p_x)
    def pass_probabilities(self, draft_law, target_probs):
        # The test passes a drafted v with probability min(1, p(v) / (l q(v))).
        scaled = jnp.asarray(self.lenience, draft_law.dtype) * draft_law
        ratio = target_probs / jnp.where(scaled > 0, scaled, 1)
        return jnp.where(scaled > 0, jnp.minimum(1.0, ratio), 1)
    def quadrature_breakpoints(self, draft_probs, target_probs):
        # The outcome flips where u = p(v) / (l q(v)): the quadrature cuts there.
        q = 1.0 if draft_probs is None else draft_probs
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios = target_probs[:-1] / (float(self.lenience) * q)
        return {"accept_breakpoints": ratios}
# --8<-- [end:stage]


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
    # Check the new stage: at l = 1 it must reproduce the standard verifier exactly.
    standard = eqx_specdec.speculative_accept(*inputs)
    lenient = eqx_specdec.speculative_accept(
        *inputs, verifier=eqx_specdec.Verifier(MyLenientRatioTest(jnp.asarray(1.0)))
    )
    assert (standard["tokens"] == lenient["tokens"]).all()
    for lenience in (1.0, 0.5, 0.25):
        ratio_test = MyLenientRatioTest(jnp.asarray(lenience))
        accepted = mean_accepted(eqx_specdec.Verifier(ratio_test=ratio_test), inputs)
        print(f"lenience {lenience:.2f}: {float(accepted):.3f} draft tokens accepted")
    # Its capabilities at work: exact quadrature, as for the library's own rules.
    q = np.asarray(draft_probs[0, :2, :3], np.float64)
    p = np.asarray(target_probs[0, :3, :3], np.float64)
    q, p = q / q.sum(-1, keepdims=True), p / p.sum(-1, keepdims=True)
    verifier = eqx_specdec.Verifier(MyLenientRatioTest(0.5))
    result = eqx_specdec.evaluate_verifier(verifier, q, p)
    print(
        f"lenience 0.50, G = 2, V = 3 ({result.method}): distance from the target "
        f"{result.distance:.4f}, tokens per step {result.tokens_per_step:.4f}"
    )
# --8<-- [end:use]
