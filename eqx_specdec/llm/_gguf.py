"""Loading a Llama-family model and its tokenizer from a GGUF file (llama.cpp's format)
with the `gguf` package, llama.cpp's own reader: quantised weights are dequantised."""

import os

import jax.numpy as jnp
import numpy as np

from ._llama import Llama, LlamaConfig, LlamaLayer
from ._tokenizer import _require, bpe_tokenizer, Tokenizer


#: GGUF's tensor names per layer, by `LlamaLayer` field.
_LAYER_TENSORS = (
    ("attention_norm", "attn_norm"),
    ("wq", "attn_q"),
    ("wk", "attn_k"),
    ("wv", "attn_v"),
    ("wo", "attn_output"),
    ("mlp_norm", "ffn_norm"),
    ("gate", "ffn_gate"),
    ("up", "ffn_up"),
    ("down", "ffn_down"),
)


def _field(reader, key, default=None):
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise ValueError(f"The GGUF file has no `{key}` entry.")
        return default
    return field.contents()


def _unpermute(w, heads):
    """Undoes the row permutation llama.cpp's converter applies to the query and key
    projections (`w` `(heads * head_dim, in)`): GGUF interleaves each head's rotary
    pairs `(i, i + head_dim / 2)` as adjacent rows, for its adjacent-pair rotation."""
    out, inner = w.shape
    return w.reshape(heads, out // heads // 2, 2, inner).swapaxes(1, 2).reshape(w.shape)


def load_gguf(path: str | os.PathLike, *, dtype=jnp.float32) -> tuple[Llama, Tokenizer]:
    """Loads a Llama-family model and its tokenizer from a GGUF file.

    Quantised weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, the K-quants, ...) are dequantised
    with the `gguf` package; F32, F16 and BF16 ones are read as they are. The query
    and key projections are un-permuted to Hugging Face's layout (llama.cpp's converter
    interleaves each head's rotary pairs), so the same model code serves both sources.

    Needs the `[llm]` extra (`python -m pip install "eqx_specdec[llm]"`).

    **Arguments:**

    - `path`: the `.gguf` file. [`eqx_specdec.llm.fetch_smollm2`][] fetches one.
    - `dtype`: the dtype of the weights in memory and of the cache (float32 by default;
        `jnp.bfloat16` halves the memory).

    **Returns:**

    `(model, tokenizer)`: an [`eqx_specdec.llm.Llama`][] and an
    [`eqx_specdec.llm.Tokenizer`][].
    """
    gguf = _require("gguf")
    reader = gguf.GGUFReader(os.fspath(path))
    architecture = _field(reader, "general.architecture")
    if architecture != "llama":
        raise ValueError(
            f"load_gguf reads Llama-family files; {os.fspath(path)!r} holds a "
            f"{architecture!r} model."
        )
    tensors = {t.name: t for t in reader.tensors}

    def weight(name):
        if name not in tensors:
            raise ValueError(f"The GGUF file has no tensor `{name}`.")
        t = tensors[name]
        array = gguf.quants.dequantize(t.data, t.tensor_type)
        return np.asarray(array, np.float32)

    heads = int(_field(reader, "llama.attention.head_count"))
    kv_heads = int(_field(reader, "llama.attention.head_count_kv", heads))
    embedding = weight("token_embd.weight")
    config = LlamaConfig(
        vocab_size=embedding.shape[0],
        dim=int(_field(reader, "llama.embedding_length")),
        layers=int(_field(reader, "llama.block_count")),
        heads=heads,
        kv_heads=kv_heads,
        hidden=int(_field(reader, "llama.feed_forward_length")),
        rope_base=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        context=int(_field(reader, "llama.context_length")),
        head_dim=int(_field(reader, "llama.attention.key_length", 0)) or None,
    )
    if int(_field(reader, "llama.rope.dimension_count", config.width_per_head)) != (
        config.width_per_head
    ):
        raise ValueError("load_gguf supports rotary embeddings over whole heads only.")

    def layer_weight(field, i):
        w = weight(f"blk.{i}.{dict(_LAYER_TENSORS)[field]}.weight")
        if field == "wq":
            w = _unpermute(w, heads)
        elif field == "wk":
            w = _unpermute(w, kv_heads)
        return w if w.ndim == 1 else w.T  # (out, in) -> (in, out)

    layers = tuple(
        LlamaLayer(
            **{
                field: jnp.asarray(layer_weight(field, i), dtype)
                for field, _ in _LAYER_TENSORS
            }
        )
        for i in range(config.layers)
    )
    head = None
    if "output.weight" in tensors:
        head = jnp.asarray(weight("output.weight").T, dtype)
    model = Llama(
        config,
        jnp.asarray(embedding, dtype),
        layers,
        jnp.asarray(weight("output_norm.weight"), dtype),
        head,
    )
    return model, _gguf_tokenizer(reader)


def _gguf_tokenizer(reader) -> Tokenizer:
    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(
            f"load_gguf builds byte-level BPE tokenizers (`gpt2`); this file's is "
            f"{kind!r}."
        )
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    types = np.asarray(_field(reader, "tokenizer.ggml.token_type"))
    special = [int(i) for i in np.nonzero(types == 3)[0]]  # CONTROL
    backend = bpe_tokenizer(
        tokens,
        list(_field(reader, "tokenizer.ggml.merges")),
        special,
        _field(reader, "tokenizer.ggml.pre", "default"),
    )
    eos = int(_field(reader, "tokenizer.ggml.eos_token_id"))
    template = reader.fields.get("tokenizer.chat_template")
    template = None if template is None else template.contents()
    stops = [eos]
    if "<|im_end|>" in tokens:
        stops.append(tokens.index("<|im_end|>"))
    return Tokenizer(backend, template, eos, stops)
