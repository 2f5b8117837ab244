"""The layout choices each of XLA's backends rewards, read where they apply (the
residual sampler, the warps, their cut-off search)."""

import jax


def on_cpu() -> bool:
    """Whether JAX's default backend is XLA CPU."""
    return jax.default_backend() == "cpu"


def on_tpu() -> bool:
    """Whether JAX's default backend is a TPU (where Pallas kernels compile with
    Mosaic; elsewhere they run in Pallas's interpret mode)."""
    return jax.default_backend() == "tpu"


# From this many entries in the batch's rows n, `batching="auto"` reads rows n of
# probabilities by the Pallas kernel on a TPU.
ROWS_N_KERNEL_MIN_ENTRIES = 1 << 20


def rows_n_by_kernel(batch: int, vocab: int, rows_given: bool) -> bool:
    """Whether `batching="auto"` reads rows n through the Pallas kernel
    (`eqx_specdec._kernels.rows_n_dma`): on a TPU, for warped logits always, and for
    probabilities (`rows_given`) from `ROWS_N_KERNEL_MIN_ENTRIES` entries (batch times
    vocabulary). On a TPU v5e, a step on probabilities at (64, 5, 128256) took 0.36 ms
    with the kernel against 1.79 ms with `vmap`'s gather of rows n; at
    (256, 8, 32000), 0.60 ms against 1.07 ms (programs of 10 steps; the kernel lost
    there, 1.16 against 0.84 ms, until the draw's windows were copied by a kernel too:
    `row_windows`); at (16, 5, 32000) `vmap` took 0.117 ms. On logits at temperature 1
    the kernel, which evaluates rows n from the logits, took 3.49 ms against 5.67 ms at
    (256, 8, 32000) and 0.159 against 0.188 ms at (16, 5, 32000)."""
    return on_tpu() and (not rows_given or batch * vocab >= ROWS_N_KERNEL_MIN_ENTRIES)


# From this many entries in a batch's rows of one position, `batching="auto"` runs the
# kernels that read each sequence's rows up to its first failure on a TPU.
LEADING_KERNEL_MIN_ENTRIES = 1 << 21


def leading_by_kernel(batch: int, vocab: int) -> bool:
    """Whether `batching="auto"` runs the Pallas kernels that read each sequence's rows
    one position after another and none after its first failure: greedy verification's
    argmaxes (`eqx_specdec._kernels.leading_argmax`) and warped logits' cut-offs and
    normalisers (`eqx_specdec._kernels.leading_cutoffs`). On a TPU, from
    `LEADING_KERNEL_MIN_ENTRIES` entries a position (batch times vocabulary): below it
    the rows of a few sequences, read one after another by eight streams, cost more
    than the rows they skip (measured with the lockstep schedule the streams
    replaced). On a TPU v5e, greedy at (64, 5, 128256) took 0.158 ms
    with the kernel against 0.301 ms with XLA's argmax of every row, at
    (256, 8, 32000) 0.232 against 0.465 ms; at (16, 5, 32000), 0.029 against
    0.026 ms. A temperature-1 step took 1.160 against 2.016 ms at (64, 5, 128256) and
    2.397 against 3.619 ms at (256, 8, 32000); at (16, 5, 32000), 0.207 against
    0.201 ms."""
    return on_tpu() and batch * vocab >= LEADING_KERNEL_MIN_ENTRIES


# From this many entries in the batch's rows n, `batching="auto"` on the CPU reads them
# in a pass of their own (`rows_n_pass`, one sequence after another).
SCAN_MIN_ENTRIES = 1 << 21


def rows_n_by_scan(batch: int, vocab: int) -> bool:
    """Whether `batching="auto"` on the CPU runs a verification on probabilities in
    three phases, the sampler's pass over rows n one sequence after another between the
    vectorised tests and draws: from `SCAN_MIN_ENTRIES` entries (a batch's rows n). At
    (64, 5, 128256) a call took 5.4 ms so against 7.2 ms row by row, at (256, 8, 32000)
    6.9 against 8.6 ms; at (16, 5, 32000) 1.16 against 1.08 ms, and the three phases
    compile slower (the test suite's 64-bit run, mostly small shapes, took 142 s
    against 115 s with them everywhere)."""
    return on_cpu() and batch * vocab >= SCAN_MIN_ENTRIES


def rows_n_apart(log_space: bool) -> bool:
    """Whether the residual sampler evaluates rows n of log-probabilities behind an
    optimisation barrier: on the CPU, where with several readers of row n XLA CPU
    evaluated every row for them (at (256, 8, 32000), over half of a temperature
    call); not elsewhere (on a TPU v5e, under `vmap`, the barrier made the
    temperature's call 1.27x slower)."""
    return log_space and on_cpu()


def argmax_by_blocks() -> bool:
    """Whether a row's argmax is found through its blocks' maxima (the first block
    holding the row's maximum, then the first maximum in it): on the CPU, where XLA's
    variadic argmax reads at a tenth of the bandwidth of a maximum over blocks (at
    (384, 128256), 88 ms against 8.3 ms). Elsewhere XLA's argmax (on a TPU v5e as fast
    as a maximum: 0.90 against 0.86 ms at (64, 6, 128256), each call's dispatch
    included), where the blocks would be a copy of the rows in another layout."""
    return on_cpu()


def upcast_once() -> bool:
    """Whether `Warp.rows` upcasts half-precision logits once, into a float32 copy that
    every pass reads (on the CPU, where XLA's upcast inside a pass costs more than the
    copy: `benchmarks/bench_xla_cpu.py`), rather than keeping them as they are and
    upcasting inside each pass (elsewhere: on a TPU the copy, written and read again
    across the warp's optimisation barrier, made bfloat16 logits slower than
    float32 ones)."""
    return on_cpu()


# Up to this many blocks, the warps' top-k keeps the largest in a heap on the CPU.
_HEAP_BLOCKS = 64


def blocks_by_top_k(k: int) -> bool:
    """Whether the warps' search takes its `k` largest blocks by XLA's TopK (else by a
    search over block maxima and a prefix sum): on the CPU up to `_HEAP_BLOCKS`,
    elsewhere always."""
    return k <= _HEAP_BLOCKS or not on_cpu()
