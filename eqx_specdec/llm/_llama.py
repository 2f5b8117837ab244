"""A Llama-family decoder in Equinox, written to the cached-model interface: grouped-query
attention with rotary position embeddings, RMS norms, a SwiGLU MLP, a tied or untied
output head. One Python loop over the layers (each layer's weights are separate arrays)."""

import dataclasses
import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from .._misc import no_type_check
from .._models.cached import AbstractPackedModel, Packing, write_and_attend


class LlamaConfig(eqx.Module):
    """The shape of a Llama-family model: what a GGUF file's metadata or a Hugging Face
    `config.json` says.

    **Arguments:**

    - `vocab_size`: $V$.
    - `dim`: the model width.
    - `layers`: the decoder layers.
    - `heads`: the query heads; `dim` must be a multiple of it.
    - `kv_heads`: the key-value heads (grouped-query attention); divides `heads`.
    - `hidden`: the SwiGLU MLP's inner width.
    - `rope_base`: the rotary embedding's base ($\\theta$).
    - `norm_eps`: the RMS norms' $\\epsilon$.
    - `context`: the most positions the model was trained on, the longest
        `max_length` its cache takes.
    - `head_dim`: the width of one head; `None` for `dim // heads`.
    """

    vocab_size: int
    dim: int
    layers: int
    heads: int
    kv_heads: int
    hidden: int
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    context: int = 8192
    head_dim: int | None = None

    def __check_init__(self):
        for name in ("vocab_size", "dim", "layers", "heads", "kv_heads", "hidden"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"LlamaConfig(`{name}`=...) must be a positive Python int, got "
                    f"{value!r}."
                )
        if self.heads % self.kv_heads:
            raise ValueError(
                f"LlamaConfig(`kv_heads`=...) must divide `heads` ({self.heads}), got "
                f"{self.kv_heads}."
            )
        if self.head_dim is None and self.dim % self.heads:
            raise ValueError(
                f"LlamaConfig(`heads`=...) must divide `dim` ({self.dim}) when "
                f"`head_dim` is not given; got {self.heads}."
            )

    @property
    def width_per_head(self) -> int:
        """The width of one attention head."""
        return self.head_dim if self.head_dim is not None else self.dim // self.heads


class LlamaLayer(eqx.Module):
    """One decoder layer's weights. Linear weights are stored `(in, out)`: `x @ w`. The
    query and key projections' output columns are in Hugging Face's order (each head's
    rotary pairs are the entries `i` and `i + head_dim / 2`)."""

    attention_norm: Float[Array, " dim"]
    wq: Float[Array, "dim q_dim"]
    wk: Float[Array, "dim kv_dim"]
    wv: Float[Array, "dim kv_dim"]
    wo: Float[Array, "q_dim dim"]
    mlp_norm: Float[Array, " dim"]
    gate: Float[Array, "dim hidden"]
    up: Float[Array, "dim hidden"]
    down: Float[Array, "hidden dim"]


#: One `(keys, values)` pair per layer, each `(kv_heads, max_length, head_dim)`.
LlamaCache = tuple[
    tuple[
        Float[Array, "kv_heads length head_dim"],
        Float[Array, "kv_heads length head_dim"],
    ],
    ...,
]


def _rms_norm(x, scale, eps):
    """`x` `(K, dim)` over its root mean square, times `scale` `(dim,)`."""
    return (
        x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * scale[None]
    )


def _rotate(x, positions, base):
    """Rotary position embedding of `x` `(K, heads, head_dim)` at `positions` `(K,)`,
    rotating the pairs `(i, i + head_dim / 2)` (Hugging Face's convention)."""
    half = x.shape[-1] // 2
    inverse = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions.astype(jnp.float32)[:, None] * inverse[None]
    cos, sin = jnp.cos(angles)[:, None], jnp.sin(angles)[:, None]
    first, second = x[..., :half], x[..., half:]
    return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], -1)


def _attend(q, keys, values, positions):
    """Causal grouped-query attention: queries `(K, heads, d)` at `positions` over the
    cache's `(kv_heads, M, d)` entries at positions `0, ..., M - 1`; each query reads
    the entries up to its own position."""
    k_count, heads, d = q.shape
    kv_heads = keys.shape[0]
    q = q.reshape(k_count, kv_heads, heads // kv_heads, d)
    scores = jnp.einsum("kgqd,gmd->gqkm", q, keys) / math.sqrt(d)
    entries = jnp.arange(keys.shape[1], dtype=positions.dtype)
    visible = entries[None, :] <= positions[:, None]
    scores = jnp.where(visible[None, None], scores, -jnp.inf)
    weights = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("gqkm,gmd->kgqd", weights, values)
    return out.reshape(k_count, heads * d)


# A layer's attention over one sequence's cache, its new keys and values written first.
_cached_attend = functools.partial(write_and_attend, _attend)


@no_type_check  # its fields are checked by `__check_init__`
class Llama(AbstractPackedModel):
    """A Llama-family decoder (Llama 2/3, SmolLM, TinyLlama, Mistral without sliding
    windows, and the like) with a key-value cache, in float32 or the dtype of its
    weights. It returns **logits**: decode with `outputs="logits"`.

    Load one with [`eqx_specdec.llm.load_gguf`][] (a llama.cpp file: quantised weights
    are dequantised) or [`eqx_specdec.llm.load_safetensors`][] (a Hugging Face
    checkpoint folder). Called through the [`eqx_specdec.models.AbstractCachedModel`][]
    interface (one sequence, `tokens[K]` at `positions[K]` and the cache), or without a
    cache on a whole sequence with `logits`.

    **Arguments:**

    - `config`: the model's [`eqx_specdec.llm.LlamaConfig`][].
    - `embedding`: float `(V, dim)`, the token embedding.
    - `layers`: the decoder layers, a tuple of [`eqx_specdec.llm.LlamaLayer`][]. (Kept
        as separate arrays, not stacked under a `lax.scan`: on the CPU, XLA copies a
        layer's weights out of stacked arrays at every call, which cost more than the
        matrix products.)
    - `final_norm`: float `(dim,)`.
    - `head`: float `(dim, V)`, the output layer, or `None` when it is the embedding's
        transpose (tied).
    """

    config: LlamaConfig = eqx.field(static=True)
    embedding: Float[Array, "V dim"]
    layers: tuple[LlamaLayer, ...]
    final_norm: Float[Array, " dim"]
    head: Float[Array, "dim V"] | None

    def __check_init__(self):
        c = self.config
        expected = (c.vocab_size, c.dim)
        if tuple(self.embedding.shape) != expected:
            raise ValueError(
                f"Llama(`embedding`=...) must have shape {expected} (vocab_size, dim), "
                f"got {tuple(self.embedding.shape)}."
            )
        q_dim, kv_dim = c.heads * c.width_per_head, c.kv_heads * c.width_per_head
        shapes = {
            "wq": (c.dim, q_dim),
            "wk": (c.dim, kv_dim),
            "wv": (c.dim, kv_dim),
            "wo": (q_dim, c.dim),
            "gate": (c.dim, c.hidden),
            "up": (c.dim, c.hidden),
            "down": (c.hidden, c.dim),
        }
        if len(self.layers) != c.layers:
            raise ValueError(
                f"Llama(`layers`=...) must hold {c.layers} layers for this config, got "
                f"{len(self.layers)}."
            )
        for i, layer in enumerate(self.layers):
            for name, shape in shapes.items():
                got = tuple(getattr(layer, name).shape)
                if got != shape:
                    raise ValueError(
                        f"Llama(`layers`=...): layer {i}'s `{name}` must have shape "
                        f"{shape} for this config, got {got}."
                    )

    def first_layers(self, count: int) -> "Llama":
        """The model cut after its first `count` layers, with the same final norm and
        head: an early-exit draft that shares the target's weights (without training it
        accepts little; see LayerSkip, Elhoushi et al. 2024).

        **Arguments:**

        - `count`: the layers kept, in `[1, layers]`.
        """
        c = self.config
        if not isinstance(count, int) or not 1 <= count <= c.layers:
            raise ValueError(
                f"`count` must be a Python int in [1, {c.layers}], got {count!r}."
            )
        return Llama(
            dataclasses.replace(c, layers=count),
            self.embedding,
            self.layers[:count],
            self.final_norm,
            self.head,
        )

    @property
    def dtype(self):
        """The dtype of the weights and of the cache."""
        return self.embedding.dtype

    def init_state(self, max_length: int) -> LlamaCache:
        """An empty key-value cache of `max_length` positions: one `(keys, values)` pair
        per layer, each of shape `(kv_heads, max_length, head_dim)`."""
        c = self.config
        if not isinstance(max_length, int) or not 1 <= max_length <= c.context:
            raise ValueError(
                f"The model holds {c.context} positions, so `max_length` (the prompt "
                "width plus the tokens to generate plus one step's slots) must lie in "
                f"[1, {c.context}]; got {max_length!r}. Shorten the prompt or "
                "`num_tokens`."
            )
        shape = (c.kv_heads, max_length, c.width_per_head)
        zeros = jnp.zeros(shape, self.dtype)
        return tuple((zeros, zeros) for _ in range(c.layers))

    def _run(self, tokens, positions, attend):
        """The layers on `tokens` at `positions`; `attend(i, q, k, v)` is layer `i`'s
        attention, returning `(outputs, cache)`: the last layer's output and the
        layers' caches."""
        c = self.config
        d = c.width_per_head
        x = self.embedding[tokens]
        new_cache = []
        for i, w in enumerate(self.layers):
            h = _rms_norm(x, w.attention_norm, c.norm_eps)
            q = _rotate((h @ w.wq).reshape(-1, c.heads, d), positions, c.rope_base)
            k = _rotate((h @ w.wk).reshape(-1, c.kv_heads, d), positions, c.rope_base)
            v = (h @ w.wv).reshape(-1, c.kv_heads, d)
            mixed, kv = attend(i, q, k, v)
            new_cache.append(kv)
            x = x + mixed @ w.wo
            h = _rms_norm(x, w.mlp_norm, c.norm_eps)
            x = x + (jax.nn.silu(h @ w.gate) * (h @ w.up)) @ w.down
        return x, tuple(new_cache)

    def _logits(self, x):
        x = _rms_norm(x, self.final_norm, self.config.norm_eps)
        if self.head is None:
            # Tied: contracted with the embedding as it is stored. (`x @ embedding.T`
            # made XLA CPU copy the transposed embedding, 113 MB for SmolLM2, at every
            # one-token call.)
            return jnp.einsum("kd,vd->kv", x, self.embedding).astype(jnp.float32)
        return (x @ self.head).astype(jnp.float32)

    def __call__(
        self,
        tokens: Int[Array, " k"],
        positions: Int[Array, " k"],
        state: LlamaCache,
    ) -> tuple[Float[Array, "k V"], LlamaCache]:
        """Writes the keys and values of `tokens` at the consecutive `positions` into
        the cache, then attends from each of them to the cache's positions up to its
        own.

        **Returns:**

        `(logits, state)`: float32 `(K, V)` and the written cache.
        """

        def attend(i, q, k, v):
            return _cached_attend(q, k, v, state[i], positions)

        x, state = self._run(tokens, positions, attend)
        return self._logits(x), state

    def packed_call(
        self, tokens: Int[Array, " T"], packing: Packing, states: LlamaCache
    ) -> tuple[Float[Array, "T V"], LlamaCache]:
        """The rows' tokens packed (see
        [`eqx_specdec.models.AbstractPackedModel`][]): the projections, the MLPs and
        the head on the `T` tokens, each row's attention over its own cache (on the
        CPU at B = 4 with SmolLM2, a call on 12 tokens took 81.0 ms against 102.5 ms
        for seven slots a row).

        **Returns:**

        `(logits, states)`: float32 `(T, V)` and the rows' written caches.
        """

        def attend(i, q, k, v):
            return packing.attend(q, k, v, states[i], _cached_attend)

        x, states = self._run(tokens, packing.positions, attend)
        return self._logits(x), states

    def logits(self, tokens: Int[Array, " length"]) -> Float[Array, "length V"]:
        """The uncached forward pass on a whole sequence: the next-token logits after
        each prefix `tokens[: t + 1]`, float32 of shape `(T, V)`."""
        return self._logits(self.hidden(tokens))

    def hidden(self, tokens: Int[Array, " length"]) -> Float[Array, "length dim"]:
        """The last layer's output on a whole sequence, before the final norm and the
        head (the features a draft head reads), shape `(T, dim)`."""
        positions = jnp.arange(tokens.shape[0], dtype=jnp.int32)

        def attend(i, q, k, v):  # no cache: the sequence attends to itself
            keys, values = jnp.swapaxes(k, 0, 1), jnp.swapaxes(v, 0, 1)
            return _attend(q, keys, values, positions), None

        return self._run(tokens, positions, attend)[0]
