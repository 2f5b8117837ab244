"""The warps' sort-free cut-offs: the bisection over order keys finds exactly what a sort
finds, ties, masked tokens and both float widths included."""

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import accept_logits

import eqx_specdec
from eqx_specdec._warps import warp as warp_module
from eqx_specdec._warps.cutoffs import (
    count_equal,
    key_values,
    largest_reaching,
    order_keys,
    top_k_cut,
)


@pytest.fixture
def taken(monkeypatch):
    """The predicates of the warps' `lax.cond`s (which path each search took), in order
    (eager calls only)."""
    predicates = []
    cond = jax.lax.cond

    def spy(pred, *branches_and_operands):
        predicates.append(pred)
        return cond(pred, *branches_and_operands)

    monkeypatch.setattr(eqx_specdec._warps.cutoffs.jax.lax, "cond", spy)
    return predicates


FLOATS = [np.float32] + ([np.float64] if jax.config.jax_enable_x64 else [])


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_order_keys_follow_the_float_order_and_invert(dtype):
    values = np.array(
        [-np.inf, -3.5, -1e-30, -0.0, 0.0, 1e-30, 2.0, 7e20, np.inf], dtype
    )
    keys = np.asarray(order_keys(jnp.asarray(values)))
    assert np.all(keys[1:] > keys[:-1])  # strictly increasing
    back = np.asarray(key_values(jnp.asarray(keys), values.dtype))
    np.testing.assert_array_equal(back.view(np.uint8), values.view(np.uint8))


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_count_equal_counts_what_comparisons_count(dtype, taken):
    """`count_equal`'s arithmetic count (no comparison in the pass) equals NumPy's count
    of equal entries, with ties, infinities, neighbouring floats and entries of every
    size; a batch holding a value below 2^-100 or an infinite one is counted by
    comparisons (the other branch), exactly too."""
    tiny = np.finfo(dtype).tiny
    row = np.array(
        [-np.inf, np.inf, 0.0, -0.0, tiny, 2 * tiny, 1e-30, 3.5, 3.5, -2.0, 7e20], dtype
    )
    normal = np.array([3.5, -2.0, 1.5, 7e20, 1e-30, 17.0], dtype)
    small = np.array([3.5, -2.0, 0.0, 7e20, 1e-30, 2.0**-110], dtype)  # 0: below 2^-100
    for values, arithmetic in ((normal, True), (small, False)):
        near = np.nextafter(values, np.inf)  # a neighbour of each value, in its row
        near[np.abs(near) < tiny] = 3 * tiny  # (XLA CPU reads subnormals as 0)
        x = np.concatenate([np.broadcast_to(row, (6, 11)), near[:, None]], axis=1)
        taken.clear()
        got = np.asarray(count_equal(jnp.asarray(x), jnp.asarray(values[:, None])))
        assert [bool(p) for p in taken] == [arithmetic]
        np.testing.assert_array_equal(got[:, 0], np.sum(x == values[:, None], -1))
    infinite = np.array([[-np.inf], [np.inf]] * 3, dtype)
    got = np.asarray(count_equal(jnp.asarray(x), jnp.asarray(infinite)))
    np.testing.assert_array_equal(got, np.sum(x == infinite, -1, keepdims=True))


def _brute_force(keys, weights, goal):
    """The largest key of the row whose keys at or above it weigh at least `goal`."""
    best = 0
    for key in np.unique(keys):
        mask = keys >= key
        total = mask.sum() if weights is None else weights[mask].sum(dtype=np.float64)
        if total >= goal:
            best = max(best, int(key))
    return best


@pytest.mark.parametrize("weighted", [False, True], ids=["count", "weight"])
def test_the_search_finds_the_sorted_answer(weighted):
    """Rows with ties (values on a coarse grid), masked entries and goals at and past
    the edges: the key found separates the same set as the brute-force answer (equal to
    it, or a key below it with no row key in between)."""
    rng = np.random.default_rng(0)
    rows, vocab = 64, 48
    values = np.round(rng.normal(size=(rows, vocab)) * 2) / 2  # many ties
    values[rng.random((rows, vocab)) < 0.2] = -np.inf
    values = values.astype(np.float32)
    keys = order_keys(jnp.asarray(values))
    if weighted:
        weights = np.exp(values - values.max(-1, keepdims=True))
        weights = (weights / weights.sum(-1, keepdims=True)).astype(np.float32)
        # Goals away from the total: where the cumulative mass meets the goal within
        # rounding, float32 and float64 sums may disagree (`Warp` keeps every token at
        # top_p = 1 outright).
        goal = rng.choice([0.05, 0.5, 0.9, 0.99], size=(rows, 1)).astype(np.float32)
    else:
        weights = None
        goal = rng.integers(1, vocab + 1, size=(rows, 1)).astype(np.int32)
    found = np.asarray(
        jax.jit(largest_reaching)(
            keys, None if weights is None else jnp.asarray(weights), jnp.asarray(goal)
        )
    )[:, 0]
    keys = np.asarray(keys)
    for row in range(rows):
        w = None if weights is None else weights[row]
        expected = _brute_force(keys[row], w, goal[row, 0])
        kept = keys[row] >= found[row]
        np.testing.assert_array_equal(kept, keys[row] >= expected, err_msg=str(row))


def _sorted_warp(logits, temperature, top_k, top_p):
    """The sort-based warp the library used before (and NumPy's sort semantics)."""
    z = logits / temperature
    out = np.empty_like(z)
    for row in range(z.shape[0]):
        r = z[row].astype(np.float64)
        if top_k[row] > 0:
            kth = np.sort(r)[::-1][min(top_k[row], r.size) - 1]
            r = np.where(r < kth, -np.inf, r)
        probs = np.exp(r - r.max())
        probs /= probs.sum()
        order = np.argsort(-probs, kind="stable")
        before = np.cumsum(probs[order]) - probs[order]
        keep = max(int(np.sum(before < top_p[row])), 1)
        r = np.where(probs < probs[order][keep - 1], -np.inf, r)
        out[row] = r
    return np.isfinite(out)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("static", [True, False], ids=["static T", "traced T"])
def test_top_k_and_top_p_keep_what_a_sort_keeps(static, dtype):
    """Per-row k (0, beyond V) and p (1 included), logits on a coarse grid (ties): the
    kept set equals the sort's, with a static temperature (no greedy rows, no argmax)
    and a traced one (greedy rows possible)."""
    rng = np.random.default_rng(1)
    batch, vocab = 40, 96
    logits = rng.normal(size=(batch, 1, vocab)) * 3
    logits[: batch // 2] = np.round(logits[: batch // 2] * 4) / 4  # ties
    logits = logits.astype(dtype)
    top_k = rng.choice([0, 1, 5, 17, vocab, vocab + 9], size=batch).astype(np.int32)
    top_p = rng.choice([0.3, 0.8, 0.95, 1.0], size=batch).astype(np.float32)
    temperature = 0.7 if static else jnp.full((batch,), 0.7, dtype)
    warp = eqx_specdec.Warp(temperature, jnp.asarray(top_k), jnp.asarray(top_p))
    got = jax.jit(lambda x: warp(x))(jnp.asarray(logits))
    kept = np.isfinite(np.asarray(got))[:, 0]
    expected = _sorted_warp(logits[:, 0], dtype(0.7), top_k, top_p)
    np.testing.assert_array_equal(kept, expected)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_a_static_top_k_takes_the_k_largest_blocks(dtype):
    """A Python-int top-k searches only the blocks of 16 holding the largest entries:
    the k-th largest equals a sort's on rows with heavy ties and masked entries, and the
    warp keeps what the search over whole rows keeps."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(6, 2, 1024))
    x[:3] = np.round(x[:3] * 2) / 2  # heavy ties, across blocks
    x[rng.random(x.shape) < 0.3] = -np.inf
    x = x.astype(dtype)
    for k in (1, 7, 16):
        cut = jax.jit(top_k_cut, static_argnums=2)(jnp.asarray(x), jnp.int32(k), k)
        kth = cut[0]
        got = np.asarray(kth)
        np.testing.assert_array_equal(got[..., 0], -np.sort(-x, axis=-1)[..., k - 1])
    static = eqx_specdec.Warp(0.7, top_k=7)
    traced = eqx_specdec.Warp(0.7, top_k=jnp.full((6,), 7, jnp.int32))
    np.testing.assert_array_equal(
        np.isfinite(np.asarray(static(jnp.asarray(x)))),
        np.isfinite(np.asarray(traced(jnp.asarray(x)))),
    )


@pytest.mark.parametrize(
    "vocab, by_top_k",
    [(2048, True), (8192, True), (8192, False)],
    ids=["32 blocks by TopK", "128 blocks by TopK", "128 blocks by a prefix sum"],
)
@pytest.mark.parametrize("flat_rows", [False, True], ids=["peaked", "some flat"])
def test_top_p_among_the_largest_blocks_and_its_fallback(
    flat_rows, vocab, by_top_k, taken, monkeypatch
):
    """Top-p searches the blocks holding each row's largest entries when those reach
    top_p in every row (peaked rows), and whole rows otherwise (a flat row in the
    batch): the kept set equals a sort's either way, and each case takes its path. The
    blocks are taken by XLA's TopK (on the CPU up to 64 blocks, on other backends
    always) or by the search over block maxima and a prefix sum (the CPU's for more),
    where rows whose block maxima tie at the least one taken take their own branch."""
    cutoffs = eqx_specdec._warps.cutoffs
    monkeypatch.setattr(cutoffs, "blocks_by_top_k", lambda k: by_top_k)
    rng = np.random.default_rng(3)
    batch = 12
    logits = rng.normal(size=(batch, 1, vocab)) * 8
    logits[:4] = np.round(logits[:4] * 2) / 2  # ties
    if flat_rows:
        logits[5] = rng.normal(size=(1, vocab)) * 0.01  # top-p 0.9 keeps ~1,800 tokens
    logits = logits.astype(np.float32)
    top_p = rng.choice([0.5, 0.9, 0.95], size=batch).astype(np.float32)
    warp = eqx_specdec.Warp(1.0, top_p=jnp.asarray(top_p))
    kept = np.isfinite(np.asarray(warp(jnp.asarray(logits))))
    expected = _sorted_warp(logits[:, 0], 1.0, np.zeros(batch, np.int32), top_p)
    np.testing.assert_array_equal(kept[:, 0], expected)
    taken = [bool(t) for t in taken]
    if not by_top_k:  # the rows with ties leave tied blocks out
        assert taken.pop(0)
    assert taken == [not flat_rows]  # the candidates' path or not


@pytest.mark.parametrize("large_k", [False, True], ids=["small k", "a large k"])
def test_a_per_row_top_k_among_the_largest_blocks_and_its_fallback(large_k, taken):
    """Per-row k: among the blocks holding each row's largest entries when every k is
    small, over whole rows when one is not; a sort's k-th largest either way."""
    rng = np.random.default_rng(4)
    batch, vocab = 10, 2048
    x = np.round(rng.normal(size=(batch, 1, vocab)) * 3) / 3  # ties
    x[rng.random(x.shape) < 0.2] = -np.inf
    x = x.astype(np.float32)
    k = rng.integers(1, 33, size=batch).astype(np.int32)
    if large_k:
        k[3] = 1500
    got, _ = top_k_cut(jnp.asarray(x), jnp.asarray(k)[:, None, None])
    expected = -np.sort(-x[:, 0], axis=-1)[np.arange(batch), k - 1]
    np.testing.assert_array_equal(np.asarray(got)[:, 0, 0], expected)
    assert [bool(t) for t in taken] == [not large_k]


# --- Warped rows evaluated inside the verifier's rows ------------------------------------

WARPED = {
    # A per-row temperature, one row greedy: the argmax path.
    "per-row temperature": lambda b: eqx_specdec.Warp(
        jnp.asarray([0.7, 0.0, 1.3, 0.5, 1.0, 0.9][:b], jnp.float32)
    ),
    "static top-k": lambda b: eqx_specdec.Warp(0.8, top_k=7),
    "per-row top-p": lambda b: eqx_specdec.Warp(
        0.9, top_p=jnp.asarray([0.5, 1.0, 0.8, 0.95, 0.3, 0.7][:b], jnp.float32)
    ),
    "min-p and a bias": lambda b: eqx_specdec.Warp(
        1.1,
        min_p=0.05,
        logit_bias=jnp.zeros((256,), jnp.float32).at[3].set(-jnp.inf).at[9].set(4.0),
    ),
}


@pytest.mark.parametrize("batching", ["map", "vmap"])
@pytest.mark.parametrize("name", list(WARPED))
def test_the_verifier_on_warped_rows_emits_what_it_does_on_their_log_probs(
    name, batching
):
    """The library's verifier takes `Warp.rows` unevaluated and evaluates each row inside
    its own iteration: the same tokens, bit for bit, as on the evaluated
    log-probabilities (which `Warp.__call__` returns), whichever way the rows are
    mapped."""
    batch, gamma, vocab = 6, 3, 256
    rng = np.random.default_rng(7)
    target = rng.standard_normal((batch, gamma + 1, vocab)).astype(np.float32) * 3
    draft = target[:, :gamma] + rng.standard_normal((batch, gamma, vocab)).astype(
        np.float32
    )
    tokens = rng.integers(0, vocab, (batch, gamma)).astype(np.int32)
    tokens[:, 0] = np.argmax(target[:, 0], -1)  # some rows accept
    u = rng.random((batch, gamma)).astype(np.float32)
    s = rng.random(batch).astype(np.float32)
    warp = WARPED[name](batch)
    verifiers = {"standard": eqx_specdec.Verifier(batching=batching)}
    if batching == "vmap":
        # Greedy reads the argmax alone, and is handed the warped logits as they are
        # before either mapping (tested once, under the mapping it takes by default).
        verifiers["greedy"] = eqx_specdec.Verifier(
            eqx_specdec.GreedyRatioTest(), batching=batching
        )

    @jax.jit
    def both(x, d, t, u, s):
        d_rows, t_rows = warp.rows(d), warp.rows(t)
        lazy, evaluated = {}, {}
        for kind, verifier in verifiers.items():
            lazy[kind] = verifier(x, d_rows, t_rows, u, s, log_space=True)
            evaluated[kind] = verifier(
                x, d_rows.log_probs(), t_rows.log_probs(), u, s, log_space=True
            )
        return lazy, evaluated, t_rows.log_probs(), warp(t)

    lazy, evaluated, rows_log_probs, called = both(tokens, draft, target, u, s)
    for kind in verifiers:
        for key in ("num_accepted", "tokens"):
            np.testing.assert_array_equal(lazy[kind][key], evaluated[kind][key])
        accepted = np.asarray(lazy[kind]["num_accepted"])
        assert accepted.max() > 0 and accepted.min() < gamma  # both outcomes happen
    np.testing.assert_array_equal(rows_log_probs, called)


@pytest.mark.parametrize(
    "warp",
    [eqx_specdec.Warp(0.7), eqx_specdec.Warp(jnp.full((16,), 0.7, jnp.float32))],
    ids=["temperature", "per-row temperature"],
)
def test_temperature_verification_writes_no_log_probabilities(warp):
    """Verifying from logits with a temperature, the compiled program's temporaries stay
    below a quarter of one `(B, G + 1, V)` array: the warped log-probabilities are never
    written out (the temporaries were 1.8 such arrays before: both sides' written)."""
    batch, gamma, vocab = 16, 4, 32_000
    dtype = jnp.float32
    args = (
        jax.ShapeDtypeStruct((batch, gamma), jnp.int32),
        jax.ShapeDtypeStruct((batch, gamma, vocab), dtype),
        jax.ShapeDtypeStruct((batch, gamma + 1, vocab), dtype),
        jax.ShapeDtypeStruct((batch, gamma), dtype),
        jax.ShapeDtypeStruct((batch,), dtype),
    )

    def step(x, d, t, u, s):
        return accept_logits(
            x, d, t, u, s, target_warp=warp, draft_warp=warp, check_inputs="off"
        )

    compiled = jax.jit(step).lower(*args).compile()
    temporaries = compiled.memory_analysis().temp_size_in_bytes
    assert temporaries < batch * (gamma + 1) * vocab * 4 / 4


@pytest.mark.parametrize(
    "top_k",
    [20, [3, 20, 7, 1], [3, 0, 20, 1]],
    ids=["static", "per-row", "per-row with a 0"],
)
def test_top_k_normalises_over_its_candidate_blocks(top_k):
    """Top-k's normaliser is summed over the candidate blocks when every row's k is
    within them (static, and per-row from 1 to C) and over whole rows when a row keeps
    everything (k = 0): the log-probabilities are a float64 sort-based reference's, tied
    and masked entries included, either way."""
    rng = np.random.default_rng(11)
    batch, vocab, temperature = 4, 2048, 0.7
    x = np.round(rng.normal(size=(batch, 2, vocab)) * 6) / 2  # ties
    x[rng.random(x.shape) < 0.1] = -np.inf
    x = x.astype(np.float32)
    k = top_k if isinstance(top_k, int) else jnp.asarray(top_k, jnp.int32)
    got = np.asarray(eqx_specdec.Warp(temperature, top_k=k)(jnp.asarray(x)))
    ks = np.broadcast_to(np.asarray(top_k), (batch,))
    z = x.astype(np.float64) / temperature
    expected = np.empty_like(z)
    for b, r in np.ndindex(batch, 2):
        row = z[b, r]
        if ks[b] > 0:
            row = np.where(row < np.sort(row)[::-1][ks[b] - 1], -np.inf, row)
        expected[b, r] = row - row.max() - np.log(np.sum(np.exp(row - row.max())))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(expected))
    finite = np.isfinite(expected)
    np.testing.assert_allclose(got[finite], expected[finite], rtol=0, atol=2e-5)


def test_warped_rows_are_normalised_only_up_to_the_first_rejection():
    """A user's test declared `causal` (reading the draft tokens' values), with the
    first-failure counter: the verifier mapping rows one by one normalises the warped
    rows position by position and stops each sequence at its first rejection, so that
    the test of a sequence that accepted n tokens only ever sees its target's rows 0 to
    n (row n: the rejected position's, or the bonus row) and its draft's rows up to
    min(n, G - 1); every other row stays all `-inf`. The same test not declared causal
    runs once per sequence, on every row. The outputs are those of the standard test on
    the evaluated log-probabilities. (Rows of 1,024 entries: shorter ones are
    normalised whole.)"""
    calls = {True: [], False: []}

    class CausalRatioTest(eqx_specdec.AbstractRatioTest):
        exact: ClassVar[bool] = True
        causal: ClassVar[bool] = True
        reads: ClassVar[str] = "draft tokens"

        def __call__(self, draft_tokens, draft_probs, target_probs, u, context):
            # Which rows the call sees examined (any entry finite), by sequence (u[0]).
            seen = (
                jnp.isfinite(target_probs).any(-1),
                jnp.isfinite(draft_probs).any(-1),
            )
            jax.debug.callback(
                lambda *a: calls[self.causal].append(tuple(map(np.asarray, a))),
                u[0],
                *seen,
            )
            log_p, log_q = context.gather(draft_tokens, draft_probs, target_probs)
            return eqx_specdec.Verdict(jnp.log(u) < log_p - log_q)

    class UndeclaredRatioTest(CausalRatioTest):
        causal: ClassVar[bool] = False

    batch, gamma, vocab = 8, 4, 1_024
    warp = eqx_specdec.Warp(0.9, top_k=40, min_p=0.01)
    rng = np.random.default_rng(12)
    target = rng.standard_normal((batch, gamma + 1, vocab)).astype(np.float32) * 2
    draft = target[:, :gamma] + 0.5 * rng.standard_normal((batch, gamma, vocab)).astype(
        np.float32
    )
    gumbel = -np.log(-np.log(rng.random(draft.shape)))
    warped = np.asarray(warp(jnp.asarray(draft)))
    tokens = np.argmax(warped + gumbel, axis=-1).astype(np.int32)  # drawn from q
    u = rng.random((batch, gamma)).astype(np.float32)
    s = rng.random(batch).astype(np.float32)
    tests = (CausalRatioTest(), UndeclaredRatioTest(), eqx_specdec.RatioTest())

    @jax.jit
    def verified(x, d, t, u, s):
        d_rows, t_rows = warp.rows(d), warp.rows(t)
        lazy = [
            eqx_specdec.Verifier(test, batching="map")(
                x, d_rows, t_rows, u, s, log_space=True
            )
            for test in tests[:2]
        ]
        log_probs = (d_rows.log_probs(), t_rows.log_probs())
        standard = eqx_specdec.Verifier(tests[2], batching="map")
        return lazy, standard(x, *log_probs, u, s, log_space=True)

    lazy, evaluated = verified(tokens, draft, target, u, s)
    jax.effects_barrier()
    for outputs in lazy:
        for key in ("num_accepted", "tokens"):
            np.testing.assert_array_equal(outputs[key], evaluated[key])
    n = np.asarray(evaluated["num_accepted"])
    assert n.min() < gamma - 1 and n.max() == gamma  # early and late stops
    for b in range(batch):
        target_rows = np.arange(gamma + 1) <= n[b]
        draft_rows = np.arange(gamma) <= min(n[b], gamma - 1)
        seen = [(t, d) for key, t, d in calls[True] if key == u[b, 0]]
        assert seen  # and never a row past the first rejection:
        assert all(not np.any(t & ~target_rows) for t, _ in seen)
        assert all(not np.any(d & ~draft_rows) for _, d in seen)
        # The last call, on the whole sequence, sees every row up to it.
        np.testing.assert_array_equal(seen[-1][0], target_rows)
        np.testing.assert_array_equal(seen[-1][1], draft_rows)
        (undeclared,) = [(t, d) for key, t, d in calls[False] if key == u[b, 0]]
        assert undeclared[0].all() and undeclared[1].all()


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision_logits_kept_as_they_are_equal_the_upcast_copy(
    dtype, monkeypatch
):
    """Half-precision logits are upcast once into a float32 copy on the CPU, and kept
    as they are elsewhere, upcast inside each pass (`upcast_once`): both give the same
    tokens, and log-probabilities within a rounding, with every warp, greedy rows
    included, under both batchings (the early exit's loop at 4,096 entries, and
    `vmap`)."""
    batch, gamma, vocab = 4, 3, 4_096
    rng = np.random.default_rng(21)
    logits = rng.standard_normal((batch, gamma + 1, vocab)) * 3
    noisy = logits[:, :gamma] + rng.standard_normal((batch, gamma, vocab))
    target, draft = jnp.asarray(logits, dtype), jnp.asarray(noisy, dtype)
    x = jnp.asarray(np.argmax(noisy, -1), jnp.int32)
    u = jnp.asarray(rng.random((batch, gamma)), jnp.float32)
    s = jnp.asarray(rng.random(batch), jnp.float32)
    warp = eqx_specdec.Warp(
        jnp.array([0.0, 0.7, 1.0, 1.3]), top_k=50, top_p=0.9, min_p=0.02
    )

    def outputs(upcast_once):
        monkeypatch.setattr(warp_module, "upcast_once", lambda: upcast_once)
        # The choice is the one the warp makes: the rows it hands on.
        assert warp.rows(target).x.dtype == (jnp.float32 if upcast_once else dtype)
        # Traced again under this choice: another check level is another program (the
        # same outputs on valid inputs), without evicting the worker's other programs.
        level = "read" if upcast_once else "off"
        return [
            accept_logits(
                x, draft, target, u, s, target_warp=warp, draft_warp=warp,
                verifier=eqx_specdec.Verifier(batching=batching),
                logprobs=eqx_specdec.LogProbs(), check_inputs=level,
            )
            for batching in ("map", "vmap")
        ]  # fmt: skip

    kept, upcast = outputs(False), outputs(True)
    for a, b in zip(kept, upcast):
        for key in ("num_accepted", "tokens"):
            np.testing.assert_array_equal(a[key], b[key])
        # XLA may round `x / T` differently in differently fused programs.
        np.testing.assert_allclose(a["logprobs"], b["logprobs"], rtol=1e-6)
    assert len(set(np.asarray(upcast[0]["num_accepted"]).tolist())) > 1


# A hang is the program's, whatever the dtype (per-row warps on 64-bit rows: the
# verifier's warped-rows test above).
@pytest.mark.dtype_free
def test_per_row_warps_under_vmap_return_at_the_shape_that_hung():
    """Every warp with one value per row (temperatures with a greedy 0, top-k with a 0,
    top-p, min-p), verified under `vmap` (the mapping on accelerators) at (16, 5,
    32000), where per-row top-p was reported to hang on a TPU v5e: the program returns,
    emitting the tokens, bit for bit, of the rows mapped one by one (the CPU's
    mapping, with its early exit at this vocabulary)."""
    batch, gamma, vocab = 16, 5, 32_000
    keys = jax.random.split(jax.random.key(5), 5)
    target = 2 * jax.random.normal(keys[0], (batch, gamma + 1, vocab))
    draft = target[:, :gamma] + 0.7 * jax.random.normal(keys[1], (batch, gamma, vocab))
    tokens = jax.random.categorical(keys[2], draft).astype(jnp.int32)
    uniforms = eqx_specdec.Uniforms(
        jax.random.uniform(keys[3], (batch, gamma)),
        jax.random.uniform(keys[4], (batch,)),
    )
    row = jnp.arange(batch)
    warp = eqx_specdec.Warp(
        temperature=jnp.where(row % 4 == 0, 0.0, 0.5 + row / batch),
        top_k=jnp.where(row % 3 == 0, 0, 5 + 10 * row).astype(jnp.int32),
        top_p=0.5 + row / (2 * batch),
        min_p=jnp.where(row % 2 == 0, 0.0, 0.02),
    )

    @jax.jit
    def verified(target, draft, tokens, uniforms):
        out = {}
        for batching in ("vmap", "map"):
            out[batching] = eqx_specdec.verify(
                eqx_specdec.Logits(target, warp),
                eqx_specdec.Draft(tokens, eqx_specdec.Logits(draft, warp)),
                uniforms,
                verifier=eqx_specdec.Verifier(batching=batching),
                check_inputs="off",
            ).tokens
        return out

    out = verified(target, draft, tokens, uniforms)
    np.testing.assert_array_equal(out["vmap"], out["map"])
    assert np.all(np.asarray(out["vmap"])[:, 0] >= 0)
