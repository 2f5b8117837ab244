"""One window of one row of each sequence's rows, `rows[row, start : start + length]`,
as `jax.lax.dynamic_slice` reads it; mapped over a batch on a TPU, copied by DMA in one
Pallas kernel.

The residual sampler's search reads one block of row $n$ of each sequence. Under
`vmap`, XLA TPU lowers that batch of dynamic slices to a loop over the sequences, about
1.2 µs an iteration: at (256, 8, 32000) two such loops (the target's window and the
draft's) took 0.62 ms of a 2.4 ms step at temperature 1, for 256 KB of windows. The
kernel starts every sequence's copy, then waits for them all. Off the TPU it runs in
Pallas's interpret mode (slow; for tests)."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .._platform import on_tpu
from .tiles import LANES, ROWS


def row_window(rows, row, start, length: int, by_kernel: bool = False):
    """`rows[row, start : start + length]` of one sequence's `(R, V)` rows, the indices
    clamped as `jax.lax.dynamic_slice` clamps them. With `by_kernel`, under `vmap` over
    all three arguments, for 32-bit rows whose vocabulary and `length` fill whole
    128-lane tiles, the batch's windows are copied by one kernel: there `start` must be
    a multiple of 128 once clamped (a search block's window: `window_start`)."""
    return _windowed(length, by_kernel)(rows, row, start)


def _fits(rows, length: int) -> bool:
    return (
        rows.ndim == 3
        and rows.dtype.itemsize == 4
        and rows.shape[-1] % LANES == 0
        and length % LANES == 0
    )


@functools.lru_cache(maxsize=8)  # one a window length, with or without the kernel
def _windowed(length: int, by_kernel: bool):
    def plain(rows, row, start):
        return jax.lax.dynamic_slice(rows, (row, start), (1, length))[0]

    windowed = jax.custom_batching.custom_vmap(plain)

    @windowed.def_vmap
    def _(axis_size, in_batched, rows, row, start):
        if by_kernel and all(in_batched) and _fits(rows, length):
            interpret = not on_tpu()
            return copied(rows, row, start, length, interpret=interpret), True
        axes = tuple(0 if b else None for b in in_batched)
        return jax.vmap(plain, in_axes=axes)(rows, row, start), True

    return windowed


def copied(rows, row, start, length: int, *, interpret: bool):
    """`(B, length)`: each sequence's window of its `(R, V)` rows, `rows` `(B, R, V)`,
    `row` and `start` `(B,)`, by DMA."""
    batch, height, vocab = rows.shape

    def clamped(
        index, size, most
    ):  # as `jax.lax.dynamic_slice`: negatives from the end
        index = index.astype(jnp.int32)
        return jnp.clip(jnp.where(index < 0, index + size, index), 0, most)

    row = clamped(row, height, height - 1)
    start = clamped(start, vocab, vocab - length)
    padded = -(-batch // ROWS) * ROWS

    def kernel(row_ref, start_ref, rows_hbm, out, sem):
        def copy(b):
            at = pl.multiple_of(start_ref[b], LANES)
            return pltpu.make_async_copy(
                rows_hbm.at[b, pl.ds(row_ref[b], 1), pl.ds(at, length)],
                out.at[pl.ds(b, 1), :],
                sem.at[0],
            )

        def begin(b, carry):
            copy(b).start()
            return carry

        def end(b, carry):
            copy(b).wait()
            return carry

        jax.lax.fori_loop(0, batch, begin, 0)
        jax.lax.fori_loop(0, batch, end, 0)

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(1,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((padded, length), lambda i, *_: (0, 0)),
        scratch_shapes=[pltpu.SemaphoreType.DMA((1,))],
    )
    out = pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((padded, length), rows.dtype),
        interpret=pltpu.InterpretParams() if interpret else False,
        name="row_windows",
    )(row, start, rows)
    return out[:batch]
