"""The cached-model interface of the decoding loop: a model that owns its state (a
key-value cache written at absolute positions) and is called on a step's new tokens
only."""

import abc
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree


class AbstractCachedModel(eqx.Module):
    """A language model with state, for [`eqx_specdec.speculative_decode`][] and
    [`eqx_specdec.autoregressive_decode`][]: the extension point for models with a
    key-value cache. [`eqx_specdec.demo.Transformer`][] is one.

    The model is written for **one sequence**; the loops `vmap` it over the batch (each
    leaf of the state gets a leading batch axis). Its state is a PyTree of arrays holding
    what the model has computed for the positions written so far (a key-value cache: one
    entry per absolute position, `max_length` of them).

    **The contract.** The loops call `init_state(max_length)` once per row, then:

    1. **Prefill**: one call on the whole padded prompt row, `positions = 0, ..., P - 1`.
       Entries past the row's prompt length are padding (token 0), written like any other.
    2. **Steps**: calls on `K` tokens at consecutive positions
       `positions = start + [0, ..., K - 1]`, with `0 <= start` and
       `start + K <= max_length`. Output row `k` is the distribution of the token at
       `positions[k] + 1` given the tokens at positions `0, ..., positions[k]`: the
       tokens of this call up to `k`, and before `start` whatever was last written there.

    The loops guarantee that when a call starts at `start`, every position before it
    was last written with the row's **committed** token there (the prompt, accepted
    draft tokens, corrections). Positions at or after `start + K` may hold stale entries
    (rejected draft tokens, padding, scratch written for rows that finished or stopped
    drafting): the model must never read them, which a causal model attending to
    positions `<= positions[k]` does not. So a rejected draft token needs no rollback:
    its entry is overwritten before anything reads that position again. Rows that
    finished keep being called (their outputs are ignored), always within
    `max_length`.

    Between steps the draft model is called once with `K = 2` (the last two committed
    positions, so that a draft token accepted last step but never fed to the draft is
    written) and then with `K = 1` per draft token; the target with `K = G + 1` (the last
    committed token and the $G$ draft tokens). Plain decoding calls with `K = 1`.

    Chains only: a tree proposal ([`eqx_specdec.Tree`][]) needs the stateless interface
    `model(tokens: int[T], positions: int[K]) -> float[K, V]`.
    """

    @abc.abstractmethod
    def init_state(self, max_length: int) -> PyTree[Array]:
        """The state of one sequence before any token is written.

        **Arguments:**

        - `max_length`: the positions the state must hold, a Python int (the prompt
            width plus the tokens to generate plus one step's slots).

        **Returns:**

        A PyTree of arrays. Raises a `ValueError` naming `max_length` when the model
        cannot hold that many positions.
        """

    @abc.abstractmethod
    def __call__(
        self,
        tokens: Int[Array, " k"],
        positions: Int[Array, " k"],
        state: PyTree[Array],
    ) -> tuple[Float[Array, "k V"], PyTree[Array]]:
        """Writes `tokens` at `positions` and returns their next-token distributions.

        **Arguments:**

        - `tokens`: int32 of shape `(K,)`, the tokens at `positions`.
        - `positions`: int32 of shape `(K,)`, consecutive absolute positions.
        - `state`: the state returned by the previous call (or `init_state`).

        **Returns:**

        `(outputs, state)`: float of shape `(K, V)` (probabilities, or logits when the
        loop is called with `outputs="logits"`), and the new state, of the same
        structure, shapes and dtypes.
        """


class Packing(eqx.Module):
    """Where each of a call's `T` packed tokens sits in a batch of `B` rows: token `t`
    is slot `slots[t]` of row `rows[t]`, at position `starts[rows[t]] + slots[t]`. A
    row's tokens take its slots `0, 1, ...` in order; `slots[t] == width` marks a
    padding token (the call's size exceeding the tokens), scored but written nowhere.

    The batch's padded layout is `(B, width)`: `padded` and `packed` move per-token
    arrays between the two, and `attend` runs a row's attention there.

    **Fields:** `rows`, `slots` int32 `(T,)`; `starts` int32 `(B,)`; `width`, static:
    the padded layout's slots a row.
    """

    rows: Int[Array, " T"]
    slots: Int[Array, " T"]
    starts: Int[Array, " B"]
    width: int = eqx.field(static=True)

    @classmethod
    def of_counts(
        cls, counts: Int[Array, " B"], starts: Int[Array, " B"], size: int, width: int
    ) -> "Packing":
        """`counts[b]` tokens of each row `b` (at most `width`, their sum at most
        `size`), row after row, then padding up to `size` tokens."""
        ends = jnp.cumsum(counts, dtype=jnp.int32)
        token = jnp.arange(size, dtype=jnp.int32)
        rows = jnp.searchsorted(ends, token, side="right").astype(jnp.int32)
        real = rows < counts.shape[0]
        rows = jnp.minimum(rows, counts.shape[0] - 1)
        slots = jnp.where(real, token - (ends - counts)[rows], width)
        return cls(rows, slots.astype(jnp.int32), starts.astype(jnp.int32), width)

    @property
    def positions(self) -> Int[Array, " T"]:
        """Each token's absolute position (a padding token's: its row's last slot)."""
        return self.starts[self.rows] + jnp.minimum(self.slots, self.width - 1)

    def padded(self, values: Array) -> Array:
        """`(T, ...)` per-token values in the padded layout `(B, width, ...)`, zeros
        where no token is (padding tokens dropped)."""
        shape = (self.starts.shape[0], self.width) + values.shape[1:]
        return (
            jnp.zeros(shape, values.dtype)
            .at[self.rows, self.slots]
            .set(values, mode="drop")
        )

    def packed(self, values: Array) -> Array:
        """`(B, width, ...)` values of the padded layout at the packed tokens
        `(T, ...)` (a padding token reads its row's last slot)."""
        return values[self.rows, jnp.minimum(self.slots, self.width - 1)]

    def attend(self, q, k, v, caches, attend_row):
        """Attention for the packed tokens, each row's in the padded layout:
        `attend_row(q, k, v, cache, positions)` on one row's `(width, ...)` queries,
        keys and values at its `width` positions and its cache, returning `(outputs,
        cache)`, mapped over the rows; `caches` carries a leading batch axis. Returns
        the packed outputs and the written caches."""

        def row(q, k, v, cache, start):
            positions = start + jnp.arange(self.width, dtype=jnp.int32)
            return attend_row(q, k, v, cache, positions)

        out, caches = jax.vmap(row)(
            self.padded(q), self.padded(k), self.padded(v), caches, self.starts
        )
        return self.packed(out), caches

    def unpacked(self, outputs: Array, counts: Int[Array, " B"]) -> Array:
        """The packed outputs `(T, ...)` of `of_counts(counts, ...)` in the padded
        layout `(B, width, ...)`: a row's slots past its last token repeat that
        token's output (a valid distribution no verdict reads)."""
        first = jnp.cumsum(counts, dtype=jnp.int32) - counts
        slot = jnp.arange(self.width, dtype=jnp.int32)
        index = first[:, None] + jnp.minimum(slot[None], counts[:, None] - 1)
        return outputs[index]


class AbstractPackedModel(AbstractCachedModel):
    """A cached model that also scores the tokens of a whole batch at once, packed: the
    rows' tokens one after another, each row's attention over its own cache. The
    trimmed chain ([`eqx_specdec.Chain`][]`(trim=True)`) calls such a target, in the
    steps where some row drafted, on the tokens the rows drafted (and each row's last
    committed token) rather than on $G + 1$ slots for every row: the matrix products
    then cost what the tokens scored cost. [`eqx_specdec.llm.Llama`][] and
    [`eqx_specdec.demo.Transformer`][] are ones.
    """

    @abc.abstractmethod
    def packed_call(
        self, tokens: Int[Array, " T"], packing: Packing, states: PyTree[Array]
    ) -> tuple[Float[Array, "T V"], PyTree[Array]]:
        """Writes each row's tokens at their positions into its state and returns their
        next-token distributions, as calling the model on each row's tokens
        (`__call__` at `packing.starts[b] + [0, width)`) would, at the tokens given.

        **Arguments:**

        - `tokens`: int32 `(T,)`, the packed tokens.
        - `packing`: where each token sits ([`eqx_specdec.models.Packing`][]).
        - `states`: the rows' states, each leaf with a leading batch axis `B`.

        **Returns:**

        `(outputs, states)`: float `(T, V)` (a padding token's output is never read)
        and the rows' new states.
        """


def write_at(cache, new, positions):
    """A key-value cache `(heads, M, head_dim)` with `new` `(K, heads, head_dim)` written
    at the consecutive `positions` (the cached-model contract's calls). A gather and a
    select rather than a scatter: batched by `vmap` (each row at its own positions), a
    scatter cost the built-in transformer's plain loop 1.47x a straightforward
    `jax.jit` loop on the CPU (1.12x with this), and attention reads the whole cache
    anyway."""
    entries = jnp.arange(cache.shape[1], dtype=positions.dtype)
    offset = entries - positions[0]
    inside = (offset >= 0) & (offset < new.shape[0])
    moved = jnp.take(new, jnp.clip(offset, 0, new.shape[0] - 1), axis=0)
    return jnp.where(inside[None, :, None], jnp.swapaxes(moved, 0, 1), cache)


def write_and_attend(attend, q, k, v, cache, positions):
    """`k` and `v` written into one sequence's key-value `cache` `(keys, values)`
    (`(heads, M, head_dim)` each) at the consecutive `positions`, then `attend(q, keys,
    values, positions)` over it: `(outputs, cache)`, a cached model's attention in one
    layer (and `Packing.attend`'s `attend_row`, with `attend` bound)."""
    keys, values = cache
    keys = write_at(keys, k.astype(keys.dtype), positions)
    values = write_at(values, v.astype(values.dtype), positions)
    return attend(q, keys, values, positions), (keys, values)


def is_cached(model: Any) -> bool:
    """Whether the loops call `model` through the cached interface."""
    return isinstance(model, AbstractCachedModel)


def initial_states(model, batch: int, max_length: int):
    """Each row's state before prefill (`None` for a stateless model)."""
    if not is_cached(model):
        return None
    state = model.init_state(max_length)
    return jax.tree.map(lambda a: jnp.broadcast_to(a, (batch, *a.shape)), state)


def call_rows(model, buffer, starts, width: int, states):
    """`model` on each row of `buffer` at positions `starts[b] + [0, width)`: the
    outputs `(B, width, V)` and the new states. A stateless model reads the whole row;
    a cached one gets the tokens at those positions and its state."""
    offsets = jnp.arange(width, dtype=jnp.int32)
    if not is_cached(model):
        return jax.vmap(lambda row, s: model(row, s + offsets))(buffer, starts), None

    def one(row, start, state):
        positions = start + offsets
        return model(row[positions], positions, state)

    return jax.vmap(one)(buffer, starts, states)


def call_packed(model, buffer, starts, counts, size: int, width: int, states):
    """`model` (an `AbstractPackedModel`) on `counts[b]` tokens of each row of `buffer`
    at positions `starts[b] + [0, counts[b])`, packed into a call of `size` tokens: the
    outputs in the padded layout `(B, width, V)` (`Packing.unpacked`) and the new
    states."""
    packing = Packing.of_counts(counts, starts, size, width)
    tokens = buffer[packing.rows, packing.positions]
    out, states = model.packed_call(tokens, packing, states)
    return packing.unpacked(out, counts), states


def prefill(model, buffer, width: int, states):
    """A cached model's first call, on each row's `width` prompt slots (padding
    included); nothing for a stateless model."""
    if not is_cached(model):
        return states
    starts = jnp.zeros((buffer.shape[0],), jnp.int32)
    return call_rows(model, buffer, starts, width, states)[1]


def check_model(name: str, model, row, width: int, vocab: int | None):
    """Traces `model` once on one row (`width` positions) and checks what it returns:
    `(width, V)` floating outputs (`V = vocab` when given) and, for a cached model, a
    state of the structure it was given. Returns `V`."""
    positions = jnp.zeros((width,), jnp.int32)
    if is_cached(model):
        state = model.init_state(row.shape[0])
        out = jax.eval_shape(model, row[:width], positions, state)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise ValueError(
                f"`{name}` is a cached model, so it must return `(outputs, state)`; "
                f"got {type(out).__name__}. See eqx_specdec.models.AbstractCachedModel."
            )
        out, new_state = out
        given = jax.eval_shape(lambda: state)
        if jax.tree.structure(new_state) != jax.tree.structure(given) or any(
            (a.shape, a.dtype) != (b.shape, b.dtype)
            for a, b in zip(jax.tree.leaves(new_state), jax.tree.leaves(given))
        ):
            raise ValueError(
                f"`{name}` must return a state of the structure, shapes and dtypes of "
                "the state it was given (its `init_state`); got "
                f"{jax.tree.map(lambda a: (a.shape, str(a.dtype)), new_state)} for "
                f"{jax.tree.map(lambda a: (a.shape, str(a.dtype)), given)}."
            )
    else:
        out = jax.eval_shape(model, row, positions)
    if vocab is None:
        vocab = out.shape[-1] if hasattr(out, "shape") and out.ndim == 2 else -1
    checked_output(name, out, (width, vocab))
    return vocab


def checked_output(name: str, value, shape: tuple[int, ...]):
    """A model's output, or a `ValueError` / `TypeError` (trace time) saying that a
    model returns one distribution per position asked."""
    if not hasattr(value, "shape") or tuple(value.shape) != shape:
        got = getattr(value, "shape", type(value).__name__)
        raise ValueError(
            f"`{name}` must return one distribution per position asked, shape "
            f"(positions, vocab) = {shape}; got {got}. A model is called as "
            "`model(tokens: int[T], positions: int[K]) -> float[K, V]`, or a cached "
            "one as `model(tokens: int[K], positions: int[K], state) -> "
            "(float[K, V], state)`."
        )
    if not jnp.issubdtype(value.dtype, jnp.floating):
        raise TypeError(f"`{name}` must return floating values, got {value.dtype}.")
    return value
