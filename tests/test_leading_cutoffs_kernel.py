"""Warped rows normalised up to each sequence's first failure by the Pallas kernel
(`batching="pallas"`, the TPU's default for warped logits at serving shapes; here in
Pallas's interpret mode): exactly the rows a threshold rule's verdicts read are
normalised, as the warp's XLA path normalises them, and none after; the verification's
tokens with it equal `vmap`'s; and where it does not apply (a rule holding an array,
greedy rows) the backend normalises every row itself."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqx_specdec as es
from eqx_specdec._kernels import leading_cutoffs, streams
from eqx_specdec._stages.row_context import RowContext
from eqx_specdec._warps.warp import as_normalised


# Eleven sequences: a second group of eight, short. Nine 128-lane tiles: a step of eight
# and a short one.
BATCH, GAMMA, VOCAB = 11, 3, 9 * 128
LOG_SPACE = RowContext(log_space=True)


def _rows(one_hot: bool):
    keys = jax.random.split(jax.random.key(3), 5)
    target = 4 * jax.random.normal(keys[0], (BATCH, GAMMA + 1, VOCAB))
    draft = target[:, :GAMMA] + 2 * jax.random.normal(keys[1], (BATCH, GAMMA, VOCAB))
    # Drafted from the draft's most likely tokens at 60% of positions (peaked rows):
    # prefixes of every length.
    tokens = jax.random.randint(keys[2], (BATCH, GAMMA), 0, VOCAB)
    likely = jax.random.uniform(keys[3], (BATCH, GAMMA)) < 0.6
    tokens = jnp.where(likely, jnp.argmax(draft, -1), tokens).astype(jnp.int32)
    uniforms = jax.random.uniform(keys[4], (BATCH, GAMMA))
    return tokens, None if one_hot else draft, target, uniforms


RULES = [es.RatioTest(), es.LenientRatioTest(lenience=0.5)]
WARPS = [
    es.Warp(),
    es.Warp(temperature=0.7, top_k=20),
    es.Warp(top_p=0.8, min_p=0.05),
]


# Each warp with each rule and each kind of draft, in six cases rather than twelve (the
# suite's time is mostly compiling): every pair of the three appears.
CASES = [
    (WARPS[0], RULES[0], False),
    (WARPS[0], RULES[1], True),
    (WARPS[1], RULES[0], True),
    (WARPS[1], RULES[1], False),
    (WARPS[2], RULES[0], False),
    (WARPS[2], RULES[1], True),
]


@pytest.mark.parametrize("warp, rule, one_hot", CASES)
def test_exactly_the_rows_up_to_the_first_failure_are_normalised(
    warp, rule, one_hot, monkeypatch
):
    if (warp, rule, one_hot) == CASES[3]:
        # The batch cut into calls of eight sequences and three, as where one call's
        # SMEM arrays would not fit (the per-row parameters of both sliced).
        monkeypatch.setattr(streams, "SMEM_WORDS", 1)
        assert len(streams.chunks(BATCH, 1)) == 2
    tokens, draft, target, _ = _rows(one_hot)
    target_rows = warp.rows(target)
    draft_rows = None if draft is None else warp.rows(draft)
    # The rule's log-ratios on the warp's own normalisers, every row read.
    xla_target = as_normalised(target_rows)
    p = xla_target.log_probs()[:, :GAMMA]
    p_x = jnp.take_along_axis(p, tokens[..., None], -1)[..., 0]
    q_x = jnp.zeros_like(p_x)
    if draft is not None:
        xla_draft = as_normalised(draft_rows)
        q = xla_draft.log_probs()
        q_x = jnp.take_along_axis(q, tokens[..., None], -1)[..., 0]
    ratio = rule.acceptance(p_x, q_x, LOG_SPACE) - q_x
    # Uniforms passing sequence b's positions before b mod (G + 1) and failing there
    # (where the rule can fail): prefixes of every length.
    design = jnp.arange(BATCH)[:, None] % (GAMMA + 1)
    log_u = jnp.where(jnp.arange(GAMMA)[None] < design, ratio - 1, ratio + 1)
    uniforms = jnp.nan_to_num(jnp.clip(jnp.exp(log_u), 0, 1 - 2**-24), nan=0.5)
    passed = jnp.log(uniforms) < ratio
    n = np.asarray(jnp.sum(jnp.cumprod(passed, axis=1), axis=1))
    assert len(set(n.tolist())) >= 3  # prefixes of several lengths
    found = rule.normalise_pass(
        tokens, draft_rows, target_rows, uniforms, LOG_SPACE, kernel=True
    )
    assert found is not None
    kernel_draft, kernel_target = jax.jit(lambda f: f)(found)
    positions = np.arange(GAMMA + 1)[None]
    wanted = positions <= n[:, None]
    pairs = [(kernel_target, xla_target, wanted)]
    if draft is not None:
        pairs.append((kernel_draft, xla_draft, wanted[:, :GAMMA]))
    else:
        assert kernel_draft is None
    for kernel, xla, wanted in pairs:
        read = np.isfinite(np.asarray(kernel.log_sum[..., 0]))
        np.testing.assert_array_equal(read, wanted)
        np.testing.assert_array_max_ulp(
            kernel.shift[wanted], xla.shift[wanted], maxulp=1
        )
        np.testing.assert_allclose(
            kernel.log_sum[wanted], xla.log_sum[wanted], rtol=1e-6, atol=1e-6
        )
        if xla.threshold is not None:  # the same tokens kept in every row read
            x = np.asarray(target_rows.x if xla is xla_target else draft_rows.x)
            np.testing.assert_array_equal(
                (x >= np.asarray(kernel.threshold))[wanted],
                (x >= np.asarray(xla.threshold))[wanted],
            )
        # Rows not read: every log-probability -inf.
        assert bool(jnp.all(kernel.log_probs()[~wanted] == -jnp.inf))


@pytest.mark.parametrize(
    "warp, rule, one_hot",
    [
        (es.Warp(temperature=0.8), es.RatioTest(), False),
        (es.Warp(min_p=0.1), es.RatioTest(), True),
        (es.Warp(top_k=20), es.LenientRatioTest(lenience=0.5), False),
    ],
)
def test_verification_with_the_kernel_gives_vmap_s_tokens(warp, rule, one_hot):
    tokens, draft, target, _ = _rows(one_hot)

    def verify(batching):
        return es.verify(
            es.Logits(target, warp),
            es.Draft(tokens, None if draft is None else es.Logits(draft, warp)),
            jax.random.key(6),
            verifier=es.Verifier(rule, batching=batching),
        )

    assert "leading_cutoffs" in str(jax.make_jaxpr(lambda: verify("pallas"))())
    vmap, pallas = verify("vmap"), verify("pallas")
    np.testing.assert_array_equal(pallas.tokens, vmap.tokens)
    np.testing.assert_array_equal(pallas.num_accepted, vmap.num_accepted)
    assert 0 < int(jnp.sum(vmap.num_accepted)) < BATCH * GAMMA


@pytest.mark.parametrize(
    "warp, rule",
    [
        # A rule holding an array: its acceptance cannot enter the kernel.
        (es.Warp(), es.LenientRatioTest(lenience=jnp.asarray(0.5))),
        # Per-row temperatures: a row may be greedy.
        (es.Warp(temperature=jnp.asarray([1.0] * (BATCH - 1) + [0.0])), es.RatioTest()),
    ],
)
def test_where_the_kernel_does_not_apply_every_row_is_normalised(warp, rule):
    tokens, draft, target, _ = _rows(one_hot=False)
    assert not leading_cutoffs.fits(warp.rows(draft), warp.rows(target)) or (
        jax.tree.leaves(rule)
    )

    def verify(batching):
        return es.verify(
            es.Logits(target, warp),
            es.Draft(tokens, es.Logits(draft, warp)),
            jax.random.key(6),
            verifier=es.Verifier(rule, batching=batching),
        )

    assert "leading_cutoffs" not in str(jax.make_jaxpr(lambda: verify("pallas"))())
    vmap, pallas = verify("vmap"), verify("pallas")
    np.testing.assert_array_equal(pallas.tokens, vmap.tokens)
    np.testing.assert_array_equal(pallas.num_accepted, vmap.num_accepted)
