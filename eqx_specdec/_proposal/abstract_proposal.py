"""What the draft proposes at each step of the decoding loop: the base of the chain and
the tree, and what one step hands back to the loop."""

import abc
import functools
from collections.abc import Callable
from typing import Literal, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, Key

from .._models.cached import checked_output as checked_output, is_cached


ModelOutputs = Literal["probs", "logits"]
Theory = Literal["exact", "lower bound", "none"]


class Models(NamedTuple):
    """The two models of the decoding loop, what each returns (`(draft, target)`), and
    whether the loop asks for the emitted tokens' log-probabilities."""

    draft: Callable
    target: Callable
    outputs: tuple[ModelOutputs, ModelOutputs]
    logprobs: bool = False


class StepOutcome(NamedTuple):
    """What one step of a proposal hands back to the loop, one entry per row:
    `num_accepted` (B,), `tokens` (B, slots) (the accepted draft tokens, the correction,
    then -1), `reached` (B, depth + 1) (the theory's $P(n \\ge k)$, NaN without
    theory), `drafted` (B,) (the draft tokens drafted), `scored` (a scalar), the
    tokens the step's target call scored over the batch (its slots a row times the
    batch in a padded call, padding included; the call's size in a packed one),
    `states`, the cached models' states after the step
    (`(draft_state, target_state)`, `None` for a stateless model), `invalid`, the
    draft's and the target's flags (B,) of the rows where what the model returned
    this step, among the rows the step used, is not a distribution
    (`invalid_distributions`; the loop stops those rows before committing anything;
    `None` for a model whose outputs the step did not use), and `logprobs` (B, slots),
    the target's log-probability of each token the step emits (-inf after them), when
    the loop asks for them (`Models.logprobs`)."""

    num_accepted: Int[Array, " B"]
    tokens: Int[Array, "B slots"]
    reached: Float[Array, "B depth_plus_1"]
    drafted: Int[Array, " B"]
    scored: Int[Array, ""]
    states: tuple = (None, None)
    invalid: tuple = (None, None)
    logprobs: Float[Array, "B slots"] | None = None


class AbstractProposal(eqx.Module):
    """What the draft proposes at each step of [`eqx_specdec.speculative_decode`][]:
    a [`eqx_specdec.Chain`][] of draft tokens (verified by an
    [`eqx_specdec.Verifier`][]) or a [`eqx_specdec.Tree`][] of them (verified by a
    tree verifier). The loop is the same for both; everything that depends on the
    proposal's shape (the buffer slots a step writes, how it is drafted, scored and
    verified, and its theory) is a method here, read before tracing or traced once.
    """

    @abc.abstractmethod
    def slots(self) -> int:
        """The buffer slots one step may write: the deepest accepted path and the
        correction.

        **Returns:**

        A Python int.
        """

    @abc.abstractmethod
    def depth(self) -> int:
        """The most draft tokens one step can accept ($G$ for a chain, the deepest path
        of a tree): the loop's histograms have `depth() + 1` entries.

        **Returns:**

        A Python int.
        """

    @abc.abstractmethod
    def check(self, verifier) -> None:
        """Raises a `TypeError` or `ValueError` (naming the argument and the fix) unless
        `verifier` can verify this proposal in the decoding loop. Called before tracing.

        **Arguments:**

        - `verifier`: the loop's verifier.
        """

    def check_models(self, draft_model, target_model) -> None:
        """Raises a `TypeError` (naming the argument and the fix) unless this proposal
        can run these models. By default: stateless models only (the interface
        `model(tokens: int[T], positions: int[K]) -> float[K, V]`); a proposal that
        runs [`eqx_specdec.models.AbstractCachedModel`][]s ([`eqx_specdec.Chain`][])
        overrides it. Called before tracing.

        **Arguments:**

        - `draft_model`, `target_model`: the loop's models.
        """
        for name, model in (
            ("draft_model", draft_model),
            ("target_model", target_model),
        ):
            if is_cached(model):
                raise TypeError(
                    f"`{name}` is a cached model ({type(model).__name__}), which "
                    f"{type(self).__name__} proposals cannot run: they need the "
                    "stateless interface `model(tokens: int[T], positions: int[K]) -> "
                    "float[K, V]`. Use a Chain proposal, or a stateless model."
                )

    @abc.abstractmethod
    def theory(self, verifier) -> Theory:
        """What the loop's theoretical acceptance is for this proposal and verifier, from
        static declarations only (read before tracing): `"exact"`, `"lower bound"` or
        `"none"` (see [`eqx_specdec.DecodeResult`][]).

        **Arguments:**

        - `verifier`: the loop's verifier.
        """

    @abc.abstractmethod
    def step(
        self,
        models: Models,
        verifier,
        buffer: Int[Array, "B width"],
        lengths: Int[Array, " B"],
        keys: Key[Array, "B 4"],
        generated: Int[Array, " B"],
        states: tuple = (None, None),
        active: Bool[Array, " B"] | None = None,
    ) -> StepOutcome:
        """Drafts, scores and verifies one step for every row. Traced.

        **Arguments:**

        - `models`: the draft and target models, and what they return.
        - `verifier`: the loop's verifier (checked by `check`).
        - `buffer`: int32 `(B, W)`, each row's tokens; row `b`'s context is its first
            `lengths[b]` tokens, the slots after it scratch.
        - `lengths`: int32 `(B,)`.
        - `keys`: `(B, 4)` keys per row: `[:, 0]` for drafting, `[:, 1]` for the
            accept uniforms, `[:, 2]` for the correction's randomness, `[:, 3]` spare.
        - `generated`: int32 `(B,)`, the tokens each row has generated so far.
        - `states`: `(draft_state, target_state)`, the cached models' states (each
            `None` for a stateless model; see [`eqx_specdec.models.AbstractCachedModel`][]).
        - `active`: bool `(B,)`, the rows still running (`None`: all of them). The
            loop discards a finished row's outcome, so a proposal may skip its work
            (a chain drafts nothing for it, so a finished row neither keeps the
            drafting loop going nor widens the target's call).

        **Returns:**

        A `StepOutcome`.
        """


def as_probs(x, outputs: ModelOutputs):
    """A model's output row(s) as probabilities."""
    x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    return jax.nn.softmax(x, axis=-1) if outputs == "logits" else x


def uniforms(keys, count: int, key_sampler: bool):
    """Each row's `count` accept uniforms, and its sampler's randomness: a uniform, or
    the key itself for a key-driven sampler."""
    accept = jax.vmap(lambda k: jax.random.uniform(k, (count,), jnp.float32))(
        keys[:, 1]
    )
    if key_sampler:
        return accept, keys[:, 2]
    sample = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys[:, 2])
    return accept, sample


@functools.singledispatch
def default_proposal(verifier) -> AbstractProposal:
    """The proposal [`eqx_specdec.speculative_decode`][] runs for `verifier` when none
    is given. Chains register `Chain()`, trees the verifier's own `tree`; a family of
    your own registers with `@default_proposal.register` on a function of its
    verifier class.

    **Arguments:**

    - `verifier`: the verifier.

    **Returns:**

    An [`eqx_specdec.AbstractProposal`][].
    """
    raise TypeError(
        "`verifier` must be an eqx_specdec.Verifier (or ShardedVerifier), or a tree "
        f"verifier (TreeVerifier, TraversalVerifier); got {type(verifier).__name__}."
    )
