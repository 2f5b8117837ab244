"""The sampling transform of a model's logits (logit bias, temperature, top-k, top-p,
min-p), and the warped rows it returns unevaluated; the cut-offs are found by the exact
searches of `cutoffs.py`."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, Integer

from .._misc import check_hyperparameter, compute_dtype
from .._platform import upcast_once
from .cutoffs import log_normaliser, row_max, top_k_cut, top_p_cutoff


def _per_row(value, logits):
    """A scalar or per-row `(B,)` parameter, shaped to broadcast against `(B, R, V)`."""
    value = jnp.asarray(value)
    return value.reshape(value.shape + (1,) * (logits.ndim - value.ndim))


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
        needs the counts: [`eqx_specdec.verify`][] on [`eqx_specdec.Logits`][] builds them from
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
        written out: an `WarpedRows`, which [`eqx_specdec.Verifier`][]
        evaluates row by row.

        **Arguments:**

        - `logits`: float of shape `(B, R, V)`; `-inf` masks a token.
        - `counts`: integer of shape `(B, R, V)`, each token's count in each
            position's history, for the penalties (required by a warp with one).

        **Returns:**

        An `WarpedRows`, whose `log_probs()` are `__call__`'s.
        """
        x = logits
        if self.logit_bias is not None or self.needs_history() or upcast_once():
            x = logits.astype(compute_dtype(logits.dtype))
        if self.logit_bias is not None:
            x = x + self._bias(x)
        if self.needs_history():
            if counts is None:
                raise ValueError(
                    "This Warp has a history-dependent penalty, so it needs each "
                    "position's token counts: pass the rows' `history` to "
                    "eqx_specdec.verify on Logits (or `counts` to the warp)."
                )
            x = self._penalise(x, counts)
        rows = x.shape[:-1] + (1,)
        params = {
            name: None
            if getattr(self, name) is None
            else jnp.broadcast_to(_per_row(getattr(self, name), x), rows)
            for name in ("temperature", "top_k", "top_p", "min_p")
        }
        # A temperature given as a Python number is static: when normal in the logits'
        # dtype, no row is greedy, and the argmax of the greedy rows is never computed.
        greedy_rows = not (
            isinstance(self.temperature, int | float)
            and self.temperature >= float(jnp.finfo(compute_dtype(x.dtype)).tiny)
        )
        # A top-k given as a Python int is static: the k-th largest is found among the
        # k blocks of 16 holding the largest entries, not by passes over whole rows.
        static_k = self.top_k if isinstance(self.top_k, int) else None
        return WarpedRows(x, **params, greedy_rows=greedy_rows, static_k=static_k)

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


class WarpedRows(eqx.Module):
    """Warped log-probabilities not yet computed: the logits `x` `(..., V)` (after the
    logit bias and the penalties) and, per row `(..., 1)`, the warp's temperature,
    top-k, top-p and min-p. [`eqx_specdec.Warp`][]`.rows` returns one; `log_probs()`
    evaluates it.

    [`eqx_specdec.Verifier`][] accepts it in place of log-probabilities. Mapping its
    rows one by one (`jax.lax.map`, its default on the CPU), it warps each row inside
    the row's own iteration: the row's maxima, cut-offs and normalisers are found
    there, position by position up to the first rejection where the ratio test allows
    it (see `causal` in [`eqx_specdec.AbstractRatioTest`][]), and XLA computes only the
    log-probabilities the row's stages read (the draft tokens' entries and row $n$).
    Under `jax.vmap` the cut-offs and normalisers are found for the whole batch first
    (where the searches' branches stay branches) and each row's log-probabilities are
    evaluated in its iteration. Either way the log-probabilities of the whole batch are
    never written.
    [`eqx_specdec.verify`][] on
    [`eqx_specdec.Logits`][] do this for the library's verifier; any other verifier
    gets the evaluated arrays.

    **Fields:** `x`, float `(..., V)` (half-precision logits stay so off the CPU,
    upcast inside each pass); `temperature`, float `(..., 1)`; `top_k`,
    integer, `top_p` and `min_p`, float, each `(..., 1)` or `None` (not applied);
    `greedy_rows` and `static_k`, static: whether a row may be greedy (a temperature
    not known to be positive), and top-k's `k` when a Python int."""

    x: Float[Array, "*rows V"]
    temperature: Float[Array, "*rows 1"]
    top_k: Int[Array, "*rows 1"] | None
    top_p: Float[Array, "*rows 1"] | None
    min_p: Float[Array, "*rows 1"] | None
    greedy_rows: bool = eqx.field(static=True)
    static_k: int | None = eqx.field(static=True)

    def normalised(self, searches=None) -> "NormalisedRows":
        """The rows' cut-offs and normalisers found (every row's at once): the same
        log-probabilities, as an `NormalisedRows`. `searches`: another form of top-k's
        and top-p's searches, as `eqx_specdec._kernels.warp_cutoffs.by_kernel` is
        (the backend's to pass), giving the same cut-offs and normalisers up to the
        order of the sums."""
        params = {
            name: getattr(self, name)
            for name in ("temperature", "top_k", "top_p", "min_p")
            if getattr(self, name) is not None
        }
        return _warp_rows(self.x, params, self.greedy_rows, self.static_k, searches)

    def log_probs(self) -> Float[Array, "*rows V"]:
        """The log-probabilities, `-inf` for the tokens the warp removed."""
        return self.normalised().log_probs()


class NormalisedRows(eqx.Module):
    """Warped log-probabilities whose cut-offs and normalisers are found but not yet
    applied: the logits `x` `(..., V)` and, per row `(..., 1)`,

    $$\\log p(v) = x(v) / T - s - c \\text{ where } x(v) \\ge t, \\quad -\\infty
    \\text{ elsewhere},$$

    with the threshold $t$ below which the warp removed a token (the largest of the
    top-k, top-p and min-p cut-offs), the scale $T$, the shift $s$ and the log of the
    normaliser $c$; a greedy row is one-hot at `best`. `log_probs()` evaluates it, one
    elementwise pass. `WarpedRows``.normalised` returns one.

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
        ids = jax.lax.broadcasted_iota(jnp.int32, self.x.shape, self.x.ndim - 1)
        return evaluated_at(self.x, ids, self.parameters())

    def parameters(self) -> tuple:
        """The per-row fields `log_probs` applies, `(threshold, scale, shift, log_sum,
        greedy, best)`, each `(..., 1)` or `None`."""
        return (
            self.threshold,
            self.scale,
            self.shift,
            self.log_sum,
            self.greedy,
            self.best,
        )

    def window(self, row, start, x: Float[Array, " length"]) -> Float[Array, " length"]:
        """`log_probs()[row, start : start + length]` of one sequence's rows (no batch
        axis), from that window `x` of its logits (`x[row, start : start + length]`,
        read by the caller), computed as `log_probs` computes it, without evaluating
        the rows."""
        ids = start + jnp.arange(x.shape[0], dtype=jnp.int32)
        parameters = tuple(None if a is None else a[row] for a in self.parameters())
        return evaluated_at(x, ids, parameters)

    def at_tokens(
        self, tokens: Integer[Array, "batch gamma"]
    ) -> Float[Array, "batch gamma"]:
        """The log-probabilities of `(B, R, V)` rows at each sequence's tokens, row $i$'s
        at `tokens[b, i]` for the first $G \\le R$ rows, each computed as `log_probs`
        computes it, without evaluating the rows; NaN at a token id out of range. One
        gather of the logits (`at_draft_tokens`); the rows' parameters are sliced (on a
        TPU v5e each gather of $BG$ points cost 15 to 30 us at (256, 8, 32000), as many
        for a `(B, R, 1)` parameter as for the logits)."""
        gamma = tokens.shape[1]
        parameters = tuple(
            None if a is None else a[:, :gamma, 0] for a in self.parameters()
        )
        return evaluated_at(at_draft_tokens(self.x, tokens), tokens, parameters)


def at_draft_tokens(
    x: Float[Array, "batch rows V"], tokens: Integer[Array, "batch gamma"]
) -> Float[Array, "batch gamma"]:
    """`x[b, i, tokens[b, i]]` for the first $G$ rows of each sequence, in one gather;
    NaN at a token id out of range (as `take_along_axis` reads it)."""
    batch, gamma = tokens.shape
    index = (
        jnp.arange(batch, dtype=jnp.int32)[:, None],
        jnp.arange(gamma, dtype=jnp.int32)[None],
        tokens.astype(jnp.int32),
    )
    return x.at[index].get(mode="fill", fill_value=jnp.nan)


def evaluated_at(x, ids, parameters):
    """`NormalisedRows.log_probs` at the entries `x` of token ids `ids`, with the rows'
    `parameters` (`NormalisedRows.parameters`) broadcast against them: the one formula
    every evaluation of normalised rows uses (whole rows, windows, points, and the
    rows-n kernel's blocks)."""
    threshold, scale, shift, log_sum, greedy, best = parameters
    x = x.astype(compute_dtype(x.dtype))
    log_probs = (x / scale - shift) - log_sum
    if threshold is not None:
        log_probs = jnp.where(x < threshold, -jnp.inf, log_probs)
    if greedy is None:
        return log_probs
    # A greedy row is one-hot at its first most likely token.
    one_hot = jnp.where(ids == best, 0.0, -jnp.inf).astype(x.dtype)
    return jnp.where(greedy, one_hot, log_probs)


def as_log_probs(rows):
    """`rows` as an array: a [`WarpedRows`][eqx_specdec._warps.warp.WarpedRows] or
    [`NormalisedRows`][eqx_specdec._warps.warp.NormalisedRows] evaluated, anything else as it
    is."""
    if isinstance(rows, WarpedRows | NormalisedRows):
        return rows.log_probs()
    return rows


def as_logits(rows):
    """`rows` as an array a reader of each row's argmax alone may take: a
    [`WarpedRows`][eqx_specdec._warps.warp.WarpedRows] or
    [`NormalisedRows`][eqx_specdec._warps.warp.NormalisedRows] as its logits, anything
    else as it is. Every warp maps a row's logits to its log-probabilities by a
    strictly increasing map on the entries it keeps and removes only entries below
    the row's maximum (a greedy row is one-hot at its first maximum), so each row's
    first most likely entry is the same in both, and a row holding a NaN, or
    without a finite entry, has none in either."""
    if isinstance(rows, WarpedRows | NormalisedRows):
        return rows.x
    return rows


def as_normalised(rows, searches=None):
    """`rows` with every row's cut-offs and normalisers found: a
    [`WarpedRows`][eqx_specdec._warps.warp.WarpedRows] normalised (top-k's and top-p's
    by `searches` where given), anything else as it is."""
    return rows.normalised(searches) if isinstance(rows, WarpedRows) else rows


def _warp_rows(
    x, params, greedy_rows: bool, static_k: int | None = None, searches=None
) -> NormalisedRows:
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
    removed where `x` is below any of the thresholds, that is below their largest.

    `searches`: where the warp searches for a cut-off (top-k, top-p), a function
    finding every cut-off and normaliser of the rows `(R, V)` from the per-row columns
    `(R, 1)` of the scale, top-k, top-p and min-p (`None` where not applied), as
    `(threshold, shift, log_sum, largest)`, or `None` where it does not apply to the
    rows (`eqx_specdec._kernels.warp_cutoffs.by_kernel`, which the backend passes)."""
    logits = x  # as stored: half-precision logits stay so (see `upcast_once`)
    x = x.astype(compute_dtype(x.dtype))
    temperature = params["temperature"].astype(x.dtype)
    # Zero, or too small to divide by in this dtype (a subnormal, flushed to zero by
    # the hardware): greedy, on every path.
    greedy = temperature < jnp.finfo(x.dtype).tiny
    scale = jnp.where(greedy, 1, temperature)
    vocab = x.shape[-1]
    rows = x.shape[:-1] + (1,)

    def per_row(a):
        return None if a is None else jnp.broadcast_to(a, rows)

    def best_of(largest):
        # The first most likely token (XLA's argmax reads the row once and writes
        # nothing); none (`vocab`) where the row's maximum is not its own entry (NaN).
        best = jnp.argmax(x, axis=-1, keepdims=True).astype(jnp.int32)
        at_best = jnp.take_along_axis(x, best, axis=-1)
        return jnp.where(at_best == largest, best, vocab)

    found = None
    if searches is not None and ("top_k" in params or "top_p" in params):
        top_k = params.get("top_k")
        if top_k is not None:
            top_k = jnp.clip(top_k.astype(jnp.int32), 0, vocab)
        columns = (scale, top_k, params.get("top_p"), params.get("min_p"))
        found = searches(
            x.reshape(-1, vocab),
            *(None if a is None else per_row(a).reshape(-1, 1) for a in columns),
        )
    if found is not None:
        threshold, shift, log_sum, largest = (a.reshape(rows) for a in found)
        return NormalisedRows(
            logits,
            threshold,
            per_row(scale),
            shift,
            log_sum,
            per_row(greedy) if greedy_rows else None,
            best_of(largest) if greedy_rows else None,
        )
    largest = row_max(x)  # every warp keeps the most likely token
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
        kth, normaliser = top_k_cut(x, k, static_k or None, (scale, highest))
        threshold = removing(jnp.where(k > 0, kth, -jnp.inf))
    if "top_p" in params:
        top_p = params["top_p"].astype(x.dtype)
        if normaliser is None:
            normaliser = log_normaliser(x / scale, highest, removed())
        shift, log_sum = normaliser
        cutoff, mass = top_p_cutoff(kept(), scale, shift, log_sum, top_p)
        # top_p = 1 keeps every token, whatever the rounding of the row's total mass.
        threshold = removing(jnp.where(top_p < 1, cutoff, -jnp.inf))
        # Renormalised by the mass kept: no second pass of exponentials.
        mass = jnp.where(top_p < 1, mass, 1)
        # A row without mass (every logit -inf) keeps its -inf normaliser, which the
        # default checks read as such.
        normaliser = (
            shift,
            jnp.where(log_sum == -jnp.inf, log_sum, log_sum + jnp.log(mass)),
        )
    if "min_p" in params:
        min_p = params["min_p"].astype(x.dtype)
        # p(v) < min_p max p  <=>  x(v) / T < log(min_p) + max x / T
        #                      <=>  x(v) < max x + T log(min_p): a bound on the logits.
        threshold = removing(largest + scale * jnp.log(min_p))
        normaliser = None  # min-p removed more: normalise again
    if normaliser is None:
        normaliser = log_normaliser(x / scale, highest, removed())
    shift, log_sum = normaliser
    return NormalisedRows(
        logits,
        per_row(threshold),
        per_row(scale),
        per_row(shift),
        per_row(log_sum),
        per_row(greedy) if greedy_rows else None,
        best_of(largest) if greedy_rows else None,
    )
