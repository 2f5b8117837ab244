"""Warped rows' cut-offs and normalisers found by one Pallas kernel, each sequence's rows
copied from HBM by DMA one position after another, and no row read after the first
position whose threshold rule fails.

A threshold rule's verdict at position $i$ reads $p_i(x_i)$ and $q_i(x_i)$ alone, and
with a counter up to the first failure nothing after that position changes the outputs
(the rule is `causal`): only rows $0, \\ldots, n$ of the target and of the draft need
their cut-offs and normalisers, which, on warped logits, read the whole row. Normalising
every row reads all of them, and XLA TPU's reshape of the batch's `(B, G + 1, V)` rows
to the `(R, V)` a kernel over rows takes copied them first (at (64, 5, 128256), the
copy took longer than the cut-offs). Here eight sequences' row $i$ lie in the sublanes
of one `(8, V)` tile, target and draft each, the warp runs there (`block_cutoffs`),
and the rule decides, in the kernel, whether row $i + 1$ is read. Off the TPU it runs in
Pallas's interpret mode (slow; for tests).

The rule's verdict is decided again by XLA from the normalisers this kernel writes: the
kernel reads a row on while the rule passes up to a margin far above any rounding
difference between the two, so it reads every row XLA's verdicts need (and at most one
more)."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .._warps.warp import at_draft_tokens, NormalisedRows, WarpedRows
from .positions import each_position
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
    """The warp's per-row parameters `(B, R)` each, in `block_cutoffs`' order: the
    scale, then top-k, top-p and log(min-p) where applied; and which of the last
    three are."""
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
    warps = tuple(a is not None for a in (rows.top_k, rows.top_p, rows.min_p))
    columns = [jnp.broadcast_to(c, shape)[..., 0].astype(jnp.float32) for c in columns]
    return columns, warps


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
    x_t = target.x
    batch, rows, vocab = x_t.shape
    gamma = rows - 1
    groups = -(-batch // ROWS)
    padded = groups * ROWS

    def pad(a):
        return jnp.pad(a, ((0, padded - batch), (0, 0)))

    def at_tokens(x):  # the gather `NormalisedRows.at_tokens` reads (XLA shares them)
        return pad(at_draft_tokens(x, draft_tokens))

    log_u = pad(jnp.log(accept_uniforms.astype(jnp.float32)))
    t_columns, t_warps = _columns(target)
    small = [at_tokens(x_t), log_u, pad(jnp.concatenate(t_columns, axis=1))]
    big = [x_t]
    d_warps = None
    if draft is not None:
        d_columns, d_warps = _columns(draft)
        small += [at_tokens(draft.x), pad(jnp.concatenate(d_columns, axis=1))]
        big.append(draft.x)
    searching = any(t_warps[:2]) or (d_warps is not None and any(d_warps[:2]))

    def kernel(*refs):
        refs = iter(refs)  # in `pallas_call`'s order, the draft's where it is given

        def take(given=True):
            return next(refs) if given else None

        drafted = draft is not None
        t_tok, log_u_ref, t_par = take(), take(), take()
        d_tok, d_par = take(drafted), take(drafted)
        t_hbm, d_hbm = take(), take(drafted)
        t_out, d_out = take(), take(drafted)
        t_buf, d_buf = take(), take(drafted)
        keys, weights = take(searching), take(searching)
        sem, alive_vmem = take(), take()

        def copies(g, j, i, slot):
            b = jnp.minimum(g * ROWS + j, batch - 1)
            out = [
                pltpu.make_async_copy(
                    t_hbm.at[b, pl.ds(i, 1), :],
                    t_buf.at[slot, pl.ds(j, 1), :],
                    sem.at[0, slot],
                )
            ]
            if d_hbm is not None and i < gamma:
                out.append(
                    pltpu.make_async_copy(
                        d_hbm.at[b, pl.ds(i, 1), :],
                        d_buf.at[slot, pl.ds(j, 1), :],
                        sem.at[1, slot],
                    )
                )
            return out

        for out, width in ((t_out, rows), (d_out, gamma)):
            if out is not None:
                out[...] = jnp.concatenate(
                    [jnp.full((ROWS, width), v, jnp.float32) for v in _UNREAD], axis=1
                )

        def found_at(buf, par, out, warps, width, i, slot, alive):
            """Row i's cut-offs and normalisers, written where the sequence is alive;
            returns those `log_prob` reads."""
            count = 1 + sum(warps)
            param = jnp.concatenate(
                [par[:, c * width + i : c * width + i + 1] for c in range(count)],
                axis=1,
            )
            threshold, shift, log_sum, _ = block_cutoffs(
                buf.at[slot], param, keys, weights, warps=warps
            )
            here = jax.lax.broadcasted_iota(jnp.int32, (ROWS, 3 * width), 1)
            written = out[...]
            for k, value in enumerate((threshold, shift, log_sum)):
                at = (here == k * width + i) & alive
                written = jnp.where(at, value, written)
            out[...] = written
            return threshold, param[:, 0:1], shift, log_sum

        def log_prob(tok, threshold, scale, shift, log_sum):
            value = (tok / scale - shift) - log_sum
            return jnp.where(tok < threshold, -jnp.inf, value)

        def examine(i, slot, alive):
            t_found = found_at(t_buf, t_par, t_out, t_warps, rows, i, slot, alive)
            if i == gamma:
                return None
            log_p = log_prob(t_tok[:, i : i + 1], *t_found)
            log_q = jnp.zeros_like(log_p)
            if d_buf is not None:
                d_found = found_at(d_buf, d_par, d_out, d_warps, gamma, i, slot, alive)
                log_q = log_prob(d_tok[:, i : i + 1], *d_found)
            ratio = acceptance(log_p, log_q) - log_q
            margin = _MARGIN_ABSOLUTE + _MARGIN_RELATIVE * jnp.abs(ratio)
            # NaN (a NaN row; -inf - -inf) fails, as XLA's comparison does.
            return alive & (log_u_ref[:, i : i + 1] < ratio + margin)

        each_position(rows, groups, copies, examine, alive_vmem)

    def spec(width):
        return pl.BlockSpec((ROWS, width), lambda g: (g, 0))

    widths = [a.shape[1] for a in small]
    out_widths = [3 * rows] + ([3 * gamma] if draft is not None else [])
    scratch = [pltpu.VMEM((2, ROWS, vocab), jnp.float32) for _ in big]
    if searching:
        scratch += [
            pltpu.VMEM((ROWS, vocab), jnp.int32),
            pltpu.VMEM((ROWS, vocab), jnp.float32),
        ]
    scratch += [
        pltpu.SemaphoreType.DMA((2, 2)),
        pltpu.VMEM((ROWS, LANES), jnp.int32),
    ]
    tile = ROWS * vocab * 4
    outs = pl.pallas_call(
        kernel,
        grid=(groups,),
        in_specs=[spec(w) for w in widths]
        + [pl.BlockSpec(memory_space=pl.ANY) for _ in big],
        out_specs=[spec(w) for w in out_widths],
        out_shape=[jax.ShapeDtypeStruct((padded, w), jnp.float32) for w in out_widths],
        scratch_shapes=scratch,
        compiler_params=pltpu.CompilerParams(
            # Sequential: each program starts the next one's copies.
            dimension_semantics=("arbitrary",),
            vmem_limit_bytes=int((2 * len(big) + 2 * searching) * tile + (16 << 20)),
        ),
        interpret=pltpu.InterpretParams() if interpret else False,
        name="leading_cutoffs",
    )(*small, *big)

    def assembled(rows_in, out, warps):
        width = out.shape[1] // 3
        threshold, shift, log_sum = (
            out[:batch, k * width : (k + 1) * width, None] for k in range(3)
        )
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

    normalised_target = assembled(target, outs[0], t_warps)
    if draft is None:
        return None, normalised_target
    return assembled(draft, outs[1], d_warps), normalised_target
