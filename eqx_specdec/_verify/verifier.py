"""The composed verifier of one device, and the contract's entry point."""

import dataclasses
import functools
import typing
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from beartype import beartype
from jaxtyping import Array, Int, jaxtyped

from .._custom_types import (
    AcceptUniforms,
    AcceptUniformsRow,
    DraftProbs,
    DraftProbsRow,
    DraftTokens,
    DraftTokensRow,
    SampleRandomness,
    SampleRandomnessBatch,
    TargetProbs,
    TargetProbsRow,
)
from .._misc import no_type_check
from .._stages.prefix_counter import AbstractPrefixCounter
from .._stages.ratio_test import AbstractRatioTest
from .._stages.residual_sampler import AbstractResidualSampler
from .._stages.row_context import ONE_DEVICE, RowContext
from .._stages.row_fields import per_row_values, with_row_values
from .._stages.threshold_rule import RatioTest
from .._stages.token_assembler import AbstractTokenAssembler, TokenAssembler
from .abstract_verifier import (
    AbstractVerifier,
    check_stages,
    RowReport,
    stage_mismatches,
    verify_row,
)
from .checks import check_level, CheckLevel
from .inputs import prepare_inputs
from .logprobs import check_logprobs, LogProbs, with_logprobs
from .masks import allowed_tokens, mask_problems, masked_probs
from .results import Problem
from .warp import as_log_probs, as_normalised, NormalisedRows, WarpedRows


@no_type_check  # its fields are checked by `__check_init__`
class Verifier(AbstractVerifier):
    """The verification step of speculative decoding, composed from four stages.

    For one row, the stages run in this order:

    1. `ratio_test` decides whether each draft token passes, returning a
        [`eqx_specdec.Verdict`][];
    2. `prefix_counter` turns those outcomes into the number accepted, $n$;
    3. `residual_sampler` draws the correction (or bonus) token $y$;
    4. `token_assembler` writes $(x_0, \\dots, x_{n-1}, y, -1, \\dots)$.

    The defaults are the standard rule of speculative sampling (Leviathan et al. 2023;
    Chen et al. 2023). Swap any stage for another implementation of its abstract base to
    get a different variant. Calling the verifier runs [`eqx_specdec.Verifier.row`][] on
    every row, mapped over the batch as `batching` says (`jax.lax.map` on the CPU,
    `jax.vmap` elsewhere, by default).

    **Arguments:**

    - `ratio_test`: an [`eqx_specdec.AbstractRatioTest`][]. Default
        [`eqx_specdec.RatioTest`][].
    - `prefix_counter`: an [`eqx_specdec.AbstractPrefixCounter`][]. Default: the one
        the ratio test's law needs (its `counter`: [`eqx_specdec.PrefixCounter`][],
        or [`eqx_specdec.LastSuccessCounter`][] for block verification).
    - `residual_sampler`: an [`eqx_specdec.AbstractResidualSampler`][]. Default: the
        ratio test's `sampler` ([`eqx_specdec.ResidualSampler`][], or
        [`eqx_specdec.ArgmaxSampler`][] for greedy and typical acceptance).
    - `token_assembler`: an [`eqx_specdec.AbstractTokenAssembler`][]. Default
        [`eqx_specdec.TokenAssembler`][].
    - `batching`: how `__call__` maps `row` over the batch: `"vmap"` (`jax.vmap`),
        `"map"` (`jax.lax.map`, one row after another) or `"auto"` (the default: `"map"`
        when JAX's default backend is the CPU, `"vmap"` otherwise). Both give identical
        results (tested). On XLA CPU, `vmap` turns the read of row $n$ of each
        sequence into a gather that runs 4x slower than the contiguous slice each
        iteration of `lax.map` reads; on accelerators, `vmap` is the fast one.
    - `allow_mismatch`: build a composition whose counter or sampler does not fit an
        exact ratio test (their `counts` or `draws` differ from those of the test's own
        stages), which is refused otherwise with a `ValueError` naming both stages.
        Such a verifier is lossy (`exact` is False): for lossy controls in tests.
        Default `False`.

    **Attributes:**

    - `exact`: whether the verifier is exact (a Python bool, before tracing): its ratio
        test declares `exact = True` and its counter and sampler fit the test. Lossy
        rules (lenient, typical, relaxed, synthetic) are not.
    """

    ratio_test: AbstractRatioTest
    prefix_counter: AbstractPrefixCounter
    residual_sampler: AbstractResidualSampler
    token_assembler: AbstractTokenAssembler
    batching: Literal["auto", "vmap", "map"] = eqx.field(static=True)
    allow_mismatch: bool = eqx.field(static=True)

    def __init__(
        self,
        ratio_test: AbstractRatioTest = RatioTest(),
        prefix_counter: AbstractPrefixCounter | None = None,
        residual_sampler: AbstractResidualSampler | None = None,
        token_assembler: AbstractTokenAssembler = TokenAssembler(),
        batching: Literal["auto", "vmap", "map"] = "auto",
        allow_mismatch: bool = False,
    ):
        self.ratio_test = ratio_test
        if isinstance(ratio_test, AbstractRatioTest):
            if prefix_counter is None:
                prefix_counter = _class_stage(ratio_test, "counter", "prefix_counter")
            if residual_sampler is None:
                residual_sampler = _class_stage(
                    ratio_test, "sampler", "residual_sampler"
                )
        self.prefix_counter = prefix_counter
        self.residual_sampler = residual_sampler
        self.token_assembler = token_assembler
        self.batching = batching
        self.allow_mismatch = allow_mismatch

    def __check_init__(self):
        if self.batching not in ("auto", "vmap", "map"):
            raise ValueError(
                f'Verifier(`batching`=...) must be "auto", "vmap" or "map", got '
                f"{self.batching!r}."
            )
        if not isinstance(self.allow_mismatch, bool):
            raise TypeError(
                "Verifier(`allow_mismatch`=...) must be a Python bool, got "
                f"{type(self.allow_mismatch).__name__}."
            )
        check_stages("Verifier", vars(self))
        mismatches = stage_mismatches(
            self.ratio_test, self.prefix_counter, self.residual_sampler
        )
        if mismatches and self.ratio_test.exact and not self.allow_mismatch:
            test = type(self.ratio_test).__name__
            raise ValueError(
                f"Verifier: {'; '.join(mismatches)}. The composition would not be "
                f"exact, though {test} is. Leave the stage out to get the one {test} "
                "needs, or pass `allow_mismatch=True` to build it anyway (a lossy "
                "control: its `exact` is then False)."
            )

    @jaxtyped(typechecker=beartype)
    def row(
        self,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        accept_uniforms: AcceptUniformsRow,
        sample_uniform: SampleRandomness,
        context: RowContext = ONE_DEVICE,
    ) -> dict[str, Int[Array, "..."]]:
        """Verifies one row (one sequence).

        **Arguments:**

        - `draft_tokens`: integer of shape `(G,)`.
        - `draft_probs`: float of shape `(G, V)`, or `None` for one-hot drafts.
        - `target_probs`: float of shape `(G + 1, V)`.
        - `accept_uniforms`: float of shape `(G,)`.
        - `sample_uniform`: float scalar (or a `jax.random` key, for a key-driven
            sampler).
        - `context`: the [`eqx_specdec.RowContext`][] the ratio test and sampler get.
            Default: probabilities over the whole vocabulary.

        **Returns:**

        `{"num_accepted": int32 scalar, "tokens": int32 array of shape (gamma + 1,)}`.
        """
        return verify_row(
            self,
            draft_tokens,
            draft_probs,
            target_probs,
            accept_uniforms,
            sample_uniform,
            context,
        )

    def __call__(
        self,
        draft_tokens: DraftTokens,
        draft_probs: DraftProbs | WarpedRows | None,
        target_probs: TargetProbs | WarpedRows,
        accept_uniforms: AcceptUniforms,
        sample_uniforms: SampleRandomnessBatch,
        *,
        log_space: bool = False,
    ) -> dict[str, Int[Array, "..."]]:
        """Verifies a batch: [`eqx_specdec.Verifier.row`][] mapped over the rows (see
        `batching`).

        Arguments and return value as for [`eqx_specdec.speculative_accept`][], which
        also validates the inputs; call this directly only on inputs already checked.
        `log_space=True` when the distributions are log-probabilities (what
        [`eqx_specdec.verify`][] passes for [`eqx_specdec.Logits`][]), which may be
        given as warped logits not yet evaluated (what [`eqx_specdec.Warp`][]`.rows`
        returns): each row's are evaluated inside its own iteration.
        """
        inputs = (draft_tokens, draft_probs, target_probs, accept_uniforms)
        row = functools.partial(verify_row, context=RowContext(log_space=log_space))
        return self._map(row, inputs + (sample_uniforms,), until_failure=True)

    def checked_call(
        self,
        draft_tokens: DraftTokens,
        draft_probs: DraftProbs | WarpedRows | None,
        target_probs: TargetProbs | WarpedRows,
        accept_uniforms: AcceptUniforms,
        sample_uniforms: SampleRandomnessBatch,
        *,
        values: bool,
        log_space: bool = False,
    ) -> tuple[dict[str, Int[Array, "..."]], RowReport]:
        """As [`eqx_specdec.AbstractVerifier.checked_call`][], with each stage's output
        checked inside its row, and rows n of `p` and `q` summarised where the sampler
        reads them."""
        inputs = (draft_tokens, draft_probs, target_probs, accept_uniforms)
        row = functools.partial(
            verify_row,
            context=RowContext(log_space=log_space),
            report=True,
            values=values,
        )
        return self._map(row, inputs + (sample_uniforms,), until_failure=True)

    def at_lengths(
        self,
        lengths: Int[Array, " B"],
        draft_tokens: DraftTokens,
        draft_probs: DraftProbs | None,
        target_probs: TargetProbs,
        accept_uniforms: AcceptUniforms,
        sample_uniforms: SampleRandomnessBatch,
    ) -> dict[str, Int[Array, "..."]]:
        """As [`eqx_specdec.AbstractVerifier.at_lengths`][]: row $b$ is
        [`eqx_specdec.Verifier.row`][] on its first `lengths[b]` draft tokens and
        `lengths[b] + 1` target rows. One verification per row where rows are mapped
        one by one (`batching="map"`: a branch on the length); under `vmap` the branches
        become a select, which runs every length.
        """
        gamma = draft_tokens.shape[1]

        def row(verifier, tokens, q, p, u, s, length):
            def at(size):
                def verified():
                    out = verifier.row(
                        tokens[:size],
                        None if q is None else q[:size],
                        p[: size + 1],
                        u[:size],
                        s,
                    )
                    pad = jnp.full((gamma - size,), -1, jnp.int32)
                    return out["num_accepted"], jnp.concatenate([out["tokens"], pad])

                return verified

            branches = [at(size) for size in range(1, gamma + 1)]
            n, out = jax.lax.switch(jnp.clip(length - 1, 0, gamma - 1), branches)
            return {"num_accepted": n, "tokens": out}

        inputs = (draft_tokens, draft_probs, target_probs, accept_uniforms)
        return self._map(row, inputs + (sample_uniforms, lengths))

    def _map(self, row, inputs, until_failure: bool = False):
        """`row(verifier, *arrays)` over the rows, each row's verifier holding the
        ratio test's per-row field values of that row. With `until_failure` (`row` is
        the verification of `inputs`, in order), warped rows mapped one by one are
        normalised only up to the first position whose test fails, where the test
        allows it (`_until_first_failure`)."""
        rows = per_row_values(self.ratio_test)
        batch = inputs[0].shape[0]
        for name, value in rows.items():
            if value.shape[0] != batch:
                raise ValueError(
                    f"{type(self.ratio_test).__name__}'s `{name}` holds values for "
                    f"{value.shape[0]} rows, but the batch has {batch}: give one per row "
                    "(leading axis B), or one shared by the batch (no batch axis)."
                )

        batching = self.batching
        if batching == "auto":
            batching = "map" if jax.default_backend() == "cpu" else "vmap"
        early = (
            until_failure
            and batching == "map"
            and self._stops_at_failure()
            and _long_rows(inputs[2])
        )

        def verified(values, test, arrays):
            # Warped logits become the row's log-probabilities here, inside its
            # iteration: only the entries its stages read are computed.
            verifier = (
                self if not values else eqx.tree_at(lambda v: v.ratio_test, self, test)
            )
            # Mapped one by one, the sampler's rows n are evaluated apart (`_apart`).
            if (
                not until_failure
                or batching != "map"
                or not any(isinstance(a, NormalisedRows) for a in arrays[1:3])
            ):
                return row(verifier, *(as_log_probs(a) for a in arrays))
            sampled = tuple(_apart(a) for a in arrays[1:3])
            arrays = tuple(as_log_probs(a) for a in arrays)
            return row(verifier, *arrays, sampled=sampled)

        if batching == "vmap":
            # Under vmap a search's branches would become selects running both: the
            # cut-offs and normalisers are found for the whole batch first. One by one,
            # each row's are found in its own iteration, on (G + 1, V) at a time.
            # The barrier holds them and the logits as computed before the map:
            # without it, a program on top-k or top-p rows compiled but never
            # returned on a TPU v5e (JAX 0.10.2), nor with a barrier over the
            # per-row fields alone.
            inputs = tuple(as_normalised(a) for a in inputs)
            inputs = jax.lax.optimization_barrier(inputs)

            def one(values, *arrays):
                test = with_row_values(self.ratio_test, values)
                return verified(values, test, arrays)

            return jax.vmap(one)(rows, *inputs)

        if early:
            inputs = _until_first_failure(self.ratio_test, rows, *inputs)

        def at(batch_arrays, b):
            # Sequence b, indexed from the whole batch inside its iteration (the batch
            # is the loop's unchanged carry: a closure would keep the caller's tracers
            # alive in the traced loop).
            rows, inputs = batch_arrays
            values = _sequence(rows, b)
            test = with_row_values(self.ratio_test, values)
            return batch_arrays, verified(values, test, _sequence(inputs, b))

        return jax.lax.scan(at, (rows, inputs), jnp.arange(batch, dtype=jnp.int32))[1]

    def _stops_at_failure(self) -> bool:
        """Whether warped rows may be normalised only up to the first position whose
        test fails: nothing after it changes the outputs (the test is `causal`, the
        counter counts up to the first failure), and calling the test once per position
        costs little (it reads only the draft tokens' values)."""
        test = self.ratio_test
        return (
            test.causal
            and test.reads == "draft tokens"
            and self.prefix_counter.counts == "first failure"
        )


def _class_stage(ratio_test: AbstractRatioTest, name: str, role: str):
    """The stage a ratio test names at class level (`counter`, `sampler`), refused when
    it holds parameters: a class attribute cannot see the test instance's fields, so
    its parameters would silently be other than the test's."""
    stage = getattr(ratio_test, name)
    if jax.tree_util.tree_leaves(stage):
        test, kind = type(ratio_test).__name__, type(stage).__name__
        raise ValueError(
            f"Verifier: {test} names {kind}(...) as its class-level `{name}`, which "
            f"holds parameters of its own: a class attribute cannot see {test}'s "
            f"fields, so {kind}'s parameters would not be {test}'s. Write the rule as "
            "an eqx_specdec.AbstractThresholdRule (its correction is derived from its "
            f"acceptance, with its own fields), or pass `{role}=` built from the "
            "test's parameters."
        )
    return stage


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


@typing.no_type_check  # validated by hand, with messages naming the argument
def probability_step(
    draft_tokens: DraftTokens,
    draft_probs: DraftProbs | None,
    target_probs: TargetProbs,
    accept_uniforms: AcceptUniforms | None,
    sample_uniforms: SampleRandomnessBatch | None,
    *,
    verifier: AbstractVerifier,
    check_inputs: CheckLevel = "read",
    logprobs: LogProbs | None = None,
    allowed: Array | None = None,
    draft_allowed: bool = True,
) -> tuple[dict[str, Array], list[Problem]]:
    """The step on probabilities (chains), traced inside [`eqx_specdec.verify`][]'s
    program: arguments as [`eqx_specdec.speculative_accept`][] has them. Returns the
    outputs' dict and the run-time checks' problems (none with checks off)."""
    entry = "verify"
    level = check_level(check_inputs)
    logprobs = check_logprobs(logprobs, entry, raw_available=False)
    inputs = prepare_inputs(
        entry,
        verifier,
        (draft_tokens, draft_probs, target_probs, accept_uniforms, sample_uniforms),
        log_space=False,
    )

    arrays = inputs.arrays()
    if allowed is not None:
        mask = allowed_tokens(allowed, inputs.target.shape)
        tokens, draft, target, accept, sample = arrays
        target = masked_probs(target, mask)
        if draft is not None and draft_allowed:
            draft = masked_probs(draft, mask[:, :-1])
        arrays = (tokens, draft, target, accept, sample)

    def with_requested(outputs):
        return with_logprobs(outputs, logprobs, arrays[2], log_space=False)

    if level is None:
        return with_requested(verifier(*arrays)), []
    values = inputs.values_in_rows(verifier, level)
    outputs, report = verifier.checked_call(*arrays, values=values)
    problems = inputs.problems(verifier, outputs, report)
    if allowed is not None:  # first: a bad mask explains the masked rows' problems
        problems = mask_problems(mask, arrays[2], log_space=False) + problems
    return with_requested(outputs), problems
