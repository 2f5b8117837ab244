"""A draft vocabulary smaller than the target's, mapped into it (EAGLE-3's `d2t`)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, Integer


class DraftVocabulary(eqx.Module):
    """A draft model's vocabulary as a subset of the target's: draft id $d$ is target id
    $d + \\mathrm{d2t}[d]$ (EAGLE-3's `d2t` offsets). The verification runs in the
    target's vocabulary: map the draft tokens with `tokens`, and scatter the draft's
    distributions with `probs` (zeros at target ids the draft cannot produce) or its
    logits with `logits` ($-\\infty$ there).

    Lossless as it is: the scattered $q$ is exactly the law the mapped tokens were
    drawn from. With logits, scatter first and give both sides the same
    [`eqx_specdec.Warp`][] (its logit bias is then in target ids on both sides), so that
    the draft's warped law is the one its tokens were sampled from.

    **Arguments:**

    - `d2t`: integer of shape `(V_draft,)`, the offsets: target id = draft id +
        `d2t[draft id]`. The target ids must be distinct and in `[0, target_vocab)`.
    - `target_vocab`: $V$, the target's vocabulary size (static).
    """

    d2t: Int[Array, " draft_vocab"]
    target_vocab: int = eqx.field(static=True)

    def __check_init__(self):
        if isinstance(self.d2t, jax.core.Tracer):
            return
        d2t = np.asarray(self.d2t)
        if d2t.ndim != 1 or not np.issubdtype(d2t.dtype, np.integer):
            raise ValueError(
                "`d2t` must be an integer array of shape (V_draft,); got "
                f"{d2t.dtype} of shape {d2t.shape}."
            )
        ids = np.arange(d2t.shape[0]) + d2t
        if ids.size and (ids.min() < 0 or ids.max() >= self.target_vocab):
            raise ValueError(
                "`d2t` maps a draft id outside the target's vocabulary [0, "
                f"{self.target_vocab}): draft id + d2t[draft id] must lie in it."
            )
        if np.unique(ids).size != ids.size:
            raise ValueError(
                "`d2t` maps two draft ids to the same target id: the map must be "
                "one-to-one."
            )

    def target_ids(self) -> Int[Array, " draft_vocab"]:
        """The target id of every draft id, shape `(V_draft,)`."""
        draft_ids = jnp.arange(self.d2t.shape[0], dtype=jnp.int32)
        return draft_ids + self.d2t.astype(jnp.int32)

    def tokens(self, draft_tokens: Integer[Array, "*shape"]) -> Int[Array, "*shape"]:
        """Draft token ids as target ids (int32); an id outside `[0, V_draft)` becomes
        -1, which the verification's checks reject (never a silently wrong token).

        **Arguments:**

        - `draft_tokens`: integer, any shape.

        **Returns:**

        int32, the same shape.
        """
        return jnp.take(
            self.target_ids(),
            draft_tokens.astype(jnp.int32),
            mode="fill",
            fill_value=-1,
        )

    def _scatter(self, values, fill):
        shape = values.shape[:-1] + (self.target_vocab,)
        out = jnp.full(shape, fill, values.dtype)
        return out.at[..., self.target_ids()].set(values)

    def probs(
        self, draft_probs: Float[Array, "*shape draft_vocab"]
    ) -> Float[Array, "*shape target_vocab"]:
        """The draft's distributions in the target's vocabulary: `(..., V_draft)` to
        `(..., V)`, zeros at the target ids outside the draft's vocabulary.

        **Arguments:**

        - `draft_probs`: float of shape `(..., V_draft)`.

        **Returns:**

        Float of shape `(..., V)`.
        """
        return self._scatter(draft_probs, 0)

    def logits(
        self, draft_logits: Float[Array, "*shape draft_vocab"]
    ) -> Float[Array, "*shape target_vocab"]:
        """The draft's logits in the target's vocabulary, $-\\infty$ at the target ids
        outside the draft's vocabulary.

        **Arguments:**

        - `draft_logits`: float of shape `(..., V_draft)`.

        **Returns:**

        Float of shape `(..., V)`.
        """
        return self._scatter(draft_logits, -jnp.inf)
