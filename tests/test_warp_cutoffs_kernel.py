"""The warps' cut-offs and normalisers by the Pallas kernel (`batching="pallas"`, the
TPU's default for warped logits; here in Pallas's interpret mode): the cut-offs and
normalisers the warp finds by XLA, over a table of warps with per-row parameters (k of
0, 1 and V, ties at the cut-off, masked tokens, top-p 1, min-p 0), rows that are not a
multiple of eight and a vocabulary with a short last step; the verification's tokens
with it equal to `vmap`'s; and a NaN logit caught through it as under `vmap`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqx_specdec as es
from eqx_specdec._kernels.warp_cutoffs import by_kernel
from eqx_specdec._warps.warp import _warp_rows


# Nine 128-lane tiles: a step of eight and a short one. 15 rows: two blocks of eight,
# the second one short.
ROWS, VOCAB = 15, 9 * 128


def _logits():
    rng = np.random.default_rng(4)
    x = 2 * rng.normal(size=(ROWS, VOCAB)).astype(np.float32)
    x[3, :40] = x[3].max()  # forty entries tied at the maximum
    x[4, 100:160] = np.sort(x[4])[-50]  # ties around top-k's cut-off
    x[5, ::3] = -np.inf  # masked tokens
    x[6] = 0.0  # one value
    return jnp.asarray(x)


def _column(values, dtype=jnp.float32):
    return jnp.asarray(np.resize(values, ROWS), dtype)[:, None]


PARAMS = {
    "temperature": _column([0.5, 1.0, 0.0, 1.7]),  # 0: a greedy row
    "top_k": _column([0, 1, 5, 50, VOCAB, 7, 200], jnp.int32),
    "top_p": _column([0.05, 0.5, 0.9, 0.99, 1.0, 0.7]),
    "min_p": _column([0.0, 0.02, 0.1, 0.3]),
}
WARPS = [("top_k",), ("top_p",), ("top_k", "top_p"), ("top_k", "top_p", "min_p")]


@pytest.mark.parametrize("names", WARPS)
def test_the_kernel_finds_the_warps_cutoffs_and_normalisers(names):
    x = _logits()
    params = {name: PARAMS[name] for name in ("temperature",) + names}

    @jax.jit
    def normalised(x):
        return (
            _warp_rows(x, params, True),
            _warp_rows(x, params, True, searches=by_kernel),
        )

    assert "pallas_call" in str(jax.make_jaxpr(normalised)(x))
    xla, kernel = normalised(x)
    # The searches are exact: the same token ids kept in every row.
    np.testing.assert_array_equal(
        np.asarray(x) >= np.asarray(kernel.threshold),
        np.asarray(x) >= np.asarray(xla.threshold),
    )
    if "min_p" not in names:  # min-p's bound is arithmetic: a fused multiply-add
        np.testing.assert_array_equal(kernel.threshold, xla.threshold)
    # A quotient, as XLA may round it (the maximum over the temperature), and the sums
    # in another order.
    np.testing.assert_array_max_ulp(kernel.shift, xla.shift, maxulp=1)
    np.testing.assert_allclose(kernel.log_sum, xla.log_sum, rtol=1e-6, atol=1e-6)
    assert bool(jnp.any(jnp.isfinite(xla.threshold)))
    # The greedy rows' tokens, from the kernel's maxima.
    np.testing.assert_array_equal(kernel.greedy, xla.greedy)
    np.testing.assert_array_equal(kernel.best, xla.best)
    assert bool(jnp.any(xla.greedy))


@pytest.mark.parametrize(
    "warp",
    [
        es.Warp(top_k=20),
        es.Warp(temperature=0.8, top_p=0.9),
        # Per-row parameters, a greedy row among them.
        es.Warp(
            temperature=jnp.asarray([0.0, 1.0, 0.7, 1.3, 1.0]),
            top_k=jnp.asarray([3, 0, 50, 9, 1]),
            top_p=jnp.asarray([0.8, 0.95, 1.0, 0.5, 0.9]),
        ),
    ],
)
def test_verification_with_the_kernel_gives_vmap_s_tokens(warp):
    batch, gamma = 5, 2
    rng = np.random.default_rng(5)
    target = 2 * rng.normal(size=(batch, gamma + 1, VOCAB)).astype(np.float32)
    draft = target[:, :gamma] + 0.3 * rng.normal(size=(batch, gamma, VOCAB))
    draft = jnp.asarray(draft, jnp.float32)
    tokens = jnp.argmax(draft, axis=-1).astype(jnp.int32)

    def verify(batching):
        return es.verify(
            es.Logits(target, warp),
            es.Draft(tokens, es.Logits(draft, warp)),
            jax.random.key(6),
            verifier=es.Verifier(batching=batching),
        )

    assert "pallas_call" in str(jax.make_jaxpr(lambda: verify("pallas"))())
    vmap, pallas = verify("vmap"), verify("pallas")
    np.testing.assert_array_equal(pallas.tokens, vmap.tokens)
    np.testing.assert_array_equal(pallas.num_accepted, vmap.num_accepted)
    assert 0 < int(jnp.sum(vmap.num_accepted))


def test_a_nan_logit_is_caught_through_the_kernel():
    batch, gamma = 3, 2
    rng = np.random.default_rng(7)
    target = rng.normal(size=(batch, gamma + 1, VOCAB)).astype(np.float32)
    draft = rng.normal(size=(batch, gamma, VOCAB)).astype(np.float32)
    target[1, 0, 7] = np.nan
    tokens = jnp.argmax(draft, axis=-1).astype(jnp.int32)
    warp = es.Warp(top_k=20)
    outs = [
        es.verify(
            es.Logits(target, warp),
            es.Draft(tokens, es.Logits(draft, warp)),
            jax.random.key(8),
            verifier=es.Verifier(batching=batching),
            throw=False,
        )
        for batching in ("vmap", "pallas")
    ]
    for out in outs:
        assert bool(out.result != es.RESULTS.successful)
        assert int(out.failed_row) == 1
        assert bool(jnp.all(out.tokens[1] == -1))
    assert bool(outs[0].result == outs[1].result)
