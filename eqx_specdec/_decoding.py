"""Speculative decoding end to end: a compiled loop that drafts, verifies and commits
tokens for a batch of sequences, each advancing at its own pace."""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, Key

from ._stages.ratio_tests import (
    BlockRatioTest,
    GreedyRatioTest,
    LenientRatioTest,
    RatioTest,
    typical_threshold,
    TypicalRatioTest,
)
from ._tree import (
    DeterministicCandidates,
    IIDCandidates,
    TreeVerifier,
    WithoutReplacementCandidates,
)
from ._verifier import Verifier


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
        (NaN when the verifier's rule has no such formula; see `theory`).
    - `theory`: `"exact"` (the rule's own probabilities), `"lower bound"` (block
        verification: the standard rule's value, which it never falls below) or `"none"`.
    """

    tokens: Int[Array, "batch length"]
    target_calls: Int[Array, " batch"]
    accepted_histogram: Int[Array, "batch gamma_plus_1"]
    theory_reached: Float[Array, "batch gamma_plus_1"]
    theory: str = eqx.field(static=True)

    def tokens_per_call(self) -> float:
        """Tokens committed per target call, over the whole batch: each step commits
        its accepted draft tokens and one correction or bonus token."""
        hist = np.asarray(self.accepted_histogram, np.float64).sum(0)
        return float((hist * np.arange(1, hist.size + 1)).sum() / hist.sum())

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
        reached = np.asarray(self.theory_reached, np.float64).sum(0)
        steps = np.asarray(self.accepted_histogram, np.float64).sum()
        return float(reached.sum() / steps)

    def theoretical_accepted_length_distribution(self) -> np.ndarray:
        """The distribution of the number of accepted draft tokens predicted by the
        models' distributions, shape `(G + 1,)`."""
        reached = np.asarray(self.theory_reached, np.float64).sum(0)
        reached = reached / reached[0]
        return reached - np.append(reached[1:], 0.0)


def _pass_probabilities(ratio_test, draft_law, target_rows):
    """For each position and each token v the probability that the ratio test passes v
    when v is drafted, or None when the rule has no per-position form."""
    p, q = target_rows, draft_law
    if isinstance(ratio_test, (RatioTest, BlockRatioTest)):
        return jnp.where(q > 0, jnp.minimum(1.0, p / jnp.where(q > 0, q, 1.0)), 1.0)
    if isinstance(ratio_test, LenientRatioTest):
        scaled = ratio_test.lenience * q
        return jnp.where(
            scaled > 0, jnp.minimum(1.0, p / jnp.where(q > 0, scaled, 1)), 1
        )
    if isinstance(ratio_test, GreedyRatioTest):
        return jax.nn.one_hot(jnp.argmax(p, -1), p.shape[-1], dtype=p.dtype)
    if isinstance(ratio_test, TypicalRatioTest):
        threshold = typical_threshold(p, ratio_test.epsilon, ratio_test.delta)
        return (p > threshold[:, None]).astype(p.dtype)
    return None


def _theory_kind(ratio_test) -> str:
    if isinstance(ratio_test, BlockRatioTest):
        return "lower bound"
    if isinstance(
        ratio_test, (RatioTest, LenientRatioTest, GreedyRatioTest, TypicalRatioTest)
    ):
        return "exact"
    return "none"


def _reached_probabilities(passes, draft_law, draft_tokens):
    """$P(n \\ge k)$, k = 0..G, for one step: unbiased given the drafted path.

    With $a_j(v)$ the pass probability of token v at position j and
    $\\beta_j = \\sum_v q_j(v) a_j(v)$, $P(n \\ge k) = E[\\prod_{j<k-1} a_j(x_j) \\beta_{k-1}]$
    over the draft $x \\sim q$; the last factor is averaged exactly.
    """
    beta = jnp.sum(draft_law * passes, axis=-1)
    a_x = jnp.take_along_axis(passes, draft_tokens[:, None], axis=-1)[:, 0]
    before = jnp.concatenate([jnp.ones((1,), a_x.dtype), jnp.cumprod(a_x)[:-1]])
    return jnp.concatenate([jnp.ones((1,), beta.dtype), before * beta])


_TREE_POLICIES = {
    IIDCandidates: "iid",
    WithoutReplacementCandidates: "without-replacement",
    DeterministicCandidates: "top-k",
}


def _tree_depths(tree) -> list[int]:
    depths = []
    for parent in tree:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths


def _as_probs(x, outputs):
    x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    return jax.nn.softmax(x, axis=-1) if outputs == "logits" else x


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


def _row_keys(key, step, batch):
    rows = jnp.arange(batch, dtype=jnp.uint32)
    return jax.vmap(lambda b: jax.random.fold_in(jax.random.fold_in(key, b), step))(
        rows
    )


def _token_buffer(prompt_tokens, room: int):
    """The prompts, left-aligned, followed by `room` free slots per row."""
    batch, width = prompt_tokens.shape
    buffer = jnp.zeros((batch, width + room), jnp.int32)
    return buffer.at[:, :width].set(prompt_tokens.astype(jnp.int32))


@eqx.filter_jit
def _decode(
    draft_model,
    target_model,
    prompt_tokens,
    prompt_lengths,
    key,
    verifier,
    num_tokens,
    gamma,
    drafting,
    outputs,
    progress,
    tree,
):
    batch = prompt_tokens.shape[0]
    if tree is None:
        room, hist_size, probe_positions = gamma + 1, gamma + 1, gamma + 1
        key_sampler = verifier.residual_sampler.randomness == "key"
        log_space = getattr(verifier.ratio_test, "log_space", False)
        theory_kind = _theory_kind(verifier.ratio_test)
    else:
        depths = _tree_depths(tree)
        room, hist_size, probe_positions = len(tree) + 1, max(depths) + 1, 1
        # The tree verifier draws its correction with one uniform per row.
        key_sampler, log_space, theory_kind = False, False, "none"
        tree_policy = drafting
    buffer = _token_buffer(prompt_tokens, num_tokens + room)
    lengths = prompt_lengths.astype(jnp.int32)

    # Trace the models once to learn V and check what they return.
    probe = jax.eval_shape(
        target_model, buffer[0], jnp.arange(probe_positions, dtype=jnp.int32)
    )
    vocab = probe.shape[-1] if hasattr(probe, "shape") and probe.ndim == 2 else -1
    _checked_output("target_model", probe, (probe_positions, vocab))
    _checked_output(
        "draft_model",
        jax.eval_shape(draft_model, buffer[0], jnp.zeros((1,), jnp.int32)),
        (1, vocab),
    )

    def tree_row(tokens, length, key):
        """Drafts one tree in depth-first order (children of a node drawn from the
        draft's distribution after it: i.i.d., without replacement, or its top-k), then
        scores the root and every node with the target (one branch buffer each)."""
        keys = jax.random.split(key, len(tree))
        node_tokens = []

        def context(node):  # the row's buffer with the path to `node` written in
            path, buf = [], tokens
            while node >= 0:
                path.append(node)
                node = tree[node]
            for a in path:
                buf = buf.at[length + depths[a] - 1].set(node_tokens[a])
            return buf

        def position(node):
            return length - 1 + (0 if node < 0 else depths[node])

        laws, remaining = {}, {}
        for i, parent in enumerate(tree):
            if parent not in laws:
                buf = context(parent)
                q = _as_probs(draft_model(buf, position(parent)[None])[0], outputs)
                laws[parent] = remaining[parent] = q
            law = remaining[parent]
            if tree_policy == "top-k":
                x = jnp.argmax(law)
            elif tree_policy == "iid":
                x = jax.random.categorical(keys[i], jnp.log(laws[parent]))
            else:
                x = jax.random.categorical(keys[i], jnp.log(law))
            x = x.astype(jnp.int32)
            if tree_policy != "iid":  # siblings are distinct
                remaining[parent] = jnp.where(
                    jnp.arange(vocab, dtype=jnp.int32) == x,
                    -1.0 if tree_policy == "top-k" else 0.0,
                    law,
                )
            node_tokens.append(x)
        contexts = [-1] + list(range(len(tree)))
        buffers = jnp.stack([context(c) for c in contexts])
        positions = jnp.stack([position(c) for c in contexts])
        p = jax.vmap(lambda b, pos: target_model(b, pos[None])[0])(buffers, positions)
        p = _as_probs(p, outputs)
        zeros = jnp.zeros((vocab,), p.dtype)
        q = jnp.stack([laws.get(c, zeros).astype(p.dtype) for c in contexts])
        return jnp.stack(node_tokens), q, p

    def draft_row(tokens, length, key):
        def one(tokens, i_key):
            i, k = i_key
            q = _as_probs(draft_model(tokens, (length - 1 + i)[None])[0], outputs)
            if drafting == "argmax":
                x = jnp.argmax(q).astype(jnp.int32)
            else:
                x = jax.random.categorical(k, jnp.log(q)).astype(jnp.int32)
            return tokens.at[length + i].set(x), (x, q)

        keys = jax.random.split(key, gamma)
        tokens, (xs, qs) = jax.lax.scan(
            one, tokens, (jnp.arange(gamma, dtype=jnp.int32), keys)
        )
        p = _as_probs(
            target_model(tokens, length - 1 + jnp.arange(gamma + 1, dtype=jnp.int32)),
            outputs,
        )
        return xs, qs, p

    def accept_and_sample_randomness(split, count):
        accept = jax.vmap(lambda k: jax.random.uniform(k, (count,), jnp.float32))(
            split[:, 1]
        )
        if key_sampler:
            return accept, split[:, 2]
        sample = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(split[:, 2])
        return accept, sample

    def propose_chain(buffer, lengths, split):
        """Drafts a chain, scores it, verifies it: `(n, tokens, P(n >= k))`."""
        xs, qs, p = jax.vmap(draft_row)(buffer, lengths, split[:, 0])
        accept, sample = accept_and_sample_randomness(split, gamma)
        if drafting == "argmax":
            law = jax.nn.one_hot(xs, vocab, dtype=qs.dtype)
            given = None
        else:
            law = given = qs
        to_verifier = (lambda a: jnp.log(a)) if log_space else (lambda a: a)
        out = verifier(
            xs,
            None if given is None else to_verifier(given),
            to_verifier(p),
            accept,
            sample,
        )
        passes = jax.vmap(
            lambda law, p: _pass_probabilities(verifier.ratio_test, law, p)
        )
        if theory_kind == "none":
            reached = jnp.full((batch, gamma + 1), jnp.nan, jnp.float32)
        else:
            reached = jax.vmap(_reached_probabilities)(
                passes(law, p[:, :gamma]), law, xs
            ).astype(jnp.float32)
        return out["num_accepted"], out["tokens"], reached

    def propose_tree(buffer, lengths, split):
        """Drafts a tree, scores every node, walks it with the tree verifier."""
        nodes, dq, p = jax.vmap(tree_row)(buffer, lengths, split[:, 0])
        accept, sample = accept_and_sample_randomness(split, len(tree))
        parents = jnp.broadcast_to(jnp.asarray(tree, jnp.int32), nodes.shape)
        deterministic = isinstance(verifier.node_rule, DeterministicCandidates)
        draft_rows = None if deterministic else dq
        out = verifier(nodes, parents, draft_rows, p, accept, sample)
        reached = jnp.full((batch, hist_size), jnp.nan, jnp.float32)
        return out["num_accepted"], out["tokens"], reached

    propose = propose_chain if tree is None else propose_tree

    def step(state):
        t, buffer, lengths, calls, hist, theory = state
        active = lengths - prompt_lengths < num_tokens
        row_keys = _row_keys(key, t, batch)
        split = jax.vmap(lambda k: jax.random.split(k, 4))(row_keys)
        n, new, reached = propose(buffer, lengths, split)
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
        theory = theory + jnp.where(active[:, None], reached, 0.0)
        if progress is not None:
            done = jnp.minimum(lengths - prompt_lengths, num_tokens).sum()
            jax.debug.callback(progress, done, batch * num_tokens)
        return t + 1, buffer, lengths, calls, hist, theory

    def unfinished(state):
        return jnp.any(state[2] - prompt_lengths < num_tokens)

    state = (
        jnp.zeros((), jnp.int32),
        buffer,
        lengths,
        jnp.zeros((batch,), jnp.int32),
        jnp.zeros((batch, hist_size), jnp.int32),
        jnp.zeros((batch, hist_size), jnp.float32),
    )
    _, buffer, lengths, calls, hist, theory = jax.lax.while_loop(
        unfinished, step, state
    )
    take = prompt_lengths[:, None] + jnp.arange(num_tokens, dtype=jnp.int32)[None]
    tokens = jnp.take_along_axis(buffer, take, axis=1)
    return DecodeResult(tokens, calls, hist, theory, theory_kind)


def _check_drafting(tree, verifier, drafting):
    """Checks `tree` against the verifier and resolves `drafting`: for a chain,
    "sample" or "argmax"; for a tree, how siblings are drawn."""
    if tree is None:
        if isinstance(verifier, TreeVerifier):
            raise TypeError(
                "A TreeVerifier needs the tree's shape: pass `tree=` the parent of each "
                "node in depth-first order, e.g. `tree=(-1, 0, -1, 2)` for two "
                "candidates at the root with one child each."
            )
        drafting = "sample" if drafting is None else drafting
        if drafting not in ("sample", "argmax"):
            raise ValueError(
                f'`drafting` must be "sample" (draft tokens x ~ q) or "argmax" (one-hot '
                f"drafts), got {drafting!r}."
            )
        return None, drafting
    if not isinstance(verifier, TreeVerifier):
        raise TypeError(
            "`tree` is given, so `verifier` must be an eqx_specdec.TreeVerifier; got "
            f"{type(verifier).__name__}."
        )
    if drafting is None:
        if type(verifier.node_rule) not in _TREE_POLICIES:
            raise TypeError(
                f"{type(verifier.node_rule).__name__} is not one of the library's node "
                'rules, so say how its siblings are drafted: `drafting=` "iid", '
                '"without-replacement" or "top-k".'
            )
        drafting = _TREE_POLICIES[type(verifier.node_rule)]
    if drafting not in _TREE_POLICIES.values():
        raise ValueError(
            '`drafting` for a tree must be "iid", "without-replacement" or "top-k", got '
            f"{drafting!r}."
        )
    tree = tuple(tree)
    valid = len(tree) > 0 and all(
        isinstance(p, int) and -1 <= p < i for i, p in enumerate(tree)
    )
    if not valid:
        raise ValueError(
            "`tree` must be a non-empty tuple of Python ints, the parent of each node in "
            "depth-first order: -1 for a child of the root, else an earlier node's "
            f"index; got {tree!r}."
        )
    return tree, drafting


def _check_decode_arguments(
    prompt_tokens, prompt_lengths, num_tokens, gamma, outputs, verifier
):
    from ._sharding import ShardedVerifier

    if not isinstance(verifier, (Verifier, ShardedVerifier, TreeVerifier)):
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


def speculative_decode(
    draft_model: Callable,
    target_model: Callable,
    prompt_tokens: Int[Array, "batch prompt"],
    prompt_lengths: Int[Array, " batch"] | None,
    num_tokens: int,
    key: Key[Array, ""],
    *,
    gamma: int = 4,
    verifier: Verifier = Verifier(),
    drafting: str | None = None,
    outputs: str = "probs",
    progress: Callable | None = None,
    tree: tuple[int, ...] | None = None,
) -> DecodeResult:
    """Generates `num_tokens` tokens for each of a batch of prompts by speculative
    decoding, in one compiled `jax.lax.while_loop`.

    Each step, for every unfinished row: the draft model proposes `gamma` tokens one at
    a time (sampled from its distributions $q_i$, or their argmax), the target model
    scores all of them at once (the `gamma + 1` distributions $p_i$), `verifier` decides
    how many survive and draws the correction, and the row commits those tokens. Rows
    advance by different amounts; each keeps its own position, and finished rows are
    masked until every row is done. The loop is compiled once per set of shapes and
    static settings (it is wrapped in `eqx.filter_jit`, and works inside `jax.jit` too).

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
    - `drafting`: `"sample"` (the default for chains): draft tokens $x_i \\sim q_i$,
        and the verifier sees $q$; `"argmax"`: $x_i = \\arg\\max_v q_i(v)$, passed to the verifier as one-hot
        drafts (`draft_probs=None`). Greedy speculative decoding is `"argmax"` with the
        greedy verifier.
    - `outputs`: `"probs"` (default) or `"logits"`: what the models return.
    - `progress`: `None`, or a function `progress(done, total)` called from the host
        after every step with the number of tokens generated so far over the batch.
    - `tree`: with a [`eqx_specdec.TreeVerifier`][] as `verifier`, the shape of the
        draft tree: the parent of each node in depth-first order (-1 for the root's
        children), a tuple of Python ints. Each step drafts the tree (children of a node
        drawn from the draft after it: i.i.d. for [`eqx_specdec.IIDCandidates`][],
        without replacement for [`eqx_specdec.WithoutReplacementCandidates`][], its
        top-$k$ for [`eqx_specdec.DeterministicCandidates`][]), scores the root and every
        node with the target (one call per node here, vmapped; a transformer would use
        a tree attention mask), and commits the accepted path and the correction.
        `drafting` may override how siblings are drawn (`"iid"`,
        `"without-replacement"`, `"top-k"`; required for a node rule of your own);
        `gamma` is unused, and `DecodeResult.theory` is `"none"`.

    **Returns:**

    A [`eqx_specdec.DecodeResult`][]: the tokens and the run's statistics.
    """
    tree, drafting = _check_drafting(tree, verifier, drafting)
    prompt_lengths = _check_decode_arguments(
        prompt_tokens, prompt_lengths, num_tokens, gamma, outputs, verifier
    )
    return _decode(
        draft_model,
        target_model,
        jnp.asarray(prompt_tokens),
        prompt_lengths,
        key,
        verifier,
        num_tokens,
        gamma,
        drafting,
        outputs,
        progress,
        tree,
    )


@eqx.filter_jit
def _autoregressive(
    model, prompt_tokens, prompt_lengths, key, num_tokens, greedy, outputs
):
    batch = prompt_tokens.shape[0]
    buffer = _token_buffer(prompt_tokens, num_tokens)

    def step(buffer, t):
        def row(tokens, length, b):
            position = length - 1 + t
            p = _as_probs(model(tokens, position[None])[0], outputs)
            if greedy:
                x = jnp.argmax(p)
            else:
                row_key = jax.random.fold_in(jax.random.fold_in(key, b), t)
                x = jax.random.categorical(row_key, jnp.log(p))
            return tokens.at[position + 1].set(x.astype(jnp.int32))

        rows = jnp.arange(batch, dtype=jnp.uint32)
        return jax.vmap(row)(buffer, prompt_lengths, rows), None

    buffer, _ = jax.lax.scan(step, buffer, jnp.arange(num_tokens, dtype=jnp.int32))
    take = prompt_lengths[:, None] + jnp.arange(num_tokens, dtype=jnp.int32)[None]
    return jnp.take_along_axis(buffer, take, axis=1)


def autoregressive_decode(
    model: Callable,
    prompt_tokens: Int[Array, "batch prompt"],
    prompt_lengths: Int[Array, " batch"] | None,
    num_tokens: int,
    key: Key[Array, ""] | None = None,
    *,
    outputs: str = "probs",
) -> Int[Array, "batch num_tokens"]:
    """Plain autoregressive decoding with one model: the baseline that speculative
    decoding must reproduce in distribution, one model call per token.

    **Arguments:**

    - `model`, `prompt_tokens`, `prompt_lengths`, `num_tokens`, `outputs`: as for
        [`eqx_specdec.speculative_decode`][].
    - `key`: a `jax.random` key to sample with, or `None` for greedy decoding (the argmax,
        lowest id on ties).

    **Returns:**

    int32 of shape `(B, L)`, the generated tokens.
    """
    prompt_lengths = _check_decode_arguments(
        prompt_tokens, prompt_lengths, num_tokens, 1, outputs, Verifier()
    )
    greedy = key is None
    return _autoregressive(
        model,
        jnp.asarray(prompt_tokens),
        prompt_lengths,
        jax.random.key(0) if greedy else key,
        num_tokens,
        greedy,
        outputs,
    )
