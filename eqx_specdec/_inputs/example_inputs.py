"""Valid random inputs of one verification step, for examples and first experiments."""

import jax.numpy as jnp
import numpy as np

from .._misc import numpy_softmax


def example_inputs(batch: int = 3, gamma: int = 4, vocab: int = 10, *, seed: int = 0):
    """Random, valid inputs of [`eqx_specdec.speculative_accept`][]: what the examples in
    the documentation run on.

    The target's and the draft's distributions are softmaxes of random logits (the draft's
    close to the target's), the draft tokens are sampled from the draft's distributions,
    and the uniforms are uniform in $[0, 1)$. The same arguments always give the same
    arrays (a NumPy generator seeded with `seed`).

    **Arguments:**

    - `batch`, `gamma`, `vocab`: the shapes B, G and V.
    - `seed`: the NumPy seed.

    **Returns:**

    `(draft_tokens, draft_probs, target_probs, accept_uniforms, sample_uniforms)`: int32
    `(B, G)`, float32 `(B, G, V)`, float32 `(B, G + 1, V)`, float32 `(B, G)` and float32
    `(B,)` JAX arrays.
    """
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(batch, gamma + 1, vocab))
    draft_logits = logits[:, :gamma] + 0.5 * rng.normal(size=(batch, gamma, vocab))
    target, draft = numpy_softmax(logits), numpy_softmax(draft_logits)
    cumulative = np.cumsum(draft, axis=-1)
    draws = rng.uniform(size=(batch, gamma, 1)) * cumulative[..., -1:]
    tokens = np.minimum((cumulative <= draws).sum(-1), vocab - 1)
    return (
        jnp.asarray(tokens, jnp.int32),
        jnp.asarray(draft, jnp.float32),
        jnp.asarray(target, jnp.float32),
        jnp.asarray(rng.uniform(size=(batch, gamma)), jnp.float32),
        jnp.asarray(rng.uniform(size=batch), jnp.float32),
    )
