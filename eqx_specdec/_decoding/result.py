"""What the decoding loop returns, and the theory of its acceptance."""

from typing import Literal

import equinox as eqx
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

from .._errors import MissingCapabilityError
from .._inputs.results import RESULTS


#: `DecodeResult.finish_reasons`: the row generated its limit (`num_tokens` or its
#: `max_lengths` entry).
FINISH_LENGTH = 0
#: `DecodeResult.finish_reasons`: the row generated one of the stop tokens.
FINISH_STOP = 1
#: `DecodeResult.finish_reasons`: a model returned a row that is not a distribution for
#: this row; the row stopped before using it (see `DecodeResult.error_positions`).
FINISH_ERROR = 2


class DecodeResult(eqx.Module):
    """What [`eqx_specdec.speculative_decode`][] returns: the generated tokens and the
    per-row statistics of the run.

    **Fields:**

    - `tokens`: int32 of shape `(B, L)`, the `L` generated tokens of each row (the prompt
        excluded).
    - `target_calls`: int32 of shape `(B,)`, the verification steps (calls of the target
        model) each row took.
    - `accepted_histogram`: int32 of shape `(B, G + 1)`: entry `[b, n]` counts the steps of
        row `b` that accepted `n` draft tokens.
    - `theory_reached`: float32 of shape `(B, G + 1)`: entry `[b, k]` sums, over the steps
        of row `b`, the probability $P(n \\ge k \\mid \\text{prefix})$ that the verifier
        accepts at least `k` draft tokens, computed from the models' own distributions
        (NaN when there is no theory; see `theory`).
    - `theory`: `"exact"` (the ratio test's own pass probabilities, from its
        [`eqx_specdec.AbstractRatioTest.pass_probabilities`][]), `"lower bound"` (block
        verification: the standard rule's value, which it never falls below) or
        `"none"` (trees, and ratio tests that do not implement `pass_probabilities`).
    - `drafted`: int32 of shape `(B,)`, the draft tokens each row drafted (one draft
        call each for a chain: $G$ per step, or the draft-length policy's choice; a
        tree's node count per step).
    - `drafting_steps`: int32 of shape `(B,)`, the steps in which the row drafted at
        least one token (the others, under a draft-length policy that allows none, were
        plain decoding steps).
    - `scored_tokens`: int32 of shape `(B,)`, the tokens the target's calls scored
        over the steps the row ran, over the whole batch: a padded call scores every
        row at one width ($G + 1$, a tree's node count plus one, or 1 in a trimmed
        chain's step where no running row drafted), padding included; a packed call
        (a trimmed chain with an [`eqx_specdec.models.AbstractPackedModel`][] target)
        its size. Rows run for a prefix of the loop's steps, so the largest entry (the
        row with the most `target_calls`) is the run's count: with per-call times, the
        cost model of the run.
    - `logprobs`: float32 of shape `(B, L)`, the target's log-probability of each
        generated token under the distribution it was verified against, with
        `speculative_decode(..., logprobs=True)`; `None` otherwise. -inf after a
        row's length.
    - `lengths`: int32 of shape `(B,)`, the tokens each row generated: up to and
        including its first stop token, at most its limit. Its `tokens` after that are
        -1.
    - `finish_reasons`: int32 of shape `(B,)`: 0 when the row generated its limit, 1
        when it generated a stop token, 2 when a model returned, for this row, a
        distribution that is not one (NaN, infinite, negative, or a sum away from 1;
        logits after their softmax): the row stopped there, and nothing drawn from that
        step is emitted (`finish_reason_names` spells them).
    - `error_steps`, `error_positions`: int32 of shape `(B,)`: for a row that finished
        with an error, the loop's step and the generated position (the index in
        `tokens` of the first token that step would have produced) where a model's
        output was invalid; -1 for the other rows.
    - `result`, `failed_row`: the [`eqx_specdec.RESULTS`][] member of the first
        problem found (`RESULTS.invalid_model_output`, or `RESULTS.successful`) and
        its first row (-1 for none), as [`eqx_specdec.Verification`][] has them (the
        loop fills both).
    """

    tokens: Int[Array, "B length"]
    target_calls: Int[Array, " B"]
    accepted_histogram: Int[Array, "B G_plus_1"]
    theory_reached: Float[Array, "B G_plus_1"]
    theory: Literal["exact", "lower bound", "none"] = eqx.field(static=True)
    drafted: Int[Array, " B"] | None = None
    logprobs: Float[Array, "B length"] | None = None
    lengths: Int[Array, " B"] | None = None
    finish_reasons: Int[Array, " B"] | None = None
    error_steps: Int[Array, " B"] | None = None
    error_positions: Int[Array, " B"] | None = None
    drafting_steps: Int[Array, " B"] | None = None
    scored_tokens: Int[Array, " B"] | None = None
    result: RESULTS | None = None
    failed_row: Int[ArrayLike, ""] | None = None

    def _theory_reached(self) -> np.ndarray:
        if self.theory == "none":
            raise MissingCapabilityError(
                "This DecodeResult has no theoretical acceptance (`theory` is "
                "'none'): the run verified trees, or its ratio test does not "
                "implement `pass_probabilities`. Implement "
                "`AbstractRatioTest.pass_probabilities` on the chain's ratio test (see "
                "the abstract base's documentation) to get it."
            )
        return np.asarray(self.theory_reached, np.float64).sum(0)

    def finish_reason_names(self) -> list[str]:
        """Each row's finish reason as serving APIs spell it: `"length"`, `"stop"` or
        `"error"`."""
        if self.finish_reasons is None:
            raise ValueError("This DecodeResult has no `finish_reasons`.")
        names = {FINISH_LENGTH: "length", FINISH_STOP: "stop", FINISH_ERROR: "error"}
        return [names[int(r)] for r in np.asarray(self.finish_reasons)]

    def tokens_per_call(self) -> float:
        """Tokens committed per target call, over the whole batch: each step commits
        its accepted draft tokens and one correction or bonus token."""
        hist = np.asarray(self.accepted_histogram, np.float64).sum(0)
        return float((hist * np.arange(1, hist.size + 1)).sum() / hist.sum())

    def draft_calls_per_token(self) -> float:
        """Draft tokens drafted per token committed, over the whole batch: the draft's
        cost per generated token (one draft call per drafted chain token)."""
        if self.drafted is None:
            raise ValueError(
                "This DecodeResult has no `drafted` counts (it was not made by "
                "speculative_decode): build it with `drafted=`."
            )
        hist = np.asarray(self.accepted_histogram, np.float64).sum(0)
        committed = (hist * np.arange(1, hist.size + 1)).sum()
        return float(np.asarray(self.drafted, np.float64).sum() / committed)

    def accepted_length_distribution(self) -> np.ndarray:
        """The observed distribution of the number of accepted draft tokens per step,
        shape `(G + 1,)`."""
        hist = np.asarray(self.accepted_histogram, np.float64).sum(0)
        return hist / hist.sum()

    def acceptance_rate(self) -> np.ndarray:
        """Per position $k = 0, \\dots, G-1$, the fraction of steps that reached draft
        token $k$ and accepted it; shape `(G,)` (NaN where no step reached it)."""
        hist = np.asarray(self.accepted_histogram, np.float64).sum(0)
        reached = hist[::-1].cumsum()[::-1]  # steps with n >= k
        with np.errstate(invalid="ignore", divide="ignore"):
            return reached[1:] / reached[:-1]

    def theoretical_tokens_per_call(self) -> float:
        """$1 + \\sum_{k=1}^{G} E\\big[P(n \\ge k \\mid \\text{prefix})\\big]$ over the
        steps taken: for the standard rule, $1 + \\sum_k E[\\prod_{j<k} \\beta_j]$ with
        $\\beta_j = \\sum_v \\min(p_j(v), q_j(v))$ along the draft."""
        reached = self._theory_reached()
        steps = np.asarray(self.accepted_histogram, np.float64).sum()
        return float(reached.sum() / steps)

    def theoretical_accepted_length_distribution(self) -> np.ndarray:
        """The distribution of the number of accepted draft tokens predicted by the
        models' distributions, shape `(G + 1,)`."""
        reached = self._theory_reached()
        reached = reached / reached[0]
        return reached - np.append(reached[1:], 0.0)
