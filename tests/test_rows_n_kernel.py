"""The residual sampler's pass over rows n for the whole batch: by the Pallas kernel
(`batching="pallas"`, the TPU's default for long rows; here in Pallas's interpret mode)
and one sequence after another (`"auto"` on the CPU, for large batches). The tokens, the accepted counts
and the checks' verdicts of `vmap`, bit for bit, on every kind of row it reads (sampled and one-hot drafts, the
standard rule's derived correction and a verdict's own residual scale, zero-mass rows,
a batch that is not a multiple of eight, a vocabulary whose last search block is
short, a threshold rule's acceptance evaluated inside it), invalid rows with the checks
off (-1, never a token), and the compositions it does not compute, which run without
it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_case

import eqx_specdec as es
from eqx_specdec._backend.mapping import row_mapping
from eqx_specdec._kernels.row_windows import row_window


# 257 blocks of 128 entries, the last one short: the search's blocks are 256 long.
BATCH, GAMMA, VOCAB = 11, 3, 32_896


def _case(one_hot: bool, invalid: bool):
    x, q, p, u, s = random_case(9, BATCH, GAMMA, VOCAB)
    q[1] = p[1, :GAMMA]  # every draft token accepted
    if invalid:  # a NaN in p_n; +inf in q_n (where the rows reject at their first)
        p[3, 0, 5] = np.nan
        q[4, 0, 9] = np.inf
        u[3:5, 0] = 0.999
    draft = es.Draft(x) if one_hot else es.Draft(x, es.Probabilities(q))
    return es.Probabilities(p), draft, es.Uniforms(u, s)


CASES = [
    # (ratio test, one-hot drafts, invalid rows, check level, whether the kernel runs)
    (es.RatioTest(), False, False, "read", True),
    (es.RatioTest(), True, False, "read", True),
    (es.RatioTest(), False, True, "off", True),
    (es.BlockRatioTest(), False, False, "off", True),  # a residual scale, no rule
    (es.LenientRatioTest(0.8), False, False, "read", True),  # its acceptance inside
    # A parameter given as an array: an operand the kernel is not given.
    (es.LenientRatioTest(jnp.float32(0.8)), False, False, "read", False),
]


@pytest.mark.parametrize("test, one_hot, invalid, level, runs", CASES)
def test_the_kernel_gives_vmap_s_tokens(test, one_hot, invalid, level, runs):
    target, draft, randomness = _case(one_hot, invalid)

    def verify(batching):
        verifier = es.Verifier(test, batching=batching)
        return es.verify(
            target,
            draft,
            randomness,
            verifier=verifier,
            check_inputs=level,
            throw=False,
        )

    assert ("pallas_call" in str(jax.make_jaxpr(lambda: verify("pallas"))())) == runs
    vmap, pallas = verify("vmap"), verify("pallas")
    np.testing.assert_array_equal(pallas.tokens, vmap.tokens)
    np.testing.assert_array_equal(pallas.num_accepted, vmap.num_accepted)
    assert bool(pallas.result == es.RESULTS.successful)
    if invalid:  # rows 3 and 4 rejected their first draft token into an invalid row
        assert (np.asarray(vmap.tokens)[3:5, 0] == -1).all()


def test_the_kernel_s_sums_catch_what_vmap_s_catch():
    target, draft, randomness = _case(one_hot=False, invalid=False)
    q = np.array(draft.distribution.probs)
    q[6] *= 1.5  # every row of sequence 6 sums to 1.5
    draft = es.Draft(draft.tokens, es.Probabilities(q))
    outs = [
        es.verify(
            target,
            draft,
            randomness,
            verifier=es.Verifier(batching=batching),
            throw=False,
        )
        for batching in ("vmap", "pallas")
    ]
    for out in outs:
        assert bool(out.result == es.RESULTS.not_normalised)
        assert int(out.failed_row) == 6
        assert jnp.array_equal(out.tokens, outs[0].tokens)


@pytest.mark.parametrize("one_hot", [False, True])
def test_rows_n_one_sequence_after_another_give_map_s_tokens(one_hot):
    """`"auto"` on the CPU from 2**21 entries in the batch's rows n: the ratio tests
    and draws vectorised around the sampler's pass over rows n, one sequence after
    another (`rows_n_pass` without the kernel), with the checks' sums."""
    x, q, p, u, s = random_case(3, 64, 2, 32_768)
    q[40] *= 1.5  # every row of q of sequence 40 sums to 1.5
    draft = es.Draft(x) if one_hot else es.Draft(x, es.Probabilities(q))
    outs = [
        es.verify(
            es.Probabilities(p),
            draft,
            es.Uniforms(u, s),
            verifier=es.Verifier(batching=batching),
            throw=False,
        )
        for batching in ("auto", "map")
    ]
    np.testing.assert_array_equal(outs[0].tokens, outs[1].tokens)
    np.testing.assert_array_equal(outs[0].num_accepted, outs[1].num_accepted)
    expected = es.RESULTS.successful if one_hot else es.RESULTS.not_normalised
    for out in outs:
        assert bool(out.result == expected)
        assert int(out.failed_row) == (-1 if one_hot else 40)
    # Read in three phases there, not row by row.
    assert row_mapping("auto", rows_given=True, shape=(64, 32_768)).passes == "scan"


@pytest.mark.parametrize("vocab, dtype", [(1000, np.float32), (16_384, jnp.bfloat16)])
def test_rows_the_kernel_does_not_fit_are_read_in_each_row(vocab, dtype):
    """A vocabulary whose search blocks do not fill 128 lanes, and half-precision rows:
    `"pallas"` runs without the kernel, as `"vmap"`."""
    x, q, p, u, s = random_case(5, 6, 2, vocab)
    target = es.Probabilities(jnp.asarray(p, dtype))
    draft = es.Draft(x, es.Probabilities(jnp.asarray(q, dtype)))

    def verify(batching):
        verifier = es.Verifier(batching=batching)
        return es.verify(target, draft, es.Uniforms(u, s), verifier=verifier).tokens

    assert "pallas_call" not in str(jax.make_jaxpr(lambda: verify("pallas"))())
    np.testing.assert_array_equal(verify("pallas"), verify("vmap"))


WARPS = [
    # (warp, one-hot drafts, whether the kernel runs)
    (es.Warp(temperature=0.7), False, True),
    (es.Warp(min_p=0.05), True, True),  # a threshold the kernel applies
    # Greedy rows (temperature 0 in some rows) are one-hot: evaluated in each row.
    (es.Warp(temperature=jnp.asarray([0.0] + [1.0] * (BATCH - 1))), False, False),
]


@pytest.mark.parametrize("warp, one_hot, runs", WARPS)
def test_warped_logits_rows_n_by_the_kernel_give_vmap_s_tokens(warp, one_hot, runs):
    """Warped logits: the kernel evaluates rows n from the logits and each row's
    normalisers, the draft tokens' values are taken from the normalised rows, and the
    draw evaluates the block it reads again from the logits."""
    rng = np.random.default_rng(2)
    target = 2 * rng.normal(size=(BATCH, GAMMA + 1, VOCAB)).astype(np.float32)
    draft = target[:, :GAMMA] + 0.7 * rng.normal(size=(BATCH, GAMMA, VOCAB))
    draft = draft.astype(np.float32)
    tokens = jax.random.categorical(jax.random.key(1), draft).astype(jnp.int32)
    drafted = es.Draft(tokens) if one_hot else es.Draft(tokens, es.Logits(draft, warp))

    def verify(batching):
        verifier = es.Verifier(batching=batching)
        return es.verify(
            es.Logits(target, warp), drafted, jax.random.key(3), verifier=verifier
        )

    assert ("pallas_call" in str(jax.make_jaxpr(lambda: verify("pallas"))())) == runs
    vmap, pallas = verify("vmap"), verify("pallas")
    np.testing.assert_array_equal(pallas.tokens, vmap.tokens)
    np.testing.assert_array_equal(pallas.num_accepted, vmap.num_accepted)
    if not one_hot:
        assert 0 < int(jnp.sum(vmap.num_accepted)) < BATCH * GAMMA


def test_the_window_kernel_copies_what_dynamic_slice_reads():
    """The draw's windows of rows n, copied by the window kernel under `vmap`: XLA's
    slices, indices clamped as it clamps them (negative ones counted from the end);
    rows it does not fit (a length off the 128-lane tiles) are sliced by XLA."""
    rows = jax.random.normal(jax.random.key(0), (BATCH, GAMMA + 1, 9 * 128))
    row = jnp.asarray([0, 1, 2, 3, 5, -1, 2, 1, 0, 3, 3])
    start = jnp.asarray([0, 128, 256, 1024, 896, 0, 1024, 2000, -128, 640, 768])
    for length, kernel in ((256, True), (100, False)):

        def sliced(r, i, s, length=length):
            return jax.lax.dynamic_slice(r, (i, s), (1, length))[0]

        def windowed(r, i, s, length=length):
            return row_window(r, i, s, length, by_kernel=True)

        copied = jax.vmap(windowed)
        jaxpr = str(jax.make_jaxpr(copied)(rows, row, start))
        assert ("pallas_call" in jaxpr) == kernel
        np.testing.assert_array_equal(
            jax.jit(copied)(rows, row, start), jax.vmap(sliced)(rows, row, start)
        )
