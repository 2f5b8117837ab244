"""The worked examples of the contract's section 2 (docs/contract.md), exact."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqx_specdec


EXAMPLES = [
    (
        dict(
            draft_tokens=[[3, 2]],
            draft_probs=[[[0.2, 0.59, 0.04, 0.17], [0.12, 0.43, 0.42, 0.03]]],
            target_probs=[
                [
                    [0.04, 0.44, 0.24, 0.28],
                    [0.27, 0.36, 0.23, 0.14],
                    [0.19, 0.34, 0.07, 0.4],
                ]
            ],
            accept_uniforms=[[0.27, 0.79]],
            sample_uniforms=[0.92],
        ),
        [1],
        [[3, 3, -1]],
    ),
    (
        dict(
            draft_tokens=[[1, 0, 2], [2, 1, 1]],
            draft_probs=[
                [
                    [0.38, 0.31, 0.2, 0.11],
                    [0.16, 0.01, 0.55, 0.28],
                    [0.26, 0.33, 0.06, 0.35],
                ],
                [
                    [0.01, 0.13, 0.49, 0.37],
                    [0.26, 0.12, 0.37, 0.25],
                    [0.05, 0.25, 0.67, 0.03],
                ],
            ],
            target_probs=[
                [
                    [0.3, 0.4, 0.05, 0.25],
                    [0.63, 0.1, 0.2, 0.07],
                    [0.16, 0.05, 0.46, 0.33],
                    [0.14, 0.55, 0.18, 0.13],
                ],
                [
                    [0.11, 0.71, 0.08, 0.1],
                    [0.21, 0.45, 0.01, 0.33],
                    [0.07, 0.02, 0.49, 0.42],
                    [0.22, 0.25, 0.28, 0.25],
                ],
            ],
            accept_uniforms=[[0.83, 0.99, 0.77], [0.6, 0.08, 0.03]],
            sample_uniforms=[0.59, 0.73],
        ),
        [3, 0],
        [[1, 0, 2, 1], [1, -1, -1, -1]],
    ),
    (
        dict(
            draft_tokens=[[2]],
            draft_probs=[[[0.01, 0.25, 0.49, 0.01, 0.24]]],
            target_probs=[
                [[0.24, 0.31, 0.06, 0.05, 0.34], [0.04, 0.17, 0.1, 0.14, 0.55]]
            ],
            accept_uniforms=[[0.66]],
            sample_uniforms=[0.38],
        ),
        [0],
        [[0, -1]],
    ),
]

MODES = {
    "eager": eqx_specdec.speculative_accept,
    "jax.jit": jax.jit(eqx_specdec.speculative_accept),
    "eqx.filter_jit": eqx.filter_jit(eqx_specdec.speculative_accept),
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("example, num_accepted, tokens", EXAMPLES)
def test_worked_example(mode, example, num_accepted, tokens):
    inputs = {
        name: jnp.asarray(value, jnp.int32 if name == "draft_tokens" else jnp.float32)
        for name, value in example.items()
    }
    out = MODES[mode](**inputs)
    assert set(out) == {"num_accepted", "tokens"}
    assert out["num_accepted"].dtype == jnp.int32
    assert out["tokens"].dtype == jnp.int32
    np.testing.assert_array_equal(out["num_accepted"], num_accepted)
    np.testing.assert_array_equal(out["tokens"], tokens)


@pytest.mark.parametrize("example, num_accepted, tokens", EXAMPLES)
def test_worked_example_from_python_lists(example, num_accepted, tokens):
    out = eqx_specdec.speculative_accept(**example)
    np.testing.assert_array_equal(out["num_accepted"], num_accepted)
    np.testing.assert_array_equal(out["tokens"], tokens)
