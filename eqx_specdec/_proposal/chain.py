"""A chain of draft tokens: drafted one draft call at a time, scored by one target call,
verified by a chain verifier, with its theory of acceptance."""

from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int, Key

from .._capabilities import has_capability
from .._misc import no_type_check
from .._stages.row_fields import per_row_values, with_row_values
from .._verify.abstract_verifier import AbstractVerifier
from .abstract_proposal import (
    AbstractProposal,
    as_probs,
    checked_output,
    ModelOutputs,
    Models,
    StepOutcome,
    Theory,
    uniforms,
)
from .draft_length import AbstractDraftLength, FixedDraftLength, verify_at_lengths


ChainDrafting = Literal["sample", "argmax"]


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
        greedy verifier.
    - `draft_length`: the [`eqx_specdec.AbstractDraftLength`][] policy that decides
        each row's draft length $L \\in [1, G]$ every step: all $G$
        ([`eqx_specdec.FixedDraftLength`][], the default) or a stopping rule
        ([`eqx_specdec.StopWhenUnlikely`][]). The buffers keep $G$ slots; a row
        verifies a chain of its own length $L$ (the verifier runs once per possible
        length, and each row takes its own), and `DecodeResult.drafted` counts the
        $L$s.
    """

    length: int = eqx.field(static=True, default=4)
    drafting: ChainDrafting = eqx.field(static=True, default="sample")
    draft_length: AbstractDraftLength = FixedDraftLength()

    def __check_init__(self):
        length = self.length
        if not isinstance(length, int) or isinstance(length, bool) or length < 1:
            raise ValueError(
                f"Chain(`length`=...) must be a Python int >= 1, got {length!r}."
            )
        if self.drafting not in ("sample", "argmax"):
            raise ValueError(
                'Chain(`drafting`=...) must be "sample" (draft tokens x ~ q) or '
                f'"argmax" (one-hot drafts), got {self.drafting!r}.'
            )
        if not isinstance(self.draft_length, AbstractDraftLength):
            raise TypeError(
                "Chain(`draft_length`=...) must be an eqx_specdec.AbstractDraftLength "
                "(FixedDraftLength, StopWhenUnlikely or your own), got "
                f"{type(self.draft_length).__name__}."
            )

    def slots(self) -> int:
        return self.length + 1

    def depth(self) -> int:
        return self.length

    def check(self, verifier) -> None:
        if not isinstance(verifier, AbstractVerifier):
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

    def step(self, models, verifier, buffer, lengths, keys, generated) -> StepOutcome:
        xs, qs, p = jax.vmap(
            lambda t, n, k: draft_chain(models, t, n, k, self.length, self.drafting)
        )(buffer, lengths, keys[:, 0])
        theory = self.theory(verifier)  # the declared test's, before it is swapped
        test = verifier.ratio_test.in_decoding_loop(generated)
        if test is not verifier.ratio_test:
            verifier = _with_ratio_test(verifier, test)
        key_sampler = verifier.residual_sampler.randomness == "key"
        accept, sample = uniforms(keys, self.length, key_sampler)
        if self.drafting == "argmax":
            law, given = jax.nn.one_hot(xs, qs.shape[-1], dtype=qs.dtype), None
        else:
            law = given = qs
        log_space = verifier.ratio_test.log_space is True

        def space(a):
            return jnp.log(a) if log_space else a

        arrays = (xs, None if given is None else space(given), space(p), accept, sample)
        if self.draft_length.always_full:
            drafted = jnp.full((xs.shape[0],), self.length, jnp.int32)
            out = verifier(*arrays)
        else:
            drafted = jax.vmap(self.draft_length)(xs, law, p).astype(jnp.int32)
            drafted = jnp.clip(drafted, 1, self.length)
            out = verify_at_lengths(verifier, drafted, *arrays)
        if theory == "none":
            reached = jnp.full((xs.shape[0], self.length + 1), jnp.nan, jnp.float32)
            return StepOutcome(out["num_accepted"], out["tokens"], reached, drafted)

        def passes_of(values, law, p):
            return with_row_values(test, values).pass_probabilities(law, p)

        passes = jax.vmap(passes_of)(per_row_values(test), law, p[:, : self.length])
        # Positions past a row's draft length are never drafted: they never pass.
        used = jnp.arange(self.length, dtype=jnp.int32)[None] < drafted[:, None]
        passes = jnp.where(used[..., None], passes, 0)
        reached = jax.vmap(reached_probabilities)(passes, law, xs)
        return StepOutcome(
            out["num_accepted"], out["tokens"], reached.astype(jnp.float32), drafted
        )


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


def draft_chain(
    models: Models,
    tokens: Int[Array, " width"],
    length: Int[Array, ""],
    key: Key[Array, ""],
    gamma: int,
    drafting: ChainDrafting,
):
    """Drafts `gamma` tokens after `tokens[:length]`, one draft call each (sampled from
    $q_i$, or its argmax), then scores the chain with one target call.

    **Returns:**

    `(x, q, p)`: int32 `(gamma,)`, the draft's distributions `(gamma, V)` and the
    target's `(gamma + 1, V)`.
    """
    outputs: ModelOutputs = models.outputs

    def one(tokens, i_key):
        i, k = i_key
        q = as_probs(models.draft(tokens, (length - 1 + i)[None])[0], outputs)
        if drafting == "argmax":
            x = jnp.argmax(q).astype(jnp.int32)
        else:
            x = jax.random.categorical(k, jnp.log(q)).astype(jnp.int32)
        return tokens.at[length + i].set(x), (x, q)

    keys = jax.random.split(key, gamma)
    tokens, (xs, qs) = jax.lax.scan(
        one, tokens, (jnp.arange(gamma, dtype=jnp.int32), keys)
    )
    positions = length - 1 + jnp.arange(gamma + 1, dtype=jnp.int32)
    p = models.target(tokens, positions)
    p = checked_output("target_model", p, (gamma + 1, qs.shape[-1]))
    return xs, qs, as_probs(p, outputs)


def reached_probabilities(passes, draft_law, draft_tokens):
    """$P(n \\ge k)$, k = 0..G, for one step: unbiased given the drafted path.

    With $a_j(v)$ the pass probability of token v at position j and
    $\\beta_j = \\sum_v q_j(v) a_j(v)$, $P(n \\ge k) = E[\\prod_{j<k-1} a_j(x_j) \\beta_{k-1}]$
    over the draft $x \\sim q$; the last factor is averaged exactly.
    """
    beta = jnp.sum(draft_law * passes, axis=-1)
    a_x = jnp.take_along_axis(passes, draft_tokens[:, None], axis=-1)[:, 0]
    before = jnp.concatenate([jnp.ones((1,), a_x.dtype), jnp.cumprod(a_x)[:-1]])
    return jnp.concatenate([jnp.ones((1,), beta.dtype), before * beta])
