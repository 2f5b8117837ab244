"""Speculative decoding end to end: a compiled loop that drafts, verifies and commits
tokens for a batch of sequences, each advancing at its own pace."""

import typing
from collections.abc import Callable
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, Key

from .._capabilities import has_capability, require
from .._stages.row_fields import per_row_values, with_row_values
from .._tree.abstract_tree_verifier import AbstractTreeVerifier, check_static_depth
from .._tree.top_down import check_tree_shape
from .._verify.abstract_verifier import AbstractVerifier
from .._verify.dispatch import FilterJit
from .._verify.verifier import Verifier
from .draft_length import AbstractDraftLength, FixedDraftLength, verify_at_lengths
from .drafting import (
    ChainDrafting,
    draft_chain,
    draft_tree,
    ModelOutputs,
    token_buffer,
    tree_depths,
)
from .result import DecodeResult, reached_probabilities


def _checked_output(name, value, shape):
    if not hasattr(value, "shape") or tuple(value.shape) != shape:
        got = getattr(value, "shape", type(value).__name__)
        raise ValueError(
            f"`{name}` must return one distribution per position asked, shape "
            f"(positions, vocab) = {shape}; got {got}. A model is called as "
            "`model(tokens: int[T], positions: int[K]) -> float[K, V]`."
        )
    if not jnp.issubdtype(value.dtype, jnp.floating):
        raise TypeError(f"`{name}` must return floating values, got {value.dtype}.")
    return value


def _with_ratio_test(verifier, test):
    """`verifier` running `test`, the ratio test its `in_decoding_loop` returned."""
    try:
        return eqx.tree_at(lambda v: v.ratio_test, verifier, test)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"{type(verifier).__name__} does not hold its ratio test as a field, so "
            f"the decoding loop cannot run the step's test that {type(test).__name__}."
            "in_decoding_loop returns. Use an eqx_specdec.Verifier."
        ) from error


def _row_keys(key, step, batch):
    rows = jnp.arange(batch, dtype=jnp.uint32)
    return jax.vmap(lambda b: jax.random.fold_in(jax.random.fold_in(key, b), step))(
        rows
    )


def _uniforms(split, count: int, key_sampler: bool):
    """Each row's accept uniforms `(count,)` and its sampler's randomness."""
    accept = jax.vmap(lambda k: jax.random.uniform(k, (count,), jnp.float32))(
        split[:, 1]
    )
    if key_sampler:
        return accept, split[:, 2]
    sample = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(split[:, 2])
    return accept, sample


def check_tree(tree, verifier, drafting) -> tuple[int, ...] | None:
    """Checks `tree` against the verifier: trees need a TreeVerifier whose node rule
    can draft (`candidate_law`), and chains anything else."""
    if tree is None:
        if isinstance(verifier, AbstractTreeVerifier):
            check_tree_shape(
                None, type(verifier).__name__
            )  # raises: a tree verifier needs the tree's shape
        if drafting not in ("sample", "argmax"):
            raise ValueError(
                f'`drafting` must be "sample" (draft tokens x ~ q) or "argmax" (one-hot '
                f"drafts), got {drafting!r}."
            )
        return None
    if not isinstance(verifier, AbstractTreeVerifier):
        raise TypeError(
            "`tree` is given, so `verifier` must be a tree verifier (TreeVerifier or "
            "TraversalVerifier, an eqx_specdec.AbstractTreeVerifier); got "
            f"{type(verifier).__name__}."
        )
    if drafting != "sample":
        raise ValueError(
            "`drafting` is for chains; a tree's children are drafted by its node rule's "
            "`candidate_law`. Subclass the node rule to change how they are drawn."
        )
    rule = verifier.drafting_rule()
    require(rule, "candidate_law", "drafting a tree in the decoding loop")
    tree = check_tree_shape(tree)
    check_static_depth(verifier, tree)
    return tree


def check_decode_arguments(
    prompt_tokens, prompt_lengths, num_tokens, gamma, outputs, verifier
):
    if not isinstance(verifier, (AbstractVerifier, AbstractTreeVerifier)):
        raise TypeError(
            "`verifier` must be an eqx_specdec.Verifier (or ShardedVerifier, or "
            f"TreeVerifier with `tree`), got {type(verifier).__name__}."
        )
    for name, value, low in (("num_tokens", num_tokens, 1), ("gamma", gamma, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"`{name}` must be a Python int >= {low}, got {value!r}.")
    if outputs not in ("probs", "logits"):
        raise ValueError(f'`outputs` must be "probs" or "logits", got {outputs!r}.')
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
    try:
        lengths = np.asarray(prompt_lengths)
    except jax.errors.TracerArrayConversionError:
        lengths = None  # traced: checked by the caller's own program, if at all
    if lengths is not None:
        if lengths.min(initial=1) < 1 or lengths.max(initial=1) > width:
            raise ValueError(
                f"`prompt_lengths` must lie in [1, {width}] (each prompt holds at least "
                f"one token and fits its row of `prompt_tokens`); got {lengths.tolist()}."
            )
    return jnp.asarray(prompt_lengths, jnp.int32)


class _DecodeLoop(eqx.Module):
    """The decoding loop: the models and the verifier (their arrays traced), and the
    static settings of one compiled program."""

    draft_model: Callable
    target_model: Callable
    verifier: AbstractVerifier | AbstractTreeVerifier
    num_tokens: int = eqx.field(static=True)
    gamma: int = eqx.field(static=True)
    drafting: ChainDrafting = eqx.field(static=True)
    outputs: ModelOutputs = eqx.field(static=True)
    progress: Callable | None = eqx.field(static=True)
    tree: tuple[int, ...] | None = eqx.field(static=True)
    draft_length: AbstractDraftLength = FixedDraftLength()

    @property
    def room(self) -> int:
        """Buffer slots a step may write: the draft and the correction."""
        return self.gamma + 1 if self.tree is None else len(self.tree) + 1

    @property
    def histogram_size(self) -> int:
        """The number of possible accepted counts, 0..(deepest accepted path)."""
        return self.gamma + 1 if self.tree is None else max(tree_depths(self.tree)) + 1

    @property
    def theory(self) -> Literal["exact", "lower bound", "none"]:
        """The loop's theory, from static declarations only (read before tracing):
        none for trees and for ratio tests without `pass_probabilities`, otherwise the
        test's declared `theory`."""
        test = None if self.tree is not None else self.verifier.ratio_test
        if test is None or not has_capability(test, "pass_probabilities"):
            return "none"
        return test.theory

    def check_models(self, buffer):
        """Traces the models once to learn V and check what they return."""
        positions = 1 if self.tree is not None else self.gamma + 1
        probe = jax.eval_shape(
            self.target_model, buffer[0], jnp.arange(positions, dtype=jnp.int32)
        )
        vocab = probe.shape[-1] if hasattr(probe, "shape") and probe.ndim == 2 else -1
        _checked_output("target_model", probe, (positions, vocab))
        draft = jax.eval_shape(self.draft_model, buffer[0], jnp.zeros((1,), jnp.int32))
        _checked_output("draft_model", draft, (1, vocab))
        return vocab

    def propose_chain(self, buffer, lengths, split, vocab, generated):
        """Drafts a chain, scores it, verifies it: `(n, tokens, P(n >= k),
        drafted)`."""
        xs, qs, p = jax.vmap(
            lambda t, n, k: draft_chain(
                self.draft_model,
                self.target_model,
                t,
                n,
                k,
                gamma=self.gamma,
                drafting=self.drafting,
                outputs=self.outputs,
            )
        )(buffer, lengths, split[:, 0])
        verifier = self.verifier
        test = verifier.ratio_test.in_decoding_loop(generated)
        if test is not verifier.ratio_test:
            verifier = _with_ratio_test(verifier, test)
        key_sampler = verifier.residual_sampler.randomness == "key"
        accept, sample = _uniforms(split, self.gamma, key_sampler)
        if self.drafting == "argmax":
            law, given = jax.nn.one_hot(xs, vocab, dtype=qs.dtype), None
        else:
            law = given = qs
        log_space = verifier.ratio_test.log_space is True

        def space(a):
            return jnp.log(a) if log_space else a

        arrays = (xs, None if given is None else space(given), space(p), accept, sample)
        if self.draft_length.always_full:
            drafted = jnp.full((xs.shape[0],), self.gamma, jnp.int32)
            out = verifier(*arrays)
        else:
            drafted = jax.vmap(self.draft_length)(xs, law, p).astype(jnp.int32)
            drafted = jnp.clip(drafted, 1, self.gamma)
            out = verify_at_lengths(verifier, drafted, *arrays)
        if self.theory == "none":
            reached = jnp.full((xs.shape[0], self.gamma + 1), jnp.nan, jnp.float32)
            return out["num_accepted"], out["tokens"], reached, drafted

        def passes_of(values, law, p):
            return with_row_values(test, values).pass_probabilities(law, p)

        passes = jax.vmap(passes_of)(per_row_values(test), law, p[:, : self.gamma])
        # Positions past a row's draft length are never drafted: they never pass.
        used = jnp.arange(self.gamma, dtype=jnp.int32)[None] < drafted[:, None]
        passes = jnp.where(used[..., None], passes, 0)
        reached = jax.vmap(reached_probabilities)(passes, law, xs)
        reached = reached.astype(jnp.float32)
        return out["num_accepted"], out["tokens"], reached, drafted

    def propose_tree(self, buffer, lengths, split, vocab, generated):
        """Drafts a tree, scores every node, walks it with the tree verifier."""
        rule = self.verifier.drafting_rule()
        nodes, dq, p = jax.vmap(
            lambda t, n, k: draft_tree(
                self.draft_model,
                self.target_model,
                t,
                n,
                k,
                tree=self.tree,
                node_rule=rule,
                outputs=self.outputs,
            )
        )(buffer, lengths, split[:, 0])
        accept, sample = _uniforms(split, len(self.tree), False)
        parents = jnp.broadcast_to(jnp.asarray(self.tree, jnp.int32), nodes.shape)
        draft_rows = dq if rule.uses_draft_probs else None
        out = self.verifier(nodes, parents, draft_rows, p, accept, sample)
        reached = jnp.full((nodes.shape[0], self.histogram_size), jnp.nan, jnp.float32)
        drafted = jnp.full((nodes.shape[0],), len(self.tree), jnp.int32)
        return out["num_accepted"], out["tokens"], reached, drafted

    def __call__(self, prompt_tokens, prompt_lengths, key) -> DecodeResult:
        batch, room, hist_size = prompt_tokens.shape[0], self.room, self.histogram_size
        buffer = token_buffer(prompt_tokens, self.num_tokens + room)
        lengths = prompt_lengths.astype(jnp.int32)
        vocab = self.check_models(buffer)
        propose = self.propose_chain if self.tree is None else self.propose_tree

        def step(state):
            t, buffer, lengths, calls, hist, reached_sum, drafted_sum = state
            active = lengths - prompt_lengths < self.num_tokens
            split = jax.vmap(lambda k: jax.random.split(k, 4))(_row_keys(key, t, batch))
            generated = lengths - prompt_lengths
            n, new, reached, drafted = propose(buffer, lengths, split, vocab, generated)
            # Commit: accepted tokens and the correction; the slots after it are scratch.
            index = lengths[:, None] + jnp.arange(room, dtype=jnp.int32)[None]
            written = jax.vmap(lambda b, i, v: b.at[i].set(v))(
                buffer, index, jnp.maximum(new, 0)
            )
            buffer = jnp.where(active[:, None], written, buffer)
            lengths = jnp.where(active, lengths + n + 1, lengths)
            calls = calls + active.astype(jnp.int32)
            hist = hist + active[:, None].astype(jnp.int32) * jax.nn.one_hot(
                n, hist_size, dtype=jnp.int32
            )
            reached_sum = reached_sum + jnp.where(active[:, None], reached, 0.0)
            drafted_sum = drafted_sum + jnp.where(active, drafted, 0)
            if self.progress is not None:
                done = jnp.minimum(lengths - prompt_lengths, self.num_tokens).sum()
                jax.debug.callback(self.progress, done, batch * self.num_tokens)
            return t + 1, buffer, lengths, calls, hist, reached_sum, drafted_sum

        def unfinished(state):
            return jnp.any(state[2] - prompt_lengths < self.num_tokens)

        state = (
            jnp.zeros((), jnp.int32),
            buffer,
            lengths,
            jnp.zeros((batch,), jnp.int32),
            jnp.zeros((batch, hist_size), jnp.int32),
            jnp.zeros((batch, hist_size), jnp.float32),
            jnp.zeros((batch,), jnp.int32),
        )
        _, buffer, lengths, calls, hist, reached, drafted = jax.lax.while_loop(
            unfinished, step, state
        )
        take = (
            prompt_lengths[:, None] + jnp.arange(self.num_tokens, dtype=jnp.int32)[None]
        )
        tokens = jnp.take_along_axis(buffer, take, axis=1)
        return DecodeResult(tokens, calls, hist, reached, self.theory, drafted=drafted)


@FilterJit
def _run(loop: _DecodeLoop, prompt_tokens, prompt_lengths, key) -> DecodeResult:
    return loop(prompt_tokens, prompt_lengths, key)


@typing.no_type_check  # validated by hand, with messages naming the argument
def speculative_decode(
    draft_model: Callable,
    target_model: Callable,
    prompt_tokens: Int[Array, "batch prompt"],
    prompt_lengths: Int[Array, " batch"] | None,
    num_tokens: int,
    key: Key[Array, ""],
    *,
    gamma: int = 4,
    verifier: AbstractVerifier | AbstractTreeVerifier = Verifier(),
    drafting: ChainDrafting = "sample",
    outputs: ModelOutputs = "probs",
    progress: Callable | None = None,
    tree: tuple[int, ...] | None = None,
    draft_length: AbstractDraftLength = FixedDraftLength(),
) -> DecodeResult:
    """Generates `num_tokens` tokens for each of a batch of prompts by speculative
    decoding, in one compiled `jax.lax.while_loop`.

    Each step, for every unfinished row: the draft model proposes `gamma` tokens one at
    a time (sampled from its distributions $q_i$, or their argmax), the target model
    scores all of them at once (the `gamma + 1` distributions $p_i$), `verifier` decides
    how many survive and draws the correction, and the row commits those tokens. Rows
    advance by different amounts; each keeps its own position, and finished rows are
    masked until every row is done. The loop is compiled once per set of shapes and
    static settings, with Equinox's filter semantics (the arrays of the models and the
    verifier traced, everything else static), and works inside `jax.jit` too.

    A model is any callable (an Equinox module, or a function) with the signature
    `model(tokens: int[T], positions: int[K]) -> float[K, V]`, returning for one sequence
    the next-token distributions after `tokens[: position + 1]` for each position
    (probabilities, or logits with `outputs="logits"`). [`eqx_specdec.NGramModel`][] is
    one; a transformer would run on `tokens` and read rows `positions` of its output.
    Slots of `tokens` after the current position hold scratch values a causal model
    never reads.

    The verifier is called without the run-time value checks of
    [`eqx_specdec.speculative_accept`][]: the models are trusted to return valid
    distributions.

    Randomness comes from `key` only: row $b$ at step $t$ uses
    `fold_in(fold_in(key, b), t)`, so a row's tokens do not depend on the batch.

    **Arguments:**

    - `draft_model`: the draft model.
    - `target_model`: the target model, over the same vocabulary.
    - `prompt_tokens`: integer of shape `(B, P)`, the prompts, padded on the right.
    - `prompt_lengths`: integer of shape `(B,)`, each prompt's length in `[1, P]`; `None`
        when every prompt fills its row.
    - `num_tokens`: $L$, the number of tokens to generate per row (a Python int).
    - `key`: a `jax.random` key.
    - `gamma`: $G$, the number of draft tokens per step. Default 4.
    - `verifier`: the [`eqx_specdec.Verifier`][] to run. Its stages receive
        probabilities, or log-probabilities when its ratio test has `log_space=True`.
    - `drafting`: for chains, `"sample"` (the default): draft tokens $x_i \\sim q_i$, and
        the verifier sees $q$; `"argmax"`: $x_i = \\arg\\max_v q_i(v)$, passed to the
        verifier as one-hot drafts (`draft_probs=None`). Greedy speculative decoding is
        `"argmax"` with the greedy verifier. (A tree's children are drawn by its node
        rule's `candidate_law`.)
    - `outputs`: `"probs"` (default) or `"logits"`: what the models return.
    - `progress`: `None`, or a function `progress(done, total)` called from the host
        after every step with the number of tokens generated so far over the batch.
    - `tree`: with a [`eqx_specdec.TreeVerifier`][] as `verifier`, the shape of the
        draft tree: the parent of each node in depth-first order (-1 for the root's
        children), a tuple of Python ints. Each step drafts the tree (children of a node
        drawn from the draft after it: i.i.d. for [`eqx_specdec.IIDCandidates`][],
        without replacement for [`eqx_specdec.WithoutReplacementCandidates`][], its
        top-$k$ for [`eqx_specdec.DeterministicCandidates`][]: each rule's
        [`eqx_specdec.AbstractNodeRule.candidate_law`][]), scores the root and every
        node with the target (one call per node here, vmapped; a transformer would use
        a tree attention mask), and commits the accepted path and the correction.
        `gamma` is unused, and `DecodeResult.theory` is `"none"`.
    - `draft_length`: for chains, the [`eqx_specdec.AbstractDraftLength`][] policy
        that decides each row's draft length $L \\in [1, G]$ every step: all $G$
        ([`eqx_specdec.FixedDraftLength`][], the default) or a stopping rule
        ([`eqx_specdec.StopWhenUnlikely`][]). The buffers keep $G$ slots; a row verifies
        a chain of its own length $L$ (the verifier runs once per possible length,
        and each row takes its own), and `DecodeResult.drafted` counts the $L$s.

    **Returns:**

    A [`eqx_specdec.DecodeResult`][]: the tokens and the run's statistics.
    """
    tree = check_tree(tree, verifier, drafting)
    prompt_lengths = check_decode_arguments(
        prompt_tokens, prompt_lengths, num_tokens, gamma, outputs, verifier
    )
    if not isinstance(draft_length, AbstractDraftLength):
        raise TypeError(
            "`draft_length` must be an eqx_specdec.AbstractDraftLength (FixedDraftLength, "
            f"StopWhenUnlikely or your own), got {type(draft_length).__name__}."
        )
    if tree is not None and not draft_length.always_full:
        raise ValueError(
            "`draft_length` policies apply to chains; a tree's size is its shape "
            "(`tree`). Leave `draft_length` at its default with a tree."
        )
    loop = _DecodeLoop(
        draft_model,
        target_model,
        verifier,
        num_tokens,
        gamma,
        drafting,
        outputs,
        progress,
        tree,
        draft_length,
    )
    return _run(loop, jnp.asarray(prompt_tokens), prompt_lengths, key)
