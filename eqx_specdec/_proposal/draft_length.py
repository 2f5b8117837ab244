"""Draft-length policies for the decoding loop: how many of the `gamma` draft slots a
row uses each step (SpecDec++'s stopping rule, and a fixed length)."""

import abc
from typing import ClassVar, Literal

import equinox as eqx
import jax.numpy as jnp
from beartype import beartype
from jaxtyping import Array, Float, jaxtyped

from .._custom_types import DraftProbsRow, DraftTokensRow, IntScalar, TargetProbsRow
from .._misc import check_hyperparameter, no_type_check


class AbstractDraftLength(eqx.Module):
    """Decides, for one row and step of [`eqx_specdec.speculative_decode`][], how many
    draft tokens $L \\in [0, G]$ the row drafts; the verifier then verifies a chain of
    length $L$ (the loop keeps fixed buffers of $G$ slots and masks the rest). A row
    that drafts none ($L = 0$) takes a plain decoding step: its token is drawn from the
    target's first row $p_0$ (its argmax for a rule whose sampler draws `"argmax"`).

    For the loop to stay lossless, the decision to draft token $k + 1$ may depend on the
    draft tokens before it and on the distributions at positions up to $k$ only (the
    rows there are functions of the prefix): $L$ is then a stopping time of the drafted
    prefix. A rule that looked at later draft tokens, or at the verification's uniforms,
    would not be.

    **Declared with a default:**

    - `always_full` (class attribute, bool, default `False`): `True` if the rule always
        returns $G$, so the loop verifies the whole chain once instead of once per
        possible length.
    """

    always_full: ClassVar[bool] = False

    def lookahead(self) -> int:
        """How many draft tokens past its length $L$ the rule reads to decide $L$: 0 (the
        default) when the first $L$ tokens and rows decide it, 1 when the rule stops
        *before* a token it has seen (`StopWhenUnlikely(keep_crossing=False)`). The
        loop keeps calling the draft for a row until its length plus this is reached.

        **Returns:**

        A Python int.
        """
        return 0

    def needs_target(self) -> bool:
        """Whether the rule reads `target_probs`. If not (return `False`), the decoding
        loop evaluates it after each draft call, on the tokens and rows drafted so far
        (the later ones zero), and stops calling the draft for a row once the length it
        returns is reached: its stopping-time property makes that the length it would
        return on the whole chain. If it does (the default, the safe answer), every row
        drafts $G$ tokens and the rule runs after the target call.

        **Returns:**

        A Python bool.
        """
        return True

    @abc.abstractmethod
    def __call__(
        self,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow,
        target_probs: TargetProbsRow,
    ) -> IntScalar:
        """The draft length of one row.

        **Arguments:**

        - `draft_tokens`: integer of shape `(G,)`, the $G$ tokens the draft proposed.
        - `draft_probs`: float of shape `(G, V)`, the draft's distributions $q_i$ (the
            law of the draft tokens: one-hot for argmax drafting).
        - `target_probs`: float of shape `(G + 1, V)`, the target's distributions (for
            oracle rules, which are upper bounds rather than deployable rules).

        **Returns:**

        An int32 scalar in $[0, G]$ (the loop clips other values into it).
        """


class FixedDraftLength(AbstractDraftLength):
    """Every row drafts all $G$ tokens every step (the loop's default)."""

    always_full: ClassVar[bool] = True

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow,
        target_probs: TargetProbsRow,
    ) -> IntScalar:
        return jnp.asarray(draft_tokens.shape[0], jnp.int32)


@no_type_check
class StopWhenUnlikely(AbstractDraftLength):
    """SpecDec++'s stopping rule (Huang et al. 2024): stop drafting after token $k$ when
    the predicted probability that some draft token so far is rejected exceeds $h$,

    $$L = \\min\\Big\\{k : 1 - \\prod_{j \\le k} a_j > h\\Big\\} \\quad (G \\text{ if none}),$$

    with $a_j$ a predicted acceptance probability of position $j$:

    - `"confidence"`: the draft's confidence, $a_j = \\max_v q_j(v)$: known after the
        $j$-th draft call, so a serving stack can stop calling the draft there.
    - `"oracle"`: the true conditional acceptance of the standard rule,
        $a_j = \\sum_v \\min(p_j(v), q_j(v))$: it reads the target's rows, so it is an
        upper bound on what any learned predictor of acceptance reaches, not a
        deployable rule.

    With `keep_crossing=False` the token whose risk crosses $h$ is not drafted:
    $L = \\min\\{k : 1 - \\prod_{j \\le k + 1} a_j > h\\}$, which may be 0 (the row
    drafts nothing this step). For a draft whose rows say when it has nothing to
    propose ([`eqx_specdec.models.PromptLookupDraft`][]'s uniform row), that skips a token
    that is almost surely rejected and, with `Chain(trim=True)`, the target's call on
    its position.

    Lossless with any lossless verifier: $L$ depends on the rows up to position $L$
    (with `keep_crossing=False`, $L + 1$) only, which are functions of the draft tokens
    before them.

    **Arguments:**

    - `threshold`: $h \\in [0, 1]$; 0 drafts one token, 1 drafts all $G$. A float or a
        scalar array (traced: sweep it without recompiling). Default 0.5.
    - `predictor`: `"confidence"` (the default) or `"oracle"`.
    - `keep_crossing`: `True` (the default, SpecDec++'s rule) to draft the token whose
        risk crosses $h$; `False` to stop before it ($L \\in [0, G]$).
    """

    threshold: Float[Array, ""] | float = 0.5
    predictor: Literal["confidence", "oracle"] = eqx.field(
        static=True, default="confidence"
    )
    keep_crossing: bool = eqx.field(static=True, default=True)

    def __check_init__(self):
        check_hyperparameter("threshold", self.threshold, 0.0, 1.0, low_open=False)
        if self.predictor not in ("confidence", "oracle"):
            raise ValueError(
                'StopWhenUnlikely(`predictor`=...) must be "confidence" or "oracle", '
                f"got {self.predictor!r}."
            )
        if not isinstance(self.keep_crossing, bool):
            raise TypeError(
                "StopWhenUnlikely(`keep_crossing`=...) must be a Python bool, got "
                f"{self.keep_crossing!r}."
            )

    def lookahead(self) -> int:
        """1 with `keep_crossing=False` (the crossing token is read, not drafted)."""
        return 0 if self.keep_crossing else 1

    def needs_target(self) -> bool:
        """`True` for the oracle predictor only."""
        return self.predictor == "oracle"

    def predicted_acceptance(
        self, draft_probs: DraftProbsRow, target_probs: TargetProbsRow
    ) -> Float[Array, " G"]:
        """The predicted acceptance $a_j$ of each position, shape `(G,)`."""
        if self.predictor == "confidence":
            return jnp.max(draft_probs, axis=-1)
        gamma = draft_probs.shape[0]
        return jnp.sum(jnp.minimum(draft_probs, target_probs[:gamma]), axis=-1)

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow,
        target_probs: TargetProbsRow,
    ) -> IntScalar:
        accepted = self.predicted_acceptance(draft_probs, target_probs)
        risk = 1 - jnp.cumprod(accepted)
        threshold = jnp.asarray(self.threshold, risk.dtype)
        # Risk never falls: positions at or under the threshold are a prefix, and the
        # token that crosses it is drafted too unless `keep_crossing` is False.
        length = jnp.sum(risk <= threshold, dtype=jnp.int32) + int(self.keep_crossing)
        return jnp.minimum(length, draft_tokens.shape[0]).astype(jnp.int32)
