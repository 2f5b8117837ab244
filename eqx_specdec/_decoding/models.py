"""A built-in, offline language-model pair: character-level n-gram models fit on text
that ships with the package, so that the end-to-end loop runs anywhere with the exact
target distribution known."""

import functools
import importlib.resources

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from beartype import beartype
from jaxtyping import Array, Float, Int, jaxtyped


#: The built-in character vocabulary: token id `i` is `VOCABULARY[i]`. Id 0, the space,
#: also stands for every position before the start of a sequence.
VOCABULARY = " abcdefghijklmnopqrstuvwxyz.,;:'-"

#: Prompts the `demo` command starts from.
BUILTIN_PROMPTS = (
    "the ",
    "we hold these ",
    "and god said, ",
    "it was the ",
    "in the beginning ",
    "with malice toward ",
    "call me ",
    "four score and ",
)


def encode(text: str) -> np.ndarray:
    """Maps text to token ids of the built-in vocabulary: lower case, and every character
    outside [`eqx_specdec.VOCABULARY`][] (newlines included) becomes a space.

    **Arguments:**

    - `text`: a string.

    **Returns:**

    An int32 NumPy array of shape `(len(text),)`.
    """
    index = {c: i for i, c in enumerate(VOCABULARY)}
    return np.asarray([index.get(c, 0) for c in text.lower()], np.int32)


def decode(tokens) -> str:
    """Maps token ids of the built-in vocabulary back to text; negative ids (padding)
    are dropped.

    **Arguments:**

    - `tokens`: a sequence of integer ids.

    **Returns:**

    A string.
    """
    return "".join(VOCABULARY[int(t)] for t in np.asarray(tokens).ravel() if t >= 0)


class NGramModel(eqx.Module):
    """A character-level (or any token-level) n-gram language model as an Equinox module:
    the next-token distribution depends on the previous `order - 1` tokens only.

    It follows the model interface of [`eqx_specdec.speculative_decode`][]: called on a
    token buffer and the positions to predict after, it returns one distribution per
    position. Positions before the start of the buffer read as token 0. Build one with
    [`eqx_specdec.fit_ngram`][].

    **Arguments:**

    - `probs`: float of shape `(vocab ** (order - 1), vocab)`: row `c` is the next-token
        distribution after the context whose tokens, most recent first, are the base-`vocab`
        digits of `c` (least significant first).
    - `order`: the $n$ of the n-gram, at least 1.
    """

    probs: Float[Array, "contexts vocab"]
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
    ) -> Float[Array, "k vocab"]:
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
    token 0, as in [`eqx_specdec.NGramModel`][].

    **Arguments:**

    - `tokens`: a 1-d sequence of integer ids in `[0, vocab_size)`.
    - `vocab_size`: the vocabulary size $V$.
    - `order`: the $n$; the model holds $V^n$ float32 probabilities.

    **Returns:**

    An [`eqx_specdec.NGramModel`][].
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


@functools.cache
def builtin_corpus() -> np.ndarray:
    """The token ids of the text shipped with the package (about 8,500 characters of
    public-domain English prose), in the built-in vocabulary.

    **Returns:**

    An int32 NumPy array.
    """
    files = importlib.resources.files("eqx_specdec") / "data" / "corpus.txt"
    text = " ".join(files.read_text(encoding="utf-8").split())
    return encode(text)


@functools.cache
def builtin_models(
    draft_order: int = 2, target_order: int = 4
) -> tuple[NGramModel, NGramModel]:
    """The built-in model pair: character n-gram models of two orders fit on the same
    shipped text ([`eqx_specdec.builtin_corpus`][]). The draft (a bigram model by
    default) is weaker than the target (a 4-gram model), and both are exact, so the target
    distribution of any continuation is known.

    **Arguments:**

    - `draft_order`: the draft's $n$. Default 2.
    - `target_order`: the target's $n$. Default 4.

    **Returns:**

    `(draft_model, target_model)`, two [`eqx_specdec.NGramModel`][]s over
    [`eqx_specdec.VOCABULARY`][].
    """
    corpus = builtin_corpus()
    vocab = len(VOCABULARY)
    return fit_ngram(corpus, vocab, draft_order), fit_ngram(corpus, vocab, target_order)
