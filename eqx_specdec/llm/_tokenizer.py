"""A model's tokenizer and chat template, host-side: byte-level BPE built with the
`tokenizers` package from a GGUF file's vocabulary and merges or from a Hugging Face
`tokenizer.json`, and the template rendered with Jinja."""

from collections.abc import Sequence

import jax
import numpy as np


def _require(module: str):
    """Imports one of the `[llm]` extra's packages, or says how to install it."""
    try:
        return __import__(module)
    except ImportError as error:
        raise ImportError(
            f"eqx_specdec.llm needs the `{module}` package: install the extra with "
            '`python -m pip install "eqx_specdec[llm]"` (from a checkout: '
            '`python -m pip install ".[llm]"`).'
        ) from error


class Tokenizer:
    """Text to token ids and back, and the model's chat template.

    Built by [`eqx_specdec.llm.load_gguf`][] and
    [`eqx_specdec.llm.load_safetensors`][] beside the model; `backend` is the
    `tokenizers.Tokenizer` doing the work.

    **Arguments:**

    - `backend`: a `tokenizers.Tokenizer`.
    - `chat_template`: the Jinja chat template, or `None` when the model has none.
    - `eos_id`: the end-of-sequence token's id.
    - `stop_ids`: the ids that end an assistant's turn (`eos_id` and, for a ChatML
        template, `<|im_end|>`), as the decoding loop's `stop_tokens`.
    """

    def __init__(self, backend, chat_template, eos_id: int, stop_ids: Sequence[int]):
        self.backend = backend
        self.chat_template = chat_template
        self.eos_id = int(eos_id)
        self.stop_ids = tuple(sorted({int(i) for i in stop_ids}))

    @property
    def vocab_size(self) -> int:
        """The ids the tokenizer knows, special tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """The token ids of `text` (special tokens written in it, such as
        `<|im_start|>`, are parsed as such; no beginning-of-sequence token is added)."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(
        self, ids: Sequence[int] | np.ndarray | jax.Array, *, skip_special: bool = False
    ) -> str:
        """The text of `ids` (negative ids, the loop's padding, are dropped)."""
        ids = [int(i) for i in ids if int(i) >= 0]
        return self.backend.decode(ids, skip_special_tokens=skip_special)

    def chat(self, messages, *, add_generation_prompt: bool = True) -> str:
        """`messages` (a list of `{"role": ..., "content": ...}` dicts, or one string:
        a user's message) rendered with the model's chat template, ready to `encode`.
        """
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        if self.chat_template is None:
            raise ValueError(
                "This model has no chat template: `encode` the prompt text directly."
            )
        jinja2 = _require("jinja2")
        environment = jinja2.Environment(
            trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined
        )
        template = environment.from_string(self.chat_template)
        return template.render(
            messages=list(messages), add_generation_prompt=add_generation_prompt
        )


def bpe_tokenizer(tokens, merges, special_ids, pre: str):
    """A byte-level BPE `tokenizers.Tokenizer` from a GGUF file's `tokens` (byte-level
    strings, by id), `merges` (`"a b"` strings), the ids of its control tokens
    (registered as special tokens: never split, skipped by `decode(skip_special=True)`)
    and its pre-tokenizer's name."""
    tokenizers = _require("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(tokens)}
    pairs = [tuple(merge.split(" ", 1)) for merge in merges]
    backend = tokenizers.Tokenizer(
        models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False)
    )
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("smollm", "starcoder", "refact", "codeshell"):
        # llama.cpp's pre-tokenizers for these split every digit first.
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    else:
        backend.pre_tokenizer = byte_level
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(
        [tokenizers.AddedToken(tokens[i], special=True) for i in special_ids]
    )
    return backend
