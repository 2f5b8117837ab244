"""Speculative decoding in wall-clock time: its speed-up over plain decoding of the same
target, and what a cost model predicts from the models' measured per-call times."""

import statistics
import time
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Int, Key

from .._chain.abstract_verifier import AbstractVerifier
from .._chain.verifier import Verifier
from .._models.cached import AbstractCachedModel
from .._proposal.abstract_proposal import ModelOutputs
from .._proposal.chain import Chain
from .autoregressive import _autoregressive
from .loop import speculative_decode


class Speedup(eqx.Module):
    """What [`eqx_specdec.evaluation.measure_speedup`][] measured, in one run (medians of the
    repeats; times in seconds).

    **Fields:**

    - `speculative_seconds`, `plain_seconds`: one whole decode of the batch, by
        speculative decoding and by plain decoding of the target (the same cache): the
        faster of the library's plain loop and, for a cached target returning logits,
        the `jax.jit` + `lax.scan` loop a user writes.
    - `batch`: the rows decoded together.
    - `tokens`: the tokens generated (batch times `num_tokens`).
    - `tokens_per_call`: tokens committed per target call, over the batch.
    - `steps`: the loop's steps (its target calls; the slowest row's).
    - `draft_call_seconds`: one draft call on the batch, one new token per row: plain
        decoding with the draft, its time over `num_tokens`.
    - `target_call_seconds`: one target call on the batch scoring $G + 1$ tokens per
        row: plain decoding's program with every call on $G + 1$ tokens, its time over
        `num_tokens`.
    - `plain_call_seconds`: one target call on one token per row: `plain_seconds`
        over `num_tokens`.
    - `draft_calls_per_step`: the draft calls per step: $G$, or under a stopping
        draft-length policy the rows' mean drafted length (a lower bound: the batch
        calls the draft until its last row stops).
    - `gamma`: the chain's length $G$.
    - `scored_tokens`: the tokens the target's calls scored over the run, the whole
        batch (`DecodeResult.scored_tokens`). The cost model prices a call on $s$
        tokens affinely between `plain_call_seconds` (one token a row, $B$ tokens)
        and `target_call_seconds` ($G + 1$ a row): exact for the padded calls, an
        interpolation for a trimmed chain's packed ones (with SmolLM2 at $B = 4$ on
        the CPU within 7% of a packed call's measured cost from 12 to 28 tokens).
        Default: every step on $G + 1$ tokens a row.
    """

    speculative_seconds: float
    plain_seconds: float
    batch: int
    tokens: int
    tokens_per_call: float
    steps: int
    draft_call_seconds: float
    target_call_seconds: float
    plain_call_seconds: float
    draft_calls_per_step: float
    gamma: int
    scored_tokens: int | None = None

    @property
    def calls_seconds(self) -> float:
        """The model calls of the whole speculative run, as the cost model counts
        them: `draft_calls_per_step` draft calls a step, and one target call, its
        cost affine in the tokens it scores (`scored_tokens`)."""
        narrow, wide = self.batch, self.batch * (self.gamma + 1)
        scored = self.steps * wide if self.scored_tokens is None else self.scored_tokens
        # Each call: the one-token call, and each token beyond the batch's first
        # at the slope between the one-token and the (G + 1)-token calls.
        slope = (self.target_call_seconds - self.plain_call_seconds) / max(
            wide - narrow, 1
        )
        return (
            self.steps * self.draft_calls_per_step * self.draft_call_seconds
            + self.steps * self.plain_call_seconds
            + (scored - self.steps * narrow) * slope
        )

    @property
    def speedup(self) -> float:
        """The measured wall-clock speed-up, plain time over speculative time."""
        return self.plain_seconds / self.speculative_seconds

    @property
    def predicted_speedup(self) -> float:
        """What the cost model predicts from the per-call times alone: plain decoding
        is `num_tokens` plain calls, speculative decoding `steps` steps of
        `draft_calls_per_step` draft calls and one target call (on one position in
        steps where no row drafted, by its tokens in a packed one: `scored_tokens`;
        the verification and the loop's own work count as free,
        and a cached draft's two-token catch-up call as a one-token call)."""
        plain = (self.tokens / self.batch) * self.plain_call_seconds
        return plain / self.calls_seconds

    @property
    def loop_seconds_per_step(self) -> float:
        """What a step costs beyond the model calls the cost model counts: the loop's
        own work (drafting bookkeeping, verification, the caches' positions), the
        measured time of the run less its calls, per step. Below zero when the calls
        ran faster inside the loop than alone (within the runs' noise)."""
        return (self.speculative_seconds - self.calls_seconds) / self.steps


def _seconds(fn) -> float:
    """One timed call of `fn`, waiting for its outputs."""
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def straightforward_decode(
    model, prompt_tokens, prompt_lengths, key, num_tokens, greedy
):
    """The plain decoding loop a user writes for a cached model returning logits: each
    row prefilled with its padded prompt, then a `lax.scan` of one-token calls, the
    next token the argmax (`greedy`) or drawn with `jax.random.categorical` from the
    row's key folded with the step; `vmap` over the rows. The baseline
    [`eqx_specdec.evaluation.measure_speedup`][] times beside the library's plain loop
    (whichever is faster is the speed-up's denominator)."""
    batch, width = prompt_tokens.shape
    keys = jax.random.split(key, batch)

    def one_row(prompt, length, row_key):
        state = model.init_state(width + num_tokens)
        logits, state = model(prompt, jnp.arange(width, dtype=jnp.int32), state)

        def pick(logits, t):
            if greedy:
                return jnp.argmax(logits).astype(jnp.int32)
            draw = jax.random.categorical(jax.random.fold_in(row_key, t), logits)
            return draw.astype(jnp.int32)

        def step(carry, t):
            token, state = carry
            logits, state = model(token[None], (length + t)[None], state)
            return (pick(logits[0], t + 1), state), token

        first = pick(logits[length - 1], 0)
        (last, _), tokens = jax.lax.scan(
            step, (first, state), jnp.arange(num_tokens - 1, dtype=jnp.int32)
        )
        return jnp.concatenate([tokens, last[None]])

    return jax.vmap(one_row)(prompt_tokens, prompt_lengths, keys)


straightforward_jit = eqx.filter_jit(straightforward_decode)


def measure_speedup(
    draft_model: Callable,
    target_model: Callable,
    prompt_tokens: Int[ArrayLike, "B prompt"],
    prompt_lengths: Int[ArrayLike, " B"] | None,
    num_tokens: int,
    key: Key[Array, ""],
    *,
    verifier: AbstractVerifier = Verifier(),
    proposal: Chain = Chain(),
    outputs: tuple[ModelOutputs, ModelOutputs] = ("probs", "probs"),
    repeats: int = 5,
) -> Speedup:
    """Times speculative decoding against plain autoregressive decoding of the same
    target (the same batch, prompts, tokens to generate and cache; the library's loop
    and, for a cached target returning logits, the `jax.jit` + `lax.scan` loop a user
    writes, the faster of the two), and the models' calls alone for the cost model (each in plain decoding's own program, see
    [`eqx_specdec.evaluation.Speedup`][]): everything compiled first, then `repeats` rounds that
    time each run once, interleaved.

    **Arguments:**

    - `draft_model`, `target_model`, `prompt_tokens`, `prompt_lengths`, `num_tokens`,
        `key`, `verifier`, `proposal`: as for [`eqx_specdec.speculative_decode`][]
        (chains: the cost model counts one draft call per drafted token).
    - `outputs`: what the `(draft, target)` models return.
    - `repeats`: timed runs of each (the medians are reported).

    **Returns:**

    An [`eqx_specdec.evaluation.Speedup`][].
    """
    prompt_tokens = jnp.asarray(prompt_tokens, jnp.int32)
    batch, width = prompt_tokens.shape
    if prompt_lengths is None:
        prompt_lengths = jnp.full((batch,), width, jnp.int32)
    prompt_lengths = jnp.asarray(prompt_lengths, jnp.int32)

    def speculative():
        return speculative_decode(
            draft_model,
            target_model,
            prompt_tokens,
            prompt_lengths,
            num_tokens,
            key,
            verifier=verifier,
            proposal=proposal,
            outputs=outputs,
        )

    result = speculative()
    gamma = proposal.length

    def calls_of(model, width, outputs, greedy=False):
        """Plain decoding with `model`, every call on `width` tokens (sampled: for the
        cost model's per-call times, which the way a token is picked barely moves)."""
        return lambda: _autoregressive(
            model,
            prompt_tokens,
            prompt_lengths,
            key,
            num_tokens,
            greedy,
            outputs,
            width,
            False,  # no check of the rows: the baseline a user writes
        )

    # The baselines decode as the verifier does: by argmax when its correction is the
    # target's argmax (greedy decoding), by sampling otherwise.
    greedy = verifier.residual_sampler.draws == "argmax"
    runs = {
        "speculative": speculative,
        "plain": calls_of(target_model, 1, outputs[1], greedy),
        "draft call": calls_of(draft_model, 1, outputs[0]),
        "target call": calls_of(target_model, gamma + 1, outputs[1]),
    }
    if isinstance(target_model, AbstractCachedModel) and outputs[1] == "logits":
        runs["straightforward"] = lambda: straightforward_jit(
            target_model, prompt_tokens, prompt_lengths, key, num_tokens, greedy
        )
    for run in runs.values():  # compiled before timing
        jax.block_until_ready(run())
    times = {name: [] for name in runs}
    for _ in range(repeats):  # interleaved: each round times every run once
        for name, run in runs.items():
            times[name].append(_seconds(run))
    median = {name: statistics.median(t) for name, t in times.items()}
    plain = min(median["plain"], median.get("straightforward", np.inf))
    steps = int(np.max(np.asarray(result.target_calls)))
    calls_per_step = float(gamma)
    if not proposal.draft_length.always_full:
        calls_per_step = float(
            np.sum(np.asarray(result.drafted)) / np.sum(np.asarray(result.target_calls))
        )
    scored = None
    if result.scored_tokens is not None:
        # The row with the most steps ran in every one of them: the largest count.
        scored = int(np.max(np.asarray(result.scored_tokens)))
    return Speedup(
        gamma=gamma,
        scored_tokens=scored,
        speculative_seconds=median["speculative"],
        plain_seconds=plain,
        batch=batch,
        tokens=batch * num_tokens,
        tokens_per_call=result.tokens_per_call(),
        steps=steps,
        draft_call_seconds=median["draft call"] / num_tokens,
        target_call_seconds=median["target call"] / num_tokens,
        plain_call_seconds=plain / num_tokens,
        draft_calls_per_step=calls_per_step,
    )


def speedup_table(measurements: dict[str, Speedup]) -> str:
    """The measurements as a Markdown table, one row per configuration."""
    lines = [
        "| draft | tokens/s, speculative / plain | speed-up | predicted (cost model) | "
        "measured / predicted | tokens per target call | ms per call: draft / target "
        "on G + 1 tokens / plain | the loop's own work per step, ms (of a target "
        "call on G + 1) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in measurements.items():
        lines.append(
            f"| {name} | {s.tokens / s.speculative_seconds:.0f} / "
            f"{s.tokens / s.plain_seconds:.0f} | **{s.speedup:.2f}x** | "
            f"{s.predicted_speedup:.2f}x | {s.speedup / s.predicted_speedup:.2f} | "
            f"{s.tokens_per_call:.2f} | {1e3 * s.draft_call_seconds:.3f} / "
            f"{1e3 * s.target_call_seconds:.3f} / {1e3 * s.plain_call_seconds:.3f} | "
            f"{1e3 * s.loop_seconds_per_step:.3f} "
            f"({s.loop_seconds_per_step / s.target_call_seconds:.0%}) |"
        )
    return "\n".join(lines)
