"""One verification step on a batch of random drafts, with the standard verifier."""

import jax
import jax.numpy as jnp

import eqx_specdec


B, G, V = 4, 5, 32_000  # rows, draft tokens per row, vocabulary
k_q, k_p, k_x, k_u, k_s = jax.random.split(jax.random.key(0), 5)
target_logits = jax.random.normal(k_p, (B, G + 1, V))
draft_logits = target_logits[:, :G] + 0.5 * jax.random.normal(k_q, (B, G, V))
draft_probs = jax.nn.softmax(draft_logits, axis=-1)  # q, what the draft sampled from
target_probs = jax.nn.softmax(target_logits, axis=-1)  # p, the target's distributions
draft_tokens = jax.random.categorical(k_x, draft_logits).astype(jnp.int32)

verify = jax.jit(eqx_specdec.speculative_accept)
out = verify(
    draft_tokens,
    draft_probs,
    target_probs,
    jax.random.uniform(k_u, (B, G)),  # accept_uniforms
    jax.random.uniform(k_s, (B,)),  # sample_uniforms
)
print("num_accepted:", out["num_accepted"])
print("tokens:\n", out["tokens"])
