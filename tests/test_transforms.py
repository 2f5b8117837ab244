"""jit, filter_jit, vmap, vmap-of-vmap, no retracing, output dtypes in both modes."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_case
from user_stages import LenientRatioTest

import eqx_specdec


def _assert_same(a, b):
    assert set(a) == set(b) == {"num_accepted", "tokens"}
    for key in a:
        assert a[key].dtype == b[key].dtype == jnp.int32
        np.testing.assert_array_equal(a[key], b[key])


VERIFIERS = [
    eqx_specdec.Verifier(),
    eqx_specdec.Verifier(ratio_test=LenientRatioTest(0.5)),
]


@pytest.mark.parametrize("verifier", VERIFIERS)
def test_vmap_of_row_equals_batched_call(verifier):
    x, q, p, u, s = random_case(0, 16, 4, 50)
    batched = eqx_specdec.speculative_accept(x, q, p, u, s, verifier=verifier)
    _assert_same(jax.vmap(verifier.row)(x, q, p, u, s), batched)
    _assert_same(jax.jit(jax.vmap(verifier.row))(x, q, p, u, s), batched)
    rows = [
        verifier.row(*(jnp.asarray(a[b]) for a in (x, q, p, u, s))) for b in range(3)
    ]
    for b, row in enumerate(rows):
        np.testing.assert_array_equal(row["tokens"], batched["tokens"][b])
        assert row["num_accepted"].shape == ()


@pytest.mark.parametrize("verifier", VERIFIERS)
def test_vmap_of_vmap_equals_batched_call(verifier):
    x, q, p, u, s = random_case(1, 16, 4, 50)
    batched = eqx_specdec.speculative_accept(x, q, p, u, s, verifier=verifier)
    grid = [a.reshape(4, 4, *a.shape[1:]) for a in (x, q, p, u, s)]
    nested = jax.jit(jax.vmap(jax.vmap(verifier.row)))(*grid)
    flat = {k: v.reshape(16, *v.shape[2:]) for k, v in nested.items()}
    _assert_same(flat, batched)
    # The batched entry point under an outer vmap (several independent batches).
    outer = eqx.filter_vmap(
        lambda *a: eqx_specdec.speculative_accept(*a, verifier=verifier)
    )(*grid)
    _assert_same({k: v.reshape(16, *v.shape[2:]) for k, v in outer.items()}, batched)


@pytest.mark.parametrize("wrap", [jax.jit, eqx.filter_jit])
def test_no_retrace_for_new_values(wrap):
    traced = wrap(
        eqx.debug.assert_max_traces(eqx_specdec.speculative_accept, max_traces=1)
    )
    for seed in range(3):
        traced(*random_case(seed, 8, 3, 40))


def test_no_retrace_when_sweeping_an_array_hyperparameter():
    """A user sweeping lenience as an array pays one compilation."""

    @jax.jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def run(lenience, *inputs):
        verifier = eqx_specdec.Verifier(ratio_test=LenientRatioTest(lenience))
        return eqx_specdec.speculative_accept(*inputs, verifier=verifier)

    inputs = random_case(3, 8, 3, 40)
    totals = [
        int(run(jnp.float32(lenience), *inputs)["num_accepted"].sum())
        for lenience in (1.0, 0.5, 0.1)
    ]
    assert totals == sorted(totals)


def test_verifier_as_a_traced_argument():
    x, q, p, u, s = random_case(4, 8, 3, 40)
    verifier = eqx_specdec.Verifier(ratio_test=LenientRatioTest(jnp.float32(0.5)))
    eager = eqx_specdec.speculative_accept(x, q, p, u, s, verifier=verifier)
    _assert_same(
        jax.jit(eqx_specdec.speculative_accept)(x, q, p, u, s, verifier=verifier), eager
    )


TOKEN_DTYPES = [jnp.int8, jnp.int16, jnp.int32, jnp.uint16, jnp.uint32]
if jax.config.jax_enable_x64:  # int64 arrays exist only in 64-bit mode
    TOKEN_DTYPES.append(jnp.int64)


@pytest.mark.parametrize("token_dtype", TOKEN_DTYPES)
def test_int32_outputs_for_any_token_dtype(token_dtype):
    x, q, p, u, s = random_case(5, 8, 3, 100)
    expected = eqx_specdec.speculative_accept(x, q, p, u, s)
    out = jax.jit(eqx_specdec.speculative_accept)(
        jnp.asarray(x, token_dtype), q, p, u, s
    )
    _assert_same(out, expected)


@pytest.mark.parametrize("vocab", [6, 300, 5000])
def test_batching_by_map_and_by_vmap_agree(vocab):
    """`Verifier(batching=...)` only changes how rows are mapped, never the tokens."""
    x, q, p, u, s = random_case(11, 16, 4, vocab)
    outs = [
        eqx_specdec.speculative_accept(
            x, q, p, u, s, verifier=eqx_specdec.Verifier(batching=batching)
        )
        for batching in ("map", "vmap", "auto")
    ]
    for out in outs[1:]:
        _assert_same(out, outs[0])


def test_bad_batching_mode():
    with pytest.raises(ValueError, match="`batching`"):
        eqx_specdec.Verifier(batching="pmap")
