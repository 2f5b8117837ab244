"""The schedule of the kernels that read each sequence's rows one position after another
and none after its first failure (`leading_argmax`, `leading_cutoffs`): eight sequences
to a group, one program a group, row $i$ of the sequences still alive copied by DMA into
the sublanes of `(8, V)` tiles, then examined."""

import functools

import jax.numpy as jnp
from jax.experimental import pallas as pl

from .tiles import LANES, ROWS


def each_position(rows: int, groups: int, copies, examine, alive_vmem):
    """Runs one group's positions, inside a kernel whose grid is the `groups` groups
    (sequential: each program starts the next one's copies of row 0 into the other of
    two slots).

    **Arguments:**

    - `rows`: the positions, $G + 1$.
    - `groups`: the grid's size.
    - `copies(g, j, i, slot)`: the DMA copies (a list) of row `i` of sequence `j` of
        group `g` into buffer slot `slot` (`pl.program_id(0) % 2` for this group's).
    - `examine(i, slot, alive)`: examines row `i` of the eight sequences, lying in
        `slot`, `alive` `(8, 1)` boolean; returns the sequences still alive after it,
        or `None` where no row is read after `i`.
    - `alive_vmem`: `(8, 128)` int32 VMEM scratch for the sequences alive.
    """
    group = pl.program_id(0)
    slot = group % 2

    def start(g, i, slot):
        for j in range(ROWS):
            for c in copies(g, j, i, slot):
                c.start()

    # Row 0 of every sequence is read: the next group's arrives while this group's rows
    # are examined.
    pl.when(group == 0)(lambda: start(group, 0, 0))
    pl.when(group + 1 < groups)(lambda: start(group + 1, 0, 1 - slot))
    for j in range(ROWS):
        for c in copies(group, j, 0, slot):
            c.wait()
    alive_vmem[...] = jnp.ones((ROWS, LANES), jnp.int32)

    def flags():  # the alive sequences, as eight scalars the copies branch on
        # (Copying the flags to SMEM by DMA instead measured 5% to 25% slower.)
        alive = alive_vmem[...]
        return [alive[j, 0] > 0 for j in range(ROWS)]

    for i in range(rows):

        def position(i=i, reading=None):
            if reading is not None:
                for j in range(ROWS):
                    for c in copies(group, j, i, slot):
                        pl.when(reading[j])(c.start)
                for j in range(ROWS):
                    for c in copies(group, j, i, slot):
                        pl.when(reading[j])(c.wait)
            alive = examine(i, slot, alive_vmem[:, :1] > 0)
            if alive is not None:
                alive_vmem[...] = jnp.broadcast_to(
                    alive.astype(jnp.int32), (ROWS, LANES)
                )

        if i == 0:
            position()
        else:
            reading = flags()
            pl.when(functools.reduce(jnp.logical_or, reading))(
                functools.partial(position, reading=reading)
            )
