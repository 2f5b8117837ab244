"""The composed verifier of one device, and the contract's entry point."""

import functools
import typing
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from beartype import beartype
from jaxtyping import Array, Int, jaxtyped

from .._backend.abstract_row_mapping import RowVerification
from .._backend.mapping import row_mapping
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
from .._inputs.checks import check_level, CheckLevel
from .._inputs.logprobs import check_logprobs, LogProbs, with_logprobs
from .._inputs.masks import allowed_tokens, mask_problems, masked_probs
from .._inputs.results import Problem
from .._misc import given_as_arrays, no_type_check
from .._stages.prefix_counter import AbstractPrefixCounter
from .._stages.ratio_test import AbstractRatioTest
from .._stages.residual_sampler import AbstractResidualSampler
from .._stages.row_context import ONE_DEVICE, RowContext
from .._stages.row_fields import per_row_values
from .._stages.threshold_rule import RatioTest
from .._stages.token_assembler import AbstractTokenAssembler, TokenAssembler
from .._warps.warp import as_logits, WarpedRows
from .abstract_verifier import (
    AbstractVerifier,
    check_stages,
    decide_row,
    RowReport,
    stage_mismatches,
    verify_row,
)
from .inputs import prepare_inputs


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
        `"map"` (`jax.lax.map`, one row after another), `"pallas"` (`jax.vmap`, with
        the rows read by Pallas kernels where they compute what the stages would: rows
        $n$ of the batch for the standard [`eqx_specdec.ResidualSampler`][] on float32
        probabilities, or normalised warped float32 logits, whose vocabulary fills whole
        128-lane tiles; greedy verification's argmaxes, each sequence's rows read up to
        its first rejection; elsewhere `"vmap"`; off the TPU the kernels run in Pallas's
        interpret mode, for tests) or `"auto"` (the default: on the CPU, `"vmap"` with
        the sampler's pass over rows $n$ run one sequence after another where the rows
        are given as arrays and the batch's rows $n$ hold $2^{21}$ entries or more,
        else `"map"`, and `"vmap"` for greedy verification, which reads no row $n$; on
        a TPU, `"pallas"` from 65,536 entries and `"vmap"` below, and for greedy
        verification from $2^{21}$ entries a position; elsewhere `"vmap"`). All give the same tokens (tested). On XLA CPU, `vmap` turns the
        read of row $n$ of each sequence into a gather that runs 4x slower than the
        contiguous slice each iteration of `lax.map` reads; on a TPU v5e, the kernel
        reads rows $n$ of 128,256 entries five times faster than `vmap`'s gather.
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
    batching: Literal["auto", "vmap", "map", "pallas"] = eqx.field(static=True)
    allow_mismatch: bool = eqx.field(static=True)

    def __init__(
        self,
        ratio_test: AbstractRatioTest = RatioTest(),
        prefix_counter: AbstractPrefixCounter | None = None,
        residual_sampler: AbstractResidualSampler | None = None,
        token_assembler: AbstractTokenAssembler = TokenAssembler(),
        batching: Literal["auto", "vmap", "map", "pallas"] = "auto",
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
        if self.batching not in ("auto", "vmap", "map", "pallas"):
            raise ValueError(
                'Verifier(`batching`=...) must be "auto", "vmap", "map" or "pallas", '
                f"got {self.batching!r}."
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
        verification = _verification(
            self, RowContext(log_space=log_space), values=False, checked=False
        )
        row = functools.partial(verify_row, context=verification.context)
        return self._map(row, inputs + (sample_uniforms,), verification)

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
        verification = _verification(
            self, RowContext(log_space=log_space), values, checked=True
        )
        row = functools.partial(
            verify_row, context=verification.context, report=True, values=values
        )
        return self._map(row, inputs + (sample_uniforms,), verification)

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

    def _map(self, row, inputs, verification: RowVerification | None = None):
        """`row(verifier, *arrays)` over the rows, each row's verifier holding the
        ratio test's per-row field values of that row, mapped as the backend's
        [`AbstractRowMapping`][eqx_specdec._backend.abstract_row_mapping.AbstractRowMapping]
        for `batching` does it. `verification`: `row` is the verification of
        `inputs`, in order (see `RowVerification`)."""
        values = per_row_values(self.ratio_test)
        argmax_only = (
            self.ratio_test.reads == "argmax"
            and self.residual_sampler.draws == "argmax"
        )
        if argmax_only:
            # Both stages read each row's argmax alone: warped logits as they are.
            inputs = tuple(as_logits(a) for a in inputs)
        batch = inputs[0].shape[0]
        for name, value in values.items():
            if value.shape[0] != batch:
                raise ValueError(
                    f"{type(self.ratio_test).__name__}'s `{name}` holds values for "
                    f"{value.shape[0]} rows, but the batch has {batch}: give one per row "
                    "(leading axis B), or one shared by the batch (no batch axis)."
                )
        rows_given = given_as_arrays(*inputs[1:3])
        shape = (batch, jax.tree_util.tree_leaves(inputs[2])[0].shape[-1])
        mapping = row_mapping(self.batching, argmax_only, rows_given, shape)
        return mapping(self, row, values, inputs, verification)


def _verification(
    verifier: AbstractVerifier, context: RowContext, values: bool, checked: bool
) -> RowVerification:
    """What a mapping is told of `verifier`'s verification of rows: see
    `RowVerification`."""
    decide = functools.partial(decide_row, context=context)
    fit = not stage_mismatches(
        verifier.ratio_test, verifier.prefix_counter, verifier.residual_sampler
    )
    return RowVerification(context, values, decide, fit, checked)


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
    argmax_only = inputs.argmax_in_rows(verifier, level)
    problems = inputs.problems(verifier, outputs, report, argmax_only=argmax_only)
    if allowed is not None:  # first: a bad mask explains the masked rows' problems
        problems = mask_problems(mask, arrays[2], log_space=False) + problems
    return with_requested(outputs), problems
