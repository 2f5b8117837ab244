"""What serving stacks ask of a verification step: log-probabilities of the emitted
tokens, against NumPy references, opt-in so that the default program is unchanged."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import accept_from_key, accept_logits, tree_accept

import eqx_specdec as es


def _reference(rows_log, tokens, top_k):
    """NumPy: log p_i(t_i) at the emitted positions (-inf after), and each emitted
    row's top-k (largest first, lowest id first on ties)."""
    rows_log = np.asarray(rows_log, np.float64)
    batch, slots, _ = rows_log.shape
    values = np.full((batch, slots), -np.inf)
    top_values = np.full((batch, slots, top_k), -np.inf)
    top_ids = np.full((batch, slots, top_k), -1)
    for b in range(batch):
        for i in range(slots):
            t = tokens[b, i]
            if t < 0:
                continue
            values[b, i] = rows_log[b, i, t]
            order = np.lexsort((np.arange(rows_log.shape[-1]), -rows_log[b, i]))
            top_ids[b, i] = order[:top_k]
            top_values[b, i] = rows_log[b, i, order[:top_k]]
    return values, top_values, top_ids


def test_logprobs_of_the_probabilities_entry_point():
    inputs = es.example_inputs(batch=6, gamma=4, vocab=10)
    out = es.speculative_accept(*inputs, logprobs=es.LogProbs(top_k=3))
    plain = es.speculative_accept(*inputs)
    assert set(plain) == {"num_accepted", "tokens"}  # opt-in: the default is unchanged
    np.testing.assert_array_equal(out["tokens"], plain["tokens"])
    tokens = np.asarray(out["tokens"])
    expected, top_values, top_ids = _reference(np.log(inputs[2]), tokens, 3)
    np.testing.assert_allclose(out["logprobs"], expected, rtol=1e-6)
    np.testing.assert_allclose(out["top_logprobs"], top_values, rtol=1e-6)
    np.testing.assert_array_equal(out["top_tokens"], top_ids)
    assert out["logprobs"].dtype == jnp.float32 and out["top_tokens"].dtype == jnp.int32
    # The correction token's log-probability is under the target's row n, never the
    # residual it was drawn from.
    rows = np.arange(6)
    n = np.asarray(out["num_accepted"])
    correction = tokens[rows, n]
    np.testing.assert_allclose(
        out["logprobs"][rows, n],
        np.log(np.asarray(inputs[2])[rows, n, correction]),
        rtol=1e-6,
    )


def _warped_reference(logits, temperature, top_k):
    """NumPy: temperature, then the top-k cut (ties at the k-th value kept), then a
    log-softmax."""
    x = np.asarray(logits, np.float64) / temperature
    kth = -np.sort(-x, axis=-1)[..., top_k - 1 : top_k]
    x = np.where(x >= kth, x, -np.inf)
    return (
        x
        - np.log(np.sum(np.exp(x - x.max(-1, keepdims=True)), -1, keepdims=True))
        - x.max(-1, keepdims=True)
    )


def test_logprobs_of_the_logits_entry_point_processed_and_raw():
    key = jax.random.key(3)
    batch, gamma, vocab = 5, 3, 40
    k_d, k_t, k_x, k_u, k_s = jax.random.split(key, 5)
    draft_logits = 2 * jax.random.normal(k_d, (batch, gamma, vocab))
    target_logits = 2 * jax.random.normal(k_t, (batch, gamma + 1, vocab))
    warp = es.Warp(0.7, top_k=6)
    draft_tokens = jax.random.categorical(k_x, warp(draft_logits)).astype(jnp.int32)
    u = jax.random.uniform(k_u, (batch, gamma))
    s = jax.random.uniform(k_s, (batch,))
    run = functools.partial(
        accept_logits,
        draft_tokens,
        draft_logits,
        target_logits,
        u,
        s,
        target_warp=warp,
        draft_warp=warp,
    )
    out = jax.jit(lambda: run(logprobs=es.LogProbs(raw=True, top_k=2)))()
    tokens = np.asarray(out["tokens"])
    np.testing.assert_array_equal(tokens, run()["tokens"])
    warped = _warped_reference(target_logits, 0.7, 6)
    expected, top_values, top_ids = _reference(warped, tokens, 2)
    np.testing.assert_allclose(out["logprobs"], expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["top_logprobs"], top_values, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out["top_tokens"], top_ids)
    raw = np.asarray(jax.nn.log_softmax(target_logits.astype(jnp.float32), -1))
    raw_expected, _, _ = _reference(raw, tokens, 1)
    np.testing.assert_allclose(out["raw_logprobs"], raw_expected, rtol=1e-5, atol=1e-5)
    # Every emitted token is inside its row's top-k: finite processed log-probability.
    emitted = tokens >= 0
    assert np.isfinite(np.asarray(out["logprobs"])[emitted]).all()


def test_logprobs_errors_name_the_argument():
    inputs = es.example_inputs(batch=2, gamma=2, vocab=5)
    with pytest.raises(
        ValueError, match=r"LogProbs\(`top_k`=...\) must be a Python int"
    ):
        es.LogProbs(top_k=-1)
    with pytest.raises(ValueError, match="no raw log-probability"):
        es.speculative_accept(*inputs, logprobs=es.LogProbs(raw=True))
    with pytest.raises(TypeError, match=r"verify\(`logprobs`=...\) must be"):
        es.speculative_accept(*inputs, logprobs=True)


def test_logprobs_from_a_key_match_the_uniforms_entry_point():
    _, draft, target, _, _ = es.example_inputs(batch=4, gamma=3, vocab=8)
    tokens = jnp.argmax(draft, -1).astype(jnp.int32)
    key = jax.random.key(5)
    spec = es.LogProbs(top_k=2)
    out = accept_from_key(key, tokens, draft, target, logprobs=spec)
    drawn = es.Uniforms.from_key(key, 4, 3)
    u, s = drawn.accept, drawn.sample
    direct = es.speculative_accept(tokens, draft, target, u, s, logprobs=spec)
    for name in ("tokens", "logprobs", "top_logprobs", "top_tokens"):
        np.testing.assert_array_equal(out[name], direct[name])


@pytest.mark.parametrize(
    "verifier",
    [es.TreeVerifier(es.IIDCandidates()), es.TraversalVerifier()],
    ids=["top-down", "traversal"],
)
def test_tree_logprobs_read_each_token_s_parent_row(verifier):
    rng = np.random.default_rng(0)
    batch, vocab, parents = 6, 5, np.array([-1, 0, 0, -1, 3], np.int32)
    nodes = len(parents)
    tokens = np.zeros((batch, nodes), np.int32)
    for b in range(batch):  # siblings distinct
        tokens[b, [0, 3]] = rng.choice(vocab, 2, replace=False)
        tokens[b, [1, 2]] = rng.choice(vocab, 2, replace=False)
        tokens[b, 4] = rng.integers(vocab)
    q = rng.dirichlet(np.ones(vocab), (batch, nodes + 1)).astype(np.float32)
    p = rng.dirichlet(np.ones(vocab), (batch, nodes + 1)).astype(np.float32)
    u = rng.uniform(size=(batch, nodes)).astype(np.float32)
    s = rng.uniform(size=batch).astype(np.float32)
    out = tree_accept(
        tokens,
        np.tile(parents, (batch, 1)),
        q,
        p,
        u,
        s,
        verifier=verifier,
        logprobs=es.LogProbs(),
    )
    emitted, path = np.asarray(out["tokens"]), np.asarray(out["path"])
    for b in range(batch):
        for k in range(nodes + 1):
            if emitted[b, k] < 0:
                assert out["logprobs"][b, k] == -np.inf
                continue
            row = 0 if k == 0 else path[b, k - 1] + 1
            np.testing.assert_allclose(
                out["logprobs"][b, k], np.log(p[b, row, emitted[b, k]]), rtol=1e-6
            )


def _own_logprobs(target, prompt_tokens, generated, logits=False):
    """The target's own log-probability of each generated token, recomputed from the
    whole sequence (a stateless model called on every position at once)."""
    rows = []
    for prompt, tokens in zip(np.asarray(prompt_tokens), np.asarray(generated)):
        sequence = jnp.asarray(np.concatenate([prompt, tokens]))
        positions = jnp.arange(len(prompt) - 1, len(sequence) - 1)
        out = target(sequence, positions)
        log = jax.nn.log_softmax(out, -1) if logits else jnp.log(out)
        rows.append(np.take_along_axis(np.asarray(log), tokens[:, None], 1)[:, 0])
    return np.stack(rows)


@pytest.mark.parametrize(
    "verifier",
    [es.Verifier(), es.TreeVerifier(es.IIDCandidates(), tree=(-1, 0, -1))],
    ids=["chain", "tree"],
)
def test_decoding_returns_the_target_s_own_logprobs(verifier):
    draft, target = es.demo.builtin_models()
    prompts = jnp.asarray(np.stack([es.demo.encode("the "), es.demo.encode("and ")]))
    result = es.speculative_decode(
        draft,
        target,
        prompts,
        None,
        24,
        jax.random.key(0),
        verifier=verifier,
        logprobs=True,
    )
    plain = es.speculative_decode(
        draft, target, prompts, None, 24, jax.random.key(0), verifier=verifier
    )
    assert plain.logprobs is None
    np.testing.assert_array_equal(result.tokens, plain.tokens)
    expected = _own_logprobs(target, prompts, result.tokens)
    np.testing.assert_allclose(result.logprobs, expected, rtol=1e-5, atol=1e-6)


def test_decoding_logprobs_with_a_cached_transformer_target():
    draft, _ = es.demo.builtin_models()
    target = es.demo.Transformer.init(
        jax.random.key(1),
        vocab_size=len(es.demo.VOCABULARY),
        dim=16,
        depth=1,
        heads=2,
        context=64,
    )
    prompts = jnp.asarray(es.demo.encode("we hold ")[None])
    result = es.speculative_decode(
        draft,
        target,
        prompts,
        None,
        16,
        jax.random.key(0),
        outputs=("probs", "logits"),
        logprobs=True,
    )

    def stateless(tokens, positions):
        return target.logits(tokens)[positions]

    expected = _own_logprobs(stateless, prompts, result.tokens, logits=True)
    np.testing.assert_allclose(result.logprobs, expected, rtol=1e-5, atol=1e-5)


def test_rows_stop_at_their_first_stop_token_and_their_limit():
    draft, target = es.demo.builtin_models()
    prompts = jnp.asarray(
        np.stack([es.demo.encode(p) for p in ("the ", "and ", "it w", "we h")])
    )
    key = jax.random.key(2)
    free = es.speculative_decode(draft, target, prompts, None, 40, key)
    limits = np.asarray([40, 40, 1, 40], np.int32)
    stop = es.demo.encode(" ").tolist()  # a space ends a row: the first word
    streamed = []
    out = es.speculative_decode(
        draft,
        target,
        prompts,
        None,
        40,
        key,
        stop_tokens=stop,
        max_lengths=limits,
        logprobs=True,
        stream=lambda new: streamed.append(np.asarray(new)),
    )
    free_tokens, tokens = np.asarray(free.tokens), np.asarray(out.tokens)
    # The stream, step by step, holds exactly the emitted tokens, in order.
    steps = np.concatenate(streamed, axis=1)
    for b in range(4):
        np.testing.assert_array_equal(
            steps[b][steps[b] >= 0], tokens[b][tokens[b] >= 0]
        )
    reasons = out.finish_reason_names()
    for b in range(4):
        spaces = np.flatnonzero(free_tokens[b] == stop[0])
        first = spaces[0] + 1 if spaces.size else 40
        length = min(first, int(limits[b]))
        assert int(out.lengths[b]) == length
        assert reasons[b] == ("stop" if first <= limits[b] else "length")
        # The same tokens as the unstopped run up to the end, nothing after it.
        np.testing.assert_array_equal(tokens[b, :length], free_tokens[b, :length])
        assert (tokens[b, length:] == -1).all()
        assert np.isfinite(out.logprobs[b, :length]).all()
        assert (np.asarray(out.logprobs[b, length:]) == -np.inf).all()
    assert "stop" in reasons and "length" in reasons
    # A stopped row takes no more steps.
    assert (np.asarray(out.target_calls) <= np.asarray(free.target_calls)).all()
    assert int(out.target_calls[2]) < int(free.target_calls[2])


def test_the_whole_loop_is_lossless_with_stop_tokens():
    """The emitted sequences (cut after the first stop token) follow the target's own
    distribution of cut sequences, enumerated exactly."""
    vocab, length, rows, stop = 3, 4, 24_000, 2
    rng = np.random.default_rng(0)
    target = np.maximum(rng.dirichlet(np.ones(vocab), vocab), 0.05)
    target /= target.sum(-1, keepdims=True)
    draft = 0.5 * rng.dirichlet(np.ones(vocab), vocab) + 0.5 / vocab
    models = [
        es.demo.NGramModel(jnp.asarray(m, jnp.float32), 2) for m in (draft, target)
    ]
    out = es.speculative_decode(
        *models,
        jnp.ones((rows, 1), jnp.int32),
        None,
        length,
        jax.random.key(0),
        proposal=es.Chain(2),
        stop_tokens=(stop,),
    )

    def cut(seq):
        seq = list(seq)
        return tuple(seq[: seq.index(stop) + 1] if stop in seq else seq)

    exact = {}
    for seq in itertools.product(range(vocab), repeat=length):
        prob, previous = 1.0, 1
        for token in seq:
            prob, previous = prob * target[previous, token], token
        exact[cut(seq)] = exact.get(cut(seq), 0.0) + prob
    cells = sorted(exact)
    index = {c: i for i, c in enumerate(cells)}
    counts = np.zeros(len(cells))
    for seq in np.asarray(out.tokens):
        counts[index[tuple(int(t) for t in seq if t >= 0)]] += 1
    estimate = es.evaluation.EmissionEstimate(
        counts[None], np.array([float(rows)]), rows
    )
    chi = estimate.chi_square(np.asarray([exact[c] for c in cells])[None])
    assert float(chi["statistic"][0]) < float(chi["threshold"][0])
    assert "stop" in out.finish_reason_names() and "length" in out.finish_reason_names()


def test_stop_and_limit_errors_name_the_argument():
    draft, target = es.demo.builtin_models()
    prompts = jnp.asarray(es.demo.encode("the ")[None])
    key = jax.random.key(0)
    with pytest.raises(ValueError, match=r"`stop_tokens` must be ids of the models"):
        es.speculative_decode(draft, target, prompts, None, 4, key, stop_tokens=[99])
    with pytest.raises(TypeError, match="`stop_tokens` must be a sequence"):
        es.speculative_decode(draft, target, prompts, None, 4, key, stop_tokens=[-1])
    with pytest.raises(
        ValueError, match=r"`max_lengths` must lie in \[1, num_tokens\]"
    ):
        es.speculative_decode(
            draft, target, prompts, None, 4, key, max_lengths=jnp.asarray([5])
        )
    with pytest.raises(ValueError, match=r"`max_lengths` must have shape \(B,\)"):
        es.speculative_decode(
            draft, target, prompts, None, 4, key, max_lengths=jnp.asarray([1, 2])
        )


@pytest.mark.dtype_free  # per-row keys, float32 models
def test_a_row_s_tokens_depend_on_its_own_seed_only():
    draft, target = es.demo.builtin_models()
    texts = ["the ", "and ", "it w", "we h", "call", "four"]
    prompts = jnp.asarray(np.stack([es.demo.encode(t) for t in texts]))
    keys = jax.random.split(jax.random.key(7), 6)
    run = functools.partial(es.speculative_decode, draft, target, num_tokens=24)
    together = np.asarray(run(prompts, None, key=keys).tokens)
    # Row 3 alone, then in another batch, at another position, beside other seeds.
    alone = run(prompts[3:4], None, key=keys[3:4]).tokens
    np.testing.assert_array_equal(alone[0], together[3])
    order = np.array([5, 3, 0])
    others = jax.random.split(jax.random.key(8), 3).at[1].set(keys[3])
    mixed = np.asarray(run(prompts[order], None, key=others).tokens)
    np.testing.assert_array_equal(mixed[1], together[3])
    assert (mixed[0] != together[5]).any()  # a new seed, new tokens
    # Plain decoding takes per-row seeds the same way.
    plain = es.autoregressive_decode(target, prompts, None, 8, keys)
    np.testing.assert_array_equal(
        es.autoregressive_decode(target, prompts[3:4], None, 8, keys[3:4])[0], plain[3]
    )


def _chi_square_of_pairs(first, second, bins=10):
    """Pearson's statistic of the 2-d histogram of two uniform samples against the
    product of uniforms, and a threshold exceeded with probability about 1e-6 under
    independence (Wilson-Hilferty)."""
    counts, _, _ = np.histogram2d(first, second, bins=bins, range=[[0, 1], [0, 1]])
    expected = first.size / bins**2
    statistic = ((counts - expected) ** 2 / expected).sum()
    dof = bins**2 - 1
    z = 4.75  # one-sided 1e-6
    threshold = dof * (1 - 2 / (9 * dof) + z * np.sqrt(2 / (9 * dof))) ** 3
    return statistic, threshold


def test_the_three_streams_are_independent():
    from eqx_specdec._decoding.loop import row_keys, step_streams

    rows = 20_000
    keys = row_keys(jax.random.key(0), rows)
    streams = jax.vmap(lambda k: step_streams(k, 3))(keys)  # (rows, 4) keys
    draws = np.asarray(jax.vmap(jax.vmap(jax.random.uniform))(streams))  # (rows, 4)
    for a, b in itertools.combinations(range(3), 2):
        statistic, threshold = _chi_square_of_pairs(draws[:, a], draws[:, b])
        assert statistic < threshold, (a, b, statistic, threshold)
    # The coupled control: the residual drawn from the accept stream's key, shifted
    # (the peers' bug: one noise source feeding two decisions) is caught.
    coupled = (
        draws[:, 1] + 0.05 * np.asarray(jax.random.uniform(jax.random.key(1), (rows,)))
    ) % 1
    statistic, threshold = _chi_square_of_pairs(draws[:, 1], coupled)
    assert statistic > 10 * threshold


PENALTIES = dict(repetition_penalty=1.6, frequency_penalty=0.5, presence_penalty=0.3)


def _penalised(logits, counts):
    """NumPy reference (vLLM's and Hugging Face's conventions): repetition, then
    frequency and presence, then a softmax."""
    x = np.asarray(logits, np.float64)
    seen = counts > 0
    rep, freq, pres = (PENALTIES[k] for k in PENALTIES)
    x = np.where(seen, np.where(x > 0, x / rep, x * rep), x)
    x = x - freq * counts - pres * seen
    z = np.exp(x - x.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def test_penalties_count_the_draft_prefix():
    from eqx_specdec._chain.logits import token_counts

    rng = np.random.default_rng(0)
    batch, gamma, vocab = 3, 3, 6
    history = np.array([[0, 0, 4, -1], [5, -1, -1, -1], [-1, -1, -1, -1]], np.int32)
    drafts = rng.integers(0, vocab, (batch, gamma)).astype(np.int32)
    counts = np.asarray(token_counts(jnp.asarray(history), jnp.asarray(drafts), vocab))
    logits = 2 * rng.normal(size=(batch, gamma + 1, vocab)).astype(np.float32)
    warped = np.exp(
        np.asarray(es.Warp(**PENALTIES)(jnp.asarray(logits), jnp.asarray(counts)))
    )
    for b in range(batch):
        for i in range(gamma + 1):
            seen = [t for t in history[b] if t >= 0] + list(drafts[b, :i])
            expected = np.bincount(np.asarray(seen, int), minlength=vocab)
            np.testing.assert_array_equal(counts[b, i], expected)
            np.testing.assert_allclose(
                warped[b, i], _penalised(logits[b, i], expected), rtol=1e-5, atol=1e-7
            )
    with pytest.raises(ValueError, match="needs `history`"):
        accept_logits(
            jnp.asarray(drafts),
            None,
            jnp.asarray(logits),
            jnp.full((batch, gamma), 0.5),
            jnp.full((batch,), 0.5),
            target_warp=es.Warp(**PENALTIES),
        )
    with pytest.raises(ValueError, match="`repetition_penalty` must lie in"):
        es.Warp(repetition_penalty=0.0)


def _completed_joint(history, draft_logits, target_logits, prefix_aware):
    """The exact distribution of the first G + 1 tokens when one speculative step (the
    logits entry point, penalties counting `history`) is followed by plain decoding of
    the penalised target: every draft sequence enumerated with its probability, every
    cell of the uniforms between the step's breakpoints evaluated once. With
    `prefix_aware=False`, the target rows are penalised with `history` alone (the peers'
    bug), the draft as it really sampled."""
    gamma, vocab = draft_logits.shape

    def counts(prefix):
        return np.bincount(
            np.asarray(list(history) + list(prefix), int), minlength=vocab
        )

    def target(i, prefix):
        return _penalised(target_logits[i], counts(prefix))

    def draft(i, prefix):
        return _penalised(draft_logits[i], counts(prefix))

    rows, weights = [], []
    for x in itertools.product(range(vocab), repeat=gamma):
        q = [draft(i, x[:i]) for i in range(gamma)]
        p = [target(i, x[:i]) for i in range(gamma + 1)]
        weight = np.prod([q[i][x[i]] for i in range(gamma)])
        u_cells = []
        for i in range(gamma):
            r = min(1.0, p[i][x[i]] / q[i][x[i]])
            u_cells.append(
                [(r / 2, r), ((1 + r) / 2, 1 - r)] if r < 1 else [(0.5, 1.0)]
            )
        residuals = [np.maximum(p[i] - q[i], 0) for i in range(gamma)] + [p[gamma]]
        cuts = sorted(
            {0.0, 1.0}
            | {
                float(c)
                for r in residuals
                if r.sum() > 0
                for c in np.cumsum(r / r.sum())
                if 0 < c < 1
            }
        )
        top = 1 - 2.0**-24  # the largest float32 below 1
        s_cells = [
            (min((a + b) / 2, top), b - a) for a, b in zip(cuts, cuts[1:]) if b > a
        ]
        for us in itertools.product(*u_cells):
            for s, ws in s_cells:
                rows.append((x, [u for u, _ in us], s))
                weights.append(weight * np.prod([w for _, w in us]) * ws)
    x = jnp.asarray([r[0] for r in rows], jnp.int32)
    u = jnp.asarray([r[1] for r in rows], jnp.float32)
    s = jnp.asarray([r[2] for r in rows], jnp.float32)
    batch = len(rows)
    draft_rows = jnp.broadcast_to(jnp.asarray(draft_logits), (batch, gamma, vocab))
    target_rows = jnp.broadcast_to(
        jnp.asarray(target_logits), (batch, gamma + 1, vocab)
    )
    history_rows = jnp.broadcast_to(
        jnp.asarray(history, jnp.int32), (batch, len(history))
    )
    warp = es.Warp(**PENALTIES)
    if prefix_aware:
        out = accept_logits(
            x,
            draft_rows,
            target_rows,
            u,
            s,
            target_warp=warp,
            draft_warp=warp,
            history=history_rows,
        )
    else:
        from eqx_specdec._chain.logits import token_counts

        flat = jnp.broadcast_to(
            token_counts(history_rows, x, vocab)[:, :1], target_rows.shape
        )
        out = accept_logits(
            x,
            draft_rows,
            warp(target_rows, flat),
            u,
            s,
            draft_warp=warp,
            history=history_rows,
        )
    joint = np.zeros((vocab,) * (gamma + 1))
    tokens, n = np.asarray(out["tokens"]), np.asarray(out["num_accepted"])
    for b in range(batch):
        emitted = tuple(int(t) for t in tokens[b, : n[b] + 1])
        for rest in itertools.product(range(vocab), repeat=gamma - n[b]):
            seq = emitted + rest
            tail = np.prod(
                [target(k, seq[:k])[seq[k]] for k in range(n[b] + 1, gamma + 1)]
            )
            joint[seq] += weights[b] * tail
    exact = np.zeros_like(joint)
    for seq in itertools.product(range(vocab), repeat=gamma + 1):
        exact[seq] = np.prod([target(k, seq[:k])[seq[k]] for k in range(gamma + 1)])
    return joint, exact


def test_penalties_are_lossless_by_exact_quadrature_and_the_peers_bug_is_caught():
    rng = np.random.default_rng(3)
    vocab, gamma = 3, 2
    history = [0, 0, 2]
    target_logits = 1.5 * rng.normal(size=(gamma + 1, vocab))
    draft_logits = 1.5 * rng.normal(size=(gamma, vocab))
    joint, exact = _completed_joint(history, draft_logits, target_logits, True)
    assert abs(joint.sum() - 1) < 1e-5
    np.testing.assert_allclose(joint, exact, atol=2e-6)
    lossy, _ = _completed_joint(history, draft_logits, target_logits, False)
    assert np.abs(lossy - exact).sum() / 2 > 0.01  # total variation of the control


def _pack(mask):
    """Booleans (..., V) as uint32 words (..., ceil(V / 32)), bit v % 32 of word v // 32."""
    vocab = mask.shape[-1]
    words = -(-vocab // 32)
    padded = np.zeros(mask.shape[:-1] + (words * 32,), bool)
    padded[..., :vocab] = mask
    bits = padded.reshape(mask.shape[:-1] + (words, 32)).astype(np.uint64)
    return (bits << np.arange(32, dtype=np.uint64)).sum(-1).astype(np.uint32)


def _random_mask(rng, shape, keep=0.4):
    mask = rng.uniform(size=shape) < keep
    mask[..., 0] |= ~mask.any(-1)  # at least one allowed token per position
    return mask


def test_masks_restrict_every_row_and_pack_into_bits():
    rng = np.random.default_rng(0)
    batch, gamma, vocab = 64, 3, 40
    inputs = es.example_inputs(batch=batch, gamma=gamma, vocab=vocab)
    mask = _random_mask(rng, (batch, gamma + 1, vocab))
    out = es.speculative_accept(*inputs, allowed=jnp.asarray(mask))
    bits = es.speculative_accept(*inputs, allowed=jnp.asarray(_pack(mask)))
    np.testing.assert_array_equal(out["tokens"], bits["tokens"])
    # The same as verifying the masked, renormalised rows.
    tokens, q, p, u, s = (np.asarray(a) for a in inputs)
    p_masked = np.where(mask, p, 0) / np.where(mask, p, 0).sum(-1, keepdims=True)
    q_masked = np.where(mask[:, :-1], q, 0)
    q_masked /= q_masked.sum(-1, keepdims=True)
    expected = es.speculative_accept(
        inputs[0],
        jnp.asarray(q_masked, jnp.float32),
        jnp.asarray(p_masked, jnp.float32),
        inputs[3],
        inputs[4],
        check_inputs="off",
    )
    np.testing.assert_array_equal(out["tokens"], expected["tokens"])
    # No emitted token is outside its position's mask (draft tokens drawn outside it
    # are rejected; corrections are drawn inside it).
    emitted = np.asarray(out["tokens"])
    rows, cols = np.nonzero(emitted >= 0)
    assert mask[rows, cols, emitted[rows, cols]].all()
    assert (~mask[np.arange(batch)[:, None], np.arange(gamma), tokens]).any()  # tested


def test_masked_verification_is_lossless_by_exact_quadrature_and_one_sided_is_caught():
    from eqx_specdec._inputs.masks import masked_probs

    rng = np.random.default_rng(1)
    gamma, vocab = 2, 5
    q = rng.dirichlet(np.ones(vocab), gamma).astype(np.float32)
    p = rng.dirichlet(np.ones(vocab), gamma + 1).astype(np.float32)
    mask = _random_mask(rng, (gamma + 1, vocab), keep=0.6)
    p_m = np.asarray(masked_probs(jnp.asarray(p)[None], jnp.asarray(mask)[None])[0])
    q_m = np.asarray(
        masked_probs(jnp.asarray(q)[None], jnp.asarray(mask[:-1])[None])[0]
    )
    verifier = es.Verifier()
    # The draft sampled under the mask, or not: the emissions follow the masked target.
    for draft in (q_m, q):
        estimate = es.evaluation.emission_by_quadrature(
            verifier, draft, p_m, draft_law=draft
        )
        assert estimate.max_error(p_m) < 1e-6
    # The lossy control: the mask applied to the draft only.
    estimate = es.evaluation.emission_by_quadrature(verifier, q_m, p, draft_law=q_m)
    assert estimate.max_error(p_m) > 0.02


@pytest.mark.execution_bound
@pytest.mark.dtype_free  # float32 rows, a statistic of the masked law
def test_masked_verification_at_a_large_vocabulary_by_monte_carlo():
    rng = np.random.default_rng(2)
    rows, gamma, vocab = 8_000, 2, 4096
    logits = rng.normal(size=(gamma + 1, vocab)).astype(np.float32)
    mask = np.zeros((gamma + 1, vocab), bool)
    mask[:, rng.choice(vocab, 24, replace=False)] = True  # a grammar's 24 tokens
    key = jax.random.key(0)
    k_x, k_u, k_s = jax.random.split(key, 3)
    draft_logits = jnp.broadcast_to(
        jnp.asarray(logits[:gamma] * 0.7), (rows, gamma, vocab)
    )
    target_logits = jnp.broadcast_to(jnp.asarray(logits), (rows, gamma + 1, vocab))
    allowed = jnp.broadcast_to(jnp.asarray(mask), (rows, gamma + 1, vocab))
    # The draft samples under the mask.
    draft_tokens = jax.random.categorical(
        k_x, jnp.where(allowed[:, :gamma], draft_logits, -jnp.inf)
    ).astype(jnp.int32)
    out = accept_logits(
        draft_tokens,
        draft_logits,
        target_logits,
        jax.random.uniform(k_u, (rows, gamma)),
        jax.random.uniform(k_s, (rows,)),
        allowed=allowed,
    )
    first = np.asarray(out["tokens"])[:, 0]
    ids = np.flatnonzero(mask[0])
    assert np.isin(first, ids).all()
    target = np.exp(logits[0, ids] - logits[0, ids].max())
    target /= target.sum()
    counts = np.array([(first == i).sum() for i in ids], float)
    estimate = es.evaluation.EmissionEstimate(
        counts[None], np.array([float(rows)]), rows
    )
    chi = estimate.chi_square(target[None])
    assert float(chi["statistic"][0]) < float(chi["threshold"][0])


def test_mask_errors_name_the_argument_and_the_row():
    inputs = es.example_inputs(batch=3, gamma=2, vocab=6)
    mask = np.ones((3, 3, 6), bool)
    mask[1, 2] = False
    with pytest.raises(RuntimeError, match="`allowed` has a position with no "):
        es.speculative_accept(*inputs, allowed=jnp.asarray(mask))
    with pytest.raises(RuntimeError, match="in row 1"):
        es.speculative_accept(*inputs, allowed=jnp.asarray(mask))
    with pytest.raises(ValueError, match=r"`allowed` must have shape \(B, G \+ 1, V\)"):
        es.speculative_accept(*inputs, allowed=jnp.ones((3, 2, 6), bool))
    with pytest.raises(ValueError, match="`allowed` must be booleans"):
        es.speculative_accept(*inputs, allowed=jnp.ones((3, 3, 6), jnp.int32))


def test_tree_masks_restrict_each_context_s_row():
    rng = np.random.default_rng(4)
    batch, vocab, parents = 200, 6, np.array([-1, 0, -1, 2], np.int32)
    nodes = len(parents)
    tokens = rng.integers(0, vocab, (batch, nodes)).astype(np.int32)
    q = rng.dirichlet(np.ones(vocab), (batch, nodes + 1)).astype(np.float32)
    p = rng.dirichlet(np.ones(vocab), (batch, nodes + 1)).astype(np.float32)
    u = rng.uniform(size=(batch, nodes)).astype(np.float32)
    s = rng.uniform(size=batch).astype(np.float32)
    mask = _random_mask(rng, (batch, nodes + 1, vocab), keep=0.5)
    out = tree_accept(
        tokens,
        np.tile(parents, (batch, 1)),
        q,
        p,
        u,
        s,
        verifier=es.TreeVerifier(es.IIDCandidates()),
        allowed=jnp.asarray(mask),
        draft_allowed=False,  # drafted without the mask: some nodes lie outside it
    )
    emitted, path = np.asarray(out["tokens"]), np.asarray(out["path"])
    for b in range(batch):
        for k in range(int(out["num_accepted"][b]) + 1):
            row = 0 if k == 0 else path[b, k - 1] + 1
            assert mask[b, row, emitted[b, k]]
