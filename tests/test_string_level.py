"""String-level rejection sampling on a toy pair of tokenizers: the proposed target
token's law (enumerated) against the draft's simulated texts, the whole step lossless by
chi-square against the target, and the token-level law as the ratio's denominator
caught."""

import jax
import numpy as np
import pytest

import eqx_specdec as es
from eqx_specdec._vocabularies import string_level


DRAFT = ("a", "b", "c", "ab", "bc", "ca")
TARGET = ("a", "b", "c", "ab", "ba", "abc", "cc")
DRAWS = 20_000


def _toy(seed=0):
    rng = np.random.default_rng(seed)
    # The draft: a bigram over its own tokens (row 0: the first token of a position).
    bigram = rng.dirichlet(np.full(len(DRAFT), 0.7), size=len(DRAFT) + 1)

    def next_draft(prefix):
        return bigram[0 if not prefix else prefix[-1] + 1]

    p = rng.dirichlet(np.ones(len(TARGET)))
    return next_draft, p


def _simulate(vocab, next_draft, rng, draws):
    """The proposed target token of `draws` draft texts, each written token by token
    (the draws that share a prefix advance together)."""
    groups = {(): np.arange(draws)}
    out = np.empty(draws, np.int32)
    while groups:
        prefix, rows = groups.popitem()
        if vocab.finished(prefix):
            out[rows] = vocab.target_token(prefix)
            continue
        probs = next_draft(prefix)
        picks = rng.choice(len(probs), size=len(rows), p=probs)
        for d in np.unique(picks):
            groups[prefix + (int(d),)] = rows[picks == d]
    return out


def _chi_square(tokens, law):
    counts = np.bincount(tokens, minlength=len(law))[None].astype(float)
    estimate = es.evaluation.EmissionEstimate(
        counts, np.array([float(len(tokens))]), len(tokens)
    )
    stats = estimate.chi_square(np.asarray(law, np.float64)[None])
    return float(stats["statistic"][0]), float(stats["threshold"][0])


def test_string_level_rejection_sampling_is_lossless():
    vocab = es.models.StringLevelDraft(DRAFT, TARGET)
    next_draft, p = _toy()
    psi = vocab.target_law(next_draft)
    assert psi.sum() == pytest.approx(1.0, abs=1e-12)
    # Multi-piece and longer-token proposals happen: "abc" (a + bc) and "ba" (b + a).
    assert psi[TARGET.index("abc")] > 0 and psi[TARGET.index("ba")] > 0
    proposed = _simulate(vocab, next_draft, np.random.default_rng(1), DRAWS)
    statistic, threshold = _chi_square(proposed, psi)
    assert statistic < threshold

    # Token-level intersection's law: the draft's first token, on the shared strings.
    first = next_draft(())
    token_level = np.zeros(len(TARGET))
    for d, text in enumerate(DRAFT):
        if text in TARGET:
            token_level[TARGET.index(text)] += first[d]
    token_level /= token_level.sum()

    rows = np.tile(np.stack([p, p]), (DRAWS, 1, 1)).astype(np.float32)
    u = jax.random.uniform(jax.random.key(2), (DRAWS, 1))
    s = jax.random.uniform(jax.random.key(3), (DRAWS,))
    for law, lossless in ((psi, True), (token_level, False)):
        q = np.tile(law, (DRAWS, 1, 1)).astype(np.float32)
        out = es.speculative_accept(proposed[:, None], q, rows, u, s)
        statistic, threshold = _chi_square(np.asarray(out["tokens"][:, 0]), p)
        assert (statistic < threshold) is lossless, (lossless, statistic, threshold)


def test_string_level_errors_name_the_argument(monkeypatch):
    with pytest.raises(ValueError, match="lacks the single characters \\['d'\\]"):
        es.models.StringLevelDraft(("a", "d"), ("a", "b"))
    with pytest.raises(ValueError, match="`target_strings` holds a string twice"):
        es.models.StringLevelDraft(("a",), ("a", "a"))
    with pytest.raises(ValueError, match="`draft_strings` must be a non-empty"):
        es.models.StringLevelDraft((), ("a",))
    long = es.models.StringLevelDraft(("a", "b"), ("a", "b", "a" * 40))
    monkeypatch.setattr(string_level, "_MAX_SEQUENCES", 30)  # a 40-step enumeration
    with pytest.raises(ValueError, match="too large for string-level rejection"):
        long.target_law(lambda prefix: np.array([0.5, 0.5]))
