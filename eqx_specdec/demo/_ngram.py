"""Character n-gram models, exact and cheap: the built-in draft, and a target whose
distribution of any continuation is known."""

import functools

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from beartype import beartype
from jaxtyping import Array, Float, Int, jaxtyped

from ._corpus import builtin_corpus, VOCABULARY


class NGramModel(eqx.Module):
    """A character-level (or any token-level) n-gram language model as an Equinox module:
    the next-token distribution depends on the previous `order - 1` tokens only.

    It follows the model interface of [`eqx_specdec.speculative_decode`][]: called on a
    token buffer and the positions to predict after, it returns one distribution per
    position. Positions before the start of the buffer read as token 0. Build one with
    [`eqx_specdec.demo.fit_ngram`][].

    **Arguments:**

    - `probs`: float of shape `(vocab ** (order - 1), vocab)`: row `c` is the next-token
        distribution after the context whose tokens, most recent first, are the base-`vocab`
        digits of `c` (least significant first).
    - `order`: the $n$ of the n-gram, at least 1.
    """

    probs: Float[Array, "contexts V"]
    order: int = eqx.field(static=True)

    def __check_init__(self):
        vocab = self.probs.shape[-1]
        if self.order < 1 or self.probs.shape != (vocab ** (self.order - 1), vocab):
            raise ValueError(
                f"NGramModel(`probs`=...) must have shape (vocab ** (order - 1), vocab) = "
                f"({vocab} ** {self.order - 1}, {vocab}) for order {self.order}; got "
                f"{tuple(self.probs.shape)}."
            )

    @property
    def vocab_size(self) -> int:
        return self.probs.shape[-1]

    @jaxtyped(typechecker=beartype)
    def __call__(
        self, tokens: Int[Array, " length"], positions: Int[Array, " k"]
    ) -> Float[Array, "k V"]:
        """The next-token distributions after `tokens[: position + 1]`.

        **Arguments:**

        - `tokens`: integer of shape `(T,)`, the token buffer of one sequence.
        - `positions`: integer of shape `(K,)`: predict the token at `position + 1`.

        **Returns:**

        Float of shape `(K, V)`, the distributions.
        """
        vocab = self.vocab_size
        context = jnp.zeros(positions.shape, jnp.int32)
        for back in range(self.order - 1):  # most recent token first
            where = positions - back
            token = jnp.where(where >= 0, tokens[jnp.maximum(where, 0)], 0)
            context = context + token.astype(jnp.int32) * vocab**back
        return self.probs[context]


def fit_ngram(tokens, vocab_size: int, order: int) -> NGramModel:
    """Fits an interpolated (Witten-Bell) n-gram model to a token sequence.

    Every order mixes its maximum-likelihood estimate with the next lower order, with
    weight $c(h) / (c(h) + t(h))$ on the estimate, where $c(h)$ counts the context $h$ and
    $t(h)$ the distinct tokens seen after it; the unigram is add-one smoothed, so every
    token has positive probability after every context. Positions before the start read as
    token 0, as in [`eqx_specdec.demo.NGramModel`][].

    **Arguments:**

    - `tokens`: a 1-d sequence of integer ids in `[0, vocab_size)`.
    - `vocab_size`: the vocabulary size $V$.
    - `order`: the $n$; the model holds $V^n$ float32 probabilities.

    **Returns:**

    An [`eqx_specdec.demo.NGramModel`][].
    """
    tokens = np.asarray(tokens, np.int64).ravel()
    if order < 1:
        raise ValueError(f"`order` must be at least 1, got {order}.")
    if tokens.size == 0 or tokens.min() < 0 or tokens.max() >= vocab_size:
        raise ValueError(
            f"`tokens` must be a non-empty sequence of ids in [0, {vocab_size})."
        )
    padded = np.concatenate([np.zeros(order - 1, np.int64), tokens])
    counts = np.bincount(tokens, minlength=vocab_size).astype(np.float64)
    probs = (counts + 1) / (counts.sum() + vocab_size)
    probs = probs[None]  # order 1: one (empty) context
    for k in range(2, order + 1):
        # Context index of each token: the k - 1 tokens before it, most recent first.
        context = np.zeros(tokens.size, np.int64)
        start = order - 1
        for back in range(1, k):
            context += padded[
                start - back : start - back + tokens.size
            ] * vocab_size ** (back - 1)
        table = np.zeros((vocab_size ** (k - 1), vocab_size))
        np.add.at(table, (context, tokens), 1.0)
        seen = table.sum(-1, keepdims=True)
        types = (table > 0).sum(-1, keepdims=True)
        weight = seen / np.maximum(seen + types, 1)
        estimate = table / np.maximum(seen, 1)
        lower = probs[np.arange(vocab_size ** (k - 1)) % vocab_size ** (k - 2)]
        probs = weight * estimate + (1 - weight) * lower
    probs = probs / probs.sum(-1, keepdims=True)
    return NGramModel(jnp.asarray(probs, jnp.float32), order)


@functools.lru_cache(maxsize=4)
def builtin_models(
    draft_order: int = 2, target_order: int = 4
) -> tuple[NGramModel, NGramModel]:
    """The built-in model pair: character n-gram models of two orders fit on the same
    shipped text ([`eqx_specdec.demo.builtin_corpus`][]). The draft (a bigram model by
    default) is weaker than the target (a 4-gram model), and both are exact, so the target
    distribution of any continuation is known.

    **Arguments:**

    - `draft_order`: the draft's $n$. Default 2.
    - `target_order`: the target's $n$. Default 4.

    **Returns:**

    `(draft_model, target_model)`, two [`eqx_specdec.demo.NGramModel`][]s over
    [`eqx_specdec.demo.VOCABULARY`][]. The last four pairs asked for are kept (a
    bounded cache: fitting takes a fraction of a second).
    """
    corpus = builtin_corpus()
    vocab = len(VOCABULARY)
    return fit_ngram(corpus, vocab, draft_order), fit_ngram(corpus, vocab, target_order)
