"""A chain of draft tokens: drafted one draft call at a time, scored by one target call,
verified by a chain verifier, with its theory of acceptance."""

from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int, Key

from .._capabilities import has_capability
from .._chain.abstract_verifier import AbstractVerifier
from .._inputs.checks import invalid_distributions
from .._inputs.logprobs import emitted_logprobs
from .._misc import no_type_check
from .._models.cached import AbstractPackedModel, call_packed, call_rows, is_cached
from .._search import draw as draw_token, inverse_cdf
from .._stages.row_fields import per_row_values, with_row_values
from .abstract_proposal import (
    AbstractProposal,
    as_probs,
    checked_output,
    default_proposal,
    Models,
    StepOutcome,
    Theory,
    uniforms,
)
from .draft_length import AbstractDraftLength, FixedDraftLength


ChainDrafting = Literal["sample", "argmax", "propose"]


@no_type_check  # its fields are checked by `__check_init__`
class Chain(AbstractProposal):
    """A chain of $G$ draft tokens per step, verified by an [`eqx_specdec.Verifier`][]
    (or [`eqx_specdec.ShardedVerifier`][]): the default proposal of
    [`eqx_specdec.speculative_decode`][] for chain verifiers.

    Each step the draft model proposes the tokens one draft call at a time, the target
    scores all of them at once (the $G + 1$ distributions $p_i$), and the verifier
    decides how many survive.

    **Arguments:**

    - `length`: $G$, the draft tokens per step, a Python int $\\ge 1$. Default 4.
    - `drafting`: `"sample"` (the default): $x_i \\sim q_i$, and the verifier sees $q$;
        `"argmax"`: $x_i = \\arg\\max_v q_i(v)$, passed to the verifier as one-hot
        drafts (`draft_probs=None`). Greedy speculative decoding is `"argmax"` with the
        greedy verifier. `"propose"`: the draft proposes each row's whole chain in one
        call, with a method `propose(tokens: int[T], length: int[], count: int) ->
        (int[count], int[])` returning the tokens and how many of them the row drafts
        (such as [`eqx_specdec.models.PromptLookupDraft`][]): no draft distribution is formed
        (a deterministic draft, verified with the one-hot rule, `draft_probs=None`),
        no draft loop runs, and each row's length is the draft's own (with the default
        `draft_length`). Made for drafts with no model, whose per-token calls and
        $V$-wide rows would cost more than the proposal itself.
    - `draft_length`: the [`eqx_specdec.AbstractDraftLength`][] policy that decides
        each row's draft length $L \\in [1, G]$ every step: all $G$
        ([`eqx_specdec.FixedDraftLength`][], the default) or a stopping rule
        ([`eqx_specdec.StopWhenUnlikely`][]). The buffers keep $G$ slots; a row
        verifies a chain of its own length $L$ (the verifier runs once per possible
        length, and each row takes its own), and `DecodeResult.drafted` counts the
        $L$s.
    - `trim`: `True` to call the target on one position only in the steps where no
        row drafted a token (a draft-length policy that allows $L = 0$, such as
        `StopWhenUnlikely(keep_crossing=False)`), and on $G + 1$ otherwise: two
        compiled target calls, chosen at run time. It pays where drafts are often
        empty (a [`eqx_specdec.models.PromptLookupDraft`][] that finds no match): such a step
        then costs what a plain decoding step does. Needs a `draft_length` policy that
        stops without reading the target. It pays where a call on $G + 1$ tokens costs
        clearly more than one on a single token (a CPU: 1.7x for SmolLM2), not on a
        TPU, where the two cost alike and XLA relayouts the caches and weights between
        the two call sites on every step (0.3 ms a step for SmolLM2,
        `benchmarks/results-tpu.md`). Default `False` (always $G + 1$).
    """

    length: int = eqx.field(static=True, default=4)
    drafting: ChainDrafting = eqx.field(static=True, default="sample")
    draft_length: AbstractDraftLength = FixedDraftLength()
    trim: bool = eqx.field(static=True, default=False)

    def __check_init__(self):
        length = self.length
        if not isinstance(length, int) or isinstance(length, bool) or length < 1:
            raise ValueError(
                f"Chain(`length`=...) must be a Python int >= 1, got {length!r}."
            )
        if self.drafting not in ("sample", "argmax", "propose"):
            raise ValueError(
                'Chain(`drafting`=...) must be "sample" (draft tokens x ~ q), '
                '"argmax" (one-hot drafts) or "propose" (a draft that proposes the '
                f"whole chain in one call), got {self.drafting!r}."
            )
        if not isinstance(self.draft_length, AbstractDraftLength):
            raise TypeError(
                "Chain(`draft_length`=...) must be an eqx_specdec.AbstractDraftLength "
                "(FixedDraftLength, StopWhenUnlikely or your own), got "
                f"{type(self.draft_length).__name__}."
            )
        if not isinstance(self.trim, bool):
            raise TypeError(
                f"Chain(`trim`=...) must be a Python bool, got {self.trim!r}."
            )
        if self.drafting == "propose" and not self.draft_length.always_full:
            raise ValueError(
                'Chain(drafting="propose") takes each row\'s draft length from the '
                "draft's own proposal, so `draft_length` must be left at its default "
                f"(FixedDraftLength()); got {type(self.draft_length).__name__}."
            )
        if self.trim and not self.stops_early():
            raise ValueError(
                "Chain(`trim`=True) needs a `draft_length` policy that stops drafting "
                "without reading the target (such as StopWhenUnlikely()), so that the "
                f"draft lengths are known before the target is called; got "
                f"{type(self.draft_length).__name__}."
            )

    def stops_early(self) -> bool:
        """Whether rows stop drafting at their own length, decided from the draft alone
        (before the target is called)."""
        if self.drafting == "propose":  # the draft says each row's length
            return True
        policy = self.draft_length
        return not policy.always_full and not policy.needs_target()

    def slots(self) -> int:
        return self.length + 1

    def depth(self) -> int:
        return self.length

    def check(self, verifier) -> None:
        if getattr(verifier, "draft_shape", None) != "chain":
            raise TypeError(
                "The proposal is a Chain, so `verifier` must verify chains (an "
                "eqx_specdec.Verifier or ShardedVerifier); got "
                f"{type(verifier).__name__}. A tree verifier drafts the tree it holds: "
                "build it with `tree=` and leave `proposal` out."
            )

    def theory(self, verifier) -> Theory:
        test = verifier.ratio_test
        if not has_capability(test, "pass_probabilities"):
            return "none"
        return test.theory

    def check_models(self, draft_model, target_model) -> None:
        """A chain runs stateless and cached models alike (either or both); with
        `drafting="propose"` the draft is stateless and has a `propose` method."""
        if self.drafting == "propose" and (
            not callable(getattr(draft_model, "propose", None))
            or is_cached(draft_model)
        ):
            raise TypeError(
                'Chain(drafting="propose") needs a `draft_model` that proposes a whole '
                "chain in one call, with a method `propose(tokens, length, count) -> "
                "(tokens[count], drafted)` and no cache (such as "
                f"eqx_specdec.models.PromptLookupDraft); got {type(draft_model).__name__}. "
                'Draft it with drafting="sample" or "argmax" instead.'
            )

    def step(
        self,
        models,
        verifier,
        buffer,
        lengths,
        keys,
        generated,
        states=(None, None),
        active=None,
    ) -> StepOutcome:
        policy = self.draft_length
        stops_early = self.stops_early()
        if active is None:
            active = jnp.ones(lengths.shape, bool)  # a step outside the loop
        draft_state, target_state = states
        xs, qs, drafted, buffer, draft_state = draft_chain(
            models,
            buffer,
            lengths,
            keys[:, 0],
            self.length,
            self.drafting,
            policy if stops_early else None,
            draft_state,
            active,
        )
        theory = self.theory(verifier)  # the declared test's, before it is swapped
        test = verifier.ratio_test.in_decoding_loop(generated)
        if test is not verifier.ratio_test:
            verifier = _with_ratio_test(verifier, test)
        key_sampler = verifier.residual_sampler.randomness == "key"
        accept, sample = uniforms(keys, self.length, key_sampler)
        batch, slots = xs.shape[0], self.length + 1
        if qs is None:  # a proposing draft forms no rows: the target's V
            vocab = jax.eval_shape(
                lambda: call_rows(models.target, buffer, lengths - 1, 1, target_state)
            )[0].shape[-1]
        else:
            vocab = qs.shape[-1]

        def verified(p, scored_tokens):
            """The verifier on the target's $G + 1$ rows, from a call on
            `scored_tokens` tokens."""
            if qs is None:  # proposed tokens: one-hot drafts
                law = jax.nn.one_hot(xs, vocab, dtype=p.dtype)
            else:
                law = draft_law(xs, qs, self.drafting)
            given = qs if self.drafting == "sample" else None
            arrays = (xs, given, p, accept, sample)
            drafted_ = drafted
            if policy.always_full and self.drafting != "propose":
                out = verifier(*arrays)
            else:
                if not stops_early:
                    drafted_ = jax.vmap(policy)(xs, law, p).astype(jnp.int32)
                drafted_ = jnp.clip(drafted_, 0, self.length)
                out = verifier.at_lengths(jnp.maximum(drafted_, 1), *arrays)
                out = _plain_step_where_none(
                    verifier, drafted_, active, p[:, 0], sample, out
                )
            positions = jnp.arange(self.length, dtype=jnp.int32)
            drafted_rows = positions[None] < drafted_[:, None]
            invalid = (
                jnp.zeros((batch,), bool)
                if qs is None
                else invalid_distributions(qs, drafted_rows),
                invalid_distributions(p),
            )
            logprobs = emitted_logprobs(out["tokens"], p) if models.logprobs else None
            if theory == "none":
                reached = jnp.full((batch, slots), jnp.nan, jnp.float32)
            else:

                def passes_of(values, law, p):
                    return with_row_values(test, values).pass_probabilities(law, p)

                passes = jax.vmap(passes_of)(
                    per_row_values(test), law, p[:, : self.length]
                )
                # Positions past a row's draft length are never drafted: they never
                # pass.
                passes = jnp.where(drafted_rows[..., None], passes, 0)
                reached = jax.vmap(reached_probabilities)(passes, law, xs)
            return StepOutcome(
                out["num_accepted"],
                out["tokens"],
                reached.astype(jnp.float32),
                drafted_,
                scored_tokens,
                invalid=invalid,
                logprobs=logprobs,
            )

        def plain(p):
            """No running row drafted: a plain decoding step for every row from the
            target's one row (what the verifier emits for a row that drafted nothing:
            its first row's token, drawn with the row's sampling randomness)."""
            token = _plain_tokens(verifier, p[:, 0], sample)
            tokens = jnp.full((batch, slots), -1, jnp.int32).at[:, 0].set(token)
            logprobs = None
            if models.logprobs:  # the one row stands for every slot (-inf after 0)
                rows = jnp.broadcast_to(p, (batch, slots, vocab))
                logprobs = emitted_logprobs(tokens, rows)
            if theory == "none":
                reached = jnp.full((batch, slots), jnp.nan, jnp.float32)
            else:  # P(n >= 0) = 1; no draft token to accept
                reached = jnp.zeros((batch, slots), jnp.float32).at[:, 0].set(1)
            return StepOutcome(
                jnp.zeros((batch,), jnp.int32),
                tokens,
                reached,
                jnp.zeros((batch,), jnp.int32),
                jnp.asarray(batch, jnp.int32),
                invalid=(jnp.zeros((batch,), bool), invalid_distributions(p)),
                logprobs=logprobs,
            )

        def scored(width, packed=None):
            def call(carry):
                return score_chain(
                    models, buffer, lengths, width, vocab, carry[1], packed
                )

            return call

        if not self.trim:
            p, target_state = scored(slots)((None, target_state))
            outcome = verified(p, jnp.asarray(batch * slots, jnp.int32))
        else:
            # Batch-wide branches (the loop's step is not vmapped): a step where no
            # running row drafted calls the target on one position and costs what a
            # plain decoding step does. The target's calls run as loops of at most one
            # trip, which update its cache in place (a `lax.cond` copies its operands
            # and results, the cache included: 2.5 ms a step for SmolLM2 at B = 1).
            wide = jnp.any(drafted > 0)

            def run_if(pred, width, target_state, packed=None):
                call = scored(width, packed)
                shape = jax.eval_shape(call, (None, target_state))[0]
                init = (jnp.zeros(shape.shape, shape.dtype), target_state)
                return _run_if(pred, call, init)

            one, target_state = run_if(~wide, 1, target_state)
            sizes = packed_sizes(models.target, batch, self.length)
            taken = jnp.asarray(batch * slots, jnp.int32)  # the wide call's tokens
            if not sizes:
                every, target_state = run_if(wide, slots, target_state)
            else:
                # A packed target is called on the tokens the rows drafted (and each
                # row's last committed one), in the smallest of a few call sizes that
                # holds them, rather than on G + 1 slots a row.
                counts = jnp.clip(drafted, 0, self.length).astype(jnp.int32) + 1
                total = jnp.sum(counts)
                every, smaller = None, 0
                for size in sizes:
                    here = wide & (total > smaller) & (total <= size)
                    found, target_state = run_if(
                        here, slots, target_state, (counts, size)
                    )
                    every = found if every is None else jnp.where(here, found, every)
                    taken = jnp.where(here, jnp.int32(size), taken)
                    smaller = size
            outcome = jax.lax.cond(
                wide, lambda: verified(every, taken), lambda: plain(one)
            )
        return outcome._replace(states=(draft_state, target_state))


def _run_if(pred, fn, init):
    """`fn(init)` where the scalar `pred` holds, `init` otherwise: a loop of at most one
    trip, whose carry XLA updates in place."""

    def body(carry):
        return jnp.zeros((), bool), fn(carry[1])

    return jax.lax.while_loop(lambda carry: carry[0], body, (pred, init))[1]


def _plain_step_where_none(verifier, drafted, active, first_rows, sample, out):
    """The rows that drafted no token take a plain decoding step: their token is drawn
    from the target's first row $p_0$ with the row's sampling randomness (its argmax
    for a rule whose sampler draws `"argmax"`), what any exact rule emits with nothing
    to accept."""

    def replaced(out):
        none = drafted == 0
        tokens = out["tokens"]
        token = _plain_tokens(verifier, first_rows, sample).astype(tokens.dtype)
        plain = jnp.full_like(tokens, -1).at[:, 0].set(token)
        return {
            "num_accepted": jnp.where(none, 0, out["num_accepted"]),
            "tokens": jnp.where(none[:, None], plain, tokens),
        }

    # A batch-wide branch (the loop's step is not vmapped): steps where every running
    # row drafted skip the draw over the vocabulary (finished rows draft nothing, and
    # their outcome is discarded).
    empty = jnp.any((drafted == 0) & active)
    return jax.lax.cond(empty, replaced, lambda out: out, out)


def _plain_tokens(verifier, first_rows, sample) -> Int[Array, " B"]:
    """Each row's plain decoding token from `first_rows` $p_0$ `(B, V)`, drawn as the
    verifier's sampler draws: the argmax, by its key, or by inverse CDF."""
    sampler = verifier.residual_sampler
    if sampler.draws == "argmax":
        token = jnp.argmax(first_rows, axis=-1)
    elif sampler.randomness == "key":
        token = jax.vmap(lambda k, p: jax.random.categorical(k, jnp.log(p)))(
            sample, first_rows
        )
    else:
        token = jax.vmap(inverse_cdf)(first_rows, sample.astype(first_rows.dtype))
    return token.astype(jnp.int32)


def _with_ratio_test(verifier, test):
    """`verifier` running `test`, the ratio test its `in_decoding_loop` returned."""
    try:
        return eqx.tree_at(lambda v: v.ratio_test, verifier, test)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"{type(verifier).__name__} does not hold its ratio test as a field, so "
            f"the decoding loop cannot run the step's test that {type(test).__name__}."
            "in_decoding_loop returns. Use an eqx_specdec.Verifier."
        ) from error


def draft_law(xs, qs, drafting: ChainDrafting):
    """The law the draft tokens were drawn from: `qs`, or one-hot rows for argmax
    drafting."""
    if drafting == "argmax":
        return jax.nn.one_hot(xs, qs.shape[-1], dtype=qs.dtype)
    return qs


#: The committed positions the draft's first call of a step writes when the draft is a
#: cached model: the last two, so that a draft token accepted last step (never fed to
#: the draft, which stopped after drafting it) is written before anything reads it.
CATCH_UP = 2


def draft_chain(
    models: Models,
    buffer: Int[Array, "B width"],
    lengths: Int[Array, " B"],
    keys: Key[Array, " B"],
    gamma: int,
    drafting: ChainDrafting,
    policy: AbstractDraftLength | None,
    draft_state,
    active: Bool[Array, " B"],
):
    """Drafts up to `gamma` tokens after each row's `buffer[b, : lengths[b]]`, one draft
    call per token (sampled from $q_i$, or its argmax). With a `policy` (a draft-length
    rule that does not read the target), a row stops drafting once the rule's length
    is reached, and the loop over draft calls ends when every row has stopped: the
    draft calls are the ones the rows need; rows that are not `active` (finished in
    the decoding loop) draft nothing, so they neither keep that loop going nor make
    the target score their chain. A cached draft is called on the new tokens only
    (see [`eqx_specdec.models.AbstractCachedModel`][]).

    **Returns:**

    `(x, q, drafted, buffer, draft_state)`: int32 `(B, G)`, the draft's distributions
    `(B, G, V)` (rows past a row's draft length are zero or scratch; `None` for
    `"propose"` drafting, which forms none), int32 `(B,)` the tokens each row
    drafted, the buffer with the draft tokens after each row's context, and the
    draft's state.
    """
    draft_outputs = models.outputs[0]
    batch = buffer.shape[0]
    rows = jnp.arange(batch)
    if drafting == "propose":  # the whole chain in one call, no rows formed
        xs, drafted = jax.vmap(lambda row, n: models.draft.propose(row, n, gamma))(
            buffer, lengths
        )
        xs = xs.astype(jnp.int32)
        drafted = jnp.where(active, jnp.clip(drafted, 0, gamma), 0).astype(jnp.int32)
        slots = lengths[:, None] + jnp.arange(gamma, dtype=jnp.int32)[None]
        buffer = buffer.at[rows[:, None], slots].set(xs)
        return xs, None, drafted, buffer, draft_state
    token_keys = jax.vmap(lambda k: jax.random.split(k, gamma))(keys)

    def draw(q, i):
        if drafting == "argmax":
            return jnp.argmax(q, axis=-1).astype(jnp.int32)
        # -1 for a row that is not a distribution: the loop stops that row (its
        # check reads q) before anything is committed; 0 meanwhile, a valid id.
        return jnp.maximum(jax.vmap(draw_token)(token_keys[:, i], q), 0)

    def stopped_after(xs, qs, count):
        """Rows whose draft length is at most `count`: by the rule's stopping-time
        property, decided by the first `count` tokens and rows alone."""
        if policy is None:
            return jnp.zeros((batch,), bool)
        return length_of(xs, qs) + policy.lookahead() <= count

    def length_of(xs, qs):
        dummy_target = jnp.zeros((batch, gamma + 1, qs.shape[-1]), qs.dtype)
        return jax.vmap(policy)(xs, draft_law(xs, qs, drafting), dummy_target)

    # The first draft call: the last committed positions (two for a cached draft).
    width = CATCH_UP if is_cached(models.draft) else 1
    starts = jnp.maximum(lengths - width, 0)
    q, draft_state = call_rows(models.draft, buffer, starts, width, draft_state)
    q = as_probs(q[rows, lengths - 1 - starts], draft_outputs)
    x = draw(q, 0)
    xs = jnp.zeros((batch, gamma), jnp.int32).at[:, 0].set(x)
    qs = jnp.zeros((batch, gamma, q.shape[-1]), q.dtype).at[:, 0].set(q)
    buffer = buffer.at[rows, lengths].set(x)
    drafted = active.astype(jnp.int32)
    stopped = stopped_after(xs, qs, 1) | ~active

    def more(carry):
        i, *_, stopped = carry
        return (i < gamma) & ~jnp.all(stopped)

    def next_token(carry):
        i, buffer, xs, qs, drafted, draft_state, stopped = carry
        q, draft_state = call_rows(
            models.draft, buffer, lengths - 1 + i, 1, draft_state
        )
        q = as_probs(q[:, 0], draft_outputs)
        x = draw(q, i)
        xs, qs = xs.at[:, i].set(x), qs.at[:, i].set(q)
        # Rows that stopped keep drafting scratch past their length (never verified).
        buffer = buffer.at[rows, lengths + i].set(x)
        drafted = drafted + (~stopped).astype(jnp.int32)
        stopped = stopped | stopped_after(xs, qs, i + 1)
        return i + 1, buffer, xs, qs, drafted, draft_state, stopped

    carry = (jnp.ones((), jnp.int32), buffer, xs, qs, drafted, draft_state, stopped)
    _, buffer, xs, qs, drafted, draft_state, _ = jax.lax.while_loop(
        more, next_token, carry
    )
    if policy is not None:  # the rows' lengths, now that each has stopped
        drafted = jnp.clip(length_of(xs, qs), 0, gamma).astype(jnp.int32)
        drafted = jnp.where(active, drafted, 0)
    return xs, qs, drafted, buffer, draft_state


def score_chain(
    models: Models, buffer, lengths, width: int, vocab: int, target_state, packed=None
):
    """The target's rows `(B, width, V)` as probabilities, at each row's positions
    `lengths[b] - 1 + [0, width)` (its last committed token, then the draft tokens),
    and its state. `packed`: `(counts, size)`, the target (packed) called on the first
    `counts[b]` of each row's positions only, in one call of `size` tokens (a row's
    slots past them repeat its last row: `Packing.unpacked`)."""
    starts = lengths - 1
    if packed is None:
        p, target_state = call_rows(models.target, buffer, starts, width, target_state)
    else:
        counts, size = packed
        p, target_state = call_packed(
            models.target, buffer, starts, counts, size, width, target_state
        )
    checked_output("target_model", p[0], (width, vocab))
    return as_probs(p, models.outputs[1]), target_state


def packed_sizes(target, batch: int, gamma: int) -> tuple[int, ...]:
    """The call sizes (tokens) a trimmed chain of `gamma` tokens calls a packed target
    ([`eqx_specdec.models.AbstractPackedModel`][]) on in the steps where some row
    drafted: half the batch's slots and all of them, the smallest holding the step's
    tokens taken at run time. None (the rows' `gamma + 1` slots each) for another
    target, or where half the slots cannot hold the commonest such step, one row
    drafting in full and the others not (a single row, or two): there the packed call
    would be compiled and rarely taken. With SmolLM2 at B = 4 on the CPU the rows
    drafting in such steps scored 11 to 17 tokens of 28 on average, and a call on 12
    took 81.0 ms against 102.5 ms on 28 (`benchmarks/results-cpu.md`)."""
    slots = batch * (gamma + 1)
    half = -(-slots // 2)
    if not isinstance(target, AbstractPackedModel) or half < gamma + batch:
        return ()
    return (half, slots)


def trim_pays() -> bool:
    """Whether `Chain(trim=True)` pays on JAX's default backend: on a CPU, where a
    call on $G + 1$ tokens costs clearly more than one on a single token (1.7x for
    SmolLM2), and not elsewhere: on a TPU the two cost alike, and the trimmed chain's
    two call sites make XLA relayout the caches and weights on every step
    (`benchmarks/results-tpu.md`). What the command-line tools choose."""
    return jax.default_backend() == "cpu"


def trimmed_widths(gamma: int) -> tuple[int, ...]:
    """The target widths a trimmed chain of `gamma` tokens compiles: 1 (no row drafted)
    and `gamma + 1`. (Every width between, the narrowest holding the step's chains
    taken at run time, was tried with SmolLM2 on the CPU: each width compiles the
    target once more, and the speed-up did not move, since the drafts' chains were
    nearly always full; `benchmarks/results-cpu.md`.)"""
    return (1, gamma + 1)


def reached_probabilities(passes, draft_law, draft_tokens):
    """$P(n \\ge k)$, k = 0..G, for one step: unbiased given the drafted path.

    With $a_j(v)$ the pass probability of token v at position j and
    $\\beta_j = \\sum_v q_j(v) a_j(v)$, $P(n \\ge k) = E[\\prod_{j<k-1} a_j(x_j) \\beta_{k-1}]$
    over the draft $x \\sim q$; the last factor is averaged exactly.
    """
    # A contraction, not `sum(draft_law * passes)`: on the CPU, XLA runs the product
    # and sum over a 49,152-entry vocabulary as a slow fused loop (0.8 ms against 0.2).
    beta = jnp.einsum("gv,gv->g", draft_law, passes)
    a_x = jnp.take_along_axis(passes, draft_tokens[:, None], axis=-1)[:, 0]
    before = jnp.concatenate([jnp.ones((1,), a_x.dtype), jnp.cumprod(a_x)[:-1]])
    return jnp.concatenate([jnp.ones((1,), beta.dtype), before * beta])


@default_proposal.register
def _chain_for(verifier: AbstractVerifier) -> Chain:
    return Chain()
