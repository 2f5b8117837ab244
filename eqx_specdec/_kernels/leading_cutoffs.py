"""Warped rows' cut-offs and normalisers found by one Pallas kernel, each sequence's rows
copied from HBM by DMA one position after another, and no row read after the first
position whose threshold rule fails.

A threshold rule's verdict at position $i$ reads $p_i(x_i)$ and $q_i(x_i)$ alone, and
with a counter up to the first failure nothing after that position changes the outputs
(the rule is `causal`): only rows $0, \\ldots, n$ of the target and of the draft need
their cut-offs and normalisers, which, on warped logits, read the whole row. Normalising
every row reads all of them, and XLA TPU's reshape of the batch's `(B, G + 1, V)` rows
to the `(R, V)` a kernel over rows takes copied them first (at (64, 5, 128256), the
copy took longer than the cut-offs). Here eight streams (`streams.each_row`) each copy
their sequence's next row into their sublane of an `(8, V)` tile, target and draft
each, the warp runs there (`block_cutoffs`), and the rule decides, in the kernel,
whether a stream's next row is read or it takes the next sequence. Off the TPU it runs
in Pallas's interpret mode (slow; for tests).

The rule's verdict is decided again by XLA from the normalisers this kernel writes: the
kernel reads a row on while the rule passes up to a margin far above any rounding
difference between the two, so it reads every row XLA's verdicts need (and at most one
more)."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .._warps.warp import at_draft_tokens, NormalisedRows, WarpedRows
from .streams import chunks, column, each_row, state_scratch, token_column
from .tiles import LANES, ROWS
from .warp_cutoffs import block_cutoffs


# A row not read: every log-probability -inf, nothing removed (as the row-by-row
# backend leaves the rows it never examines).
_UNREAD = (-jnp.inf, 0.0, jnp.inf)  # threshold, shift, log_sum
# How far below XLA's the kernel's log-ratio may round without stopping early: float32
# rounding of the same formula is a few ulps of it.
_MARGIN_ABSOLUTE = 1e-4
_MARGIN_RELATIVE = 1e-5


def fits(draft, target) -> bool:
    """Whether the kernel normalises these rows: warped float32 logits without greedy
    rows (a temperature known to be positive), whose vocabulary fills whole 128-lane
    tiles; the draft's likewise, or `None` (one-hot drafts)."""

    def warped(rows):
        return (
            isinstance(rows, WarpedRows)
            and not rows.greedy_rows
            and rows.x.dtype == jnp.float32
            and rows.x.ndim == 3
            and rows.x.shape[-1] % LANES == 0
        )

    return warped(target) and (draft is None or warped(draft))


def _columns(rows: WarpedRows):
    """The warp's per-row parameters, flat `(C * B * R,)` (column, sequence, row), in
    `block_cutoffs`' order: the scale, then top-k, top-p and log(min-p) where applied;
    their count; and which of the last three are applied."""
    shape = rows.x.shape[:-1] + (1,)
    vocab = rows.x.shape[-1]
    columns = [jnp.broadcast_to(rows.temperature, shape)]
    if rows.top_k is not None:
        columns.append(jnp.clip(rows.top_k.astype(jnp.int32), 0, vocab))
    if rows.top_p is not None:
        columns.append(rows.top_p)
    if rows.min_p is not None:
        # min-p's log taken by XLA, as the warp's own path takes it.
        columns.append(jnp.log(rows.min_p.astype(jnp.float32)))
    flat = [jnp.broadcast_to(c, shape).astype(jnp.float32).reshape(-1) for c in columns]
    return jnp.concatenate(flat), len(flat), _applied(rows)


def _applied(rows: WarpedRows):
    """Which of top-k, top-p and min-p `rows` apply."""
    return tuple(a is not None for a in (rows.top_k, rows.top_p, rows.min_p))


def _words(draft, target) -> int:
    """The SMEM words a sequence's inputs and outputs take in the kernel: the draft
    tokens' values, the uniforms, the parameters and the three outputs of each row."""
    rows = target.x.shape[1]
    gamma = rows - 1
    words = 2 * gamma + (1 + sum(_applied(target)) + 3) * rows + 1
    if draft is not None:
        words += gamma * (1 + 1 + sum(_applied(draft)) + 3)
    return words


def normalised_until_failure(
    draft_tokens, draft, target, accept_uniforms, acceptance, *, interpret: bool
):
    """`draft` and `target` (`WarpedRows`, `fits` must hold) as `NormalisedRows` whose
    rows are normalised up to each sequence's first position where the threshold rule
    fails, and unread after it (every log-probability `-inf`): the target's rows
    $0, \\ldots, n$ (the bonus row $G$ only where every position passed) and the
    draft's rows $0, \\ldots, \\min(n, G - 1)$.

    **Arguments:**

    - `draft_tokens`: integer `(B, G)`.
    - `draft`: `WarpedRows` `(B, G, V)`, or `None` for one-hot drafts.
    - `target`: `WarpedRows` `(B, G + 1, V)`.
    - `accept_uniforms`: float `(B, G)`.
    - `acceptance`: the rule's $\\log t$ from $\\log p$ and $\\log q$, elementwise
        (traced inside the kernel: it may close over no array).
    - `interpret`: run in Pallas's interpret mode.
    """
    batch = target.x.shape[0]
    pieces = chunks(batch, _words(draft, target))

    def part(rows, start, stop):  # sequences start to stop (broadcast leaves whole)
        if rows is None or len(pieces) == 1:
            return rows
        return jax.tree.map(
            lambda x: x if x.ndim < 3 or x.shape[0] == 1 else x[start:stop], rows
        )

    found = [
        _found(
            draft_tokens[a:b],
            part(draft, a, b),
            part(target, a, b),
            accept_uniforms[a:b],
            acceptance,
            interpret,
        )
        for a, b in pieces
    ]
    t_out, d_out = (
        None if parts[0] is None else jnp.concatenate(parts) for parts in zip(*found)
    )

    def assembled(rows_in, out, warps):
        threshold, shift, log_sum = out[..., 0:1], out[..., 1:2], out[..., 2:3]
        shape = rows_in.x.shape[:-1] + (1,)
        return NormalisedRows(
            rows_in.x,
            threshold if any(warps) else None,
            jnp.broadcast_to(rows_in.temperature, shape).astype(jnp.float32),
            shift,
            log_sum,
            None,
            None,
        )

    normalised_target = assembled(target, t_out, _applied(target))
    if draft is None:
        return None, normalised_target
    return assembled(draft, d_out, _applied(draft)), normalised_target


def _found(draft_tokens, draft, target, accept_uniforms, acceptance, interpret):
    """`(target_out, draft_out)`: `(B, G + 1, 3)` and `(B, G, 3)` (or `None`) float32,
    each row's threshold, shift and log-normaliser, `_UNREAD`'s where it was not read."""
    x_t = target.x
    batch, rows, vocab = x_t.shape
    gamma = rows - 1

    def flat_at_tokens(x):  # `NormalisedRows.at_tokens` gathers the same (XLA TPU did
        # not share the two: 29 us each at (256, 8, 32000), `results-tpu.md`)
        return at_draft_tokens(x, draft_tokens).astype(jnp.float32).reshape(-1)

    log_u = jnp.log(accept_uniforms.astype(jnp.float32)).reshape(-1)
    t_par, t_count, t_warps = _columns(target)
    small = [flat_at_tokens(x_t), log_u, t_par]
    big = [x_t]
    d_count, d_warps = 0, None
    if draft is not None:
        d_par, d_count, d_warps = _columns(draft)
        small += [flat_at_tokens(draft.x), d_par]
        big.append(draft.x)
    searching = any(t_warps[:2]) or (d_warps is not None and any(d_warps[:2]))
    drafted = draft is not None

    def kernel(*refs):
        refs = iter(refs)  # in `pallas_call`'s order, the draft's where it is given

        def take(given=True):
            return next(refs) if given else None

        t_val, log_u_ref, t_par_ref = take(), take(), take()
        d_val, d_par_ref = take(drafted), take(drafted)
        t_hbm, d_hbm = take(), take(drafted)
        t_out, d_out, last_out = take(), take(drafted), take()
        t_buf, d_buf = take(), take(drafted)
        keys, weights = take(searching), take(searching)
        sem, state, flags, stage = take(), take(), take(), take()

        def copies(b, i, j, slot):
            out = [
                (
                    pltpu.make_async_copy(
                        t_hbm.at[b, pl.ds(i, 1), :],
                        t_buf.at[slot, pl.ds(j, 1), :],
                        sem.at[0, slot],
                    ),
                    None,
                )
            ]
            if drafted:
                row = jnp.minimum(i, gamma - 1)
                copy = pltpu.make_async_copy(
                    d_hbm.at[b, pl.ds(row, 1), :],
                    d_buf.at[slot, pl.ds(j, 1), :],
                    sem.at[1, slot],
                )
                out.append((copy, i < gamma))
            return out

        def found_at(buf, par, count, width, warps, slot, sequence, position):
            """The streams' rows' cut-offs and normalisers, and their parameters."""
            param = jnp.concatenate(
                [
                    column(
                        par,
                        lambda b, i, c=c: (
                            (c * batch + b) * width + jnp.minimum(i, width - 1)
                        ),
                        sequence,
                        position,
                    )
                    for c in range(count)
                ],
                axis=1,
            )
            threshold, shift, log_sum, _ = block_cutoffs(
                buf.at[slot], param, keys, weights, warps=warps
            )
            return threshold, param[:, 0:1], shift, log_sum

        def log_prob(tok, threshold, scale, shift, log_sum):
            value = (tok / scale - shift) - log_sum
            return jnp.where(tok < threshold, -jnp.inf, value)

        def examine(slot, sequence, position, active):
            where = (sequence, position)
            t_found = found_at(t_buf, t_par_ref, t_count, rows, t_warps, slot, *where)
            values = [t_found[0], t_found[2], t_found[3]]
            log_p = log_prob(token_column(t_val, gamma, *where), *t_found)
            log_q = jnp.zeros_like(log_p)
            if drafted:
                d_found = found_at(
                    d_buf, d_par_ref, d_count, gamma, d_warps, slot, *where
                )
                values += [d_found[0], d_found[2], d_found[3]]
                log_q = log_prob(token_column(d_val, gamma, *where), *d_found)
            lane = jax.lax.broadcasted_iota(jnp.int32, (ROWS, LANES), 1)
            staged = jnp.zeros((ROWS, LANES), jnp.float32)
            for k, value in enumerate(values):
                staged = jnp.where(lane == k, value, staged)
            stage[...] = staged
            found = stage[...]
            for j in range(ROWS):

                @pl.when(active[j])
                def _(j=j):
                    b, i = sequence[j], position[j]
                    for k in range(3):
                        t_out[(b * rows + i) * 3 + k] = found[j, k]
                    last_out[b] = i
                    if drafted:

                        @pl.when(i < gamma)
                        def _():
                            for k in range(3):
                                d_out[(b * gamma + i) * 3 + k] = found[j, 3 + k]

            ratio = acceptance(log_p, log_q) - log_q
            margin = _MARGIN_ABSOLUTE + _MARGIN_RELATIVE * jnp.abs(ratio)
            # NaN (a NaN row; -inf - -inf) fails, as XLA's comparison does.
            return token_column(log_u_ref, gamma, *where) < ratio + margin

        each_row(batch, rows, copies, examine, state, flags)

    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    out_shape = [jax.ShapeDtypeStruct((batch * rows * 3,), jnp.float32)]
    if drafted:
        out_shape.append(jax.ShapeDtypeStruct((batch * gamma * 3,), jnp.float32))
    out_shape.append(jax.ShapeDtypeStruct((batch,), jnp.int32))
    scratch = [pltpu.VMEM((2, ROWS, vocab), jnp.float32) for _ in big]
    if searching:
        scratch += [
            pltpu.VMEM((ROWS, vocab), jnp.int32),
            pltpu.VMEM((ROWS, vocab), jnp.float32),
        ]
    scratch += [
        pltpu.SemaphoreType.DMA((2, 2)),
        *state_scratch(),
        pltpu.VMEM((ROWS, LANES), jnp.float32),
    ]
    tile = ROWS * vocab * 4
    outs = pl.pallas_call(
        kernel,
        grid=(1,),
        in_specs=[smem for _ in small]
        + [pl.BlockSpec(memory_space=pl.ANY) for _ in big],
        out_specs=[smem for _ in out_shape],
        out_shape=out_shape,
        scratch_shapes=scratch,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("arbitrary",),
            vmem_limit_bytes=int((2 * len(big) + 2 * searching) * tile + (16 << 20)),
        ),
        interpret=pltpu.InterpretParams() if interpret else False,
        name="leading_cutoffs",
    )(*small, *big)
    last = outs[-1]

    def unpacked(out, width):
        out = out.reshape(batch, width, 3)
        read = (jnp.arange(width, dtype=jnp.int32)[None] <= last[:, None])[..., None]
        return jnp.where(read, out, jnp.asarray(_UNREAD, jnp.float32)[None, None])

    return unpacked(outs[0], rows), unpacked(outs[1], gamma) if drafted else None
