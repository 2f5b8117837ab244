"""The run-time check levels: what the default level validates (every value the
verification reads), what the complete level adds, the one error class and message on
every path, and the stages' outputs checked against their contracts."""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import accept_logits, message_line, PATH_ERRORS, random_case, tree_accept

import eqx_specdec as es


B, G, V = 3, 4, 10


def _case(seed=0):
    return [np.array(a) for a in random_case(seed, B, G, V)]


def _clean_outputs(x, q, p, u, s):
    out = es.speculative_accept(x, q, p, u, s, check_inputs="off")
    return np.asarray(out["num_accepted"]), np.asarray(out["tokens"])


# Where the default level must look: the draft token's entries p_i(x_i), q_i(x_i) at
# every position, and rows n of p and q.
def _read_entry(kind):
    def corrupt(x, q, p, n):
        b, i = 1, 0
        array = p if kind == "p" else q
        array[b, i, x[b, i]] = np.nan
        return "holds a NaN, infinite or negative value in row 1"

    return corrupt


def _row_n(kind, factor):
    # Scaled so that the rejection at n stands (p down, q up): row n stays row n.
    def corrupt(x, q, p, n):
        b = int(np.argmin(n))
        assert n[b] < G
        array = p if kind == "p" else q
        array[b, n[b]] *= factor
        return f"whose sum is not within 0.001 of 1 in row {b}"

    return corrupt


def _negative_at_row_n(x, q, p, n):
    b = 0
    v = (x[b, min(n[b], G - 1)] + 1) % V  # not the draft token
    p[b, n[b], v] = -0.2
    p[b, n[b], (v + 1) % V] += 0.2  # the sum stays 1
    return "`target_probs` holds a NaN, infinite or negative value in row 0"


READ_VALUES = {
    "p at a draft token": _read_entry("p"),
    "q at a draft token": _read_entry("q"),
    "p row n unnormalised": _row_n("p", 0.5),
    "q row n unnormalised": _row_n("q", 1.5),
    "p row n negative, sum 1": _negative_at_row_n,
}


@pytest.mark.parametrize("name", list(READ_VALUES))
def test_default_level_catches_every_value_read(name):
    x, q, p, u, s = _case()
    n, _ = _clean_outputs(x, q, p, u, s)
    message = READ_VALUES[name](x, q, p, n)
    with pytest.raises(RuntimeError, match=message):
        es.speculative_accept(x, q, p, u, s)


@pytest.mark.parametrize("seed", range(4))
def test_default_level_never_misses_a_value_that_changes_an_output(seed):
    """Corrupt random entries: either the default level reports it, or the outputs
    (checks off) are those of the clean inputs, so no bad value that can change an
    output goes unreported."""
    rng = np.random.default_rng(seed)
    x, q, p, u, s = _case(seed)
    clean = _clean_outputs(x, q, p, u, s)
    unreported = reported = 0
    for _ in range(25):
        q2, p2 = q.copy(), p.copy()
        array = p2 if rng.random() < 0.5 else q2
        index = tuple(rng.integers(0, d) for d in array.shape)
        array[index] = rng.choice([np.nan, -0.3, 2.0, np.inf])
        try:
            es.speculative_accept(x, q2, p2, u, s)
        except RuntimeError:
            reported += 1
            continue
        unreported += 1
        got = _clean_outputs(x, q2, p2, u, s)
        np.testing.assert_array_equal(got[0], clean[0])
        np.testing.assert_array_equal(got[1], clean[1])
        with pytest.raises(RuntimeError):  # the complete level sees it
            es.speculative_accept(x, q2, p2, u, s, check_inputs="all")
    assert reported and unreported  # both cases exercised


def test_complete_level_checks_rows_never_read():
    x, q, p, u, s = _case()
    n, _ = _clean_outputs(x, q, p, u, s)
    b = int(np.argmin(n))  # a row whose last position is not read
    assert n[b] < G
    p[b, G] *= 2  # the bonus row, not read when a draft token is rejected
    es.speculative_accept(x, q, p, u, s)  # nothing read is wrong
    with pytest.raises(RuntimeError, match=f"sum is not within 0.001 of 1 in row {b}"):
        es.speculative_accept(x, q, p, u, s, check_inputs="all")


def test_same_error_after_valid_calls_and_message_first():
    """The issue's example: a bad call after a valid one raises the same class and
    message as a first bad call, the message on one line."""
    rng = np.random.default_rng(0)
    p = rng.random((2, 3, 8), dtype=np.float32)
    p /= p.sum(-1, keepdims=True)
    q = rng.random((2, 2, 8), dtype=np.float32)
    q /= q.sum(-1, keepdims=True)
    u = rng.random((2, 2), dtype=np.float32)
    s = rng.random(2, dtype=np.float32)
    x = np.array([[1, 2], [3, 4]], np.int32)
    bad = x.copy()
    bad[0, 0] = -1
    errors = []
    for valid_first in (False, True, True):
        if valid_first:
            es.speculative_accept(x, q, p, u, s)
        with pytest.raises(RuntimeError) as info:
            np.asarray(es.speculative_accept(bad, q, p, u, s)["tokens"])
        errors.append(str(info.value))
    (line,) = {message_line(error) for error in errors}
    assert line.startswith(
        "`draft_tokens` holds a token id outside [0, V) = [0, 8) in row 0"
    )
    assert "normalise" not in line and "wrap" not in line


def test_large_input_raises_at_the_call_without_reading_outputs():
    x, q, p, u, s = random_case(0, 256, 4, 4096)
    p = np.array(p)
    p[200] *= 2  # every row, so row n too
    with pytest.raises(RuntimeError, match="in row 200"):
        es.speculative_accept(x, q, p, u, s)  # outputs never read


def test_inside_a_callers_jit_and_vmap():
    x, q, p, u, s = _case()
    run = jax.jit(es.speculative_accept)
    jax.block_until_ready(run(x, q, p, u, s))  # valid: no error
    bad = x.copy()
    bad[2, 1] = V
    message = r"`draft_tokens` holds a token id outside \[0, V\) = \[0, 10\) in row 2"
    # A plain jax.jit: JAX's class for a failed callback (see test_errors.PATH_ERRORS).
    with pytest.raises((jax.errors.JaxRuntimeError, ValueError), match=message):
        jax.block_until_ready(run(bad, q, p, u, s))
    # Equinox's paths: with several devices (this suite has eight), JAX's
    # JaxRuntimeError; with one, eqx.EquinoxRuntimeError (both bases of
    # InvalidInputError; the one-device paths: test_errors.py).
    error = PATH_ERRORS[eqx.filter_jit]
    with pytest.raises(error, match=message):
        jax.block_until_ready(eqx.filter_jit(es.speculative_accept)(bad, q, p, u, s))
    stacked = [np.stack([a, a]) for a in (x, q, p, u, s)]
    stacked[0][1] = bad
    with pytest.raises(error, match=message):
        jax.block_until_ready(jax.vmap(es.speculative_accept)(*stacked))


def test_compile_work_does_not_grow_with_the_batch():
    """One message per problem, not per row: the checked program has the same
    operations at B = 1,000 and B = 200,000."""

    def equations(jaxpr):
        total = 0
        for eqn in jaxpr.eqns:
            total += 1
            for param in eqn.params.values():
                inner = getattr(param, "jaxpr", param)
                if hasattr(inner, "eqns"):
                    total += equations(inner)
        return total

    def count(batch):
        x, q, p, u, s = random_case(0, batch, 2, 4)
        jaxpr = jax.make_jaxpr(es.speculative_accept)(x, q, p, u, s)
        return equations(jaxpr.jaxpr)

    assert count(1_000) == count(200_000)


class _PastTheEndCounter(es.AbstractPrefixCounter):
    counts: ClassVar[str] = "first failure"

    def __call__(self, passed):
        return jnp.sum(passed).astype(jnp.int32) + 10


class _OutOfVocabularySampler(es.AbstractResidualSampler):
    draws: ClassVar[str] = "residual"
    randomness: ClassVar[str] = "none"

    def __call__(
        self,
        num_accepted,
        verdict,
        draft_tokens,
        draft_probs,
        target_probs,
        sample,
        context,
    ):
        return jnp.int32(target_probs.shape[-1])


class _NaNScaleTest(es.AbstractRatioTest):
    exact: ClassVar[bool] = True
    reads: ClassVar[str] = "draft tokens"

    def __call__(
        self, draft_tokens, draft_probs, target_probs, accept_uniforms, context
    ):
        passed = accept_uniforms < 0.5
        return es.Verdict(passed, jnp.full(passed.shape, jnp.nan))


class _ZeroPaddingAssembler(es.AbstractTokenAssembler):
    def __call__(self, num_accepted, draft_tokens, correction):
        return jnp.zeros(draft_tokens.shape[0] + 1, jnp.int32)


STAGE_FAULTS = [
    (es.Verifier(prefix_counter=_PastTheEndCounter()),
     "_PastTheEndCounter (the prefix counter) returned a number accepted outside "
     "[0, G] = [0, 4] in row 0 (the first such row). Fix _PastTheEndCounter:"),
    (es.Verifier(residual_sampler=_OutOfVocabularySampler()),
     "_OutOfVocabularySampler (the residual sampler) returned a correction token "
     "outside [0, V) = [0, 10) in row 0"),
    (es.Verifier(ratio_test=_NaNScaleTest()),
     "_NaNScaleTest (the ratio test) returned a NaN or infinite "
     "`Verdict.residual_scale` in row 0"),
    (es.Verifier(token_assembler=_ZeroPaddingAssembler()),
     "_ZeroPaddingAssembler (the token assembler) returned tokens not laid out as the "
     "contract says in row 1"),  # row 0 accepts all G: zeros are well laid out there
]  # fmt: skip


@pytest.mark.parametrize("level", ["read", "all"])
@pytest.mark.parametrize("verifier, message", STAGE_FAULTS)
def test_stage_outputs_are_checked(verifier, message, level):
    x, q, p, u, s = _case()
    with pytest.raises(RuntimeError) as info:
        es.speculative_accept(x, q, p, u, s, verifier=verifier, check_inputs=level)
    assert message_line(str(info.value)).startswith(message)
    out = es.speculative_accept(x, q, p, u, s, verifier=verifier, check_inputs="off")
    assert out["tokens"].shape == (B, G + 1)  # unchecked: runs, values unspecified


def test_logits_and_tree_entry_points_take_the_levels():
    x, q, p, u, s = _case()
    logits = np.log(p)
    logits[1, 0, 2] = np.nan
    for level in ("read", "all"):
        with pytest.raises(RuntimeError, match="NaN or \\+inf logit in row 1"):
            accept_logits(x, np.log(q), logits, u, s, check_inputs=level)
    parents = np.tile(np.array([-1, 0, 1, 2], np.int32), (B, 1))
    draft = np.concatenate([q, q[:, :1]], axis=1)
    bad = p.copy()
    bad[0, 4] *= 3
    for level in ("read", "all"):
        with pytest.raises(RuntimeError, match="`target_probs` has a distribution"):
            tree_accept(x, parents, draft, bad, u, s, check_inputs=level)
    out = tree_accept(x, parents, draft, bad, u, s, check_inputs="off")
    assert out["tokens"].shape == (B, G + 1)


# Warped logits: the default level checks the rows the verification read (target rows
# 0 to n, draft rows 0 to n), through the maxima the warp found there, on every
# backend: the row-by-row early exit, `vmap`, and the TPU's kernel (interpreted here;
# 256 entries fill whole 128-lane tiles).
LOGIT_V = 256


def _logit_case(seed):
    x, q, p, u, s = random_case(seed, B, G, LOGIT_V)
    return [np.array(a) for a in (x, np.log(q), np.log(p), u, s)]


def _verify_logits(batching, x, q, p, u, s, level):
    return es.verify(
        es.Logits(p, es.Warp(temperature=0.9)),
        es.Draft(x, es.Logits(q, es.Warp(temperature=0.9))),
        es.Uniforms(u, s),
        verifier=es.Verifier(batching=batching),
        check_inputs=level,
    )


# `vmap` and the TPU's kernel; the row-by-row map normalises with the same warp.
@pytest.mark.parametrize("batching", ["vmap", "pallas"])
def test_default_level_checks_the_logit_rows_read(batching):
    """Corrupt random logits (NaN, +inf, or a whole row -inf): either the default
    level reports it, naming the argument, or the outputs (checks off) are those of
    the clean inputs and the complete level reports it; a corruption of a row read is
    always reported."""
    rng = np.random.default_rng(3)
    x, q, p, u, s = _logit_case(3)
    clean = _verify_logits(batching, x, q, p, u, s, "off")
    n = np.asarray(clean.num_accepted)
    assert n.min() < G  # rows after a first failure, never read
    reported = unreported = 0
    for trial in range(12):
        q2, p2 = q.copy(), p.copy()
        target = trial % 2 == 0
        array, name = (p2, "target_logits") if target else (q2, "draft_logits")
        b, i = int(rng.integers(B)), int(rng.integers(array.shape[1]))
        if trial % 3 == 2:
            array[b, i] = -np.inf
            message = (
                f"`{name}` has a distribution whose logits are all -inf in row {b}"
            )
        else:
            array[b, i, rng.integers(LOGIT_V)] = rng.choice([np.nan, np.inf])
            message = f"`{name}` holds a NaN or \\+inf logit in row {b}"
        if i <= n[b]:  # a row the verification read
            with pytest.raises(RuntimeError, match=message):
                _verify_logits(batching, x, q2, p2, u, s, "read")
            reported += 1
            continue
        out = _verify_logits(batching, x, q2, p2, u, s, "read")
        unreported += 1
        np.testing.assert_array_equal(out.num_accepted, clean.num_accepted)
        np.testing.assert_array_equal(out.tokens, clean.tokens)
        with pytest.raises(RuntimeError, match=message):
            _verify_logits(batching, x, q2, p2, u, s, "all")
    assert reported and unreported  # both cases exercised


# The warp's normalisers by XLA (`vmap`; the row-by-row map runs the same warp) and by
# the TPU's kernel.
@pytest.mark.parametrize("batching", ["vmap", "pallas"])
@pytest.mark.parametrize(
    "warp",
    [es.Warp(top_k=5), es.Warp(top_k=jnp.asarray(5)), es.Warp(top_p=0.8)]
    + [es.Warp(min_p=0.1)],
    ids=str,
)
def test_every_warp_s_normalisers_report_a_bad_logit_in_a_row_read(warp, batching):
    x, q, p, u, s = _logit_case(3)
    corruptions = [
        ("target_logits", 1, np.nan, "holds a NaN or \\+inf logit in row 1"),
        ("target_logits", 1, np.inf, "holds a NaN or \\+inf logit in row 1"),
        (
            "target_logits",
            2,
            None,
            "has a distribution whose logits are all -inf in row 2",
        ),
        ("draft_logits", 2, np.nan, "holds a NaN or \\+inf logit in row 2"),
    ]
    for name, b, value, message in corruptions:
        q2, p2 = q.copy(), p.copy()
        array = p2 if name == "target_logits" else q2
        if value is None:
            array[b, 0] = -np.inf
        else:
            array[b, 0, 17] = value  # row 0: read by every verification
        with pytest.raises(RuntimeError, match=f"`{name}` {message}"):
            es.verify(
                es.Logits(p2, warp),
                es.Draft(x, es.Logits(q2, warp)),
                es.Uniforms(u, s),
                verifier=es.Verifier(batching=batching),
            )
