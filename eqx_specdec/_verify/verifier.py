"""The composed verifier of one device, and the contract's entry point."""

import functools
import typing
from typing import Literal

import equinox as eqx
import jax
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
from .._exactness import refuse_inexact
from .._misc import no_type_check
from .._stages.prefix_counter import AbstractPrefixCounter
from .._stages.ratio_test import AbstractRatioTest, RatioTest
from .._stages.residual_sampler import AbstractResidualSampler
from .._stages.row_fields import per_row_values, with_row_values
from .._stages.token_assembler import AbstractTokenAssembler, TokenAssembler
from .abstract_verifier import (
    AbstractVerifier,
    check_stages,
    RowReport,
    stage_mismatches,
    verify_row,
)
from .checks import check_level, checked, CheckLevel
from .dispatch import entry_point
from .inputs import prepare_inputs
from .logprobs import check_logprobs, LogProbs, with_logprobs
from .masks import allowed_tokens, mask_problems, masked_probs


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
                prefix_counter = ratio_test.counter
            if residual_sampler is None:
                residual_sampler = ratio_test.sampler
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
    ) -> dict[str, Int[Array, "..."]]:
        """Verifies one row (one sequence).

        **Arguments:**

        - `draft_tokens`: integer of shape `(G,)`.
        - `draft_probs`: float of shape `(G, V)`, or `None` for one-hot drafts.
        - `target_probs`: float of shape `(G + 1, V)`.
        - `accept_uniforms`: float of shape `(G,)`.
        - `sample_uniform`: float scalar (or a `jax.random` key, for a key-driven
            sampler).

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
        )

    def __call__(
        self,
        draft_tokens: DraftTokens,
        draft_probs: DraftProbs | None,
        target_probs: TargetProbs,
        accept_uniforms: AcceptUniforms,
        sample_uniforms: SampleRandomnessBatch,
    ) -> dict[str, Int[Array, "..."]]:
        """Verifies a batch: [`eqx_specdec.Verifier.row`][] mapped over the rows (see
        `batching`).

        Arguments and return value as for [`eqx_specdec.speculative_accept`][], which
        also validates the inputs; call this directly only on inputs already checked.
        """
        inputs = (draft_tokens, draft_probs, target_probs, accept_uniforms)
        return self._map(Verifier.row, inputs + (sample_uniforms,))

    def checked_call(
        self,
        draft_tokens: DraftTokens,
        draft_probs: DraftProbs | None,
        target_probs: TargetProbs,
        accept_uniforms: AcceptUniforms,
        sample_uniforms: SampleRandomnessBatch,
        *,
        values: bool,
    ) -> tuple[dict[str, Int[Array, "..."]], RowReport]:
        """As [`eqx_specdec.AbstractVerifier.checked_call`][], with each stage's output
        checked inside its row, and rows n of `p` and `q` summarised where the sampler
        reads them."""
        inputs = (draft_tokens, draft_probs, target_probs, accept_uniforms)
        row = functools.partial(verify_row, report=True, values=values)
        return self._map(row, inputs + (sample_uniforms,))

    def _map(self, row, inputs):
        """`row(verifier, *arrays)` over the rows, each row's verifier holding the
        ratio test's per-row field values of that row."""
        rows = per_row_values(self.ratio_test)
        batch = inputs[0].shape[0]
        for name, value in rows.items():
            if value.shape[0] != batch:
                raise ValueError(
                    f"{type(self.ratio_test).__name__}'s `{name}` holds values for "
                    f"{value.shape[0]} rows, but the batch has {batch}: give one per row "
                    "(leading axis B), or one shared by the batch (no batch axis)."
                )

        def one(values, *arrays):
            test = with_row_values(self.ratio_test, values)
            verifier = (
                self if not values else eqx.tree_at(lambda v: v.ratio_test, self, test)
            )
            return row(verifier, *arrays)

        batching = self.batching
        if batching == "auto":
            batching = "map" if jax.default_backend() == "cpu" else "vmap"
        if batching == "vmap":
            return jax.vmap(one)(rows, *inputs)
        return jax.lax.map(lambda arrays: one(*arrays), (rows,) + inputs)


@entry_point
@typing.no_type_check  # validated by hand, with messages naming the argument
def speculative_accept(
    draft_tokens: DraftTokens,
    draft_probs: DraftProbs | None,
    target_probs: TargetProbs,
    accept_uniforms: AcceptUniforms | None,
    sample_uniforms: SampleRandomnessBatch | None,
    *,
    verifier: AbstractVerifier = Verifier(),
    check_inputs: CheckLevel = "read",
    logprobs: LogProbs | None = None,
    allowed: Array | None = None,
    draft_allowed: bool = True,
    exact_only: bool = False,
) -> dict[str, Array]:
    """Runs one verification step of speculative decoding on a batch.

    For each row $b$, draft token $x_i$ passes when $u_i\\, q_i(x_i) < p_i(x_i)$; the
    number accepted $n$ counts the passes before the first failure; the correction token
    $y$ is drawn by inverse CDF with uniform $s$ from
    $\\operatorname{norm}((p_n - q_n)_+)$ (or from $p_G$ when $n = G$). Those are the
    default stages; `verifier` swaps them.

    Compiled on first use with Equinox's filter semantics (as `eqx.filter_jit` does):
    every array, the arrays inside `verifier`'s stages included, is traced; every other
    value (a stage's Python `bool`, `int`, `float`, `str` or tuple fields) is static, so
    stages may use such fields in Python control flow, and each new value compiles
    once. Works as well inside `jax.jit`, `eqx.filter_jit`, `jax.vmap` and
    `eqx.filter_vmap` (over a stacked verifier, say). The only randomness is the
    supplied uniforms: the same inputs give bit-identical outputs.

    **Arguments:**

    - `draft_tokens`: integer of shape `(B, G)`, the draft tokens $x_i$, in `[0, V)`.
    - `draft_probs`: float of shape `(B, G, V)`, the distributions $q_i$ the draft tokens
        were sampled from; `None` for one-hot drafts ($q_i = \\mathrm{onehot}(x_i)$:
        n-gram, prompt-lookup and argmax drafters).
    - `target_probs`: float of shape `(B, G + 1, V)`, the target's distributions $p_i$;
        row `G` follows the last draft token.
    - `accept_uniforms`: float of shape `(B, G)`, the uniforms $u_i \\in [0, 1)$. May be
        `None` when the verifier's ratio test draws no randomness (greedy, typical).
    - `sample_uniforms`: float of shape `(B,)`, the uniforms $s \\in [0, 1)$. For a
        sampler driven by keys ([`eqx_specdec.GumbelSampler`][]), a `jax.random` key
        array of shape `(B,)`; `None` for a deterministic sampler
        ([`eqx_specdec.ArgmaxSampler`][]).
    - `verifier`: the [`eqx_specdec.AbstractVerifier`][] to run (a
        [`eqx_specdec.Verifier`][] or [`eqx_specdec.ShardedVerifier`][]). Default: the
        standard rule.
    - `check_inputs`: the run-time check level, a Python string (see the Correctness
        page for what each guarantees and costs):
        - `"read"` (the default): every value the verification reads: token ids in
            `[0, V)`, uniforms in `[0, 1)`, $p_i(x_i)$ and $q_i(x_i)$ finite and in
            `[0, 1]` at every position, the whole rows $n$ of `p` and `q` finite,
            non-negative and summing to 1 within `1e-3` (`1e-2` for float16 and
            bfloat16), and what each stage returned. Stages that read whole rows (their
            `reads` attribute) get every row checked.
        - `"all"`: every row of every distribution as well.
        - `"off"`: nothing; the program is the verifier's own. The outputs are still
            int32 arrays of the right shapes, their values unspecified for invalid
            inputs.

        Under `jax.jit`, mark it static: `jax.jit(speculative_accept,
        static_argnames="check_inputs")` (`eqx.filter_jit` does so by itself).
    - `logprobs`: `None` (the default: the outputs below only), or an
        [`eqx_specdec.LogProbs`][]: the outputs also hold the log-probabilities of the
        emitted tokens under the target rows given (and, with `top_k`, each emitted
        position's most likely tokens).
    - `allowed`: `None`, or each position's allowed tokens (structured output): bool
        of shape `(B, G + 1, V)`, or uint32 bits `(B, G + 1, ceil(V / 32))` (token $v$
        is bit `v % 32` of word `v // 32`). Every target row is restricted to its
        allowed tokens and renormalised, the correction and bonus rows included, so the
        emitted tokens follow the masked target; a draft token outside its mask has
        target probability 0 and is rejected.
    - `draft_allowed`: whether the draft sampled under the same mask (default `True`):
        its rows are then masked and renormalised too, as the law it drew from.
    - `exact_only`: `True` to refuse (a `ValueError`, before tracing) a verifier that is
        not exact (`verifier.exact` is False: a lossy rule, or stages built with
        `allow_mismatch=True`): for users who must not change the distribution. Default
        `False`.

    **Returns:**

    A dict with `"num_accepted"`, int32 of shape `(B,)`, and `"tokens"`, int32 of shape
    `(B, G + 1)`: the accepted draft tokens, the correction token, then `-1`.

    **Raises:**

    - `ValueError`: at trace time, when a rank or shape is wrong or the shapes disagree;
        the message names the argument, the expected shape and the one received.
    - `TypeError`: at trace time, when `draft_tokens` is not integer or a probability or
        uniform array is not floating, or `verifier` is not a `Verifier`.
    - [`eqx_specdec.InvalidInputError`][]: when a checked value is invalid or a stage
        returned a value outside its contract; the message names the argument (or the
        stage's class), the problem, the first offending row and the fix. On the CPU,
        raised at the call (the call waits for the check). On accelerators, and inside
        a `jax.jit` of yours, the check is a branch of the program that reaches the host
        only on a problem, and JAX raises it as its `JaxRuntimeError` (the base class)
        when an output is read.
    """
    level = check_level(check_inputs)
    refuse_inexact("speculative_accept", verifier, exact_only)
    logprobs = check_logprobs(logprobs, "speculative_accept", raw_available=False)
    inputs = prepare_inputs(
        "speculative_accept",
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
        return with_requested(verifier(*arrays))
    values = inputs.values_in_rows(verifier, level)
    outputs, report = verifier.checked_call(*arrays, values=values)
    problems = inputs.problems(verifier, outputs, report)
    if allowed is not None:  # first: a bad mask explains the masked rows' problems
        problems = mask_problems(mask, arrays[2], log_space=False) + problems
    return checked(with_requested(outputs), problems)
