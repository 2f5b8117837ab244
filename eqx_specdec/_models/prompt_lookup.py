"""Prompt lookup: a draft with no model, proposing the tokens that followed the latest
earlier occurrence of the context's last n-gram (Saxena 2023; vLLM's and llama.cpp's
n-gram drafts). Deterministic, so its chain is verified with the one-hot rule."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from .._misc import no_type_check


@no_type_check  # its fields are checked by `__check_init__`
class PromptLookupDraft(eqx.Module):
    """A draft model with no weights: at each position it looks for the latest earlier
    occurrence of the context's last $n$ tokens (the longest $n$ from `max_ngram` down
    to `min_ngram` that has one) and proposes the token that followed it. Text that
    reuses its context (a summary quoting its source, an edit of code, an extraction)
    is drafted many tokens at a time; elsewhere nothing matches.

    The fast way to draft with it is `Chain(drafting="propose", trim=True)`: `propose`
    returns each row's whole chain of $G$ tokens in one call (the tokens that followed
    the match), verified with the one-hot rule; a row with no match drafts nothing and
    takes a plain step, and the target is called on one position when no row has a
    match. No draft loop runs and no row over the vocabulary is formed.

    As a model it is also stateless and per-position, for any other chain: it returns a
    **one-hot** row (probabilities) where a match is found, and the **uniform** row
    where none is. Drafted with the default `Chain(drafting="sample")`, a matched
    position's token is the lookup's, and the standard rule verifies it as the one-hot
    rule does ($q$ is one-hot there). Stop drafting before the first position without a
    match with `draft_length=StopWhenUnlikely(keep_crossing=False)` (the uniform row's
    confidence is $1/V$): a row with no match drafts nothing and takes a plain step, and
    with `Chain(trim=True)` the target is called on the positions the drafts need only
    (one, when no row has a match). Decode with `outputs=("probs", "logits")` for a
    target returning logits.

    **Arguments:**

    - `vocab_size`: $V$, the target's vocabulary.
    - `max_ngram`: the longest n-gram matched (default 3).
    - `min_ngram`: the shortest (default 2). A match of one token proposes too often:
        on SmolLM2's chat answers the first token it proposed was accepted about a
        third of the time, so a step that drafted on it cost a wide target call for
        little (the cost model's speed-up on an open question 0.91x with 1, 0.99x with
        2; on a summary 2.44x and 2.21x).
    """

    vocab_size: int = eqx.field(static=True)
    max_ngram: int = eqx.field(static=True, default=3)
    min_ngram: int = eqx.field(static=True, default=2)

    def __check_init__(self):
        for name in ("vocab_size", "max_ngram", "min_ngram"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"PromptLookupDraft(`{name}`=...) must be a positive Python int, "
                    f"got {value!r}."
                )
        if self.min_ngram > self.max_ngram:
            raise ValueError(
                "PromptLookupDraft(`min_ngram`=...) must be at most `max_ngram` "
                f"({self.max_ngram}), got {self.min_ngram} (its default is 2: pass "
                "`min_ngram=1` too for single-token matches)."
            )

    def _latest(
        self, tokens: Int[Array, " T"], position: Int[Array, ""]
    ) -> tuple[Int[Array, ""], Int[Array, ""]]:
        """`(end, n)`: the last position of the latest earlier occurrence of the last
        `n` tokens of `tokens[: position + 1]`, for the largest `n` that has one;
        `(-1, 0)` when none has."""
        ends = jnp.arange(tokens.shape[0], dtype=jnp.int32)  # an occurrence's last

        def at(i):
            return tokens[jnp.clip(i, 0, tokens.shape[0] - 1)]

        found_end = jnp.asarray(-1, jnp.int32)
        found_n = jnp.asarray(0, jnp.int32)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            match = (ends < position) & (ends >= n - 1) & (position >= n - 1)
            for i in range(n):
                match = match & (at(ends - i) == at(position - i))
            latest = jnp.max(jnp.where(match, ends, -1))
            better = (found_end < 0) & (latest >= 0)
            found_end = jnp.where(better, latest, found_end)
            found_n = jnp.where(better, n, found_n)
        return found_end, found_n

    def lookup(
        self, tokens: Int[Array, " T"], position: Int[Array, ""]
    ) -> tuple[Int[Array, ""], Int[Array, ""]]:
        """The proposal after `tokens[: position + 1]`: `(token, n)`, the token that
        followed the latest earlier occurrence of the last `n` tokens, for the largest
        `n` that has one; `(0, 0)` when none has."""
        end, n = self._latest(tokens, position)
        token = jnp.where(
            end >= 0, tokens[jnp.clip(end + 1, 0, tokens.shape[0] - 1)], 0
        )
        return token.astype(jnp.int32), n

    def propose(
        self, tokens: Int[Array, " T"], length: Int[Array, ""], count: int
    ) -> tuple[Int[Array, " count"], Int[Array, ""]]:
        """A whole chain after the context `tokens[: length]` in one call (what
        `Chain(drafting="propose")` calls): the `count` tokens that followed the latest
        earlier occurrence of the context's last n-gram (as `lookup` finds it), read on
        periodically where that continuation reaches the end of the context (a match
        $d$ tokens back proposes the last $d$ tokens again and again, as a repeating
        pattern continues). Entries at or past `length` are never read.

        **Arguments:**

        - `tokens`: int `(T,)`, the row's buffer.
        - `length`: its context's length, at least 1.
        - `count`: $G$, a Python int.

        **Returns:**

        `(proposed, drafted)`: int32 `(count,)`, and `count` where a match is found, 0
        where none is (the row drafts nothing).
        """
        end, n = self._latest(tokens, length - 1)
        period = jnp.maximum(length - 1 - end, 1)  # >= 1 where a match is found
        offsets = jnp.arange(count, dtype=jnp.int32) % period
        index = jnp.clip(end + 1 + offsets, 0, tokens.shape[0] - 1)
        proposed = jnp.where(n > 0, tokens[index], 0).astype(jnp.int32)
        drafted = jnp.where(n > 0, count, 0).astype(jnp.int32)
        return proposed, drafted

    def __call__(
        self, tokens: Int[Array, " T"], positions: Int[Array, " K"]
    ) -> Float[Array, "K V"]:
        """The draft's rows after `tokens[: positions[k] + 1]`: one-hot at the proposed
        token where a match is found, uniform where none is. Shape `(K, V)`."""

        def row(position):
            token, n = self.lookup(tokens, position)
            one_hot = jax.nn.one_hot(token, self.vocab_size, dtype=jnp.float32)
            uniform = jnp.full((self.vocab_size,), 1 / self.vocab_size, jnp.float32)
            return jnp.where(n > 0, one_hot, uniform)

        return jax.vmap(row)(positions)
