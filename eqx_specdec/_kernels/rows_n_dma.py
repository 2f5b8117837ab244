"""Rows n of every sequence read by one Pallas kernel: the standard residual's pass (the
block totals of its weights and of $p_n$, and the checks' sums) for the whole batch,
each row copied from HBM by DMA at the accepted count, eight sequences to a program.

Under `vmap`, XLA reads row n of each sequence through a gather; on a TPU v5e at
(64, 5, 128256) the step took 1.79 ms that way and 0.39 ms with this kernel, which reads
at about twice the time the bytes take at the bandwidth of a plain reduction
(`benchmarks/results-tpu.md`). Off the TPU it runs in Pallas's interpret mode (slow; for
tests)."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .._misc import given_as_arrays
from .._search import block_size
from .._warps.warp import evaluated_at, NormalisedRows
from .tiles import LANES as _LANES, ROWS as _ROWS


def fits(draft_probs, target_probs, log_space: bool = False) -> bool:
    """Whether the kernel reads these rows: float32 arrays of probabilities, or in log
    space normalised warped rows of float32 logits without greedy rows
    (`NormalisedRows`, evaluated in the kernel), whose vocabulary and search blocks
    fill whole 128-lane tiles."""
    rows = [a for a in (draft_probs, target_probs) if a is not None]
    for a in rows:
        if log_space:
            if not isinstance(a, NormalisedRows) or a.greedy is not None:
                return False
            a = a.x
        elif not given_as_arrays(a):
            return False
        if a.dtype != jnp.float32:
            return False
    target = target_probs.x if log_space else target_probs
    vocab = target.shape[-1]
    return vocab % _LANES == 0 and block_size(vocab) % _LANES == 0


def _columns(rows, at):
    """The array the kernel copies rows of, and for normalised rows the `(B,)` columns
    of row `at[b]` of each sequence's `(threshold, scale, shift, log_sum)` (the
    threshold -inf where nothing was removed); `None` for plain probabilities."""
    if not isinstance(rows, NormalisedRows):
        return rows, None
    threshold, scale, shift, log_sum = rows.parameters()[:4]
    if threshold is None:
        threshold = jnp.full_like(scale, -jnp.inf)
    index = (jnp.arange(at.shape[0]), at, 0)
    return rows.x, tuple(
        a[index].astype(jnp.float32) for a in (threshold, scale, shift, log_sum)
    )


def _as_probabilities(x, parameters):
    """Entries `x` of a normalised row as the probabilities its evaluation gives:
    `exp(NormalisedRows.log_probs())`, with the row's `(threshold, scale, shift,
    log_sum)` columns (no greedy rows: `fits`)."""
    return jnp.exp(evaluated_at(x, None, (*parameters, None, None)))


def residual_block_totals(
    num_accepted,
    residual_scale,
    draft_tokens,
    draft_probs,
    target_probs,
    acceptance,
    *,
    checked: bool,
    interpret: bool,
):
    """The residual sampler's pass over rows n of a batch (`fits` must hold).

    **Arguments:** `num_accepted` `(B,)`; `residual_scale` `(B, G)`, the verdicts' $c$;
    `draft_tokens` `(B, G)`; `draft_probs` `(B, G, V)` or `None` for one-hot drafts;
    `target_probs` `(B, G + 1, V)` (each rows of probabilities, or normalised warped
    rows of logits, whose rows n are evaluated in the kernel); `acceptance`, a
    threshold rule's acceptance `(p, q) -> t` on probabilities (elementwise, closing
    over no arrays), or `None` for the residual $(c p_n - q_n)_+$; `checked`: negative entries count as NaN in the
    totals of $p_n$, and the sum of $q_n$ so counted is returned.

    **Returns:** `(totals, p_totals, q_total)`: the block totals `(B, blocks)` of the
    weights (the residual where a draft token was rejected, else $p_n$) and of $p_n$,
    and `q_total` `(B,)` (`None` for one-hot drafts or without `checked`).
    """
    n = num_accepted.astype(jnp.int32)
    gamma = draft_tokens.shape[1]
    rejected_at = jnp.minimum(n, gamma - 1)
    one_hot = draft_probs is None
    target_probs, p_parameters = _columns(target_probs, n)
    q_parameters = None
    if not one_hot:
        draft_probs, q_parameters = _columns(draft_probs, rejected_at)
    normalised = [x is not None for x in (p_parameters, q_parameters)]
    extra = [c for x in (p_parameters, q_parameters) if x is not None for c in x]
    batch, _, vocab = target_probs.shape
    size = block_size(vocab)
    blocks = -(-vocab // size)
    width = -(-blocks // _LANES) * _LANES
    groups = -(-batch // _ROWS)
    padded = groups * _ROWS
    one_hot = draft_probs is None
    with_rule = acceptance is not None

    at = (jnp.arange(batch), rejected_at)
    scale = residual_scale[at].astype(jnp.float32)
    token = draft_tokens[at].astype(jnp.int32)
    rejected = (n < gamma).astype(jnp.int32)

    def column(x):  # (padded, 1), read a group of eight rows at a time
        return jnp.pad(x, (0, padded - batch))[:, None]

    def kernel(n_ref, r_ref, scale_ref, token_ref, rejected_ref, *refs):
        p_columns = q_columns = None
        if normalised[0]:
            p_columns, refs = refs[:4], refs[4:]
        if normalised[1]:
            q_columns, refs = refs[:4], refs[4:]
        if one_hot:
            p_hbm, totals_out, p_totals_out, p_buf, sem = refs
            q_hbm = q_buf = q_total_out = None
        else:
            (p_hbm, q_hbm, totals_out, p_totals_out, q_total_out) = refs[:5]
            p_buf, q_buf, sem = refs[5:]
        group = pl.program_id(0)

        def copies(g, slot):
            out = []
            for i in range(_ROWS):
                b = jnp.minimum(g * _ROWS + i, batch - 1)
                to = pl.ds(i, 1)
                out.append(
                    pltpu.make_async_copy(
                        p_hbm.at[b, pl.ds(n_ref[b], 1), :],
                        p_buf.at[slot, to, :],
                        sem.at[0, slot],
                    )
                )
                if not one_hot:
                    out.append(
                        pltpu.make_async_copy(
                            q_hbm.at[b, pl.ds(r_ref[b], 1), :],
                            q_buf.at[slot, to, :],
                            sem.at[1, slot],
                        )
                    )
            return out

        # Two slots: the next group's rows arrive while this group's are summed.
        @pl.when(group == 0)
        def _():
            for copy in copies(group, 0):
                copy.start()

        @pl.when(group + 1 < groups)
        def _():
            for copy in copies(group + 1, (group + 1) % 2):
                copy.start()

        slot = group % 2
        for copy in copies(group, slot):
            copy.wait()

        scale_col = scale_ref[...]
        rejected_col = rejected_ref[...] > 0
        token_col = token_ref[...]
        lane = jax.lax.broadcasted_iota(jnp.int32, (_ROWS, width), 1)

        p_read = None if p_columns is None else [c[...] for c in p_columns]
        q_read = None if q_columns is None else [c[...] for c in q_columns]

        def block(start, length):
            p = p_buf[slot, :, pl.ds(start, length)]
            if p_read is not None:
                p = _as_probabilities(p, p_read)
            if one_hot:
                ids = start + jax.lax.broadcasted_iota(jnp.int32, (_ROWS, length), 1)
                q = (ids == token_col).astype(jnp.float32)
            else:
                q = q_buf[slot, :, pl.ds(start, length)]
                if q_read is not None:
                    q = _as_probabilities(q, q_read)
            if with_rule:  # the rule's min(q, t); q's +inf kept
                taken = jnp.minimum(q, acceptance(p, q).astype(jnp.float32))
                if not checked:
                    taken = jnp.where(q == jnp.inf, q, taken)
            else:
                taken = q
            difference = scale_col * p - taken
            residual = jnp.where(
                difference == -jnp.inf, jnp.nan, jnp.maximum(difference, 0.0)
            )
            weights = jnp.where(rejected_col, residual, p)
            fallback = jnp.where(p >= 0, p, jnp.nan) if checked else p
            q_part = None
            if checked and not one_hot:
                q_part = jnp.where(q >= 0, q, jnp.nan)
            return weights, fallback, q_part

        def add(j, start, length, carry):
            totals, p_totals, q_sum = carry
            weights, fallback, q_part = block(start, length)
            here = lane == j
            totals = jnp.where(here, jnp.sum(weights, 1, keepdims=True), totals)
            p_totals = jnp.where(here, jnp.sum(fallback, 1, keepdims=True), p_totals)
            if q_part is not None:
                q_sum = q_sum + jnp.sum(q_part, 1, keepdims=True)
            return totals, p_totals, q_sum

        zeros = jnp.zeros((_ROWS, width), jnp.float32)
        carry = (zeros, zeros, jnp.zeros((_ROWS, 1), jnp.float32))
        full = vocab // size

        def step(j, carry):
            return add(j, pl.multiple_of(j * size, size), size, carry)

        carry = jax.lax.fori_loop(0, full, step, carry, unroll=min(8, full))
        if vocab % size:
            carry = add(full, full * size, vocab - full * size, carry)
        totals, p_totals, q_sum = carry
        totals_out[...] = totals
        p_totals_out[...] = p_totals
        if q_total_out is not None:
            q_total_out[...] = jnp.broadcast_to(q_sum, q_total_out.shape)

    column_spec = pl.BlockSpec((_ROWS, 1), lambda g, *_: (g, 0))
    in_hbm = pl.BlockSpec(memory_space=pl.ANY)
    out_spec = pl.BlockSpec((_ROWS, width), lambda g, *_: (g, 0))
    lanes_spec = pl.BlockSpec((_ROWS, _LANES), lambda g, *_: (g, 0))
    buffer = pltpu.VMEM((2, _ROWS, vocab), jnp.float32)
    totals_shape = jax.ShapeDtypeStruct((padded, width), jnp.float32)
    out_shape = [totals_shape, totals_shape]
    out_specs = [out_spec, out_spec]
    in_specs = [column_spec] * (3 + len(extra)) + [in_hbm]
    scratch = [buffer]
    operands = [target_probs]
    if not one_hot:
        in_specs.append(in_hbm)
        operands.append(draft_probs)
        scratch.append(buffer)
        out_shape.append(jax.ShapeDtypeStruct((padded, _LANES), jnp.float32))
        out_specs.append(lanes_spec)
    scratch.append(pltpu.SemaphoreType.DMA((2, 2)))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(groups,),
        in_specs=in_specs,
        out_specs=out_specs,
        scratch_shapes=scratch,
    )
    vmem = len(scratch[:-1]) * 2 * _ROWS * vocab * 4
    outputs = pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        out_shape=out_shape,
        compiler_params=pltpu.CompilerParams(
            # Sequential: each program starts the next one's copies.
            dimension_semantics=("arbitrary",),
            vmem_limit_bytes=int(vmem + (16 << 20)),
        ),
        interpret=pltpu.InterpretParams() if interpret else False,
    )(
        n,
        rejected_at,
        column(scale),
        column(token),
        column(rejected),
        *(column(c) for c in extra),
        *operands,
    )
    totals, p_totals = (x[:batch, :blocks] for x in outputs[:2])
    q_total = None
    if checked and not one_hot:
        q_total = outputs[2][:batch, 0]
    return totals, p_totals, q_total
