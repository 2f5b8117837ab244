"""The schedule of the kernels that read each sequence's rows one position after another
and none after its first failure (`leading_argmax`, `leading_cutoffs`): eight streams,
one to a sublane of the TPU's `(8, V)` tiles, each reading its sequence's rows in order
and taking the next sequence from a queue the moment its own stops.

Each examination of a tile costs the same however many of its sublanes hold a row the
verdicts need. Reading eight sequences in lockstep (a group's positions one after
another until the last of its eight stops) examined, at every position, the tile of the
group's longest prefix: at (256, 8, 32000) with a mean of 2.4 draft tokens accepted,
about twice the tiles the rows needed took. Here every tile but those of the last few
examinations holds eight rows the verdicts read.

The streams' sequences and positions are scalars in SMEM; each examination's copies are
started once the verdicts before it are known, and waited for before it."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .tiles import LANES, ROWS


_SEQUENCE, _POSITION, _NEXT = 0, ROWS, 2 * ROWS
# The 32-bit words of SMEM one call's arrays may take: half of a TPU v5e's 1 MiB.
SMEM_WORDS = 1 << 17


def state_scratch():
    """The scratch `each_row` takes: the streams' sequences and positions and the queue's
    head in SMEM, and a tile the verdicts pass through to scalars."""
    return [
        pltpu.SMEM((2 * ROWS + 1,), jnp.int32),
        pltpu.VMEM((ROWS, LANES), jnp.int32),
    ]


def each_row(batch: int, rows: int, copies, examine, state, flags):
    """Examines rows $0, \\ldots, n$ of each of `batch` sequences, inside a kernel run
    once (a grid of one), eight streams at a time.

    **Arguments:**

    - `batch`: the sequences.
    - `rows`: the positions, $G + 1$; a sequence stops after its last.
    - `copies(b, i, j, slot)`: the DMA copies of row `i` of sequence `b` into sublane
        `j` of buffer slot `slot` (scalars), as pairs `(copy, when)`: `when` a scalar
        condition, or `None` for always.
    - `examine(slot, sequence, position, active)`: examines the tile in `slot`, whose
        sublane `j` holds row `position[j]` of sequence `sequence[j]` where `active[j]`
        (eight scalars each; an inactive stream's sequence is some sequence's, clamped);
        returns `(8, 1)` booleans: whether each sequence reads its next row.
    - `state`, `flags`: the scratch of `state_scratch`.
    """

    def each_copy(slot, action):
        for j in range(ROWS):
            b, i = state[_SEQUENCE + j], state[_POSITION + j]

            @pl.when(b < batch)
            def _(b=b, i=i, j=j):
                for copy, when in copies(b, i, j, slot):
                    if when is None:
                        action(copy)
                    else:
                        pl.when(when)(functools.partial(action, copy))

    for j in range(ROWS):
        state[_SEQUENCE + j] = jnp.int32(j)  # from `batch` on, idle from the start
        state[_POSITION + j] = jnp.int32(0)
    state[_NEXT] = jnp.int32(ROWS)
    each_copy(0, lambda copy: copy.start())

    def examination(carry):
        count, _ = carry
        slot = count % 2
        each_copy(slot, lambda copy: copy.wait())
        sequence = [state[_SEQUENCE + j] for j in range(ROWS)]
        position = [state[_POSITION + j] for j in range(ROWS)]
        active = [b < batch for b in sequence]
        clamped = [jnp.minimum(b, batch - 1) for b in sequence]
        going = examine(slot, clamped, position, active)
        flags[...] = jnp.broadcast_to(going.astype(jnp.int32), (ROWS, LANES))
        read = flags[...]
        for j in range(ROWS):
            on = (read[j, 0] > 0) & (position[j] < rows - 1)
            state[_POSITION + j] = jnp.where(on, position[j] + 1, 0)

            @pl.when(active[j] & jnp.logical_not(on))
            def _(j=j):  # the next sequence in the queue
                head = state[_NEXT]
                state[_SEQUENCE + j] = head
                state[_NEXT] = head + 1

        each_copy(1 - slot, lambda copy: copy.start())
        live = functools.reduce(
            jnp.add,
            [(state[_SEQUENCE + j] < batch).astype(jnp.int32) for j in range(ROWS)],
        )
        return count + 1, live

    jax.lax.while_loop(
        lambda carry: carry[1] > 0,
        examination,
        (jnp.int32(0), jnp.int32(min(ROWS, batch))),
    )


def column(values, index, sequence, position):
    """`(8, 1)` float32 or int32: `values[index(sequence[j], position[j])]` in sublane
    `j`, from a flat SMEM array."""
    sublane = jax.lax.broadcasted_iota(jnp.int32, (ROWS, 1), 0)
    out = jnp.zeros((ROWS, 1), values.dtype)
    for j in range(ROWS):
        out = jnp.where(sublane == j, values[index(sequence[j], position[j])], out)
    return out


def token_column(values, gamma: int, sequence, position):
    """`(8, 1)`: `column` of a flat `(B * G,)` SMEM array of per-draft-token values at
    each stream's sequence and position (the bonus row $G$ reads position $G - 1$'s,
    which no verdict uses)."""

    def index(b, i):
        return b * gamma + jnp.minimum(i, gamma - 1)

    return column(values, index, sequence, position)


def chunks(batch: int, words_per_sequence: int):
    """The batch's sequences cut into calls whose SMEM arrays (`words_per_sequence`
    32-bit words a sequence) fit in `SMEM_WORDS`, eight sequences or more a call:
    `(start, stop)` pairs."""
    most = max(ROWS, SMEM_WORDS // words_per_sequence // ROWS * ROWS)
    return [(s, min(s + most, batch)) for s in range(0, batch, most)]
