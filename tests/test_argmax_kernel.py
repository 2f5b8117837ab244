"""Greedy verification's argmaxes found by the Pallas kernel that reads each sequence's
rows one position after another and stops at its first rejection (`batching="pallas"`,
the TPU's default for large batches; here in Pallas's interpret mode): `vmap`'s tokens
and accepted counts bit for bit, on logits and probabilities, with ties, rows without a
most likely token where the verification stops and after it, and a batch that is not a
multiple of eight; the default checks read no row the verification does not; and a
counter the kernel does not fit runs without it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqx_specdec as es
from eqx_specdec._kernels import streams
from eqx_specdec._kernels.leading_argmax import leading_argmax


# 9 tiles of 128 entries: the argmax's steps are one tile wide.
BATCH, GAMMA, VOCAB = 11, 3, 1152
GREEDY = es.GreedyRatioTest()


def _case(log_space: bool):
    """Drafts that agree with the target's argmax at about half the positions; a tie
    (sequence 2, row 0); a NaN in a row after the first rejection (sequence 0, row 3)
    and an all -inf (or zero) row after it (sequence 5, row 2)."""
    rng = np.random.default_rng(4)
    rows = rng.normal(size=(BATCH, GAMMA + 1, VOCAB)).astype(np.float32)
    if not log_space:
        rows = np.exp(rows) / np.exp(rows).sum(-1, keepdims=True)
    best = rows.argmax(-1)
    tokens = best[:, :GAMMA].copy()
    wrong = rng.random((BATCH, GAMMA)) < 0.45
    tokens[wrong] = (tokens[wrong] + 1) % VOCAB
    tokens[0, :2] = best[0, :2] + 1  # sequence 0 rejects its first draft token
    tokens[1] = best[1, :GAMMA]  # sequence 1 accepts all
    rows[2, 0, 3] = rows[2, 0, best[2, 0]]  # a tie: the lower id wins
    tokens[2, 0] = min(3, best[2, 0])
    rows[0, 3, 7] = np.nan  # after sequence 0's first rejection: never read
    tokens[5, 0] = best[5, 0]
    tokens[5, 1] = (best[5, 1] + 1) % VOCAB
    rows[5, 2] = -np.inf if log_space else 0.0  # after sequence 5's first rejection
    return tokens, rows


def _verify(tokens, rows, log_space, batching, level="off", verifier=None):
    target = es.Logits(jnp.asarray(rows)) if log_space else es.Probabilities(rows)
    verifier = verifier or es.Verifier(GREEDY, batching=batching)
    return es.verify(
        target,
        es.Draft(jnp.asarray(tokens)),
        jax.random.key(0),
        verifier=verifier,
        check_inputs=level,
        throw=False,
    )


@pytest.mark.parametrize("log_space", [True, False])
def test_the_kernel_gives_vmap_s_tokens(log_space, monkeypatch):
    tokens, rows = _case(log_space)
    if not log_space:
        # The batch cut into calls of eight sequences and three, as where one call's
        # SMEM arrays would not fit.
        monkeypatch.setattr(streams, "SMEM_WORDS", 1)
        assert len(streams.chunks(BATCH, 1)) == 2
    found = leading_argmax(
        jnp.asarray(tokens), jnp.asarray(rows), log_space=log_space, interpret=True
    )
    # Every row's argmax up to the first rejection, then no token: rows not read.
    best = np.asarray(es.RowContext(log_space=log_space).argmax(jnp.asarray(rows)))
    for b in range(BATCH):
        n = next((i for i in range(GAMMA) if best[b, i] != tokens[b, i]), GAMMA)
        np.testing.assert_array_equal(found[b, : n + 1], best[b, : n + 1])
        assert (np.asarray(found[b, n + 1 :]) == VOCAB).all()
    assert int(found[2, 0]) == min(3, int(best[2, 0]))
    vmap = _verify(tokens, rows, log_space, "vmap")
    pallas = _verify(tokens, rows, log_space, "pallas")
    np.testing.assert_array_equal(pallas.tokens, vmap.tokens)
    np.testing.assert_array_equal(pallas.num_accepted, vmap.num_accepted)
    assert int(pallas.num_accepted[1]) == GAMMA


@pytest.mark.parametrize("batching", ["vmap", "pallas"])
def test_the_default_checks_read_the_rows_greedy_verification_reads(batching):
    """A NaN after the first rejection changes no output and is no problem; a NaN in
    the row where a sequence stops is caught, naming the argument and the row."""
    tokens, rows = _case(log_space=True)
    out = _verify(tokens, rows, True, batching, level="read")
    assert bool(out.result == es.RESULTS.successful)
    rows[4, int(out.num_accepted[4]), 11] = np.nan
    out = _verify(tokens, rows, True, batching, level="read")
    assert bool(out.result == es.RESULTS.invalid_logit)
    assert int(out.failed_row) == 4
    assert int(out.tokens[4, out.num_accepted[4]]) == -1
    assert "target_logits" in out.error_message()


def test_a_counter_that_does_not_fit_runs_without_the_kernel():
    """A counter that does not fit the greedy test (a lossy control): the kernel's stop
    at the first rejection assumes a count up to it."""
    tokens, rows = _case(log_space=True)

    def lossy_verifier(batching):
        return es.Verifier(
            GREEDY,
            prefix_counter=es.LastSuccessCounter(),
            allow_mismatch=True,
            batching=batching,
        )

    lossy, vmap = lossy_verifier("pallas"), lossy_verifier("vmap")
    jaxpr = jax.make_jaxpr(
        lambda a: _verify(tokens, a, True, None, verifier=lossy).tokens
    )(rows)
    assert "pallas_call" not in str(jaxpr)
    np.testing.assert_array_equal(
        _verify(tokens, rows, True, None, verifier=lossy).num_accepted,
        _verify(tokens, rows, True, None, verifier=vmap).num_accepted,
    )
