"""Sharded verification on 8 host CPU devices (conftest sets
`--xla_force_host_platform_device_count=8`): batch, vocabulary and combined meshes give
the single-device tokens, and no (B, V)-sized array crosses devices."""

import jax
import numpy as np
import pytest
from helpers import accept_from_key, float_dtypes, random_case
from jax.sharding import NamedSharding, PartitionSpec
from user_stages import (
    ArgminPrefixCounter,
    LenientRatioTest as UserLenientRatioTest,
    ScatterTokenAssembler,
    SearchsortedSampler,
)

import eqx_specdec as es
from benchmarks.bench_sharding import collectives, gathering_verifier
from eqx_specdec._chain.verifier import probability_step


pytestmark = pytest.mark.skipif(
    jax.device_count() < 8, reason="needs 8 devices: XLA_FLAGS is set in conftest.py"
)

# (mesh shape, axis names, batch axis, vocabulary axis)
MESHES = {
    "vocab 8": ((8,), ("vocab",), None, "vocab"),
    "batch 2 x vocab 4": ((2, 4), ("batch", "vocab"), "batch", "vocab"),
    "batch 4 x vocab 2": ((4, 2), ("batch", "vocab"), "batch", "vocab"),
    "batch 8": ((8,), ("batch",), "batch", None),
}

VOCAB_VERIFIERS = {
    "standard": es.Verifier(),
    "lenient 0.5": es.Verifier(es.LenientRatioTest(0.5)),
    "greedy": es.Verifier(es.GreedyRatioTest(), residual_sampler=es.ArgmaxSampler()),
    "block": es.Verifier(es.BlockRatioTest(), es.LastSuccessCounter()),
    "user counter and assembler": es.Verifier(
        prefix_counter=ArgminPrefixCounter(), token_assembler=ScatterTokenAssembler()
    ),
}

BATCH_ONLY_VERIFIERS = {
    "typical": es.Verifier(es.TypicalRatioTest(), residual_sampler=es.TypicalSampler()),
    "user sampler": es.Verifier(residual_sampler=SearchsortedSampler()),
}


def _mesh(name):
    shape, names, batch_axis, vocab_axis = MESHES[name]
    return jax.make_mesh(shape, names), batch_axis, vocab_axis


def _place(mesh, batch_axis, vocab_axis, arrays):
    """Lays the inputs out over the mesh as a sharded model would hand them over."""
    spec = {
        3: PartitionSpec(batch_axis, None, vocab_axis),
        2: PartitionSpec(batch_axis, None),
        1: PartitionSpec(batch_axis),
    }
    return [jax.device_put(a, NamedSharding(mesh, spec[a.ndim])) for a in arrays]


def _case(seed, batch, gamma, vocab, dtype, greedy_drafts=False):
    x, q, p, u, s = random_case(seed, batch, gamma, vocab, dtype=dtype)
    if greedy_drafts:  # drafts that often match the target's argmax
        best = p[:, :gamma].argmax(-1)
        keep = np.random.default_rng(seed).random(x.shape) < 0.8
        x = np.where(keep, best, x).astype(np.int32)
    return x, q, p, u, s


# Shards of 12 tokens (the flat search) and of 128 to 512 (the two-level search). Each
# vocabulary's layouts run in one test, against one single-device result (compiled once).
MESHES_BY_VOCAB = {
    96: ["vocab 8", "batch 4 x vocab 2"],
    1024: ["vocab 8", "batch 2 x vocab 4", "batch 8"],
}


@pytest.mark.parametrize("vocab", list(MESHES_BY_VOCAB))
@pytest.mark.parametrize("name", list(VOCAB_VERIFIERS))
def test_sharded_equals_single_device(name, vocab):
    dtype = float_dtypes()[-1]  # float32, and float64 in 64-bit mode
    verifier = VOCAB_VERIFIERS[name]
    x, q, p, u, s = _case(vocab, 16, 4, vocab, dtype, greedy_drafts=name == "greedy")
    drafts = [q] if name == "block" else [q, None]  # None: one-hot drafts
    for draft in drafts:
        expected = es.speculative_accept(x, draft, p, u, s, verifier=verifier)
        if draft is not None:  # the case holds rejections and bonus tokens
            counts = np.asarray(expected["num_accepted"])
            assert counts.min() == 0 and counts.max() == 4
        for mesh_name in MESHES_BY_VOCAB[vocab]:
            mesh, batch_axis, vocab_axis = _mesh(mesh_name)
            sharded = es.ShardedVerifier(verifier, mesh, batch_axis, vocab_axis)
            got = es.speculative_accept(x, draft, p, u, s, verifier=sharded)
            for field in ("num_accepted", "tokens"):
                np.testing.assert_array_equal(
                    got[field], expected[field], err_msg=f"{field} on {mesh_name}"
                )


@pytest.mark.parametrize("name", list(BATCH_ONLY_VERIFIERS) + ["gumbel"])
def test_batch_sharding_runs_any_verifier(name):
    mesh, _, _ = _mesh("batch 8")
    x, q, p, u, s = _case(3, 16, 3, 200, np.float32)
    if name == "gumbel":
        verifier = es.Verifier(residual_sampler=es.GumbelSampler())
        s = jax.random.split(jax.random.key(0), 16)
    else:
        verifier = BATCH_ONLY_VERIFIERS[name]
    sharded = es.ShardedVerifier(verifier, mesh, batch_axis="batch")
    expected = es.speculative_accept(x, q, p, u, s, verifier=verifier)
    got = es.speculative_accept(x, q, p, u, s, verifier=sharded)
    np.testing.assert_array_equal(got["tokens"], expected["tokens"])


def test_sharded_verifier_under_jit_vmap_free_and_with_sharded_inputs():
    mesh, batch_axis, vocab_axis = _mesh("batch 2 x vocab 4")
    sharded = es.ShardedVerifier(es.Verifier(), mesh, batch_axis, vocab_axis)
    x, q, p, u, s = _case(5, 16, 4, 512, np.float32)
    placed = _place(mesh, batch_axis, vocab_axis, (x, q, p, u, s))
    run = jax.jit(es.speculative_accept, static_argnames="check_inputs")
    got = run(*placed, verifier=sharded, check_inputs="off")
    expected = es.speculative_accept(x, q, p, u, s)
    np.testing.assert_array_equal(got["tokens"], expected["tokens"])
    # Outputs stay sharded over the batch.
    assert got["tokens"].sharding.spec[0] == batch_axis


def _collectives(compiled_text):
    """(op, element count, shape) of every cross-device collective in compiled HLO."""
    return [
        (op, int(np.prod(shape)), shape) for op, shape, _ in collectives(compiled_text)
    ]


@pytest.mark.parametrize("check_inputs", ["off", "read"])
@pytest.mark.parametrize("mesh_name", ["vocab 8", "batch 2 x vocab 4", "batch 8"])
def test_no_row_crosses_devices(mesh_name, check_inputs):
    batch, gamma, vocab = 64, 5, 4096
    mesh, batch_axis, vocab_axis = _mesh(mesh_name)
    sharded = es.ShardedVerifier(es.Verifier(), mesh, batch_axis, vocab_axis)
    x, q, p, u, s = _case(9, batch, gamma, vocab, np.float32)
    placed = _place(mesh, batch_axis, vocab_axis, (x, q, p, u, s))

    # The program of the entry point: its step on probabilities, which `verify`
    # compiles.
    def body(*a):
        outputs, problems = probability_step(
            *a, verifier=sharded, check_inputs=check_inputs
        )
        return outputs, [problem.flags for problem in problems]

    run = jax.jit(body)
    text = run.lower(*placed).compile().as_text()
    collectives = _collectives(text)
    largest = max((c[1] for c in collectives), default=0)
    # Per-row scalars only: at most a few values per row, position and shard.
    assert largest <= batch * (gamma + 1) * 8, collectives
    if vocab_axis is None and check_inputs == "off":
        assert collectives == []  # batch sharding: nothing crosses devices
    if vocab_axis is not None:
        assert collectives  # the scheme does communicate, and the parser sees it
    # The naive alternative (gather the rows, then verify) really does move rows, and
    # gives the same tokens.
    if vocab_axis is not None:
        naive = jax.jit(gathering_verifier(mesh, batch_axis, vocab_axis))
        naive_text = naive.lower(*placed).compile().as_text()
        assert max(c[1] for c in _collectives(naive_text)) >= batch * vocab // 2
        np.testing.assert_array_equal(
            naive(*placed)["tokens"], run(*placed)[0]["tokens"]
        )


def test_inside_the_decoding_loop():
    mesh, batch_axis, vocab_axis = _mesh("batch 2 x vocab 4")
    # The built-in text, over a vocabulary padded to 40 so that it splits over 4 shards.
    draft = es.demo.fit_ngram(es.demo.builtin_corpus(), 40, 2)
    target = es.demo.fit_ngram(es.demo.builtin_corpus(), 40, 3)
    tokens = np.zeros((8, 4), np.int32)
    for i, text in enumerate(es.demo.BUILTIN_PROMPTS):
        tokens[i] = es.demo.encode(text[:4])
    key = jax.random.key(0)
    for verifier, drafting in [
        (es.Verifier(), "sample"),
        (es.Verifier(es.BlockRatioTest(), es.LastSuccessCounter()), "sample"),
        (
            es.Verifier(es.GreedyRatioTest(), residual_sampler=es.ArgmaxSampler()),
            "argmax",
        ),
    ]:
        sharded = es.ShardedVerifier(verifier, mesh, batch_axis, vocab_axis)
        chain = es.Chain(4, drafting)
        expected = es.speculative_decode(
            draft, target, tokens, None, 24, key, verifier=verifier, proposal=chain
        )
        got = es.speculative_decode(
            draft, target, tokens, None, 24, key, verifier=sharded, proposal=chain
        )
        np.testing.assert_array_equal(got.tokens, expected.tokens)
        np.testing.assert_array_equal(
            got.accepted_histogram, expected.accepted_histogram
        )


@pytest.mark.parametrize(
    "build, error, match",
    [
        (lambda m: es.ShardedVerifier(es.Verifier(es.TypicalRatioTest(), residual_sampler=es.ArgmaxSampler()), m, vocab_axis="vocab"),
         es.MissingCapabilityError, "TypicalRatioTest does not declare `vocab_parallel = True`.*vocab_axis=None"),
        (lambda m: es.ShardedVerifier(es.Verifier(residual_sampler=es.GumbelSampler()), m, vocab_axis="vocab"),
         es.MissingCapabilityError, "GumbelSampler does not declare `vocab_parallel = True`"),
        (lambda m: es.ShardedVerifier(es.Verifier(UserLenientRatioTest(0.5)), m, vocab_axis="vocab"),
         es.MissingCapabilityError, r"LenientRatioTest does not declare `vocab_parallel = True`"),
        (lambda m: es.ShardedVerifier(es.Verifier(residual_sampler=SearchsortedSampler()), m, vocab_axis="vocab"),
         es.MissingCapabilityError, "SearchsortedSampler does not declare `vocab_parallel = True`"),
        (lambda m: es.ShardedVerifier(es.Verifier(), m, vocab_axis="model"),
         ValueError, r"`vocab_axis`='model'\): the mesh has axes \('batch', 'vocab'\)"),
        (lambda m: es.ShardedVerifier(es.Verifier(), m, batch_axis="vocab", vocab_axis="vocab"),
         ValueError, "must be different axes"),
        (lambda m: es.ShardedVerifier(es.Verifier(), "mesh", vocab_axis="vocab"),
         TypeError, "must be a jax.sharding.Mesh"),
    ],
)  # fmt: skip
def test_unshardable_settings_are_clear_errors(build, error, match):
    mesh, _, _ = _mesh("batch 2 x vocab 4")
    with pytest.raises(error, match=match):
        build(mesh)


def test_uneven_splits_are_clear_errors():
    mesh, batch_axis, vocab_axis = _mesh("batch 2 x vocab 4")
    sharded = es.ShardedVerifier(es.Verifier(), mesh, batch_axis, vocab_axis)
    x, q, p, u, s = _case(1, 4, 2, 30, np.float32)
    with pytest.raises(
        ValueError, match="vocabulary V = 30 does not split evenly over the 4 devices"
    ):
        es.speculative_accept(x, q, p, u, s, verifier=sharded)
    x, q, p, u, s = _case(1, 3, 2, 32, np.float32)
    with pytest.raises(
        ValueError, match="batch B = 3 does not split evenly over the 2 devices"
    ):
        es.speculative_accept(x, q, p, u, s, verifier=sharded)
    # The run-time value checks still run on sharded inputs.
    x, q, p, u, s = _case(1, 4, 2, 32, np.float32)
    p = p.copy()
    p[2, 1, 5] = -0.5
    message = r"negative probability in row 2 \(the first such row\)"
    with pytest.raises(RuntimeError, match=message):
        es.speculative_accept(x, q, p, u, s, verifier=sharded, check_inputs="all")
    key = jax.random.key(0)
    with pytest.raises(RuntimeError, match=message):
        accept_from_key(key, x, q, p, verifier=sharded, check_inputs="all")
    # Inside a jit of the caller's, the check runs after the sharded program, as a
    # callback of the caller's program: JAX raises it when the outputs are read.
    with pytest.raises(jax.errors.JaxRuntimeError, match=message):
        run = jax.jit(
            lambda *a: es.speculative_accept(*a, verifier=sharded, check_inputs="all")
        )
        jax.block_until_ready(run(x, q, p, u, s))
    out = jax.jit(
        lambda *a: es.speculative_accept(*a, verifier=sharded, check_inputs="off")
    )(x, q, p, u, s)
    assert out["tokens"].shape == (4, 3)
