"""A NumPy reference written from section 1 of the contract (docs/contract.md), and
random test cases."""

import os
import pathlib
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.contract_calls import (  # noqa: F401 (re-exported to the tests)
    accept_from_key,
    accept_logits,
    tree_accept,
    tree_accept_logits,
)


TIE = 1e-4


def reference_row(x, q, p, u, s, *, lenience=1.0):
    """One row of the contract in float64. `q=None` means one-hot drafts.

    Returns `(n, tokens, ambiguous)`; `ambiguous` is True when a uniform lies within
    `TIE` of what it is compared with, where float32 rounding may decide the outcome.
    """
    x = np.asarray(x)
    p = np.asarray(p, np.float64)
    q = None if q is None else np.asarray(q, np.float64)
    gamma, vocab = x.shape[0], p.shape[1]
    ambiguous = False
    n = gamma
    for i in range(gamma):
        p_x = p[i, x[i]]
        q_x = 1.0 if q is None else q[i, x[i]]
        scaled_q = lenience * q_x
        if scaled_q > 0 and abs(u[i] - p_x / scaled_q) < TIE:
            ambiguous = True
        if not u[i] * scaled_q < p_x:
            n = i
            break
    if n < gamma:
        q_n = np.eye(vocab)[x[n]] if q is None else q[n]
        # The lenient rule's derived correction, norm((p - min(q, p / l))_+).
        residual = np.maximum(p[n] - np.minimum(q_n, p[n] / lenience), 0.0)
        if residual.sum() == 0:
            residual = p[n]
    else:
        residual = p[gamma]
    if not (
        np.all(np.isfinite(residual)) and np.all(residual >= 0) and residual.sum() > 0
    ):
        y = -1  # not a distribution: the contract draws nothing from it
    else:
        cumulative = np.cumsum(residual / residual.sum())
        if np.any(np.abs(cumulative - s) < TIE):
            ambiguous = True
        above = np.nonzero(cumulative > s)[0]
        y = above[0] if above.size else np.nonzero(residual > 0)[0][-1]
    tokens = np.full(gamma + 1, -1, np.int64)
    tokens[:n] = x[:n]
    tokens[n] = y
    return n, tokens, ambiguous


def reference(x, q, p, u, s, *, lenience=1.0):
    rows = [
        reference_row(
            x[b], None if q is None else q[b], p[b], u[b], s[b], lenience=lenience
        )
        for b in range(x.shape[0])
    ]
    n, tokens, ambiguous = zip(*rows)
    return np.array(n), np.stack(tokens), np.array(ambiguous)


def softmax(logits):
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def random_case(seed, batch, gamma, vocab, *, dtype=np.float32):
    """Random inputs mixing flat and peaked rows, drafts close to and far from the target,
    rows that accept every draft token (`q = p`) and rows that reject the first (`u_0`
    near 1, `x_0` least likely under p/q).
    """
    rng = np.random.default_rng(seed)
    temperature = rng.choice([0.3, 1.0, 4.0], size=(batch, 1, 1))
    logits = rng.normal(size=(batch, gamma + 1, vocab)) * temperature
    p = softmax(logits)
    # 0: a draft close to the target, 1: all-accept, 2: first-reject, 3: unrelated draft.
    mode = rng.integers(0, 4, size=batch)
    noise = rng.normal(size=(batch, gamma, vocab)) * temperature
    closeness = np.where(mode == 3, 1.0, 0.1)[:, None, None]
    q = softmax((1 - closeness) * logits[:, :gamma] + closeness * noise)
    q[mode == 1] = p[mode == 1, :gamma]
    p, q = p.astype(dtype), q.astype(dtype)
    # Sample the draft tokens from q, as a draft model would.
    cumulative = np.cumsum(q.astype(np.float64), axis=-1)
    draws = rng.uniform(size=(batch, gamma, 1)) * cumulative[..., -1:]
    x = np.minimum((cumulative <= draws).sum(-1), vocab - 1)
    u = rng.uniform(size=(batch, gamma))
    s = rng.uniform(size=batch)
    for b in np.nonzero(mode == 2)[0]:
        ratio = p[b, 0].astype(np.float64) / q[b, 0]
        x[b, 0] = np.argmin(ratio)
        u[b, 0] = 0.999
    return (
        x.astype(np.int32),
        q,
        p,
        u.astype(dtype),
        s.astype(dtype),
    )


def caught_false_claim(evaluate, verifier) -> float | None:
    """Runs `evaluate()`, an evaluation of `verifier`, which declares itself exact but
    is lossy: the tool raises naming the false claim. Returns the distance the error
    reports (`None` for Monte Carlo, which reports the chi-square test's
    rejection)."""
    assert verifier.exact
    with pytest.raises(ValueError, match="declares itself exact, but") as caught:
        evaluate()
    found = re.search(r"distance from the target of ([0-9.e+-]+)", str(caught.value))
    return None if found is None else float(found.group(1))


def float_dtypes():
    """The float input dtypes this mode can represent."""
    dtypes = [np.float32]
    if jax.config.jax_enable_x64:
        dtypes.append(np.float64)
    return dtypes


def default_xla_environment() -> dict:
    """The environment for a subprocess that runs as a user would: XLA's default flags
    (the suite's own, `conftest.py`, compile quickly but run slowly), and this checkout's
    package on the path."""
    quick = ("XLA_FLAGS", "JAX_DISABLE_MOST_OPTIMIZATIONS")
    env = {k: v for k, v in os.environ.items() if k not in quick}
    root = str(pathlib.Path(__file__).parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


def direct(f):
    return f


# The class of the checks' error on every path (called directly, inside jax.jit or
# eqx.filter_jit, on one device or several): JAX's JaxRuntimeError, a RuntimeError.
ONE_DEVICE = jax.device_count() == 1


def message_line(error) -> str:
    """The line of a run-time check's error that holds its message (JAX puts its own
    lines first): the argument or stage, the problem, the row and the fix."""
    lines = [x for x in str(error).splitlines() if x.startswith("RuntimeError: ")]
    assert lines, str(error)[-2000:]
    return lines[-1].removeprefix("RuntimeError: ")


PATH_ERRORS = {
    direct: jax.errors.JaxRuntimeError,
    eqx.filter_jit: jax.errors.JaxRuntimeError,
    jax.jit: jax.errors.JaxRuntimeError,
}


def assert_packed_call_scores_each_row_s_tokens(model, vocab: int):
    """A packed model's call on 1, 4 and 2 tokens of three rows, packed into 9 (two
    padding tokens), after a prefill: the outputs at each row's tokens are its own
    call's on its four slots, the cache entries up to its last token are the same, and
    its slots past them repeat its last output."""
    from eqx_specdec._models.cached import call_packed, call_rows, initial_states

    batch, width = 3, 4
    buffer = jax.random.randint(jax.random.key(1), (batch, 24), 0, vocab)
    states = initial_states(model, batch, 24)
    _, states = call_rows(model, buffer, jnp.zeros(batch, jnp.int32), 12, states)
    starts = jnp.asarray([5, 9, 2], jnp.int32)
    counts = jnp.asarray([1, 4, 2], jnp.int32)
    packed, packed_states = eqx.filter_jit(call_packed)(
        model, buffer, starts, counts, 9, width, states
    )
    rows, row_states = eqx.filter_jit(call_rows)(model, buffer, starts, width, states)
    for b, (start, count) in enumerate(zip(starts.tolist(), counts.tolist())):
        np.testing.assert_allclose(
            packed[b, :count], rows[b, :count], rtol=1e-5, atol=1e-5
        )
        np.testing.assert_array_equal(
            packed[b, count:],
            jnp.broadcast_to(packed[b, count - 1], packed[b, count:].shape),
        )
        for a, c in zip(jax.tree.leaves(packed_states), jax.tree.leaves(row_states)):
            np.testing.assert_allclose(
                a[b, :, : start + count], c[b, :, : start + count], rtol=1e-5, atol=1e-5
            )
