"""String-level rejection sampling (SLRS) for a draft with another tokenizer, on small
vocabularies: the draft's text mapped to a target token, and that token's exact law."""

from collections.abc import Callable, Sequence

import equinox as eqx
import numpy as np
from jaxtyping import ArrayLike, Float


# The exact law enumerates the draft's token sequences; it is refused beyond this many.
_MAX_SEQUENCES = 200_000


class StringLevelDraft(eqx.Module):
    """A draft with another tokenizer, verified at the level of strings (string-level
    rejection sampling, after Timor et al., ICML 2025): the draft writes text token by
    token, in its own vocabulary, until no longer target token could still start with
    what it wrote; that text proposes the **longest target token it starts with**. The
    proposal's law in the target's vocabulary, $\\psi$, is computed exactly by
    enumerating the draft's token sequences (`target_law`), and the standard
    verification of the proposed token against $\\psi$ is lossless
    ([`eqx_specdec.speculative_accept`][] with `draft_probs` $= \\psi$).

    Unlike token-level intersection ([`eqx_specdec.models.SharedVocabulary`][]), every draft
    token is usable: a target token the draft spells in several pieces is proposed, and
    so is one that a longer draft token begins with. The enumeration is exponential in
    the target tokens' lengths, so this is for small vocabularies (toy models, studies
    of the method), refused beyond 200,000 draft sequences per position.

    **Arguments:**

    - `draft_strings`: the text of each draft token id (non-empty strings).
    - `target_strings`: the text of each target token id (distinct, non-empty; every
        single character the draft can write must be a target token, so that every
        text starts with one).
    """

    draft_strings: tuple[str, ...] = eqx.field(static=True, converter=tuple)
    target_strings: tuple[str, ...] = eqx.field(static=True, converter=tuple)

    def __check_init__(self):
        for name, strings in (
            ("draft_strings", self.draft_strings),
            ("target_strings", self.target_strings),
        ):
            if not strings or not all(isinstance(s, str) and s for s in strings):
                raise ValueError(
                    f"`{name}` must be a non-empty sequence of non-empty strings, one "
                    "per token id."
                )
        if len(set(self.target_strings)) != len(self.target_strings):
            raise ValueError("`target_strings` holds a string twice: ids must differ.")
        targets = set(self.target_strings)
        missing = sorted({c for s in self.draft_strings for c in s} - targets)
        if missing:
            raise ValueError(
                f"`target_strings` lacks the single characters {missing!r}, which the "
                "draft can write: every text must start with a target token."
            )

    def _open(self, text: str) -> bool:
        """Whether a longer target token could still start with `text`."""
        return any(
            len(t) > len(text) and t.startswith(text) for t in self.target_strings
        )

    def target_token(self, draft_tokens: Sequence[int]) -> int:
        """The target token a draft text proposes: the longest target token it starts
        with.

        **Arguments:**

        - `draft_tokens`: the draft's token ids, in order (Python ints).

        **Returns:**

        A target id (a Python int).
        """
        text = "".join(self.draft_strings[d] for d in draft_tokens)
        best = max(
            (i for i, t in enumerate(self.target_strings) if text.startswith(t)),
            key=lambda i: len(self.target_strings[i]),
        )
        return best

    def finished(self, draft_tokens: Sequence[int]) -> bool:
        """Whether the draft has written enough: no longer target token could still
        start with its text.

        **Arguments:**

        - `draft_tokens`: the draft's token ids so far.

        **Returns:**

        A Python bool.
        """
        text = "".join(self.draft_strings[d] for d in draft_tokens)
        return bool(text) and not self._open(text)

    def target_law(
        self, next_draft: Callable[[tuple[int, ...]], ArrayLike]
    ) -> Float[np.ndarray, " V"]:
        """$\\psi$: the law of the proposed target token, exactly.

        **Arguments:**

        - `next_draft`: the draft's distribution of its next token given the draft
            tokens written so far at this position (a tuple of ids, empty at first),
            as an array of shape `(V_draft,)`.

        **Returns:**

        A float64 NumPy array of shape `(V,)`, summing to 1.
        """
        law = np.zeros(len(self.target_strings))
        stack: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
        seen = 0
        while stack:
            prefix, chance = stack.pop()
            seen += 1
            if seen > _MAX_SEQUENCES:
                raise ValueError(
                    f"StringLevelDraft.target_law enumerates more than "
                    f"{_MAX_SEQUENCES:,} draft sequences: the vocabularies are too "
                    "large for string-level rejection sampling; use SharedVocabulary."
                )
            if self.finished(prefix):
                law[self.target_token(prefix)] += chance
                continue
            probs = np.asarray(next_draft(prefix), np.float64)
            for d in np.flatnonzero(probs > 0):
                stack.append((prefix + (int(d),), chance * probs[d]))
        return law
