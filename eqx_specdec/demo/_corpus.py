"""The built-in text and its character vocabulary: what the built-in models are fit or
trained on, offline."""

import functools
import importlib.resources

import numpy as np


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
    outside [`eqx_specdec.demo.VOCABULARY`][] (newlines included) becomes a space.

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


@functools.lru_cache(maxsize=1)
def builtin_corpus() -> np.ndarray:
    """The token ids of the text shipped with the package (about 8,500 characters of
    public-domain English prose), in the built-in vocabulary.

    **Returns:**

    An int32 NumPy array, read once (a cache of one entry); it is read-only, as it is
    shared.
    """
    files = importlib.resources.files("eqx_specdec.demo") / "data" / "corpus.txt"
    text = " ".join(files.read_text(encoding="utf-8").split())
    tokens = encode(text)
    tokens.flags.writeable = False  # shared by every caller
    return tokens
