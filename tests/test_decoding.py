"""The end-to-end speculative decoding loop: lossless as a whole, greedy-exact, compiled
once, batch-invariant, with statistics that agree with the models' own distributions."""

import itertools
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from user_stages import DraftlessIIDRule

import eqx_specdec as es


def _tiny_models(vocab=3, seed=0):
    """A bigram target and a unigram-ish (bigram, flatter, shifted) draft over `vocab`
    tokens: different enough that drafts are often rejected."""
    rng = np.random.default_rng(seed)
    target = rng.dirichlet(np.full(vocab, 1.0), size=vocab)
    draft = 0.5 * rng.dirichlet(np.full(vocab, 1.0), size=vocab) + 0.5 / vocab
    target = np.maximum(target, 0.05)
    target /= target.sum(-1, keepdims=True)
    return (
        es.demo.NGramModel(jnp.asarray(draft, jnp.float32), 2),
        es.demo.NGramModel(jnp.asarray(target, jnp.float32), 2),
    )


def _sequence_probabilities(target, prompt_token, length):
    """Enumerates the target's own autoregressive distribution of `length` tokens."""
    probs = np.asarray(target.probs, np.float64)
    vocab = probs.shape[-1]
    out = {}
    for seq in itertools.product(range(vocab), repeat=length):
        prob, previous = 1.0, prompt_token
        for token in seq:
            prob *= probs[previous, token]
            previous = token
        out[seq] = prob
    return out


class FirstTokenLength(es.AbstractDraftLength):
    """A user's policy: draft one token after an even first draft token, two after an
    odd one (a stopping time: the decision reads only the tokens before the next), so
    the loop stops calling the draft for a row once it is reached."""

    def needs_target(self):
        return False

    def __call__(self, draft_tokens, draft_probs, target_probs):
        return (1 + draft_tokens[0] % 2).astype(jnp.int32)


class PeekingLength(es.AbstractDraftLength):
    """A lossy policy: keeps the second draft token only when it is token 0, a decision
    that reads the token it keeps."""

    def __call__(self, draft_tokens, draft_probs, target_probs):
        return jnp.where(draft_tokens[1] == 0, 2, 1).astype(jnp.int32)


# Two candidates at the root, each with one child: a tree of depth 2.
TREE = (-1, 0, -1, 2)

# Chains of two draft tokens in the chi-square runs; trees of TREE's shape.
CHAIN = es.Chain(2)

LOOP_VERIFIERS = {
    "standard": (es.Verifier(), dict(proposal=CHAIN)),
    "one-hot": (es.Verifier(), dict(proposal=es.Chain(2, "argmax"))),
    "block": (
        es.Verifier(es.BlockRatioTest(), es.LastSuccessCounter()),
        dict(proposal=CHAIN),
    ),
    "Gumbel sampler": (
        es.Verifier(residual_sampler=es.GumbelSampler()),
        dict(proposal=CHAIN),
    ),
    "tree, i.i.d.": (es.TreeVerifier(es.IIDCandidates(), tree=TREE), {}),
    "tree, without replacement": (
        es.TreeVerifier(es.WithoutReplacementCandidates(), tree=TREE),
        {},
    ),
    "tree, top-k": (es.TreeVerifier(es.DeterministicCandidates(), tree=TREE), {}),
    "traversal": (es.TraversalVerifier(tree=TREE), {}),
    "tree, greedy multi-draft": (
        es.TreeVerifier(es.GreedyMultiDraft(2), tree=TREE),
        {},
    ),
    "tree, SpecHub, the shape as the proposal": (
        es.TreeVerifier(es.SpecHub()),
        dict(proposal=es.Tree(TREE)),
    ),
    "tree, SpecTr's K-SEQ": (es.TreeVerifier(es.SpecTrKSeq(), tree=TREE), {}),
    "tree, importance sampling": (
        es.TreeVerifier(es.ImportanceSampling(2), tree=TREE),
        {},
    ),
    "dynamic tree (EAGLE-2), deterministic candidates": (
        es.TreeVerifier(es.DeterministicCandidates()),
        dict(proposal=es.DynamicTree(nodes=4, layers=2, branching=2)),
    ),
    # SuffixDecoding's tree: a draft with no model whose rows are the shares of the
    # continuations seen after the context's longest repeated suffix.
    "dynamic tree of suffix continuations": (
        es.TreeVerifier(es.DeterministicCandidates()),
        dict(
            proposal=es.DynamicTree(nodes=4, layers=2, branching=2),
            draft=es.models.SuffixDraft(3, min_match=1),
        ),
    ),
    "standard, stop on the draft's confidence": (
        es.Verifier(),
        dict(proposal=es.Chain(2, draft_length=es.StopWhenUnlikely(0.5))),
    ),
    "block, stop by the oracle": (
        es.Verifier(es.BlockRatioTest(), es.LastSuccessCounter()),
        dict(proposal=es.Chain(2, draft_length=es.StopWhenUnlikely(0.5, "oracle"))),
    ),
    "standard, a user's draft length": (
        es.Verifier(),
        dict(proposal=es.Chain(2, draft_length=FirstTokenLength())),
    ),
    "standard, logits models": (
        es.Verifier(),
        dict(proposal=CHAIN, outputs="logits"),
    ),
}

NUM_ROWS = 24_000
LENGTH = 3


def _chi_square_of_loop(verifier, options, seed=0):
    draft, target = _tiny_models()
    options = dict(options)
    draft = options.pop("draft", draft)
    vocab = target.vocab_size
    prompt = jnp.full((NUM_ROWS, 1), 1, jnp.int32)
    models = (draft, target)
    if options.get("outputs") == "logits":
        models = (_as_logits(draft), _as_logits(target))
    result = es.speculative_decode(
        *models,
        prompt,
        None,
        LENGTH,
        jax.random.key(seed),
        verifier=verifier,
        **options,
    )
    tokens = np.asarray(result.tokens)
    codes = (tokens * vocab ** np.arange(LENGTH)[::-1]).sum(-1)
    counts = np.bincount(codes, minlength=vocab**LENGTH).astype(np.float64)
    exact = _sequence_probabilities(target, 1, LENGTH)
    expected = np.array(
        [
            exact[tuple(int(d) for d in np.base_repr(c, vocab).zfill(LENGTH))]
            for c in range(vocab**LENGTH)
        ]
    )
    estimate = es.evaluation.EmissionEstimate(
        counts[None], np.array([float(NUM_ROWS)]), NUM_ROWS
    )
    chi = estimate.chi_square(expected[None])
    return float(chi["statistic"][0]), float(chi["threshold"][0]), result


@pytest.mark.parametrize("name", list(LOOP_VERIFIERS))
def test_the_whole_loop_is_lossless(name):
    verifier, options = LOOP_VERIFIERS[name]
    statistic, threshold, result = _chi_square_of_loop(verifier, options)
    assert statistic < threshold, (name, statistic, threshold)
    # And the drafts were really used: some steps accepted draft tokens.
    assert np.asarray(result.accepted_histogram)[:, 1:].sum() > 0


class _UncheckedDynamicTree(es.DynamicTree):
    """A user who switches off DynamicTree's refusal of rules that read q."""

    def check(self, verifier):
        pass


class _IIDRuleDraftingWithoutReplacement(DraftlessIIDRule):
    """A lossy pairing: siblings drafted without replacement, verified as i.i.d."""

    def candidate_law(self, draft, drafted):
        return es.WithoutReplacementCandidates().candidate_law(draft, drafted)


@pytest.mark.parametrize(
    "verifier, options",
    [
        (es.Verifier(es.LenientRatioTest(0.3)), dict(proposal=CHAIN)),
        (
            es.Verifier(es.BlockRatioTest(), es.PrefixCounter(), allow_mismatch=True),
            dict(proposal=CHAIN),
        ),
        (es.TreeVerifier(_IIDRuleDraftingWithoutReplacement(), tree=TREE), {}),
        (es.Verifier(), dict(proposal=es.Chain(2, draft_length=PeekingLength()))),
        (
            es.TreeVerifier(es.IIDCandidates()),
            dict(proposal=_UncheckedDynamicTree(nodes=4, layers=2, branching=2)),
        ),
    ],
    ids=[
        "lenience 0.3",
        "block weights, first-failure count",
        "siblings drawn without replacement, verified as i.i.d.",
        "a draft length that peeks at the token it keeps",
        "the q-ratio on a dynamic tree's deterministic children",
    ],
)
def test_the_whole_loop_catches_a_lossy_verifier(verifier, options):
    statistic, threshold, _ = _chi_square_of_loop(verifier, options)
    assert statistic > 3 * threshold


@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_greedy_speculative_decoding_is_greedy_decoding_of_the_target(gamma):
    draft, target = es.demo.builtin_models()
    tokens, lengths = _prompts(8)
    greedy = es.Verifier(es.GreedyRatioTest(), residual_sampler=es.ArgmaxSampler())
    result = es.speculative_decode(
        draft,
        target,
        tokens,
        lengths,
        64,
        jax.random.key(0),
        verifier=greedy,
        proposal=es.Chain(gamma, "argmax"),
    )
    reference = es.autoregressive_decode(target, tokens, lengths, 64)
    np.testing.assert_array_equal(result.tokens, reference)
    # Deterministic drafts: the theoretical tokens per call is the observed one.
    assert result.theory == "exact"
    assert abs(result.tokens_per_call() - result.theoretical_tokens_per_call()) < 1e-6
    # Speculation helped: fewer target calls than tokens.
    assert int(result.target_calls.max()) < 64


def _prompts(batch):
    texts = [
        es.demo.BUILTIN_PROMPTS[i % len(es.demo.BUILTIN_PROMPTS)] for i in range(batch)
    ]
    width = max(map(len, texts))
    tokens = np.zeros((batch, width), np.int32)
    for i, text in enumerate(texts):
        tokens[i, : len(text)] = es.demo.encode(text)
    return tokens, np.asarray([len(t) for t in texts], np.int32)


def _as_logits(model):
    return lambda t, p: jnp.log(model(t, p)) + 5.0  # any shift: still logits


@pytest.mark.parametrize("gamma", [2, 5])
def test_logits_models_decode_greedily_like_the_probabilities(gamma):
    draft, target = es.demo.builtin_models()
    tokens, lengths = _prompts(8)
    greedy = es.Verifier(es.GreedyRatioTest(), residual_sampler=es.ArgmaxSampler())
    result = es.speculative_decode(
        _as_logits(draft), _as_logits(target), tokens, lengths, 48,
        jax.random.key(0), verifier=greedy, proposal=es.Chain(gamma, "argmax"),
        outputs="logits",
    )  # fmt: skip
    reference = es.autoregressive_decode(target, tokens, lengths, 48)
    np.testing.assert_array_equal(result.tokens, reference)


def test_statistics_are_consistent_and_match_the_theory():
    draft, target = es.demo.builtin_models()
    tokens, lengths = _prompts(64)
    gamma, num_tokens = 4, 128
    result = es.speculative_decode(
        draft, target, tokens, lengths, num_tokens, jax.random.key(1),
        proposal=es.Chain(gamma),
    )  # fmt: skip
    hist = np.asarray(result.accepted_histogram)
    calls = np.asarray(result.target_calls)
    np.testing.assert_array_equal(hist.sum(-1), calls)
    committed = (hist * np.arange(1, gamma + 2)).sum(-1)
    assert np.all(committed >= num_tokens) and np.all(
        committed < num_tokens + gamma + 1
    )
    assert np.all(calls >= -(-num_tokens // (gamma + 1))) and np.all(
        calls <= num_tokens
    )
    # The observed tokens per call and its theory differ only by the acceptance noise
    # (about 0.013 standard error over ~8,600 steps).
    assert abs(result.tokens_per_call() - result.theoretical_tokens_per_call()) < 0.06
    observed = result.accepted_length_distribution()
    theory = result.theoretical_accepted_length_distribution()
    assert np.abs(observed - theory).max() < 0.03
    np.testing.assert_allclose(theory.sum(), 1.0, atol=1e-6)
    rates = result.acceptance_rate()
    assert rates.shape == (gamma,) and np.all((rates > 0.2) & (rates < 0.9))
    # Block verification accepts at least as much as the standard rule's theory.
    block = es.speculative_decode(
        draft,
        target,
        tokens,
        lengths,
        num_tokens,
        jax.random.key(1),
        proposal=es.Chain(gamma),
        verifier=es.Verifier(es.BlockRatioTest(), es.LastSuccessCounter()),
    )
    assert block.theory == "lower bound"
    assert block.tokens_per_call() > result.theoretical_tokens_per_call()


def test_rows_do_not_depend_on_the_batch():
    """Row b draws from fold_in(key, b) only: the first rows of a batch come out the
    same alone, or next to other prompts."""
    draft, target = es.demo.builtin_models()
    tokens, lengths = _prompts(8)
    key = jax.random.key(5)
    full = es.speculative_decode(draft, target, tokens, lengths, 40, key)
    first = es.speculative_decode(draft, target, tokens[:3], lengths[:3], 40, key)
    np.testing.assert_array_equal(first.tokens, full.tokens[:3])
    np.testing.assert_array_equal(first.target_calls, full.target_calls[:3])
    others = np.concatenate([tokens[:3], tokens[3:][::-1]])
    mixed = es.speculative_decode(
        draft, target, others, np.concatenate([lengths[:3], lengths[3:][::-1]]), 40, key
    )
    np.testing.assert_array_equal(mixed.tokens[:3], full.tokens[:3])
    # Same inputs, bit-identical outputs; another key, other tokens.
    again = es.speculative_decode(draft, target, tokens, lengths, 40, key)
    np.testing.assert_array_equal(again.tokens, full.tokens)
    other = es.speculative_decode(draft, target, tokens, lengths, 40, jax.random.key(6))
    assert not np.array_equal(other.tokens, full.tokens)


def test_the_loop_compiles_once_and_runs_under_jit():
    draft, target = es.demo.builtin_models()
    traces = []

    def counting_target(tokens, positions):
        traces.append(None)  # runs at trace time only
        return target(tokens, positions)

    tokens, lengths = _prompts(4)
    first = es.speculative_decode(
        draft, counting_target, tokens, lengths, 24, jax.random.key(0)
    )
    count = len(traces)
    shifted = np.roll(tokens, 1, axis=0), np.roll(lengths, 1)
    es.speculative_decode(draft, counting_target, *shifted, 24, jax.random.key(1))
    assert len(traces) == count  # new prompts and key: no new trace

    @jax.jit
    def run(draft, target, tokens, lengths, key):  # every input traced
        return es.speculative_decode(draft, target, tokens, lengths, 24, key).tokens

    np.testing.assert_array_equal(
        run(draft, target, tokens, lengths, jax.random.key(0)), first.tokens
    )


def test_ngram_model_reads_its_context():
    rng = np.random.default_rng(0)
    vocab, order = 5, 3
    probs = rng.dirichlet(np.ones(vocab), size=vocab ** (order - 1))
    model = es.demo.NGramModel(jnp.asarray(probs, jnp.float32), order)
    tokens = rng.integers(0, vocab, size=20)
    out = np.asarray(model(jnp.asarray(tokens), jnp.arange(20)))
    for t in range(20):
        previous = [
            tokens[t - back] if t - back >= 0 else 0 for back in range(order - 1)
        ]
        context = sum(int(c) * vocab**back for back, c in enumerate(previous))
        np.testing.assert_allclose(out[t], probs[context], rtol=1e-6)


def test_fit_ngram_estimates():
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 4, size=500)
    unigram = es.demo.fit_ngram(tokens, 4, 1)
    counts = np.bincount(tokens, minlength=4)
    np.testing.assert_allclose(unigram.probs[0], (counts + 1) / (500 + 4), rtol=1e-6)
    for order in (2, 3):
        model = es.demo.fit_ngram(tokens, 4, order)
        probs = np.asarray(model.probs, np.float64)
        assert probs.shape == (4 ** (order - 1), 4)
        np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-6)
        assert probs.min() > 0
    # A deterministic sequence is learnt: after "0 1" comes 2.
    cyclic = np.tile([0, 1, 2], 200)
    model = es.demo.fit_ngram(cyclic, 3, 3)
    assert float(model(jnp.asarray([0, 1]), jnp.asarray([1]))[0, 2]) > 0.99
    # The built-in pair: the target predicts the shipped text better than the draft.
    draft, target = es.demo.builtin_models()
    text = jnp.asarray(es.demo.builtin_corpus())
    positions = jnp.arange(text.shape[0] - 1)

    def nats(model):
        probs = model(text, positions)[positions, text[1:]]
        return float(-jnp.log(probs).mean())

    assert nats(target) < nats(draft) - 0.5
    assert es.demo.decode(es.demo.encode("We hold, these!")) == "we hold, these "


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(proposal=4), TypeError, "`proposal` must be an eqx_specdec.Chain"),
        (dict(num_tokens=0), ValueError, "`num_tokens` must be a Python int >= 1"),
        (dict(outputs="log"), ValueError, "`outputs` must be"),
        (
            dict(prompt_lengths=np.array([0, 4])),
            ValueError,
            r"`prompt_lengths` must lie in \[1, 4\]",
        ),
        (
            dict(prompt_lengths=np.array([1])),
            ValueError,
            r"`prompt_lengths` must have shape \(B,\)",
        ),
        (
            dict(prompt_tokens=np.zeros((2, 4), np.float32)),
            TypeError,
            "`prompt_tokens` must be integer",
        ),
        (
            dict(prompt_tokens=np.zeros((4,), np.int32)),
            ValueError,
            r"`prompt_tokens` must have shape \(B, P\)",
        ),
        (
            dict(verifier="standard"),
            TypeError,
            "`verifier` must be an eqx_specdec.Verifier",
        ),
        (
            dict(target_model=lambda t, p: jnp.ones((3,))),
            ValueError,
            "`target_model` must return one distribution per position",
        ),
        (
            dict(draft_model=lambda t, p: jnp.ones((1, 7)) / 7),
            ValueError,
            r"`draft_model` must return .* \(1, 33\)",
        ),
    ],
)
def test_bad_arguments_are_named(kwargs, error, match):
    draft, target = es.demo.builtin_models()
    arguments = dict(
        draft_model=draft,
        target_model=target,
        prompt_tokens=np.zeros((2, 4), np.int32),
        prompt_lengths=np.array([1, 4]),
        num_tokens=8,
        key=jax.random.key(0),
    )
    arguments.update(kwargs)
    with pytest.raises(error, match=match):
        es.speculative_decode(**arguments)


def test_progress_is_reported_from_inside_the_loop():
    draft, target = es.demo.builtin_models()
    tokens, lengths = _prompts(4)
    seen = []
    result = es.speculative_decode(
        draft,
        target,
        tokens,
        lengths,
        30,
        jax.random.key(0),
        progress=lambda done, total: seen.append((int(done), int(total))),
    )
    jax.effects_barrier()
    assert len(seen) == int(result.target_calls.max())  # one report per step
    done = [d for d, _ in seen]
    assert done == sorted(done) and done[-1] == 4 * 30
    assert {t for _, t in seen} == {4 * 30}


class _UserRule(DraftlessIIDRule):
    """A user's node rule: the i.i.d. rule, drafting its children with replacement."""

    def candidate_law(self, draft, drafted):
        return draft


class _RuleWithoutDrafting(es.AbstractNodeRule):
    """A node rule that does not say how its children are drafted."""

    exact: ClassVar[bool] = True
    uses_draft_probs: ClassVar[bool] = True

    def ratio(self, state, token, child):
        return es.IIDCandidates().ratio(state, token, child)

    def reject(self, state, token, child):
        return es.IIDCandidates().reject(state, token, child)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(verifier=es.TreeVerifier()), ValueError, "speculative_decode needs the tree's shape, and this TreeVerifier has none: build it with `tree=`"),
        (dict(verifier=es.TraversalVerifier()), ValueError, "this TraversalVerifier has none"),
        (dict(proposal=es.Tree((-1, 0))), TypeError, "The proposal is a Tree, so `verifier` must be a tree verifier"),
        (dict(verifier=es.TreeVerifier(tree=(-1,)), proposal=es.Chain(2)), TypeError, "The proposal is a Chain, so `verifier` must verify chains"),
        (dict(verifier=es.TreeVerifier(tree=(-1,)), proposal=es.Tree((-1, 0))), ValueError, "give the shape once"),
        (dict(verifier=es.TreeVerifier(DraftlessIIDRule(), tree=(-1,))), es.MissingCapabilityError, "DraftlessIIDRule does not implement `candidate_law`"),
    ],
)  # fmt: skip
def test_bad_tree_arguments_are_named(kwargs, error, match):
    draft, target = es.demo.builtin_models()
    with pytest.raises(error, match=match):
        es.speculative_decode(
            draft,
            target,
            np.zeros((2, 3), np.int32),
            None,
            8,
            jax.random.key(0),
            **kwargs,
        )


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: es.Chain(0), ValueError, r"Chain\(`length`=...\) must be a Python int >= 1, got 0"),
        (lambda: es.Chain(2, "top-k"), ValueError, r"Chain\(`drafting`=...\) must be \"sample\""),
        (lambda: es.Chain(2, draft_length=3), TypeError, r"Chain\(`draft_length`=...\) must be an eqx_specdec.AbstractDraftLength"),
        (lambda: es.Tree((-1, 1)), ValueError, "depth-first order"),
        (lambda: es.Tree(()), ValueError, "non-empty tuple"),
        (lambda: es.TreeVerifier(tree=(-1, True)), ValueError, "tuple of Python ints"),
        (lambda: es.TraversalVerifier(max_depth=1, tree=(-1, 0)), ValueError, "raise its `max_depth` to at least 2"),
    ],
)  # fmt: skip
def test_bad_proposals_are_named_when_built(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_a_user_node_rule_drafts_with_its_candidate_law():
    draft, target = es.demo.builtin_models()
    tokens, lengths = _prompts(4)
    tree = (-1, 0, -1, 2)
    expected = es.speculative_decode(
        draft, target, tokens, lengths, 32, jax.random.key(2),
        verifier=es.TreeVerifier(es.IIDCandidates(), tree=tree),
    )  # fmt: skip
    got = es.speculative_decode(
        draft, target, tokens, lengths, 32, jax.random.key(2),
        verifier=es.TreeVerifier(_UserRule(), tree=tree),
    )  # fmt: skip
    np.testing.assert_array_equal(got.tokens, expected.tokens)
    assert got.theory == "none" and got.accepted_histogram.shape == (4, 3)


def _nan_after(model, first_bad: int):
    """A stateless model that returns NaN rows from position `first_bad` on (a model
    that overflows in half precision, say)."""

    def broken(tokens, positions):
        return jnp.where(
            (positions >= first_bad)[:, None], jnp.nan, model(tokens, positions)
        )

    return broken


@pytest.mark.parametrize("tree", [False, True, "dynamic"])
def test_a_model_that_returns_nan_stops_its_row_with_an_error(tree):
    """Each row stops at the step whose target rows hold NaN: finish reason "error",
    the step and position recorded, -1 after what it committed, and every token before
    that equal to a clean run's (same key); `check_models=True` raises instead, naming
    the model, the row and the position."""
    draft, target = es.demo.builtin_models()
    prompts = np.stack(
        [es.demo.encode("the cat sat on"), es.demo.encode("once upon a ti")]
    )
    prompts = jnp.asarray(prompts, jnp.int32)
    first_bad = prompts.shape[1] + 12
    options = {
        False: {},
        True: dict(verifier=es.TreeVerifier(tree=(-1, 0, 0, 1))),
        "dynamic": dict(
            verifier=es.TreeVerifier(es.DeterministicCandidates()),
            proposal=es.DynamicTree(nodes=4, layers=3, branching=2),
        ),
    }[tree]
    broken = _nan_after(target, first_bad)
    run = es.speculative_decode(
        draft, broken, prompts, None, 24, jax.random.key(1), **options
    )
    clean = es.speculative_decode(
        draft, target, prompts, None, 24, jax.random.key(1), **options
    )
    assert run.finish_reason_names() == ["error", "error"]
    assert np.all(np.asarray(run.error_steps) >= 0)
    # The target's row at first_bad predicts generated token 13; the failing step, the
    # first to read it, started at most `depth` tokens before (G = 4, or the tree's).
    depth = 3 if tree else 4
    assert np.all(np.asarray(run.error_positions) <= 13)
    assert np.all(np.asarray(run.error_positions) >= 13 - depth)
    np.testing.assert_array_equal(run.lengths, run.error_positions)
    tokens = np.asarray(run.tokens)
    for b, length in enumerate(np.asarray(run.lengths)):
        np.testing.assert_array_equal(
            tokens[b, :length], np.asarray(clean.tokens)[b, :length]
        )
        assert np.all(tokens[b, length:] == -1)
    assert bool(run.result == es.RESULTS.invalid_model_output)
    # The first row to fail, at the earliest failing step.
    steps = np.asarray(run.error_steps)
    assert steps[int(run.failed_row)] == steps.min()
    with pytest.raises(RuntimeError, match=r"`target_model` .* row \d .*error_steps"):
        es.speculative_decode(
            draft,
            broken,
            prompts,
            None,
            24,
            jax.random.key(1),
            check_models=True,
            **options,
        )


def test_plain_decoding_emits_minus_one_from_an_invalid_row_on():
    draft, target = es.demo.builtin_models()
    prompts = jnp.asarray(np.stack([es.demo.encode("the cat sat on")] * 2), jnp.int32)
    first_bad = prompts.shape[1] + 12
    tokens = es.autoregressive_decode(
        _nan_after(target, first_bad), prompts, None, 24, jax.random.key(0)
    )
    clean = es.autoregressive_decode(target, prompts, None, 24, jax.random.key(0))
    # Token i is drawn from the row at position P - 1 + i: valid up to i = 12.
    np.testing.assert_array_equal(np.asarray(tokens)[:, :13], np.asarray(clean)[:, :13])
    assert np.all(np.asarray(tokens)[:, 13:] == -1)
