"""Draft vocabularies mapped into the target's: a subset of it (EAGLE-3's `d2t`), and
another tokenizer's, verified over the tokens both share."""

from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, Integer


def _checked_map(
    name: str, array, target_vocab: int, to_target, rule: str, off_map: bool = False
):
    """The target ids of a draft vocabulary's map `array` (given as argument `name`,
    an integer array of shape `(V_draft,)`), checked: distinct and in
    `[0, target_vocab)` (`rule` says how they are found), except -1 (a draft id off
    the map) where `off_map`. `to_target`: the map array to the target ids."""
    values = np.asarray(array)
    if values.ndim != 1 or not np.issubdtype(values.dtype, np.integer):
        raise ValueError(
            f"`{name}` must be an integer array of shape (V_draft,); got "
            f"{values.dtype} of shape {values.shape}."
        )
    ids = to_target(values)
    mapped = ids[ids != -1] if off_map else ids
    if mapped.size and (mapped.min() < 0 or mapped.max() >= target_vocab):
        raise ValueError(
            f"`{name}` maps a draft id outside the target's vocabulary [0, "
            f"{target_vocab}): {rule}."
        )
    if np.unique(mapped).size != mapped.size:
        raise ValueError(
            f"`{name}` maps two draft ids to the same target id: the map must be "
            "one-to-one."
        )
    return ids


def _target_tokens(target_ids, draft_tokens):
    """Draft token ids through the map `target_ids` (int32), -1 off it or outside
    `[0, V_draft)`."""
    return jnp.take(
        target_ids.astype(jnp.int32),
        draft_tokens.astype(jnp.int32),
        mode="fill",
        fill_value=-1,
    )


def _scatter(values, target_ids, target_vocab: int, fill):
    """`values` `(..., V_draft)` at their target ids in `(..., V)`, `fill` elsewhere;
    values of draft ids off the map (-1) are dropped."""
    shape = values.shape[:-1] + (target_vocab + 1,)
    at = jnp.where(target_ids >= 0, target_ids, target_vocab)
    out = jnp.full(shape, fill, values.dtype).at[..., at].set(values)
    return out[..., :target_vocab]  # the last column: the dropped values


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
        if not isinstance(self.d2t, jax.core.Tracer):
            _checked_map(
                "d2t",
                self.d2t,
                self.target_vocab,
                lambda d2t: np.arange(d2t.shape[0]) + d2t,
                "draft id + d2t[draft id] must lie in it",
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
        return _target_tokens(self.target_ids(), draft_tokens)

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
        return _scatter(draft_probs, self.target_ids(), self.target_vocab, 0)

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
        return _scatter(draft_logits, self.target_ids(), self.target_vocab, -jnp.inf)


class SharedVocabulary(eqx.Module):
    """A draft with another tokenizer, verified over the tokens both vocabularies share
    (token-level intersection; Timor et al., ICML 2025). Draft id $d$ whose token string
    the target's vocabulary also holds maps to that target id; the other draft ids are
    off the map.

    The draft must draw its tokens from its distribution **restricted** to the shared
    tokens and renormalised: `restrict_logits` (or `restrict_probs`) gives that law in
    the draft's own vocabulary, and `logits` (or `probs`) the same law in the target's,
    for the verification. Then the verification is lossless as it is: the $q$ it is
    given is exactly the law of the mapped tokens. A draft token off the map is an error
    (`tokens`), never a token.

    **Arguments:**

    - `draft_to_target`: integer of shape `(V_draft,)`, the target id of each draft id,
        or -1 off the map. The target ids must be distinct and in `[0, target_vocab)`.
    - `target_vocab`: $V$, the target's vocabulary size (static).

    Build it from the two tokenizers' token strings with `from_token_strings`.
    """

    draft_to_target: Int[Array, " draft_vocab"]
    target_vocab: int = eqx.field(static=True)

    def __check_init__(self):
        if isinstance(self.draft_to_target, jax.core.Tracer):
            return
        ids = _checked_map(
            "draft_to_target",
            self.draft_to_target,
            self.target_vocab,
            lambda ids: ids,
            "each id is a target id, or -1 off the map",
            off_map=True,
        )
        if not np.any(ids >= 0):
            raise ValueError(
                "`draft_to_target` maps no draft id: the vocabularies share no token."
            )

    @classmethod
    def from_token_strings(
        cls,
        draft_tokens: Sequence[str],
        target_tokens: Sequence[str],
        normalise: Callable[[str], str] | None = None,
    ) -> "SharedVocabulary":
        """The map between two tokenizers' vocabularies, from their token strings in
        id order: a draft id maps to the target id of the same string.

        **Arguments:**

        - `draft_tokens`, `target_tokens`: the token strings of each vocabulary, the
            string of id $i$ at index $i$ (for a Hugging Face tokenizer,
            `tokenizer.convert_ids_to_tokens(range(len(tokenizer)))`).
        - `normalise`: applied to every string first, for tokenizers that spell the
            same text differently (a leading space as `"Ġ"` in one and `"▁"` in the
            other). Default: the strings as given.

        **Returns:**

        A `SharedVocabulary` of `target_vocab = len(target_tokens)`.

        **Raises:** `ValueError` if a vocabulary holds the same (normalised) string
        twice, naming it: the map would be ambiguous.
        """
        normalise = normalise or (lambda token: token)

        def ids_of(side, tokens):
            ids = {}
            for i, token in enumerate(tokens):
                key = normalise(token)
                if key in ids:
                    raise ValueError(
                        f"The {side} vocabulary holds {key!r} twice (ids {ids[key]} "
                        f"and {i}): a shared token must name one id on each side. "
                        "Pass a `normalise` that keeps them apart, or drop one."
                    )
                ids[key] = i
            return ids

        target_ids = ids_of("target", target_tokens)
        draft_ids = ids_of("draft", draft_tokens)
        ids = [target_ids.get(key, -1) for key in draft_ids]
        return cls(jnp.asarray(np.asarray(ids, np.int32)), len(target_tokens))

    def shared(self) -> Bool[Array, " draft_vocab"]:
        """Whether each draft id is on the map, shape `(V_draft,)`."""
        return self.draft_to_target >= 0

    def restrict_logits(
        self, draft_logits: Float[Array, "*shape draft_vocab"]
    ) -> Float[Array, "*shape draft_vocab"]:
        """The draft's logits with the tokens off the map removed ($-\\infty$): the law
        the draft must sample its tokens from (in its own vocabulary)."""
        return jnp.where(self.shared(), draft_logits, -jnp.inf)

    def restrict_probs(
        self, draft_probs: Float[Array, "*shape draft_vocab"]
    ) -> Float[Array, "*shape draft_vocab"]:
        """The draft's distributions restricted to the shared tokens and renormalised
        (in its own vocabulary). A row with no mass on the shared tokens becomes NaN,
        which the verification's checks reject."""
        kept = jnp.where(self.shared(), draft_probs, 0)
        return kept / jnp.sum(kept, axis=-1, keepdims=True)

    def tokens(self, draft_tokens: Integer[Array, "*shape"]) -> Int[Array, "*shape"]:
        """Draft token ids as target ids (int32).

        A draft token off the map, or outside `[0, V_draft)`, is an error: called on
        concrete arrays this raises a `ValueError` naming the first such token; traced,
        it becomes -1, which the verification's checks reject
        (`RESULTS.token_out_of_range`). Draw the draft from `restrict_logits` so that it never
        proposes one.

        **Arguments:**

        - `draft_tokens`: integer, any shape.

        **Returns:**

        int32, the same shape.
        """
        ids = _target_tokens(self.draft_to_target, draft_tokens)
        if not isinstance(ids, jax.core.Tracer):
            off = np.argwhere(np.asarray(ids) < 0)
            if off.size:
                where = tuple(int(i) for i in off[0])
                token = int(np.asarray(draft_tokens)[where])
                raise ValueError(
                    f"`draft_tokens` holds draft id {token} at {where}, which is off "
                    "the shared vocabulary's map (its string is not in the target's "
                    "vocabulary, or the id is outside the draft's): draw the draft's "
                    "tokens from `SharedVocabulary.restrict_logits` of its logits."
                )
        return ids

    def probs(
        self, draft_probs: Float[Array, "*shape draft_vocab"]
    ) -> Float[Array, "*shape target_vocab"]:
        """The restricted draft distributions (`restrict_probs`) in the target's
        vocabulary: `(..., V_draft)` to `(..., V)`, zeros at the target ids the draft
        does not share."""
        restricted = self.restrict_probs(draft_probs)
        return _scatter(restricted, self.draft_to_target, self.target_vocab, 0)

    def logits(
        self, draft_logits: Float[Array, "*shape draft_vocab"]
    ) -> Float[Array, "*shape target_vocab"]:
        """The restricted draft logits (`restrict_logits`) in the target's vocabulary,
        $-\\infty$ at the target ids the draft does not share. Give both sides the same
        [`eqx_specdec.Warp`][] (its logit bias in target ids), and draw the draft's
        tokens from the same warp of these logits."""
        restricted = self.restrict_logits(draft_logits)
        return _scatter(restricted, self.draft_to_target, self.target_vocab, -jnp.inf)
