"""Speculative decoding end to end: a compiled loop that drafts, verifies and commits
tokens for a batch of sequences, each advancing at its own pace."""

import typing
from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Int, Key

from .._chain.abstract_verifier import AbstractVerifier
from .._chain.verifier import Verifier
from .._exactness import refuse_inexact
from .._inputs.checks import MODEL_MESSAGES, model_problems
from .._inputs.results import first_of, raise_if_failed, RESULTS, Status, status_of
from .._models.cached import check_model, initial_states, is_cached, prefill
from .._proposal.abstract_proposal import (
    AbstractProposal,
    default_proposal,
    ModelOutputs,
    Models,
)
from .._tree.abstract_tree_verifier import AbstractTreeVerifier
from .result import DecodeResult, FINISH_ERROR, FINISH_LENGTH, FINISH_STOP


def token_buffer(prompt_tokens, room: int):
    """The prompts, left-aligned, followed by `room` free slots per row."""
    batch, width = prompt_tokens.shape
    buffer = jnp.zeros((batch, width + room), jnp.int32)
    return buffer.at[:, :width].set(prompt_tokens.astype(jnp.int32))


def row_keys(key, batch: int):
    """Each row's own key: `key[b]` for one key per row, else `fold_in(key, b)`."""
    if _per_row(key):
        return key
    rows = jnp.arange(batch, dtype=jnp.uint32)
    return jax.vmap(lambda b: jax.random.fold_in(key, b))(rows)


def step_streams(row_key, step):
    """A row's four independent keys at step `step` (`split(fold_in(row_key, step),
    4)`): drafting, the accept uniforms, the residual's randomness, spare."""
    return jax.random.split(jax.random.fold_in(row_key, step), 4)


def _per_row(key) -> bool:
    return jnp.issubdtype(key.dtype, jax.dtypes.prng_key) and key.ndim == 1


def check_key(key, batch: int):
    """`key`: one `jax.random` key, or one per row; or an error naming it."""
    if not hasattr(key, "dtype"):
        raise TypeError(
            f"`key` must be a jax.random key (jax.random.key(seed)) or one per row "
            f"(jax.random.split(key, B)); got {type(key).__name__}."
        )
    typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    if typed and key.shape not in ((), (batch,)):
        raise ValueError(
            f"`key` must be one jax.random key (shape ()) or one per row (shape (B,) = "
            f"({batch},)); got shape {key.shape}."
        )
    return key


def resolve_proposal(proposal, verifier) -> AbstractProposal:
    """The proposal the loop runs: `proposal`, or by default the verifier's own (see
    `default_proposal`: its `tree` for a tree verifier, `Chain()` for a chain),
    checked against the verifier."""
    if proposal is None:
        proposal = default_proposal(verifier)
    if not isinstance(proposal, AbstractProposal):
        raise TypeError(
            "`proposal` must be an eqx_specdec.Chain (draft tokens in a chain) or "
            f"eqx_specdec.Tree, or None for the verifier's own; got {proposal!r}."
        )
    proposal.check(verifier)
    return proposal


def check_stop_tokens(stop_tokens) -> tuple[int, ...]:
    """`stop_tokens` as a tuple of Python ints, or an error naming it."""
    try:
        ids = tuple(stop_tokens)
    except TypeError:
        ids = None
    if ids is None or not all(
        isinstance(t, (int, np.integer)) and not isinstance(t, bool) and t >= 0
        for t in ids
    ):
        raise TypeError(
            "`stop_tokens` must be a sequence of non-negative Python ints (token ids), "
            f"such as (0,) or [eos_id]; got {stop_tokens!r}."
        )
    return tuple(int(t) for t in ids)


def _concrete(value) -> np.ndarray | None:
    """`value` as a NumPy array, or `None` when it is traced (under a caller's jit)."""
    try:
        return np.asarray(value)
    except jax.errors.TracerArrayConversionError:
        return None


def check_max_lengths(max_lengths, batch: int, num_tokens: int):
    """`max_lengths` as int32 `(B,)` (`num_tokens` each when `None`), or an error naming
    it."""
    if max_lengths is None:
        return jnp.full((batch,), num_tokens, jnp.int32)
    if jnp.shape(max_lengths) != (batch,):
        raise ValueError(
            f"`max_lengths` must have shape (B,) = ({batch},), got "
            f"{jnp.shape(max_lengths)}."
        )
    values = _concrete(max_lengths)  # None when traced: clipped into range below
    if values is not None and (values.min() < 1 or values.max() > num_tokens):
        raise ValueError(
            f"`max_lengths` must lie in [1, num_tokens] = [1, {num_tokens}] (each row "
            f"generates at least one token); got {values.tolist()}."
        )
    return jnp.clip(jnp.asarray(max_lengths, jnp.int32), 1, num_tokens)


def check_decode_arguments(prompt_tokens, prompt_lengths, num_tokens, outputs):
    if (
        not isinstance(num_tokens, int)
        or isinstance(num_tokens, bool)
        or num_tokens < 1
    ):
        raise ValueError(f"`num_tokens` must be a Python int >= 1, got {num_tokens!r}.")
    pair = outputs if isinstance(outputs, tuple) else (outputs, outputs)
    if len(pair) != 2 or any(o not in ("probs", "logits") for o in pair):
        raise ValueError(
            '`outputs` must be "probs" or "logits" (what both models return), or a '
            '(draft, target) pair of them such as ("probs", "logits"); got '
            f"{outputs!r}."
        )
    if jnp.ndim(prompt_tokens) != 2:
        raise ValueError(
            "`prompt_tokens` must have shape (B, P): one row per sequence, padded to "
            f"a common width; got shape {jnp.shape(prompt_tokens)}."
        )
    if not jnp.issubdtype(jnp.result_type(prompt_tokens), jnp.integer):
        raise TypeError(
            f"`prompt_tokens` must be integer token ids, got {jnp.result_type(prompt_tokens)}."
        )
    batch, width = jnp.shape(prompt_tokens)
    if prompt_lengths is None:
        return jnp.full((batch,), width, jnp.int32)
    if jnp.shape(prompt_lengths) != (batch,):
        raise ValueError(
            f"`prompt_lengths` must have shape (B,) = ({batch},), got "
            f"{jnp.shape(prompt_lengths)}."
        )
    lengths = _concrete(prompt_lengths)  # None when traced: not checked here
    if lengths is not None:
        if lengths.min(initial=1) < 1 or lengths.max(initial=1) > width:
            raise ValueError(
                f"`prompt_lengths` must lie in [1, {width}] (each prompt holds at least "
                f"one token and fits its row of `prompt_tokens`); got {lengths.tolist()}."
            )
    return jnp.asarray(prompt_lengths, jnp.int32)


class _LoopState(typing.NamedTuple):
    """The carry of the decoding loop: the step, each row's buffer, length, steps taken,
    histogram of accepted lengths, theory sums and draft tokens drafted, the cached
    models' states, and the checked mode's status."""

    t: Int[Array, ""]
    buffer: Int[Array, "B width"]
    lengths: Int[Array, " B"]
    calls: Int[Array, " B"]
    hist: Int[Array, "B depth_plus_1"]
    reached: Array
    drafted: Int[Array, " B"]
    drafting_steps: Int[Array, " B"]  # steps in which the row drafted a token
    scored: Int[Array, " B"]  # tokens the target's calls scored while the row ran
    states: tuple
    status: Status
    logprobs: Array | None  # (B, W) float32 when asked for, like `buffer`
    stopped: Bool[Array, " B"]  # a stop token was committed
    error_step: Int[Array, " B"]  # the step a model's output was invalid, or -1
    error_position: Int[Array, " B"]  # the generated position it would have filled


class _DecodeLoop(eqx.Module):
    """The decoding loop: the models, the verifier and the proposal (their arrays
    traced), and the static settings of one compiled program."""

    draft_model: Callable
    target_model: Callable
    verifier: AbstractVerifier | AbstractTreeVerifier
    proposal: AbstractProposal
    num_tokens: int = eqx.field(static=True)
    outputs: ModelOutputs | tuple[ModelOutputs, ModelOutputs] = eqx.field(static=True)
    progress: Callable | None = eqx.field(static=True)
    stream: Callable | None = eqx.field(static=True, default=None)
    check_models: bool = eqx.field(static=True, default=False)
    logprobs: bool = eqx.field(static=True, default=False)
    stop_tokens: tuple[int, ...] = eqx.field(static=True, default=())

    def trace_models(self, buffer, width: int) -> None:
        """Traces each model once on one row to check what it returns (and, for a
        cached model, the state it returns)."""
        vocab = check_model("target_model", self.target_model, buffer[0], 1, None)
        check_model("draft_model", self.draft_model, buffer[0], 1, vocab)
        outside = [t for t in self.stop_tokens if t >= vocab]
        if outside:
            raise ValueError(
                f"`stop_tokens` must be ids of the models' vocabulary [0, {vocab}); got "
                f"{outside}."
            )
        if is_cached(self.target_model) or is_cached(self.draft_model):
            for name in ("target_model", "draft_model"):
                check_model(name, getattr(self, name), buffer[0], width, vocab)

    def __call__(self, prompt_tokens, prompt_lengths, key, max_lengths) -> DecodeResult:
        batch, width = prompt_tokens.shape
        slots = self.proposal.slots()
        hist_size = self.proposal.depth() + 1
        theory = self.proposal.theory(self.verifier)
        outputs = self.outputs
        outputs = outputs if isinstance(outputs, tuple) else (outputs, outputs)
        models = Models(self.draft_model, self.target_model, outputs, self.logprobs)
        buffer = token_buffer(prompt_tokens, self.num_tokens + slots)
        lengths = prompt_lengths.astype(jnp.int32)
        self.trace_models(buffer, width)
        max_length = buffer.shape[1]
        states = tuple(
            prefill(m, buffer, width, initial_states(m, batch, max_length))
            for m in (self.draft_model, self.target_model)
        )

        stop_ids = jnp.asarray(self.stop_tokens, jnp.int32)
        rows_key = row_keys(key, batch)

        def is_stop(tokens):
            if not self.stop_tokens:
                return jnp.zeros(tokens.shape, bool)
            ids = stop_ids.reshape((1,) * tokens.ndim + stop_ids.shape)
            return jnp.any(tokens[..., None] == ids, axis=-1)

        def running(state: _LoopState):
            within = state.lengths - prompt_lengths < max_lengths
            return within & ~state.stopped & (state.error_step < 0)

        def step(state: _LoopState) -> _LoopState:
            lengths = state.lengths
            active = running(state)
            keys = jax.vmap(lambda k: step_streams(k, state.t))(rows_key)
            generated = lengths - prompt_lengths
            outcome = self.proposal.step(
                models,
                self.verifier,
                state.buffer,
                lengths,
                keys,
                generated,
                state.states,
                active,
            )
            n, new, states = outcome.num_accepted, outcome.tokens, outcome.states
            status = state.status
            # A row whose models returned something that is not a distribution stops
            # here, before anything drawn from it is committed.
            problems = model_problems(outcome.invalid, active)
            invalid = jnp.zeros_like(active)
            for problem in problems:
                invalid = invalid | problem.flags
            status = first_of(status, status_of(problems))
            error_step = jnp.where(invalid, state.t, state.error_step)
            error_position = jnp.where(invalid, generated, state.error_position)
            called = active  # the models ran for these rows
            active = active & ~invalid
            # Commit: accepted tokens and the correction; the slots after it are scratch.
            index = lengths[:, None] + jnp.arange(slots, dtype=jnp.int32)[None]
            write = jax.vmap(lambda b, i, v: b.at[i].set(v))
            written = write(state.buffer, index, jnp.maximum(new, 0))
            logprob_buffer = state.logprobs
            if logprob_buffer is not None:
                logprob_buffer = jnp.where(
                    active[:, None],
                    write(logprob_buffer, index, outcome.logprobs),
                    logprob_buffer,
                )
            # A stop token among the tokens this step commits, within the row's limit.
            at = jnp.arange(slots, dtype=jnp.int32)[None]
            committed = (at <= n[:, None]) & (
                lengths[:, None] - prompt_lengths[:, None] + at < max_lengths[:, None]
            )
            stopped = state.stopped | (active & jnp.any(committed & is_stop(new), 1))
            lengths = jnp.where(active, lengths + n + 1, lengths)
            if self.stream is not None:
                # What this step emits, as the result will hold it: the committed
                # tokens within the row's limit, up to its first stop token.
                emitted = committed & active[:, None]
                stops = is_stop(new).astype(jnp.int32)
                stop_before = jnp.cumsum(stops, axis=1) - stops
                emitted = emitted & (stop_before == 0)
                jax.debug.callback(
                    self.stream, jnp.where(emitted, new, -1), ordered=True
                )
            if self.progress is not None:
                done = jnp.minimum(lengths - prompt_lengths, self.num_tokens).sum()
                jax.debug.callback(self.progress, done, batch * self.num_tokens)
            return _LoopState(
                t=state.t + 1,
                buffer=jnp.where(active[:, None], written, state.buffer),
                lengths=lengths,
                calls=state.calls + called.astype(jnp.int32),
                hist=state.hist
                + active[:, None].astype(jnp.int32)
                * jax.nn.one_hot(n, hist_size, dtype=jnp.int32),
                reached=state.reached
                + jnp.where(active[:, None], outcome.reached, 0.0),
                drafted=state.drafted + jnp.where(active, outcome.drafted, 0),
                drafting_steps=state.drafting_steps
                + (active & (outcome.drafted > 0)).astype(jnp.int32),
                scored=state.scored + jnp.where(active, outcome.scored, 0),
                states=states,
                status=status,
                logprobs=logprob_buffer,
                stopped=stopped,
                error_step=error_step,
                error_position=error_position,
            )

        def unfinished(state: _LoopState):
            return jnp.any(running(state))

        state = _LoopState(
            t=jnp.zeros((), jnp.int32),
            buffer=buffer,
            lengths=lengths,
            calls=jnp.zeros((batch,), jnp.int32),
            hist=jnp.zeros((batch, hist_size), jnp.int32),
            reached=jnp.zeros((batch, hist_size), jnp.float32),
            drafted=jnp.zeros((batch,), jnp.int32),
            drafting_steps=jnp.zeros((batch,), jnp.int32),
            scored=jnp.zeros((batch,), jnp.int32),
            states=states,
            status=Status(
                jnp.int32(-1), RESULTS.successful, jnp.int32(-1), MODEL_MESSAGES
            ),
            logprobs=jnp.zeros(buffer.shape, jnp.float32) if self.logprobs else None,
            stopped=jnp.zeros((batch,), bool),
            error_step=jnp.full((batch,), -1, jnp.int32),
            error_position=jnp.full((batch,), -1, jnp.int32),
        )
        end = jax.lax.while_loop(unfinished, step, state)
        take = (
            prompt_lengths[:, None] + jnp.arange(self.num_tokens, dtype=jnp.int32)[None]
        )
        tokens = jnp.take_along_axis(end.buffer, take, axis=1)
        # Each row's generated length: up to its first stop token (included), at most
        # its limit; nothing after it is emitted.
        position = jnp.arange(self.num_tokens, dtype=jnp.int32)[None]
        stop_at = jnp.where(is_stop(tokens), position, self.num_tokens)
        first_stop = jnp.min(stop_at, axis=1)
        finish = jnp.where(first_stop < max_lengths, FINISH_STOP, FINISH_LENGTH)
        failed = end.error_step >= 0
        finish = jnp.where(failed, FINISH_ERROR, finish)
        generated = jnp.minimum(first_stop + 1, max_lengths)
        # A row that failed emits what it committed before the invalid step only.
        generated = jnp.where(
            failed, jnp.minimum(generated, end.error_position), generated
        )
        generated = generated.astype(jnp.int32)
        emitted = position < generated[:, None]
        tokens = jnp.where(emitted, tokens, -1)
        logprobs = None
        if end.logprobs is not None:
            logprobs = jnp.take_along_axis(end.logprobs, take, axis=1)
            logprobs = jnp.where(emitted, logprobs, -jnp.inf)
        result = DecodeResult(
            tokens,
            end.calls,
            end.hist,
            end.reached,
            theory,
            drafted=end.drafted,
            drafting_steps=end.drafting_steps,
            scored_tokens=end.scored,
            logprobs=logprobs,
            lengths=generated,
            finish_reasons=finish.astype(jnp.int32),
            error_steps=end.error_step,
            error_positions=end.error_position,
            result=end.status.result,
            failed_row=end.status.row,
        )
        if not self.check_models:
            return result
        return raise_if_failed(result, end.status, batch)


@eqx.filter_jit
def _run(
    loop: _DecodeLoop, prompt_tokens, prompt_lengths, key, max_lengths
) -> DecodeResult:
    return loop(prompt_tokens, prompt_lengths, key, max_lengths)


@typing.no_type_check  # validated by hand, with messages naming the argument
def speculative_decode(
    draft_model: Callable,
    target_model: Callable,
    prompt_tokens: Int[Array, "B prompt"],
    prompt_lengths: Int[Array, " B"] | None,
    num_tokens: int,
    key: Key[Array, ""] | Key[Array, " B"],
    *,
    verifier: AbstractVerifier | AbstractTreeVerifier = Verifier(),
    proposal: AbstractProposal | None = None,
    outputs: ModelOutputs | tuple[ModelOutputs, ModelOutputs] = "probs",
    progress: Callable | None = None,
    stream: Callable | None = None,
    check_models: bool = False,
    logprobs: bool = False,
    stop_tokens: Sequence[int] = (),
    max_lengths: Int[Array, " B"] | None = None,
    exact_only: bool = False,
) -> DecodeResult:
    """Generates `num_tokens` tokens for each of a batch of prompts by speculative
    decoding, in one compiled `jax.lax.while_loop`.

    Each step, for every unfinished row: the draft model proposes draft tokens (the
    `proposal`: a [`eqx_specdec.Chain`][] of $G$ tokens, sampled from its
    distributions $q_i$ or their argmax, or a [`eqx_specdec.Tree`][] of them), the
    target model scores all of them at once, `verifier` decides how many survive and
    draws the correction, and the row commits those tokens. Rows advance by different
    amounts; each keeps its own position, and finished rows are masked until every row
    is done. The loop is compiled once per set of shapes and static settings, with
    Equinox's filter semantics (the arrays of the models, the verifier and the proposal
    traced, everything else static), and works inside `jax.jit` too.

    A model is either **stateless**, any callable (an Equinox module, or a function)
    `model(tokens: int[T], positions: int[K]) -> float[K, V]` returning for one
    sequence the next-token distributions after `tokens[: position + 1]` for each
    position ([`eqx_specdec.demo.NGramModel`][] is one; slots of `tokens` after the current
    position hold scratch values a causal model never reads), or **cached**, an
    [`eqx_specdec.models.AbstractCachedModel`][] that owns its state (a key-value cache) and is
    called on each step's new tokens only ([`eqx_specdec.demo.Transformer`][] is one; chains
    only). Either returns probabilities, or logits with `outputs="logits"`. See
    [Bring your own model](../your_own_model.md) for the contract.

    The verifier is called without the run-time value checks of
    [`eqx_specdec.speculative_accept`][]: the models are trusted to return valid
    distributions, unless `check_models=True`.

    Randomness comes from `key` only. Each row has its own key: `key[b]` when `key`
    holds one key per row (per-request seeds), else `fold_in(key, b)`. At step $t$ a
    row splits `fold_in(row_key, t)` into four independent streams: drafting, the
    accept uniforms, the residual's randomness, and a spare one. So a row's tokens
    depend on its own key only, not on the batch, its position in it or the other
    rows' keys.

    **Arguments:**

    - `draft_model`: the draft model.
    - `target_model`: the target model, over the same vocabulary.
    - `prompt_tokens`: integer of shape `(B, P)`, the prompts, padded on the right.
    - `prompt_lengths`: integer of shape `(B,)`, each prompt's length in `[1, P]`; `None`
        when every prompt fills its row.
    - `num_tokens`: $L$, the number of tokens to generate per row (a Python int).
    - `key`: a `jax.random` key, or one per row (shape `(B,)`, e.g.
        `jax.random.split(key, B)` or keys from each request's seed).
    - `verifier`: the verifier to run: an [`eqx_specdec.Verifier`][] (or
        [`eqx_specdec.ShardedVerifier`][]) for chains, whose stages receive
        probabilities; or a tree verifier ([`eqx_specdec.TreeVerifier`][],
        [`eqx_specdec.TraversalVerifier`][]) built with its `tree`. Default: the
        standard rule.
    - `proposal`: what the draft proposes each step, an
        [`eqx_specdec.AbstractProposal`][]: a [`eqx_specdec.Chain`][] (its length
        $G$, argmax or sampled drafting, and a draft-length policy) for a chain
        verifier, a [`eqx_specdec.Tree`][] for a tree verifier. `None` (the default):
        the verifier's own, `Chain()` ($G = 4$, sampled) for a chain verifier and
        `Tree(verifier.tree)` for a tree verifier.
    - `outputs`: `"probs"` (default) or `"logits"`: what the models return; or a
        `(draft, target)` pair of them, for models that differ (an n-gram draft
        returning probabilities and a [`eqx_specdec.demo.Transformer`][] target returning
        logits: `("probs", "logits")`).
    - `progress`: `None`, or a function `progress(done, total)` called from the host
        after every step with the number of tokens generated so far over the batch.
    - `stream`: `None`, or a function `stream(tokens)` called from the host after
        every step, in order, with what the step emitted: int32 `(B, slots)`, each
        row's new tokens (as `DecodeResult.tokens` will hold them: within its limit,
        up to its first stop token) then -1. For printing text as it is accepted.
    - `check_models`: `True` to raise (a `RuntimeError`, inside the program) when a
        model returns a distribution that is not one, naming the model and the row
        (`DecodeResult.error_steps` gives the step). Default `False`: the
        loop checks every step anyway (finite, non-negative, summing to 1; logits after
        their softmax), and a row whose models return an invalid distribution stops
        there with the finish reason `"error"` (see
        [`eqx_specdec.DecodeResult`][]`.error_positions`); nothing drawn from it is
        emitted.
    - `logprobs`: `True` to return, in `DecodeResult.logprobs`, the target's
        log-probability of every generated token under the distribution it was verified
        against (the target model's row at that position, logits after their softmax):
        what a plain decoding of the target would report. Default `False`.
    - `stop_tokens`: token ids (Python ints) that end a row: a row stops at the first
        one it generates (included in its tokens), nothing after it is emitted, and
        its steps end there. Default none.
    - `max_lengths`: integer of shape `(B,)`, each row's most generated tokens, in
        `[1, num_tokens]`; `None` (the default) for `num_tokens` each.
    - `exact_only`: `True` to refuse a verifier whose `exact` is False (a lossy rule,
        or stages built with `allow_mismatch=True`), for generation that must follow
        the target exactly (evaluation, reinforcement-learning rollouts). Default
        `False`.

    Each row's generated length and why it finished are in `DecodeResult.lengths` and
    `DecodeResult.finish_reasons`; its tokens after its length are -1.

    **Returns:**

    A [`eqx_specdec.DecodeResult`][]: the tokens and the run's statistics.
    """
    for name, flag in (("check_models", check_models), ("logprobs", logprobs)):
        if not isinstance(flag, bool):
            raise TypeError(
                f"speculative_decode(`{name}`=...) must be a Python bool, got {flag!r}."
            )
    proposal = resolve_proposal(proposal, verifier)
    refuse_inexact("speculative_decode", verifier, exact_only)
    proposal.check_models(draft_model, target_model)
    prompt_lengths = check_decode_arguments(
        prompt_tokens, prompt_lengths, num_tokens, outputs
    )
    stop_tokens = check_stop_tokens(stop_tokens)
    key = check_key(key, len(prompt_lengths))
    max_lengths = check_max_lengths(max_lengths, len(prompt_lengths), num_tokens)
    loop = _DecodeLoop(
        draft_model,
        target_model,
        verifier,
        proposal,
        num_tokens,
        outputs,
        progress,
        stream,
        check_models,
        logprobs,
        stop_tokens,
    )
    return _run(loop, jnp.asarray(prompt_tokens), prompt_lengths, key, max_lengths)
