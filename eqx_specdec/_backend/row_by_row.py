"""Mapping the verification of one row over the batch one row after another
(`jax.lax.scan`), the fast form on XLA CPU: each iteration reads its own rows as
contiguous slices, and warped logits are normalised only up to each row's first
rejection, in chunks of rows."""

import dataclasses

import jax
import jax.numpy as jnp

from .._stages.row_context import RowContext
from .._stages.row_fields import with_row_values
from .._warps.warp import as_log_probs, as_normalised, NormalisedRows, WarpedRows
from .abstract_row_mapping import (
    AbstractRowMapping,
    draft_token_values,
    row_normalisers,
    stops_at_failure,
    with_test,
)


class RowByRow(AbstractRowMapping):
    """Rows verified one after another. When `row` is the verification
    (`verification`), warped rows long enough (`_EARLY_EXIT_VOCAB` entries) are
    normalised only up to each sequence's first
    position whose test fails, where the verifier allows it (a `causal` test reading
    the draft tokens' entries, a first-failure counter), and the sampler's rows n are
    evaluated apart (`_apart`); on rows given as arrays, the draft tokens' values of
    every sequence are gathered before the loop for a test reading only them
    (`draft_token_values`)."""

    def __call__(self, verifier, row, values, inputs, verification):
        early = verification and stops_at_failure(verifier) and _long_rows(inputs[2])
        if early:
            inputs = _until_first_failure(verifier.ratio_test, values, *inputs)
        taken = draft_token_values(verifier, *inputs[:3]) if verification else None

        def verified(row_values, arrays, taken):
            test = with_row_values(verifier.ratio_test, row_values)
            one = with_test(verifier, row_values, test)
            more = {} if taken is None else dict(taken=taken)
            if verification and verification.checked:
                # The normalisers the warp finds (the rows' own normalisation finds
                # them again, and XLA shares the two).
                normalisers = row_normalisers(tuple(as_normalised(a) for a in arrays))
                if normalisers is not None:
                    more["normalisers"] = normalisers
            if not verification or not any(
                isinstance(a, NormalisedRows) for a in arrays[1:3]
            ):
                return row(one, *(as_log_probs(a) for a in arrays), **more)
            sampled = tuple(_apart(a) for a in arrays[1:3])
            arrays = tuple(as_log_probs(a) for a in arrays)
            return row(one, *arrays, sampled=sampled, **more)

        def at(batch_arrays, b):
            # Sequence b, indexed from the whole batch inside its iteration (the batch
            # is the loop's unchanged carry: a closure would keep the caller's tracers
            # alive in the traced loop).
            values, inputs, taken = batch_arrays
            one = _sequence((values, inputs, taken), b)
            return batch_arrays, verified(*one)

        batch = inputs[0].shape[0]
        steps = jnp.arange(batch, dtype=jnp.int32)
        return jax.lax.scan(at, (values, inputs, taken), steps)[1]


# From this many entries a row, normalising rows only up to the first rejection pays for
# the per-position loop's steps. Measured on the CPU, ms, early exit / whole rows, draft
# tokens drawn at temperature 0.7 (about 1 of G accepted), with chunks of sequences
# (`_chunk_rows`):
#
# | (B, G, V)        | temperature 0.7 | top-k 50     | top-p 0.9    |
# | (64, 5, 1024)    | 1.6 / 1.6       | 6.3 / 12.6   | 9.0 / 13.1   |
# | (64, 5, 2048)    | 2.3 / 2.2       | 9.8 / 16.6   | 16.1 / 19.7  |
# | (256, 8, 2048)   | 6.2 / 9.9       | 31.2 / 91.8  | 53.0 / 137.3 |
# | (64, 5, 4096)    | 2.7 / 3.3       | 8.1 / 18.8   | 14.4 / 25.2  |
# | (64, 5, 16384)   | 7.3 / 10.5      | 13.8 / 27.8  | 27.2 / 68.2  |
# | (64, 5, 32000)   | 11.1 / 19.2     | 16.4 / 45.0  | 44.6 / 132.2 |
# | (256, 8, 32000)  | 45.4 / 120.6    | 62.4 / 302.6 | 180.8 / 747.8|
# | (64, 5, 128256)  | 45.2 / 107.9    | 52.8 / 138.7 | 167.3 / 375.6|
#
# (Row by row, one sequence at a time, as before the chunks, the loop's fixed costs
# made temperature alone a little slower than whole rows at 4,096 entries.)
_EARLY_EXIT_VOCAB = 1_024


def _long_rows(target) -> bool:
    """Whether the target's rows are warped logits long enough for the early exit."""
    return isinstance(target, WarpedRows) and target.x.shape[-1] >= _EARLY_EXIT_VOCAB


def _apart(rows):
    """`rows`' log-probabilities, computed apart from any other evaluation of them (a
    barrier over the per-row fields keeps XLA from merging the two): the sampler's
    reads of rows n then evaluate those rows alone. Measured at (256, 8, 32000) on the
    CPU, sharing one evaluation with the test's gather had XLA write every row of every
    sequence, over half of a temperature call."""
    if not isinstance(rows, NormalisedRows):
        return rows
    names = [f.name for f in dataclasses.fields(rows) if f.name != "x"]
    fields = jax.lax.optimization_barrier({n: getattr(rows, n) for n in names})
    return NormalisedRows(rows.x, **fields).log_probs()


def _sequence(tree, b):
    """Sequence `b` of a batch's pytree (every leaf indexed on its leading axis)."""
    return jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, b, 0, False), tree)


def _chunk_rows(vocab: int) -> int:
    """How many sequences' rows the early exit normalises at once: the largest power of
    two, at most 16, whose rows hold at most 2^17 entries. A row's cut-offs take tens of
    small operations, whose fixed costs a chunk of rows shares; large chunks fall off
    XLA CPU's fast reductions. Measured on the CPU, ms, temperature 0.7 / top-k 50 /
    top-p 0.9, by rows per chunk:

    | (B, G, V)       | 1              | 4              | 16             | 32             |
    |-----------------|----------------|----------------|----------------|----------------|
    | (64, 5, 4096)   |                |                | 2.2/8.0/14.2   | 2.4/9.9/21.4   |
    | (64, 5, 16384)  |                | 7.1/12.4/26.9  | 7.4/15.7/26.8  | 8.3/18.9/33.7  |
    | (256, 8, 32000) | 50.1/62.7/175  | 39.1/55.4/158  | 39.9/59.0/139  | 47.1/67.4/158  |
    | (64, 5, 128256) | 39.6/44.2/139  | 51.4/35.9/109  | 62.3/42.2/142  | 95.3/66.1/204  |
    """
    rows = max(1, 2**17 // vocab)
    return min(16, 1 << (rows.bit_length() - 1))


def _until_first_failure(ratio_test, values, tokens, draft, target, accept, *rest):
    """The batch's verification arguments with its warped rows (`draft` `(B, G, V)`, a
    `WarpedRows`, or `None` or log-probabilities; `target` `(B, G + 1, V)`, a
    `WarpedRows`) normalised position by position, only while each sequence's ratio test
    passes. A sequence's rows after its first position whose test fails, which a
    `causal` test with a first-failure counter never lets change the outputs, stay
    unexamined (all `-inf`): their exponentials are never computed. The target's row
    $G$ (the bonus) is normalised only in the sequences where every position passed.

    At each position the sequences still alive are gathered, alive first, and their
    rows normalised in chunks (`_chunk_rows`), in a loop that runs only as many
    chunks as there are such sequences (skipped work is not done); then the test of
    every sequence reads the position's values. `values`: the ratio test's per-row
    field values.

    Returns the arguments, with the warped ones as `NormalisedRows`."""
    batch, gamma = tokens.shape
    chunk = min(_chunk_rows(target.x.shape[-1]), batch)
    chunks = -(-batch // chunk)
    context = RowContext(log_space=True)

    def fields(rows):
        # The per-row fields of `rows.normalised()`, by name, without the logits.
        normalised = rows.normalised()
        names = [f.name for f in dataclasses.fields(normalised) if f.name != "x"]
        return {name: getattr(normalised, name) for name in names}

    # A row not yet examined: every log-probability -inf, nothing removed, not greedy.
    unexamined = dict(threshold=-jnp.inf, scale=1, shift=0, log_sum=jnp.inf)
    unexamined.update(greedy=False, best=0)

    def start(rows):
        if not isinstance(rows, WarpedRows):
            return None
        shapes = jax.eval_shape(fields, rows)
        return {
            name: None
            if leaf is None
            else jnp.full(leaf.shape, unexamined[name], leaf.dtype)
            for name, leaf in shapes.items()
        }

    def examine(rows, found, i, picked, kept):
        # Rows i of the sequences `picked` normalised together, written into `found`
        # where `kept` (the chunk's tail past the sequences alive is dropped).
        gathered = jax.tree.map(lambda a: a[picked, i], rows)
        at = jnp.where(kept, picked, batch)
        return jax.tree.map(
            lambda a, v: a.at[at, i].set(v, mode="drop"), found, fields(gathered)
        )

    def assembled(rows, found):
        return rows if found is None else NormalisedRows(rows.x, **found)

    def passed_at(i, found_draft, found_target):
        # Every sequence's test, reading position i's values.
        def one(values, tokens, draft, target, accept):
            test = with_row_values(ratio_test, values)
            draft, target = as_log_probs(draft), as_log_probs(target)
            verdict = test(tokens, draft, target, accept, context)
            return verdict.passed[jnp.minimum(i, gamma - 1)]

        draft_rows = assembled(draft, found_draft)
        target_rows = assembled(target, found_target)
        return jax.vmap(one)(values, tokens, draft_rows, target_rows, accept)

    def unfinished(state):
        i, alive, _ = state
        return (i <= gamma) & jnp.any(alive)

    def step(state):
        i, alive, (found_draft, found_target) = state
        drafted = i < gamma
        # The sequences alive, first, in order: `count` of them.
        order = jnp.argsort(~alive, stable=True).astype(jnp.int32)
        order = jnp.concatenate([order, jnp.zeros(chunks * chunk - batch, jnp.int32)])
        count = jnp.sum(alive, dtype=jnp.int32)

        def chunk_step(carry):
            j, (found_draft, found_target) = carry
            picked = jax.lax.dynamic_slice_in_dim(order, j * chunk, chunk)
            kept = j * chunk + jnp.arange(chunk, dtype=jnp.int32) < count
            found_target = examine(target, found_target, i, picked, kept)
            if found_draft is not None:
                found_draft = jax.lax.cond(
                    drafted,
                    lambda found: examine(draft, found, i, picked, kept),
                    lambda found: found,
                    found_draft,
                )
            return j + 1, (found_draft, found_target)

        _, found = jax.lax.while_loop(
            lambda carry: carry[0] * chunk < count,
            chunk_step,
            (jnp.int32(0), (found_draft, found_target)),
        )
        if gamma:
            alive = alive & drafted & passed_at(i, *found)
        else:
            alive = jnp.zeros_like(alive)
        return i + 1, alive, found

    state = (jnp.int32(0), jnp.ones(batch, bool), (start(draft), start(target)))
    _, _, (found_draft, found_target) = jax.lax.while_loop(unfinished, step, state)
    draft, target = assembled(draft, found_draft), assembled(target, found_target)
    return (tokens, draft, target, accept, *rest)
