"""Determinism and batch invariance: a row's output depends on nothing but that row."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_case

import eqx_specdec


G, V = 5, 1000


def _row_in_batch(batch, position, row_inputs, seed):
    """The row `row_inputs` placed at `position` among `batch - 1` other random rows."""
    others = random_case(seed, batch, G, V)
    return [
        np.concatenate([o[:position], r, o[position + 1 :]])
        for o, r in zip(others, row_inputs)
    ]


def _runners():
    verifier = eqx_specdec.Verifier()
    return {
        "speculative_accept": eqx_specdec.speculative_accept,
        "jax.jit": jax.jit(eqx_specdec.speculative_accept),
        "eager verifier": lambda *a: verifier(*(jnp.asarray(x) for x in a)),
        "vmap of row": jax.jit(jax.vmap(verifier.row)),
    }


@pytest.mark.parametrize("row_seed", [0, 1])
def test_row_output_is_bit_identical_in_any_batch(row_seed):
    row = [a[:1] for a in random_case(1000 + row_seed, 1, G, V)]
    results = []
    for name, run in _runners().items():
        for batch, position in [(1, 0), (7, 3), (7, 6), (256, 141)]:
            inputs = _row_in_batch(batch, position, row, seed=batch + position)
            out = run(*inputs)
            results.append(
                (
                    name,
                    batch,
                    int(out["num_accepted"][position]),
                    np.asarray(out["tokens"][position]),
                )
            )
    _, _, n0, tokens0 = results[0]
    for name, batch, n, tokens in results:
        assert n == n0, (name, batch)
        np.testing.assert_array_equal(tokens, tokens0, err_msg=f"{name}, batch {batch}")


def test_same_output_in_32_and_64_bit_mode():
    """The same float32 values give the same tokens whichever mode JAX runs in, and
    given as float64 in 64-bit mode; the outputs are int32 every time."""
    inputs = random_case(5, 64, G, V)
    outputs = []
    for x64 in (False, True):
        with jax.enable_x64(x64):
            arrays = [jnp.asarray(a) for a in inputs]
            runs = [arrays]
            if x64:  # the same values as float64 (the token ids as they are)
                runs.append(arrays[:1] + [a.astype(jnp.float64) for a in arrays[1:]])
                assert runs[-1][1].dtype == jnp.float64
            for run in runs:
                out = eqx_specdec.speculative_accept(*run)
                assert out["tokens"].dtype == jnp.int32
                outputs.append({k: np.asarray(v) for k, v in out.items()})
    for output in outputs[1:]:
        for key in outputs[0]:
            np.testing.assert_array_equal(outputs[0][key], output[key])


def test_repeated_calls_are_bit_identical():
    """Same inputs, same outputs, bit for bit: eagerly again and again, and under a
    fresh `jax.jit` each time."""
    inputs = random_case(6, 32, G, V)
    first = eqx_specdec.speculative_accept(*inputs)
    calls = [lambda: eqx_specdec.speculative_accept(*inputs)] * 3
    calls += [lambda: jax.jit(eqx_specdec.speculative_accept)(*inputs)] * 2
    for call in calls:
        again = call()
        for key in first:
            np.testing.assert_array_equal(first[key], again[key])
