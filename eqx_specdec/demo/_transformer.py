"""A small decoder-only transformer with a key-value cache, written to the cached-model
interface: the built-in target (and draft) for measuring speculative decoding in time."""

import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .._misc import no_type_check
from .._models.cached import AbstractPackedModel, Packing, write_and_attend


KVCache = tuple[tuple[Float[Array, "heads length head_dim"], ...], ...]


class _Layer(eqx.Module):
    """One pre-norm decoder layer: causal self-attention and a GELU MLP."""

    attention_norm: Float[Array, " dim"]
    qkv: Float[Array, "dim three_dim"]
    out: Float[Array, "dim dim"]
    mlp_norm: Float[Array, " dim"]
    up: Float[Array, "dim hidden"]
    down: Float[Array, "hidden dim"]


def _rms_norm(x, scale):
    """`x` `(K, dim)` normalised by its root mean square, times `scale` `(dim,)`."""
    return (
        x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale[None]
    )


def _attend(q, keys, values, query_positions):
    """Causal attention of `K` queries `(K, heads, head_dim)` at `query_positions`
    over `M` key/value entries `(heads, M, head_dim)` at positions `0, ..., M - 1`:
    query `k` reads the entries at positions up to its own, never after. (The heads
    lead the cache's layout, as the batched products want it: no copy of the cache.)"""
    head_dim = q.shape[-1]
    scores = jnp.einsum("khd,hmd->hkm", q, keys) / math.sqrt(head_dim)
    entries = jnp.arange(keys.shape[1], dtype=query_positions.dtype)
    visible = entries[None, :] <= query_positions[:, None]
    scores = jnp.where(visible[None], scores, -jnp.inf)
    weights = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("hkm,hmd->khd", weights, values)


# A layer's attention over one sequence's cache, its new keys and values written first.
_cached_attend = functools.partial(write_and_attend, _attend)


@no_type_check  # its fields are checked by `__check_init__`
class Transformer(AbstractPackedModel):
    """A decoder-only transformer over a small vocabulary, with a key-value cache:
    learned token and position embeddings, `depth` pre-norm layers (RMS norm, causal
    multi-head attention, a GELU MLP of width `4 dim`), a final norm, and the token
    embedding as the output layer. It returns **logits**: decode with
    `outputs="logits"`.

    Called through the [`eqx_specdec.models.AbstractCachedModel`][] interface (one sequence,
    `tokens[K]` at `positions[K]` and the cache), or without a cache on a whole sequence
    with `logits`. Build one with `Transformer.init`; train it with
    [`eqx_specdec.demo.train_transformer`][]; [`eqx_specdec.demo.builtin_transformers`][] loads
    the pair that ships with the package.

    **Arguments:**

    - `embedding`: float `(V, dim)`, the token embedding (and output layer).
    - `position_embedding`: float `(context, dim)`: the model holds `context`
        positions, the longest `max_length` its cache takes.
    - `layers`: the decoder layers.
    - `final_norm`: float `(dim,)`.
    - `heads`: the attention heads, a Python int dividing `dim`.
    """

    embedding: Float[Array, "V dim"]
    position_embedding: Float[Array, "context dim"]
    layers: tuple[_Layer, ...]
    final_norm: Float[Array, " dim"]
    heads: int = eqx.field(static=True)

    def __check_init__(self):
        dim = self.embedding.shape[-1]
        if not isinstance(self.heads, int) or self.heads < 1 or dim % self.heads:
            raise ValueError(
                f"Transformer(`heads`=...) must be a positive Python int dividing the "
                f"model width {dim}; got {self.heads!r}."
            )

    @classmethod
    def init(
        cls,
        key: PRNGKeyArray,
        *,
        vocab_size: int,
        dim: int = 64,
        depth: int = 2,
        heads: int = 4,
        context: int = 256,
    ) -> "Transformer":
        """A freshly initialised float32 transformer (normal weights scaled by
        $1/\\sqrt{\\text{fan-in}}$, the residual outputs by $1/\\sqrt{2\\,\\text{depth}}$).

        **Arguments:**

        - `key`: a `jax.random` key.
        - `vocab_size`, `dim`, `depth`, `heads`, `context`: the vocabulary, the width,
            the layers, the attention heads and the positions the model holds.
        """
        keys = iter(jax.random.split(key, 2 + 4 * depth))

        def normal(shape, fan_in, scale=1.0):
            weights = jax.random.normal(next(keys), shape, jnp.float32)
            return weights * (scale / math.sqrt(fan_in))

        residual = 1 / math.sqrt(2 * depth)
        layers = tuple(
            _Layer(
                attention_norm=jnp.ones((dim,), jnp.float32),
                qkv=normal((dim, 3 * dim), dim),
                out=normal((dim, dim), dim, residual),
                mlp_norm=jnp.ones((dim,), jnp.float32),
                up=normal((dim, 4 * dim), dim),
                down=normal((4 * dim, dim), 4 * dim, residual),
            )
            for _ in range(depth)
        )
        return cls(
            embedding=normal((vocab_size, dim), 1, 0.02 * math.sqrt(dim)),
            position_embedding=normal((context, dim), 1, 0.02),
            layers=layers,
            final_norm=jnp.ones((dim,), jnp.float32),
            heads=heads,
        )

    @property
    def context(self) -> int:
        """The positions the model holds."""
        return self.position_embedding.shape[0]

    def init_state(self, max_length: int) -> KVCache:
        """An empty key-value cache of `max_length` positions, one `(keys, values)` pair
        per layer, each of shape `(heads, max_length, dim / heads)`."""
        if not isinstance(max_length, int) or not 1 <= max_length <= self.context:
            raise ValueError(
                f"The Transformer holds {self.context} positions, so `max_length` "
                f"(the prompt width plus the tokens to generate plus one step's "
                f"slots) must lie in [1, {self.context}]; got {max_length!r}. Shorten "
                "the prompt or `num_tokens`, or use a model with a larger `context`."
            )
        dim = self.embedding.shape[-1]
        shape = (self.heads, max_length, dim // self.heads)
        zeros = jnp.zeros(shape, self.embedding.dtype)
        return tuple((zeros, zeros) for _ in self.layers)

    def _run(self, tokens, positions, attend):
        x = self.embedding[tokens] + self.position_embedding[positions]
        dim = x.shape[-1]
        new_state = []
        for i, layer in enumerate(self.layers):
            q, k, v = jnp.split(_rms_norm(x, layer.attention_norm) @ layer.qkv, 3, -1)
            split = (x.shape[0], self.heads, dim // self.heads)
            mixed, kv = attend(i, q.reshape(split), k.reshape(split), v.reshape(split))
            new_state.append(kv)
            x = x + mixed.reshape(x.shape) @ layer.out
            hidden = jax.nn.gelu(_rms_norm(x, layer.mlp_norm) @ layer.up)
            x = x + hidden @ layer.down
        logits = _rms_norm(x, self.final_norm) @ self.embedding.T
        return logits, tuple(new_state)

    def __call__(
        self,
        tokens: Int[Array, " k"],
        positions: Int[Array, " k"],
        state: KVCache,
    ) -> tuple[Float[Array, "k V"], KVCache]:
        """Writes the keys and values of `tokens` at `positions` into the cache, then
        attends from each of them to the cache's positions up to its own.

        **Returns:**

        `(logits, state)`: float `(K, V)` and the written cache.
        """

        def attend(i, q, k, v):
            return _cached_attend(q, k, v, state[i], positions)

        return self._run(tokens, positions, attend)

    def packed_call(
        self, tokens: Int[Array, " T"], packing: Packing, states: KVCache
    ) -> tuple[Float[Array, "T V"], KVCache]:
        """The rows' tokens packed (see
        [`eqx_specdec.models.AbstractPackedModel`][]): the products on the `T`
        tokens, each row's attention over its own cache.

        **Returns:**

        `(logits, states)`: float `(T, V)` and the rows' written caches.
        """

        def attend(i, q, k, v):
            return packing.attend(q, k, v, states[i], _cached_attend)

        return self._run(tokens, packing.positions, attend)

    def logits(self, tokens: Int[Array, " length"]) -> Float[Array, "length V"]:
        """The uncached forward pass on a whole sequence: the next-token logits after
        each prefix `tokens[: t + 1]`, shape `(T, V)`."""
        positions = jnp.arange(tokens.shape[0])

        def attend(i, q, k, v):
            return _attend(
                q, jnp.swapaxes(k, 0, 1), jnp.swapaxes(v, 0, 1), positions
            ), None

        return self._run(tokens, positions, attend)[0]
