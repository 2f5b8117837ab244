"""Greedy verification's argmaxes read by one Pallas kernel: each sequence's target rows
copied from HBM by DMA one position after another, and no row read after the first
whose argmax is not the draft token there.

Greedy verification needs the argmax of rows $0, \\ldots, n$ only: the rows up to and
including the first rejection (or the bonus row). XLA's argmax of every row reads all
$G + 1$; at the acceptance rates of real drafts (a mean $n$ well under $G / 2$) most of
those bytes are never needed. Eight streams (`streams.each_row`) each copy their
sequence's next row into their sublane of an `(8, V)` tile, and take the next sequence
once a row's argmax is not its draft token. Off the TPU it runs in Pallas's interpret
mode (slow; for tests)."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .._misc import given_as_arrays
from .streams import chunks, each_row, state_scratch, token_column
from .tiles import LANES as _LANES, lanes_per_step, ROWS as _ROWS


def fits(target_probs) -> bool:
    """Whether the kernel reads these rows: a float32 array (not warped rows) whose
    vocabulary fills whole 128-lane tiles."""
    return (
        given_as_arrays(target_probs)
        and target_probs.dtype == jnp.float32
        and target_probs.shape[-1] % _LANES == 0
    )


def _first_argmax(buf, vocab: int, log_space: bool):
    """`(8, 1)` int32: each sublane's first most likely entry of the `(8, vocab)` rows in
    `buf`, or `vocab` for a row without one (a NaN or $+\\infty$, or no mass), as
    [`eqx_specdec.RowContext.argmax`][] gives it."""
    chunk = lanes_per_step(vocab)
    lane = jax.lax.broadcasted_iota(jnp.int32, (_ROWS, chunk), 1)

    def step(j, carry):
        best, where, nan = carry
        start = pl.multiple_of(j * chunk, chunk)
        x = buf[:, pl.ds(start, chunk)]
        larger = x > best  # strict: each lane keeps its first maximum
        return (
            jnp.where(larger, x, best),
            jnp.where(larger, start + lane, where),
            nan | jnp.isnan(x).astype(jnp.int32),  # no boolean loop carries
        )

    steps = vocab // chunk
    carry = (
        jnp.full((_ROWS, chunk), -jnp.inf, jnp.float32),
        jnp.full((_ROWS, chunk), vocab, jnp.int32),
        jnp.zeros((_ROWS, chunk), jnp.int32),
    )
    best, where, nan = jax.lax.fori_loop(0, steps, step, carry, unroll=min(4, steps))
    largest = jnp.max(best, axis=1, keepdims=True)
    first = jnp.min(jnp.where(best == largest, where, vocab), axis=1, keepdims=True)
    usable = (jnp.max(nan, axis=1, keepdims=True) == 0) & (largest < jnp.inf)
    usable = usable & (largest > (-jnp.inf if log_space else 0.0))
    return jnp.where(usable, first, vocab)


def leading_argmax(draft_tokens, target_probs, *, log_space: bool, interpret: bool):
    """Each sequence's target argmaxes up to its first rejection (`fits` must hold).

    **Arguments:** `draft_tokens` `(B, G)`; `target_probs` `(B, G + 1, V)`, float32
    probabilities or logits (`log_space`); `interpret`: run in Pallas's interpret mode.

    **Returns:** `(B, G + 1)` int32: row $i$'s argmax (as
    [`eqx_specdec.RowContext.argmax`][] gives it) for $i \\le n$, where $n$ is the
    first position whose argmax is not its draft token ($G$ when there is none), and
    `V` (no token) after it: rows never read.
    """
    batch, rows, vocab = target_probs.shape
    gamma = rows - 1
    tokens = draft_tokens.astype(jnp.int32)
    parts = [
        _argmaxes(tokens[a:b], target_probs[a:b], log_space, interpret)
        for a, b in chunks(batch, gamma + rows + 1)
    ]
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts)


def _argmaxes(tokens, target_probs, log_space, interpret):
    batch, rows, vocab = target_probs.shape
    gamma = rows - 1

    def kernel(tokens_ref, p_hbm, best_out, last_out, buf, sem, state, flags, stage):
        def copies(b, i, j, slot):
            copy = pltpu.make_async_copy(
                p_hbm.at[b, pl.ds(i, 1), :], buf.at[slot, pl.ds(j, 1), :], sem.at[slot]
            )
            return [(copy, None)]

        def examine(slot, sequence, position, active):
            best = _first_argmax(buf.at[slot], vocab, log_space)
            stage[...] = jnp.broadcast_to(best, (_ROWS, _LANES))
            found = stage[...]
            for j in range(_ROWS):

                @pl.when(active[j])
                def _(j=j):
                    b, i = sequence[j], position[j]
                    best_out[b * rows + i] = found[j, 0]
                    last_out[b] = i

            return best == token_column(tokens_ref, gamma, sequence, position)

        each_row(batch, rows, copies, examine, state, flags)

    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    best, last = pl.pallas_call(
        kernel,
        grid=(1,),
        in_specs=[smem, pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=[smem, smem],
        out_shape=[
            jax.ShapeDtypeStruct((batch * rows,), jnp.int32),
            jax.ShapeDtypeStruct((batch,), jnp.int32),
        ],
        scratch_shapes=[
            pltpu.VMEM((2, _ROWS, vocab), jnp.float32),
            pltpu.SemaphoreType.DMA((2,)),
            *state_scratch(),
            pltpu.VMEM((_ROWS, _LANES), jnp.int32),
        ],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("arbitrary",),
            vmem_limit_bytes=int(2 * _ROWS * vocab * 4 + (16 << 20)),
        ),
        interpret=pltpu.InterpretParams() if interpret else False,
        name="leading_argmax",
    )(tokens.reshape(-1), target_probs)
    read = jnp.arange(rows, dtype=jnp.int32)[None] <= last[:, None]
    return jnp.where(read, best.reshape(batch, rows), vocab)
