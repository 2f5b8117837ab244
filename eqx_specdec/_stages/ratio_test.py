"""The ratio test's abstract base: the extension point for acceptance rules, with the
capabilities the library's features need of a rule."""

import abc
from typing import ClassVar, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from equinox import AbstractClassVar
from jaxtyping import Array, Float, Int

from .._capabilities import capability, require
from .._custom_types import (
    AcceptUniformsRow,
    DraftProbsRow,
    DraftTokensRow,
    TargetProbsRow,
)
from .._errors import missing_capability
from .prefix_counter import AbstractPrefixCounter, PrefixCounter
from .residual_sampler import AbstractResidualSampler, ResidualSampler
from .row_context import ONE_DEVICE, RowContext
from .verdict import Verdict


PassProbabilities = Float[Array, "G V"]


TheoryKind = Literal["exact", "lower bound"]


class AbstractRatioTest(eqx.Module):
    """Decides, for every draft position of one row, whether the draft token passes.

    This is the extension point for acceptance rules. A subclass implements `__call__`
    and declares `exact`; everything else in the pipeline (counting the accepted prefix,
    drawing the correction token, assembling the output) is done by the other stages of
    the [`eqx_specdec.Verifier`][].

    For the verifier to stay lossless, the test at position $i$ must pass with
    probability $\\min(1, p_i(x_i) / q_i(x_i))$ given the accepted prefix (or, for rules
    such as block verification, with the probabilities the matching prefix counter and
    residual expect).

    **Declared by every subclass:**

    - `exact` (class attribute, bool): whether the rule is exact: with the counter and
        sampler it names below, the emitted tokens follow the target exactly (for a
        rule whose sampler `draws` `"argmax"`, greedy decoding of it). `False` for a
        lossy rule (lenient, typical, relaxed). A [`eqx_specdec.Verifier`][] is exact
        when its test is and its other stages fit the test (`verifier.exact`); the
        exactness tools check this claim ([`eqx_specdec.evaluation.emission_by_quadrature`][]).

    **Capabilities** (methods with a default that raises
    [`eqx_specdec.MissingCapabilityError`][]; implement those the features you use
    need): `pass_probabilities` (the decoding loop's theory and the acceptance
    objectives) and `quadrature_breakpoints` (exact evaluation).

    **Declared with a default** (class attributes; most rules keep them):

    - `vocab_parallel` (default `False`): `True` when `__call__` reduces over the
        vocabulary only through its [`eqx_specdec.RowContext`][] (`gather`, `sum`,
        `argmax`), so that it runs unchanged on one device's slice of the vocabulary
        ([`eqx_specdec.ShardedVerifier`][] with `vocab_axis`).
    - `uses_uniforms` (default `True`): `False` for a test that never reads
        `accept_uniforms` (the entry points then accept `accept_uniforms=None`).
    - `counter` and `sampler` (default [`eqx_specdec.PrefixCounter`][]`()` and
        [`eqx_specdec.ResidualSampler`][]`()`): the stages the rule's law needs. A
        [`eqx_specdec.Verifier`][] built with the test alone uses them (block
        verification brings its [`eqx_specdec.LastSuccessCounter`][]), and refuses, for
        an exact test, a counter or sampler that does not fit them: one whose `counts`
        (or `draws`) differs from theirs.
    - `theory` (default `"exact"`): what `pass_probabilities` gives, `"exact"` (the
        test passes $v$ with exactly that probability) or `"lower bound"` (the rule
        accepts at least as many tokens in expectation).
    - `causal` (default `False`, always safe): `True` when the outcome at position $i$
        depends on nothing after $i$ (draft tokens, rows or uniforms). With a counter
        that counts up to the first failure, nothing after the first failing position
        then changes the outputs. For such a test that reads only the draft tokens'
        values (`reads` below), [`eqx_specdec.Verifier`][] mapping rows one by one
        normalises warped logits (from [`eqx_specdec.Warp`][]) of 1,024 or more
        entries a row position by position, calling the test of every sequence after
        each, and stops each sequence at its first rejection.
    - `reads` (default `"whole rows"`, always safe): which values the test reads, so
        that the entry points' default checks (`check_inputs="read"`) validate exactly
        those: `"draft tokens"` for a test that reads only $p_i(x_i)$ and $q_i(x_i)$
        (the standard test); `"argmax"` for one that reads the rows only through
        `context.argmax` (greedy verification), whose verdict no strictly increasing
        map of a row changes: with a sampler that `draws` `"argmax"`, the verifier
        then hands both warped logits as they are, never computing the warp's
        normalisers (see [`eqx_specdec.Warp`][]).

    For rules built from other rules, or keyed on the generated position:
    `capabilities_from` (which capabilities it delegates to which fields: `{"vocab_parallel":
    (("inner", "vocab_parallel"),)}`), `row_fields` (fields that may hold one value per
    row, by name with the rank of one row's value: `{"relaxed": 1}`), the method
    `in_decoding_loop`, and `pass_probabilities_given_drafts` (derived from an exact
    `pass_probabilities` by default).
    """

    exact: AbstractClassVar[bool]
    vocab_parallel: ClassVar[bool] = False
    uses_uniforms: ClassVar[bool] = True
    counter: ClassVar[AbstractPrefixCounter] = PrefixCounter()
    sampler: ClassVar[AbstractResidualSampler] = ResidualSampler()
    theory: ClassVar[TheoryKind] = "exact"
    causal: ClassVar[bool] = False
    reads: ClassVar[Literal["draft tokens", "argmax", "whole rows"]] = "whole rows"
    row_fields: ClassVar[dict[str, int]] = {}
    capabilities_from: ClassVar[dict[str, tuple[tuple[str, str], ...]]] = {}

    def in_decoding_loop(self, generated: Int[Array, " B"]) -> "AbstractRatioTest":
        """Called by [`eqx_specdec.speculative_decode`][] before each verification with
        each row's number of tokens generated so far; returns the test to run (the
        default: itself). A test keyed on the generated position fills a row field."""
        return self

    @abc.abstractmethod
    def __call__(
        self,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        accept_uniforms: AcceptUniformsRow,
        context: RowContext = ONE_DEVICE,
    ) -> Verdict:
        """Runs the test at every draft position of one row.

        **Arguments:**

        - `draft_tokens`: integer of shape `(G,)`, the draft tokens $x_i$.
        - `draft_probs`: float of shape `(G, V)`, the draft distributions $q_i$,
            or `None` for one-hot drafts ($q_i = \\mathrm{onehot}(x_i)$).
        - `target_probs`: float of shape `(G + 1, V)`, the target distributions
            $p_i$; the last row follows the last draft token.
        - `accept_uniforms`: float of shape `(G,)`, the uniforms $u_i \\in [0, 1)$
            (zeros for a test with `uses_uniforms = False`).
        - `context`: the [`eqx_specdec.RowContext`][]: whether the rows hold
            probabilities or log-probabilities, and (inside
            [`eqx_specdec.ShardedVerifier`][]) the slice of the vocabulary they cover.
            Default: probabilities over the whole vocabulary.

        **Returns:**

        A [`eqx_specdec.Verdict`][] holding the per-position outcomes (and, for rules
        that need it, the residual scale).
        """

    @capability
    def pass_probabilities(
        self, draft_law: PassProbabilities, target_probs: PassProbabilities
    ) -> PassProbabilities:
        """Capability for the decoding loop's theory
        ([`eqx_specdec.DecodeResult`][]`.theory_reached`): for each position $i$ and
        token $v$, the probability $a_i(v)$ that the test passes $v$ when $v$ is drafted
        at $i$ and the prefix before it was accepted. Traced (called inside the loop).

        **Arguments:**

        - `draft_law`: float `(G, V)`, the law $q_i$ the draft tokens follow.
        - `target_probs`: float `(G, V)`, the target rows $p_0..p_{G-1}$.

        **Returns:**

        `a`: float `(G, V)`; the class's `theory` says whether these are exact
        or a lower bound.
        """

    def pass_probabilities_given_drafts(
        self,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
    ) -> Float[Array, " G"]:
        """For the acceptance objectives given the drafts
        ([`eqx_specdec.evaluation.acceptance_by_position`][] with `draft_tokens`), with a working
        default: per position of
        one row, the probability over the uniforms that the test passes $x_i$, given all
        the draft tokens (positions must pass independently given them). Traced,
        differentiable. By default, the drafts' entries of an `"exact"`
        `pass_probabilities`; block verification overrides it.

        **Arguments:** one row of probabilities, as for `__call__`.

        **Returns:** float of shape `(G,)`, in $[0, 1]$.
        """
        if self.theory != "exact":
            raise missing_capability(
                self,
                "pass_probabilities_given_drafts",
                "the acceptance objectives given the draft tokens (its "
                f'`pass_probabilities` are a "{self.theory}", not exact)',
            )
        require(
            self,
            "pass_probabilities",
            "the acceptance objectives given the draft tokens",
        )
        if draft_probs is None:
            draft_probs = jax.nn.one_hot(
                draft_tokens, target_probs.shape[-1], dtype=target_probs.dtype
            )
        probs = self.pass_probabilities(draft_probs, target_probs[:-1])
        return jnp.take_along_axis(probs, draft_tokens[:, None], axis=1)[:, 0]

    @capability
    def argmax_pass(
        self,
        draft_tokens: Int[Array, "B G"],
        target_probs,
        context: RowContext = ONE_DEVICE,
        *,
        kernel: bool = False,
    ) -> Int[Array, "B G+1"] | None:
        """Capability, for a test that reads the rows through `context.argmax` alone
        and passes $x_i$ exactly when it is row $i$'s argmax (greedy verification):
        the argmaxes of the whole batch, found before the rows are verified, which each
        row's `context.argmax` of its `target_probs` then returns (so does the argmax
        sampler's). A backend calls it only when the verifier's counter and sampler fit
        the test (a counter up to the first failure).

        **Arguments:** `draft_tokens` `(B, G)`; `target_probs` `(B, G + 1, V)` as the
        rows are given (an array, or warped rows); `context`; `kernel`: in the
        backend's kernel form where there is one (a Pallas kernel, on the TPU).

        **Returns:** `None` where each row is left to take its own, else int32
        `(B, G + 1)`: row $i$'s argmax, as `context.argmax` gives it, for $i$ up to
        the first position whose argmax is not its draft token (the bonus row $G$
        when there is none), and $V$ (no token) after it, for rows never read.
        """

    @capability
    def normalise_pass(
        self,
        draft_tokens: Int[Array, "B G"],
        draft_rows,
        target_rows,
        accept_uniforms: Float[Array, "B G"],
        context: RowContext = ONE_DEVICE,
        *,
        kernel: bool = False,
    ) -> tuple | None:
        """Capability, for a `causal` test reading the draft tokens' values alone, on
        warped rows: the batch's rows normalised before they are verified, only up to
        each sequence's first position where the test fails (the rows after it stay
        unread, every log-probability `-inf`). A backend calls it only when the
        verifier's counter and sampler fit the test (a counter up to the first
        failure), so that the rows left unread never change the outputs.

        **Arguments:** `draft_tokens` `(B, G)`; `draft_rows` (`(B, G, V)`, or `None`
        for one-hot drafts) and `target_rows` (`(B, G + 1, V)`) as the rows are given
        (warped rows, as `Warp.rows` returns them, or arrays); `accept_uniforms`
        `(B, G)`; `context`; `kernel`: in the backend's kernel form where there is one
        (a Pallas kernel, on the TPU).

        **Returns:** `None` where the backend normalises every row itself, else
        `(draft_rows, target_rows)` with their cut-offs and normalisers found (`None`
        for one-hot drafts).
        """

    @capability
    def quadrature_breakpoints(self, draft_probs, target_probs) -> dict:
        """Capability for exact quadrature
        ([`eqx_specdec.evaluation.emission_by_quadrature`][], [`eqx_specdec.evaluation.evaluate_verifier`][]):
        the values of the uniforms at which the test's outcome can change, beyond the
        standard ratios $p_i(v) / q_i(v)$ (which the quadrature always cuts at). NumPy,
        not traced.

        **Arguments:**

        - `draft_probs`: float64 NumPy `(G, V)`, or `None` for one-hot drafts.
        - `target_probs`: float64 NumPy `(G + 1, V)`.

        **Returns:**

        A dict with any of `"accept_breakpoints"` (`(G, K)`: further values of
        $u_i$) and `"sample_breakpoints"` (`(K,)`: further values of $s$, where the test
        changes the correction's distribution, as block verification's residual
        scale does); `{}` if there are none.
        """
