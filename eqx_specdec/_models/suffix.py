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
    As a model (`__call__`) it gives the continuations' shares, from which a
    [`eqx_specdec.DynamicTree`][] grows a tree of them.

    **Arguments:**

    - `vocab_size`: $V$, the target's vocabulary.
    - `max_match`: the longest suffix matched (default 8).
    - `min_match`: the shortest (default 2).
    - `occurrences`: how many of the latest earlier occurrences of the matched suffix
        are counted (default 16).
    - `min_probability`: the least empirical probability of the proposed path (default
        0.5): lower drafts deeper where the continuations disagree.
    - `corpus`: `None` (the default), or earlier text to search as well, int `(C,)`:
        earlier answers, say, each followed by -1 (a continuation stops at a -1).
        Occurrences in the row's own context come first, the latest first, then the
        corpus's, the latest first.
    """

    vocab_size: int = eqx.field(static=True)
    max_match: int = eqx.field(static=True, default=8)
    min_match: int = eqx.field(static=True, default=2)
    occurrences: int = eqx.field(static=True, default=16)
    min_probability: float = eqx.field(static=True, default=0.5)
    corpus: Int[Array, " C"] | None = None

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
        corpus = self.corpus
        if corpus is not None and (
            getattr(corpus, "ndim", None) != 1
            or not jnp.issubdtype(corpus.dtype, jnp.integer)
            or corpus.shape[0] < 1
        ):
            raise ValueError(
                "SuffixDraft(`corpus`=...) must be None or a non-empty 1-D integer array "
                "of token ids (-1 between texts), got "
                f"{getattr(corpus, 'dtype', type(corpus).__name__)}"
                f"{list(getattr(corpus, 'shape', []))}."
            )

    def _matched(self, haystack, reads, context, length):
        """Each end position of `haystack`'s match with the context's suffix (the
        tokens agreeing backwards, up to `max_match`; a -1 agrees with nothing), where
        `reads` (an end with a continuation to read), else 0."""
        width = haystack.shape[0]
        ends = jnp.arange(width, dtype=jnp.int32)
        agree = jnp.ones((width,), bool)
        matched = jnp.zeros((width,), jnp.int32)
        for k in range(self.max_match):
            inside = (ends - k >= 0) & (length - 1 - k >= 0)
            here = haystack[jnp.clip(ends - k, 0, width - 1)]
            suffix = context[jnp.clip(length - 1 - k, 0, context.shape[0] - 1)]
            agree = agree & inside & (here >= 0) & (here == suffix)
            matched = matched + agree.astype(jnp.int32)
        return jnp.where(reads, matched, 0)

    def _continuations(
        self, tokens: Int[Array, " T"], length: Int[Array, ""], count: int
    ) -> tuple[Int[Array, "M count"], Int[Array, ""]]:
        """The continuations, `count` tokens each, of the `occurrences` latest earlier
        occurrences of the context's longest repeated suffix (the context's first,
        read on periodically at its end; then the corpus's, -1 past a text's end), -1
        rows past those found; and the suffix's length (0 when none of at least
        `min_match` tokens repeats)."""
        width = tokens.shape[0]
        ends = jnp.arange(width, dtype=jnp.int32)
        offsets = jnp.arange(count, dtype=jnp.int32)
        own = self._matched(tokens, ends < length - 1, tokens, length)
        found = [own]
        if self.corpus is not None:
            corpus = self.corpus.astype(jnp.int32)
            size = corpus.shape[0]
            after = corpus[jnp.clip(jnp.arange(size) + 1, 0, size - 1)]
            reads = (jnp.arange(size) < size - 1) & (after >= 0)
            found.append(self._matched(corpus, reads, tokens, length))
        longest = jnp.max(jnp.stack([jnp.max(m) for m in found]))
        longest = jnp.where(longest >= self.min_match, longest, 0)
        # One ranking: the context's ends above every corpus end, the latest first.
        shift = 0 if self.corpus is None else self.corpus.shape[0]
        keys = [jnp.where((own == longest) & (longest > 0), shift + ends, -1)]
        if self.corpus is not None:
            at_corpus = jnp.arange(shift, dtype=jnp.int32)
            keys.append(jnp.where((found[1] == longest) & (longest > 0), at_corpus, -1))
        keys = jnp.concatenate(keys)
        ranked, _ = jax.lax.top_k(keys, min(self.occurrences, keys.shape[0]))
        in_context = ranked >= shift
        end = jnp.where(in_context, ranked - shift, ranked)
        period = jnp.maximum(length - 1 - end, 1)
        index = end[:, None] + 1 + offsets[None] % period[:, None]
        rows = tokens[jnp.clip(index, 0, width - 1)]
        if self.corpus is not None:
            index = end[:, None] + 1 + offsets[None]
            inside = index < shift
            text = jnp.where(inside, corpus[jnp.clip(index, 0, shift - 1)], -1)
            rows = jnp.where(in_context[:, None], rows, text)
        return jnp.where((ranked >= 0)[:, None], rows, -1), longest

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
        continuations, match = self._continuations(tokens, length, count)
        valid = continuations[:, 0] >= 0
        offsets = jnp.arange(count, dtype=jnp.int32)

        def depth(carry, d):
            agreeing, probability, going = carry
            column = continuations[:, d]
            same = column[:, None] == column[None, :]
            votes = jnp.sum(same & agreeing[None, :], axis=1)
            votes = jnp.where(agreeing, votes, 0)
            best = jnp.argmax(votes)  # the latest occurrence on ties
            share = votes[best] / jnp.maximum(jnp.sum(agreeing), 1)
            probability = probability * share
            # A -1 (past a corpus text's end, or no occurrence) is never proposed.
            going = going & (probability >= self.min_probability) & (column[best] >= 0)
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
        """The draft's rows after `tokens[: positions[k] + 1]`: how often each token
        followed the `occurrences` latest earlier occurrences of that context's longest
        repeated suffix (the first depth of the counts `propose` walks), uniform where
        no suffix repeats. Shape `(K, V)`.

        As the draft of a [`eqx_specdec.DynamicTree`][] proposal (verified with
        [`eqx_specdec.DeterministicCandidates`][]) these rows grow SuffixDecoding's
        tree: each node's children are the continuations seen most often after its
        path, and the tree keeps the paths whose product of those shares is highest,
        within the proposal's node budget."""

        def row(position):
            continuations, match = self._continuations(tokens, position + 1, 1)
            first = continuations[:, 0]
            seen = (first >= 0) & (match > 0)
            counts = (
                jnp.zeros((self.vocab_size,), jnp.float32)
                .at[jnp.where(seen, first, 0)]
                .add(seen.astype(jnp.float32))
            )
            total = jnp.sum(counts)
            uniform = jnp.full((self.vocab_size,), 1 / self.vocab_size, jnp.float32)
            return jnp.where(total > 0, counts / jnp.maximum(total, 1), uniform)

        return jax.vmap(row)(positions)
