"""The sampling transform of a model's logits (logit bias, temperature, top-k, top-p,
min-p), with the top-k and top-p cut-offs found by an exact search over the row's values
instead of a sort."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from .._misc import check_hyperparameter, compute_dtype


def _per_row(value, logits):
    """A scalar or per-row `(B,)` parameter, shaped to broadcast against `(B, R, V)`."""
    value = jnp.asarray(value)
    return value.reshape(value.shape + (1,) * (logits.ndim - value.ndim))


_LANES = 16


def _row_reduce(arrays, inits, combine):
    """A variadic reduction over the last axis of arrays of one shape, in one pass,
    keeping the axis: as `(V / 16, 16)` blocks reduced over the blocks first, so that
    XLA CPU keeps 16 accumulators in a vector register (a reduction over the minor axis
    runs one scalar chain)."""
    vocab = arrays[0].shape[-1]
    inits = tuple(jnp.asarray(i, a.dtype) for i, a in zip(inits, arrays))
    if vocab % _LANES == 0:
        shape = arrays[0].shape[:-1] + (vocab // _LANES, _LANES)
        arrays = tuple(a.reshape(shape) for a in arrays)
        arrays = jax.lax.reduce(arrays, inits, combine, (len(shape) - 2,))
    out = jax.lax.reduce(arrays, inits, combine, (arrays[0].ndim - 1,))
    return tuple(o[..., None] for o in out)


def _min_max(x, y):
    return jnp.minimum(x[0], y[0]), jnp.maximum(x[1], y[1])


def order_keys(x: Float[Array, "*rows V"]) -> Array:
    """Unsigned integer keys in the order of the floats `x` (the sign bit flipped for
    positive values, every bit for negative ones): searching over keys bit by bit finds
    a value of `x` exactly."""
    bits = np.dtype(x.dtype).itemsize * 8
    unsigned = jnp.uint32 if bits == 32 else jnp.uint64
    raw = jax.lax.bitcast_convert_type(x, unsigned)
    top = jnp.asarray(1 << (bits - 1), unsigned)
    return jnp.where(raw >= top, ~raw, raw | top)


def key_values(keys: Array, dtype) -> Array:
    """The floats of `order_keys`' keys."""
    bits = np.dtype(dtype).itemsize * 8
    top = jnp.asarray(1 << (bits - 1), keys.dtype)
    raw = jnp.where(keys >= top, keys ^ top, ~keys)
    return jax.lax.bitcast_convert_type(raw, dtype)


def largest_reaching(keys, weights, goal):
    """Per row, the largest key $t$ of the row such that the total weight of the keys
    $\\ge t$ reaches `goal` (the count of keys, for `weights=None`).

    A bisection over the integer range `[start, end)` that holds the answer, both ends
    snapped to the row's own keys after every pass: one pass over the row finds the
    weight at or above the midpoint, the smallest key at or above it and the largest
    key below it (one fused reduction). The range closes on the answer in at most as
    many passes as the keys have bits, and in about $\\log_2$ of the number of distinct
    keys when they are spread; equal keys (ties) cost nothing more. Exact: the keys
    are integers.

    **Arguments:**

    - `keys`: unsigned integers `(*rows, V)`, from `order_keys`.
    - `weights`: float `(*rows, V)` (non-negative), or `None` to count keys.
    - `goal`: `(*rows, 1)`, the weight (or count) to reach.

    **Returns:**

    `(*rows, 1)` keys of the rows. A row whose total weight does not reach `goal`
    returns its smallest key (every key is kept).
    """
    lowest = jnp.zeros((), keys.dtype)
    highest = jnp.asarray(np.iinfo(keys.dtype).max, keys.dtype)

    def combine(x, y):
        return x[0] + y[0], jnp.minimum(x[1], y[1]), jnp.maximum(x[2], y[2])

    def reductions(middle):
        above = keys >= middle
        if weights is None:
            weight = above.astype(jnp.int32)
        else:
            weight = jnp.where(above, weights, 0)
        return _row_reduce(
            (weight, jnp.where(above, keys, highest), jnp.where(above, lowest, keys)),
            (0, highest, lowest),
            combine,
        )

    def unfinished(state):
        start, end = state
        return jnp.any(end - start > 1)

    def step(state):
        start, end = state
        live = end - start > 1
        middle = start + (end - start) // 2
        total, first_above, last_below = reductions(middle)
        reached = total >= goal
        # The answer is a key: at or above `middle` if reached, below it otherwise.
        start = jnp.where(live & reached, first_above, start)
        end = jnp.where(live & ~reached, last_below + 1, end)
        return start, end

    start, end = _row_reduce((keys, keys), (highest, lowest), _min_max)
    end = end + 1
    return jax.lax.while_loop(unfinished, step, (start, end))[0]


class Warp(eqx.Module):
    """The sampling transform a model's logits go through, as serving stacks apply it:
    a logit bias, then temperature, top-k, top-p (nucleus) and min-p. Returns
    log-probabilities.

    Each parameter is a scalar or a per-row array of shape `(B,)` (the logit bias: `(V,)`
    or per row `(B, V)`), so one batch can mix rows of different settings. A row with
    temperature 0 is greedy: its distribution is one-hot at the most likely token (ties:
    the lowest id), and speculative sampling with it reduces exactly to greedy
    verification.

    The top-k and top-p cut-offs are found without sorting, and are the sort's, ties
    included: among the blocks of 16 entries holding each row's largest values (for
    top-k, when every row's `k` is within the row's 256 largest entries or is a Python
    int; for top-p, when the row's largest entries, up to 1,024, reach it), otherwise
    by an exact bisection over the row's values, one pass over the row per step (about
    $\\log_2$ of the number of distinct values). See the Performance page. Every cut-off
    is a threshold on the logits themselves (top-p's and min-p's are the logits whose
    probability is at the bound), so the tokens kept are exactly those a sort of the row
    keeps, however XLA fuses and rounds the scaled values.

    For speculative sampling to be lossless, the target's warp must be the distribution
    the user wants to sample from, and the draft's warp must be exactly the law the draft
    tokens were sampled from (a draft sampled at temperature 0.7 with top-p 0.9 needs
    `Warp(0.7, top_p=0.9)`). Using raw draft probabilities while the draft sampled from a
    warped distribution is a known bug class.

    **Arguments:**

    - `temperature`: $T \\ge 0$; logits are divided by $T$. Default 1. 0 is greedy
        decoding; a temperature too small to divide by in the logits' dtype (below
        its smallest normal number) is greedy too, and a concrete one below float32's
        ($1.18 \\times 10^{-38}$) is refused.
    - `top_k`: keep the $k$ largest logits of each distribution ($k \\ge 1$; 0 keeps
        all); ties with the $k$-th largest are kept. `None` (the default) skips it.
    - `top_p`: keep the smallest set of most likely tokens whose probability reaches
        $p \\in (0, 1]$ (at least one token); ties with the last kept value are kept.
        `None` (the default) skips it.
    - `min_p`: keep the tokens whose probability is at least `min_p` times the most
        likely token's, after the warps before it ($\\in [0, 1]$; 0 keeps all).
        `None` (the default) skips it.
    - `logit_bias`: added to the logits before anything else (OpenAI's `logit_bias`):
        float of shape `(V,)` or `(B, V)`, in target vocabulary ids; $-\\infty$ bans a
        token. `None` (the default) adds nothing.
    - `repetition_penalty`, `presence_penalty`, `frequency_penalty`: history-dependent
        penalties, applied after the bias and before the temperature, with $c(v)$ the
        count of token $v$ in the position's history (vLLM's and Hugging Face's
        conventions): a token seen before ($c(v) > 0$) has its logit divided by the
        repetition penalty $r > 0$ when positive, multiplied by it otherwise; then
        $x(v) \\leftarrow x(v) - f\\, c(v) - a\\, [c(v) > 0]$ for the frequency $f$ and
        presence $a$ penalties. `None` (the default) skips each. A warp with a penalty
        needs the counts: [`eqx_specdec.speculative_accept_logits`][] builds them from
        its `history`, and at draft position $i$ counts the draft tokens before $i$ too.
    """

    temperature: Float[Array, "*B"] | float = 1.0
    top_k: Int[Array, "*B"] | int | None = None
    top_p: Float[Array, "*B"] | float | None = None
    min_p: Float[Array, "*B"] | float | None = None
    logit_bias: Float[Array, "*B V"] | None = None
    repetition_penalty: Float[Array, "*B"] | float | None = None
    presence_penalty: Float[Array, "*B"] | float | None = None
    frequency_penalty: Float[Array, "*B"] | float | None = None

    def __check_init__(self):
        if self.repetition_penalty is not None:
            check_hyperparameter(
                "repetition_penalty",
                self.repetition_penalty,
                0.0,
                float("inf"),
                low_open=True,
            )
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) is not None:
                check_hyperparameter(
                    name, getattr(self, name), -1e30, 1e30, low_open=False
                )
        check_hyperparameter(
            "temperature", self.temperature, 0.0, float("inf"), low_open=False
        )
        if not isinstance(self.temperature, jax.core.Tracer):
            t = np.asarray(self.temperature, np.float64)
            tiny = float(np.finfo(np.float32).tiny)
            if np.any((t > 0) & (t < tiny)):
                raise ValueError(
                    f"`temperature` must be 0 (greedy decoding) or at least {tiny:.3g} "
                    f"(the smallest normal float32), got {self.temperature}: a "
                    "subnormal temperature divides the logits into infinities. Pass 0 "
                    "for greedy decoding."
                )
        if self.top_p is not None:
            check_hyperparameter("top_p", self.top_p, 0.0, 1.0, low_open=True)
        if self.top_k is not None:
            check_hyperparameter("top_k", self.top_k, 0.0, float("inf"), low_open=False)
        if self.min_p is not None:
            check_hyperparameter("min_p", self.min_p, 0.0, 1.0, low_open=False)
        if self.logit_bias is not None and jnp.ndim(self.logit_bias) not in (1, 2):
            raise ValueError(
                "`logit_bias` must have shape (V,) or (B, V); got shape "
                f"{jnp.shape(self.logit_bias)}."
            )

    def needs_history(self) -> bool:
        """Whether the warp has a history-dependent penalty (and so needs counts)."""
        return any(
            getattr(self, name) is not None
            for name in ("repetition_penalty", "presence_penalty", "frequency_penalty")
        )

    def __call__(
        self,
        logits: Float[Array, "B rows V"],
        counts: Int[Array, "B rows V"] | None = None,
    ) -> Float[Array, "B rows V"]:
        """Warps a batch of logits.

        **Arguments:**

        - `logits`: float of shape `(B, R, V)`; `-inf` masks a token.
        - `counts`: integer of shape `(B, R, V)`, each token's count in each
            position's history, for the penalties (required by a warp with one).

        **Returns:**

        The warped log-probabilities, float32 (float64 for float64 logits), of shape
        `(B, R, V)`; `-inf` for tokens the warp removes.
        """
        return self.rows(logits, counts).log_probs()

    def rows(
        self,
        logits: Float[Array, "B rows V"],
        counts: Int[Array, "B rows V"] | None = None,
    ) -> "WarpedRows":
        """Warps a batch of logits, as `__call__` does, into log-probabilities not yet
        written out: an [`eqx_specdec.WarpedRows`][], which [`eqx_specdec.Verifier`][]
        evaluates row by row.

        **Arguments:**

        - `logits`: float of shape `(B, R, V)`; `-inf` masks a token.
        - `counts`: integer of shape `(B, R, V)`, each token's count in each
            position's history, for the penalties (required by a warp with one).

        **Returns:**

        An [`eqx_specdec.WarpedRows`][], whose `log_probs()` are `__call__`'s.
        """
        x = logits.astype(compute_dtype(logits.dtype))
        if self.logit_bias is not None:
            x = x + self._bias(x)
        if self.needs_history():
            if counts is None:
                raise ValueError(
                    "This Warp has a history-dependent penalty, so it needs each "
                    "position's token counts: pass the rows' `history` to "
                    "speculative_accept_logits (or `counts` to the warp)."
                )
            x = self._penalise(x, counts)
        params = {
            name: _per_row(getattr(self, name), x)
            for name in ("temperature", "top_k", "top_p", "min_p")
            if getattr(self, name) is not None
        }
        # A temperature given as a Python number is static: when normal in the logits'
        # dtype, no row is greedy, and the argmax of the greedy rows is never computed.
        greedy_rows = not (
            isinstance(self.temperature, int | float)
            and self.temperature >= float(jnp.finfo(x.dtype).tiny)
        )
        # A top-k given as a Python int is static: the k-th largest is found among the
        # k blocks of 16 holding the largest entries, not by passes over whole rows.
        static_k = self.top_k if isinstance(self.top_k, int) else None
        return _warp_rows(x, params, greedy_rows, static_k)

    def _penalise(self, x, counts):
        """The repetition, frequency and presence penalties, in that order."""
        seen = counts > 0
        if self.repetition_penalty is not None:
            r = _per_row(self.repetition_penalty, x).astype(x.dtype)
            x = jnp.where(seen, jnp.where(x > 0, x / r, x * r), x)
        if self.frequency_penalty is not None:
            f = _per_row(self.frequency_penalty, x).astype(x.dtype)
            x = x - f * counts.astype(x.dtype)
        if self.presence_penalty is not None:
            a = _per_row(self.presence_penalty, x).astype(x.dtype)
            x = x - a * seen.astype(x.dtype)
        return x

    def _bias(self, x):
        """The logit bias, shaped to broadcast against `(B, R, V)`."""
        bias = jnp.asarray(self.logit_bias).astype(x.dtype)
        batch, _, vocab = x.shape
        if bias.shape[-1] != vocab or (bias.ndim == 2 and bias.shape[0] != batch):
            raise ValueError(
                f"`logit_bias` must have shape (V,) = ({vocab},) or (B, V) = ({batch}, "
                f"{vocab}), in the target's vocabulary; got {tuple(bias.shape)}."
            )
        return bias[None, None] if bias.ndim == 1 else bias[:, None]


def _row_max(x):
    return _row_reduce((x,), (-jnp.inf,), lambda a, b: (jnp.maximum(a[0], b[0]),))[0]


def _log_normaliser(x, highest, removed=None):
    """The shift and the log of the sum of exponentials of rows `x` `(..., V)` (both
    `(..., 1)`), given the rows' maxima (found in vector registers; the sum is XLA's
    own, which fuses it with them): `logsumexp(x) = shift + log_sum`. Where `removed`
    (boolean, like `x`) holds, the entry counts as `-inf`: its term is exactly 0."""
    shift = jnp.where(jnp.isfinite(highest), highest, 0)
    terms = jnp.exp(x - shift)
    if removed is not None:
        terms = jnp.where(removed, 0, terms)
    total = jnp.sum(terms, axis=-1, keepdims=True)
    log_sum = jnp.log(total)
    return shift, log_sum


def _top_blocks(x, k: int):
    """The blocks of 16 entries of each row of `x` `(..., V)` that hold its `k` largest
    values, for a Python int `k`: `(candidates (rows, 16 k), m (rows, 1), left_out
    (rows, 1))`, with $m$ and `left_out` as below (every entry of the row above $m$ is
    a candidate), or `None` when the rows are too short for blocks to help.

    The `k`-th largest block maximum $m$ (found by `largest_reaching` over the block
    maxima) is at most the row's `k`-th largest value, and every entry above $m$ lies in
    one of the fewer than `k` blocks whose maximum exceeds $m$. Those blocks, topped up
    with blocks whose maximum equals $m$ to `k` blocks, hold the row's `k` largest
    values, ties included, and every entry above $m$; entries equal to $m$ lie in
    blocks not taken only where more blocks than those have the maximum $m$ (the
    third result, per row). One pass over the rows; the searches run over the block
    maxima.
    """
    vocab = x.shape[-1]
    if vocab % _LANES or k < 1 or k * _LANES * 4 > vocab:
        return None
    blocks = x.reshape((-1, vocab // _LANES, _LANES))
    block_max = jnp.max(blocks, axis=-1)
    m = key_values(largest_reaching(order_keys(block_max), None, k), x.dtype)
    index = jnp.arange(k, dtype=jnp.int32)

    def chosen(row_max, row_m):
        above = row_max > row_m
        count = jnp.sum(above, dtype=jnp.int32)
        first = jnp.nonzero(above, size=k, fill_value=0)[0]
        at_m = row_max == row_m
        tied = jnp.nonzero(at_m, size=k, fill_value=0)[0]
        # Blocks whose maximum equals m beyond the k taken: their entries equal to m
        # are not candidates.
        left_out = jnp.sum(at_m, dtype=jnp.int32) > k - count
        picks = jnp.where(index < count, first, tied[jnp.maximum(index - count, 0)])
        return picks, left_out

    picks, left_out = jax.vmap(chosen)(block_max, m[:, 0])
    candidates = jnp.take_along_axis(blocks, picks[..., None], axis=1)
    return candidates.reshape(candidates.shape[0], k * _LANES), m, left_out[:, None]


# A per-row top-k looks among the blocks holding each row's 256 largest entries (at most
# a 64th of the row) when every row's k is that small.
_TOP_K_CANDIDATES = 256


def kth_largest(x, k, bound: int | None = None):
    """The `k`-th largest value of each row of `x` `(..., V)` (`(..., 1)`; exact, ties
    included), for `k` `(..., 1)` in `[1, V]`: among the blocks holding each row's `C`
    largest entries (`_top_blocks`) when every `k` is at most `C`, else by the search
    over whole rows.

    `bound`: a Python int known to bound every `k` (a static top-k), used as `C`; by
    default `C` = min(256, V / 64), and a branch on the `k`s picks the search.
    """
    return _top_k(x, k, bound)[0]


def top_k_cut(x, k, scale, highest, bound: int | None = None):
    """Top-k's cut-off and the normaliser of what it keeps: `(kth, (shift, log_sum))`,
    each `(..., 1)`, for `k` `(..., 1)` in `[0, V]` (0 keeps every token), with
    `shift` and `log_sum` as `_log_normaliser` gives them for `x / scale` over the
    entries at or above `kth` (every entry where `k` is 0).

    Where every row's `k` is between 1 and `C` (as `kth_largest`), every kept entry
    above the `C`-th largest block maximum lies among the candidate blocks, and any
    other kept entry equals the cut-off: the sum of exponentials runs over those `16 C`
    entries, not over the row, with the cut-off's ties outside them counted (a pass of
    comparisons over the rows, taken only in a batch where some cut-off equals its
    block maximum). Otherwise the sum runs over whole rows.
    """
    return _top_k(x, k, bound, (scale, highest))


def _top_k(x, k, bound, normalise=None):
    shape = x.shape[:-1] + (1,)
    count = bound or min(_TOP_K_CANDIDATES, x.shape[-1] // (4 * _LANES))
    found = _top_blocks(x, count)

    def whole_rows_kth():
        goal = jnp.maximum(k, 1)
        return key_values(largest_reaching(order_keys(x), None, goal), x.dtype)

    def whole_rows_normaliser(kth):
        scale, highest = normalise
        return _log_normaliser(x / scale, highest, (x < kth) & (k > 0))

    if found is None:
        kth = whole_rows_kth()
        return kth, None if normalise is None else whole_rows_normaliser(kth)
    candidates, _, left_out = found
    goal = jnp.broadcast_to(jnp.maximum(k, 1), shape).reshape(-1, 1)

    def inside_kth():
        kth = largest_reaching(order_keys(candidates), None, goal)
        return key_values(kth, x.dtype).reshape(shape)

    def inside_normaliser(kth):
        # The candidates hold every kept entry above m; a kept entry outside them
        # equals the cut-off, which then equals m, in a block with the maximum m that
        # was not taken: counted by one pass over the rows, in the rare batches where
        # a row left such blocks out (exact ties between block maxima).
        divisor, highest = (
            jnp.broadcast_to(a, shape).reshape(-1, 1) for a in normalise
        )
        kth = kth.reshape(-1, 1)
        shift = jnp.where(jnp.isfinite(highest), highest, 0)
        terms = jnp.where(candidates < kth, 0, jnp.exp(candidates / divisor - shift))
        total = jnp.sum(terms, axis=-1, keepdims=True)

        def with_ties_outside():
            rows = x.reshape(-1, x.shape[-1])
            outside = jnp.sum(rows == kth, axis=-1, keepdims=True, dtype=jnp.int32)
            outside = outside - jnp.sum(
                candidates == kth, axis=-1, keepdims=True, dtype=jnp.int32
            )
            tie = jnp.exp(kth / divisor - shift)
            return total + jnp.where(outside > 0, outside.astype(total.dtype) * tie, 0)

        total = jax.lax.cond(jnp.any(left_out), with_ties_outside, lambda: total)
        return shift.reshape(shape), jnp.log(total).reshape(shape)

    if bound is not None:  # a static k, at least 1
        kth = inside_kth()
        return kth, None if normalise is None else inside_normaliser(kth)
    kth = jax.lax.cond(jnp.all(k <= count), inside_kth, whole_rows_kth)
    if normalise is None:
        return kth, None
    # Every kept entry is a candidate when every row keeps at most C (and at least 1).
    within = jnp.all((k >= 1) & (k <= count))
    normaliser = jax.lax.cond(within, inside_normaliser, whole_rows_normaliser, kth)
    return kth, normaliser


# Top-p first looks among the blocks holding the largest entries of each row: up to
# 1,024 of them, a 64th of the row.
_TOP_P_CANDIDATES = 1024


def top_p_cutoff(x, scale, highest, log_sum, top_p):
    """The smallest logit of `x` that top-p keeps, and the mass it keeps (both
    `(..., 1)`; exact, ties included): the largest logit whose mass at or above it
    reaches `top_p`, each entry's mass being `exp((x / scale - highest) - log_sum)`
    (`highest`, `log_sum`: `_log_normaliser`'s of `x / scale`). The search runs over
    the logits: `x / scale` enters only the masses (see `_warp_rows`).

    The blocks holding each row's `C` largest entries (`C` = min(1024, V / 64)) hold
    every entry above their least block maximum $m$. When those entries reach `top_p` in
    every row (the common case: serving distributions keep tens to hundreds of tokens),
    the cut-off is above $m$, where the candidates' masses are the row's, and the search
    runs over the candidates; otherwise over whole rows."""
    shape = x.shape[:-1] + (1,)

    def kept(keys, weights, cutoff):
        (mass,) = _row_reduce((jnp.where(keys >= cutoff, weights, 0),), (0,), _add)
        return mass

    def whole_rows():
        keys, weights = order_keys(x), jnp.exp((x / scale - highest) - log_sum)
        cutoff = largest_reaching(keys, weights, top_p)
        return cutoff, kept(keys, weights, cutoff)

    count = min(_TOP_P_CANDIDATES, x.shape[-1] // (4 * _LANES))
    found = _top_blocks(x, count)
    if found is None:
        cutoff, mass = whole_rows()
    else:
        candidates, m, _ = found
        goal = jnp.broadcast_to(top_p, shape).reshape(-1, 1)
        divisor, shift, norm = (
            jnp.broadcast_to(a, shape).reshape(-1, 1) for a in (scale, highest, log_sum)
        )
        keys = order_keys(candidates)
        weights = jnp.exp((candidates / divisor - shift) - norm)
        # Every entry of the row above m is a candidate: where their mass reaches
        # top_p, the cut-off is above m, and the candidates' masses there are the row's.
        (above,) = _row_reduce((jnp.where(candidates > m, weights, 0),), (0,), _add)
        inside = largest_reaching(keys, weights, goal)
        inside = (inside.reshape(shape), kept(keys, weights, inside).reshape(shape))
        cutoff, mass = jax.lax.cond(jnp.all(above >= goal), lambda: inside, whole_rows)
    return key_values(cutoff, x.dtype), mass


def _add(x, y):
    return (x[0] + y[0],)


class WarpedRows(eqx.Module):
    """Warped log-probabilities not yet written out: the logits `x` `(..., V)` and,
    per row `(..., 1)`, what turns them into log-probabilities,

    $$\\log p(v) = x(v) / T - s - c \\text{ where } x(v) \\ge t, \\quad -\\infty
    \\text{ elsewhere},$$

    with the threshold $t$ below which the warp removed a token (the largest of the
    top-k, top-p and min-p cut-offs), the scale $T$, the shift $s$ and the log of the
    normaliser $c$; a greedy row is one-hot at `best`. `log_probs()` evaluates it.
    [`eqx_specdec.Warp`][]`.rows` returns one.

    [`eqx_specdec.Verifier`][] accepts it in place of log-probabilities: it maps its
    rows over the batch (`jax.lax.map` on the CPU) and evaluates each row's
    log-probabilities inside the row's iteration, where XLA computes only the entries
    the row's stages read (the draft tokens' entries and row $n$). The log-probabilities
    of the whole batch are never written, and the passes over the logits are the warp's
    own (the maxima and the sums of exponentials).
    [`eqx_specdec.speculative_accept_logits`][] and [`eqx_specdec.verify`][] on
    [`eqx_specdec.Logits`][] do this for the library's verifier; any other verifier
    gets the evaluated arrays.

    **Fields:** `x`, float `(..., V)`; `threshold` (or `None`: nothing removed),
    `scale`, `shift`, `log_sum`, float `(..., 1)`; `greedy` (or `None`: no row is
    greedy), boolean `(..., 1)`; `best`, integer `(..., 1)` (`V` for a row holding a
    NaN)."""

    x: Float[Array, "*rows V"]
    threshold: Float[Array, "*rows 1"] | None
    scale: Float[Array, "*rows 1"]
    shift: Float[Array, "*rows 1"]
    log_sum: Float[Array, "*rows 1"]
    greedy: Bool[Array, "*rows 1"] | None
    best: Int[Array, "*rows 1"] | None

    def log_probs(self) -> Float[Array, "*rows V"]:
        """The log-probabilities, `-inf` for the tokens the warp removed."""
        x = self.x
        log_probs = (x / self.scale - self.shift) - self.log_sum
        if self.threshold is not None:
            log_probs = jnp.where(x < self.threshold, -jnp.inf, log_probs)
        if self.greedy is None:
            return log_probs
        # A greedy row is one-hot at its first most likely token.
        ids = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
        one_hot = jnp.where(ids == self.best, 0.0, -jnp.inf).astype(x.dtype)
        return jnp.where(self.greedy, one_hot, log_probs)


def as_log_probs(rows):
    """`rows` as an array: a [`WarpedRows`][eqx_specdec._verify.warp.WarpedRows]
    evaluated, anything else as it is."""
    return rows.log_probs() if isinstance(rows, WarpedRows) else rows


def _warp_rows(x, params, greedy_rows: bool, static_k: int | None = None) -> WarpedRows:
    """Temperature, top-k, top-p and min-p on rows `(..., V)` of biased logits, with the
    parameters shaped `(..., 1)` (see `Warp`). Without `greedy_rows` (a temperature
    known to be positive), no row is greedy and no argmax is taken.

    Every decision to keep or remove a token compares `x` itself with a threshold
    found from `x` (the k-th largest logit, the top-p cut-off as a logit, the min-p
    bound as a logit): XLA may compute an elementwise expression such as `x / T` in
    several fusions with different instructions, and a comparison between two copies
    that round differently could remove the very token a threshold was found at.
    `x / T` only enters the log-probabilities' values. The maxima and searches read
    `x`, never a scaled copy, which is then never written out (dividing by a positive
    number is monotone: the largest entries of `x / T` are those of `x`). A token is
    removed where `x` is below any of the thresholds, that is below their largest."""
    temperature = params["temperature"].astype(x.dtype)
    # Zero, or too small to divide by in this dtype (a subnormal, flushed to zero by
    # the hardware): greedy, on every path.
    greedy = temperature < jnp.finfo(x.dtype).tiny
    scale = jnp.where(greedy, 1, temperature)
    vocab = x.shape[-1]
    largest = _row_max(x)  # every warp keeps the most likely token
    highest = largest / scale
    threshold = None  # x below it is removed

    def removing(below):
        return below if threshold is None else jnp.maximum(threshold, below)

    def kept():
        return x if threshold is None else jnp.where(x < threshold, -jnp.inf, x)

    def removed():
        return None if threshold is None else x < threshold

    normaliser = None  # of what is kept so far, where known
    if "top_k" in params:
        k = jnp.clip(params["top_k"].astype(jnp.int32), 0, vocab)
        kth, normaliser = top_k_cut(x, k, scale, highest, static_k or None)
        threshold = removing(jnp.where(k > 0, kth, -jnp.inf))
    if "top_p" in params:
        top_p = params["top_p"].astype(x.dtype)
        if normaliser is None:
            normaliser = _log_normaliser(x / scale, highest, removed())
        shift, log_sum = normaliser
        cutoff, mass = top_p_cutoff(kept(), scale, shift, log_sum, top_p)
        # top_p = 1 keeps every token, whatever the rounding of the row's total mass.
        threshold = removing(jnp.where(top_p < 1, cutoff, -jnp.inf))
        # Renormalised by the mass kept: no second pass of exponentials.
        mass = jnp.where(top_p < 1, mass, 1)
        normaliser = (shift, log_sum + jnp.log(mass))
    if "min_p" in params:
        min_p = params["min_p"].astype(x.dtype)
        # p(v) < min_p max p  <=>  x(v) / T < log(min_p) + max x / T
        #                      <=>  x(v) < max x + T log(min_p): a bound on the logits.
        threshold = removing(largest + scale * jnp.log(min_p))
        normaliser = None  # min-p removed more: normalise again
    if normaliser is None:
        normaliser = _log_normaliser(x / scale, highest, removed())
    shift, log_sum = normaliser
    best = None
    if greedy_rows:
        # The first most likely token (XLA's argmax reads the row once and writes
        # nothing); none (`vocab`) where the row's maximum is not its own entry (NaN).
        best = jnp.argmax(x, axis=-1, keepdims=True).astype(jnp.int32)
        at_best = jnp.take_along_axis(x, best, axis=-1)
        best = jnp.where(at_best == largest, best, vocab)
    rows = x.shape[:-1] + (1,)

    def per_row(a):
        return None if a is None else jnp.broadcast_to(a, rows)

    return WarpedRows(
        x,
        per_row(threshold),
        per_row(scale),
        per_row(shift),
        per_row(log_sum),
        per_row(greedy) if greedy_rows else None,
        per_row(best),
    )
