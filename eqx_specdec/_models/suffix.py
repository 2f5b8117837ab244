"""Suffix decoding as a chain: a draft with no model that proposes the continuation
most often seen after the context's longest repeated suffix, as far as those
continuations agree (SuffixDecoding, Oliaro et al. 2025, here over each row's own
context). Deterministic, so its chain is verified with the one-hot rule."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from .._misc import no_type_check


@no_type_check  # its fields are checked by `__check_init__`
class SuffixDraft(eqx.Module):
    """A draft model with no weights that proposes, after the context, the path most
    often taken by what followed the earlier occurrences of the context's longest
    repeated suffix, and stops where those continuations disagree.

    Each call finds the longest suffix of the context, from `max_match` tokens down to
    `min_match`, that occurs earlier in it; takes the `occurrences` latest of its
    earlier occurrences; and walks their continuations as a tree of counts (a suffix
    tree's subtree, built over the row's own context): at each depth it proposes the
    token most of the still-agreeing continuations take (the latest on ties), and keeps
    only those. The path's empirical probability is the product of those shares; the
    chain stops before the first token that would take it below `min_probability`.
    One occurrence proposes its whole continuation (as prompt lookup does); several
    that diverge after two tokens propose two. A continuation that reaches the end of
    the context is read on periodically (a repeating pattern continues), as
    [`eqx_specdec.models.PromptLookupDraft`][] reads it.

    Use it with `Chain(drafting="propose", trim=True)`: `propose` returns each row's
    chain and its length (0 where no suffix repeats, and the row takes a plain step).

    **Arguments:**

    - `vocab_size`: $V$, the target's vocabulary.
    - `max_match`: the longest suffix matched (default 8).
    - `min_match`: the shortest (default 2).
    - `occurrences`: how many of the latest earlier occurrences of the matched suffix
        are counted (default 16).
    - `min_probability`: the least empirical probability of the proposed path (default
        0.5): lower drafts deeper where the continuations disagree.
    """

    vocab_size: int = eqx.field(static=True)
    max_match: int = eqx.field(static=True, default=8)
    min_match: int = eqx.field(static=True, default=2)
    occurrences: int = eqx.field(static=True, default=16)
    min_probability: float = eqx.field(static=True, default=0.5)

    def __check_init__(self):
        for name in ("vocab_size", "max_match", "min_match", "occurrences"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(
                    f"SuffixDraft(`{name}`=...) must be a positive Python int, got "
                    f"{value!r}."
                )
        if self.min_match > self.max_match:
            raise ValueError(
                "SuffixDraft(`min_match`=...) must be at most `max_match` "
                f"({self.max_match}), got {self.min_match}."
            )
        if not isinstance(self.min_probability, float) or not (
            0.0 < self.min_probability <= 1.0
        ):
            raise ValueError(
                "SuffixDraft(`min_probability`=...) must be a Python float in (0, 1], "
                f"got {self.min_probability!r}."
            )

    def _matches(
        self, tokens: Int[Array, " T"], length: Int[Array, ""]
    ) -> tuple[Int[Array, " M"], Int[Array, ""]]:
        """`(ends, match)`: the last positions of the `occurrences` latest earlier
        occurrences of the context's longest repeated suffix (-1 past those found),
        latest first, and its length (0 when none of at least `min_match` repeats)."""
        width = tokens.shape[0]
        ends = jnp.arange(width, dtype=jnp.int32)

        def at(i):
            return tokens[jnp.clip(i, 0, width - 1)]

        # Each earlier end's match with the context's suffix, token by token backwards.
        agree = jnp.ones((width,), bool)
        matched = jnp.zeros((width,), jnp.int32)
        for k in range(self.max_match):
            inside = (ends - k >= 0) & (length - 1 - k >= 0)
            agree = agree & inside & (at(ends - k) == at(length - 1 - k))
            matched = matched + agree.astype(jnp.int32)
        matched = jnp.where(ends < length - 1, matched, 0)
        longest = jnp.max(matched)
        longest = jnp.where(longest >= self.min_match, longest, 0)
        found = (matched == longest) & (longest > 0)
        count = min(self.occurrences, width)
        latest, _ = jax.lax.top_k(jnp.where(found, ends, -1), count)
        return latest, longest

    def propose(
        self, tokens: Int[Array, " T"], length: Int[Array, ""], count: int
    ) -> tuple[Int[Array, " count"], Int[Array, ""]]:
        """A chain after the context `tokens[: length]` in one call (what
        `Chain(drafting="propose")` calls). Entries at or past `length` are never read.

        **Arguments:**

        - `tokens`: int `(T,)`, the row's buffer.
        - `length`: its context's length, at least 1.
        - `count`: $G$, a Python int.

        **Returns:**

        `(proposed, drafted)`: int32 `(count,)`, and how many of them the row drafts,
        from 0 (no repeated suffix, or no continuation as likely as
        `min_probability`) to `count`.
        """
        ends, match = self._matches(tokens, length)
        valid = ends >= 0
        period = jnp.maximum(length - 1 - ends, 1)
        offsets = jnp.arange(count, dtype=jnp.int32)
        index = ends[:, None] + 1 + offsets[None] % period[:, None]
        continuations = tokens[jnp.clip(index, 0, tokens.shape[0] - 1)]  # (M, count)

        def depth(carry, d):
            agreeing, probability, going = carry
            column = continuations[:, d]
            same = column[:, None] == column[None, :]
            votes = jnp.sum(same & agreeing[None, :], axis=1)
            votes = jnp.where(agreeing, votes, 0)
            best = jnp.argmax(votes)  # the latest occurrence on ties
            share = votes[best] / jnp.maximum(jnp.sum(agreeing), 1)
            probability = probability * share
            going = going & (probability >= self.min_probability)
            agreeing = agreeing & (column == column[best])
            return (agreeing, probability, going), (column[best], going)

        start = (valid & (match > 0), jnp.ones((), jnp.float32), match > 0)
        _, (proposed, kept) = jax.lax.scan(depth, start, offsets)
        drafted = jnp.sum(kept.astype(jnp.int32))
        proposed = jnp.where(kept, proposed, 0).astype(jnp.int32)
        return proposed, drafted

    def __call__(
        self, tokens: Int[Array, " T"], positions: Int[Array, " K"]
    ) -> Float[Array, "K V"]:
        """The draft's rows after `tokens[: positions[k] + 1]`: one-hot at the first
        proposed token where one is proposed, uniform elsewhere. Shape `(K, V)`."""

        def row(position):
            proposed, drafted = self.propose(tokens, position + 1, 1)
            one_hot = jax.nn.one_hot(proposed[0], self.vocab_size, dtype=jnp.float32)
            uniform = jnp.full((self.vocab_size,), 1 / self.vocab_size, jnp.float32)
            return jnp.where(drafted > 0, one_hot, uniform)

        return jax.vmap(row)(positions)
