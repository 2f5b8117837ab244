"""A real model's distributions for rule authors: the target's and a draft's rows at the
positions of real text, recorded once and saved, so that acceptance rules are evaluated
on them without running the models."""

import os

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .._decoding.autoregressive import autoregressive_decode
from ._llama import Llama


class RecordedRows(eqx.Module):
    """Verification inputs recorded from real models: `N` windows of $G$ positions of
    text the target generated, each with the draft's rows $q_1..q_G$, the target's rows
    $p_1..p_{G+1}$ and the text's tokens there (the rows along a teacher-forced prefix,
    as [`eqx_specdec.evaluation.acceptance_by_position`][] reads them). Pass window `i` to
    [`eqx_specdec.evaluation.evaluate_verifier`][] (`draft_probs[i]`, `target_probs[i]`), or all of
    them at once to [`eqx_specdec.evaluation.acceptance_by_position`][] and
    [`eqx_specdec.evaluation.expected_accepted_length`][].

    **Fields:**

    - `draft_probs`: float32 `(N, G, V)`.
    - `target_probs`: float32 `(N, G + 1, V)`.
    - `tokens`: int32 `(N, G)`, the text's tokens at the window's positions.
    """

    draft_probs: Float[Array, "N G V"] = eqx.field(converter=jnp.asarray)
    target_probs: Float[Array, "N G_plus_1 V"] = eqx.field(converter=jnp.asarray)
    tokens: Int[Array, "N G"] = eqx.field(converter=jnp.asarray)

    def save(self, path: str | os.PathLike) -> None:
        """Writes the rows to `path` (a `.npz` file, float16: half the bytes; `load`
        renormalises each row in float32)."""
        np.savez_compressed(
            path,
            draft_probs=np.asarray(self.draft_probs, np.float16),
            target_probs=np.asarray(self.target_probs, np.float16),
            tokens=np.asarray(self.tokens, np.int32),
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> "RecordedRows":
        """Reads rows written by `save`."""
        data = np.load(path)

        def rows(name):
            values = data[name].astype(np.float32)
            return jnp.asarray(values / values.sum(-1, keepdims=True))

        return cls(
            rows("draft_probs"), rows("target_probs"), jnp.asarray(data["tokens"])
        )


@eqx.filter_jit
def _probs(model, tokens):
    return jax.nn.softmax(model.logits(tokens), axis=-1)


def record_rows(
    target: Llama,
    draft: Llama,
    texts: list[tuple[list[int], int]],
    *,
    gamma: int = 4,
    windows: int = 8,
) -> RecordedRows:
    """Records verification inputs from real models on given texts: both models read
    each text once (uncached forward passes), and `windows` windows of `gamma`
    positions, evenly spaced over the part of the text after its prompt, are kept.
    [`eqx_specdec.llm.continue_prompts`][] makes such texts (the target continues
    prompts), as `python -m eqx_specdec record` does.

    **Arguments:**

    - `target`, `draft`: [`eqx_specdec.llm.Llama`][] models over the same vocabulary
        (a draft made of the target's first layers: `target.first_layers(k)`).
    - `texts`: `(tokens, start)` pairs: a text's token ids, and where its continuation
        starts (its prompt's length); at least `gamma + 1` tokens after `start`.
    - `gamma`: $G$, the positions per window.
    - `windows`: the windows per text.

    **Returns:**

    A [`eqx_specdec.llm.RecordedRows`][] of `len(texts) * windows` windows.
    """
    qs, ps, xs = [], [], []
    for tokens, start in texts:
        text = jnp.asarray(tokens, jnp.int32)
        room = len(tokens) - start - gamma - 1
        if start < 1 or room < 0:
            raise ValueError(
                f"Each text in `texts` needs a prompt (`start` >= 1) and at least "
                f"`gamma` + 1 = {gamma + 1} tokens after it; got start {start} in "
                f"{len(tokens)} tokens."
            )
        p, q = _probs(target, text), _probs(draft, text)
        # Row t is the distribution of the token at t + 1. A window at offset o drafts
        # the tokens at start + o .. start + o + G - 1.
        for offset in np.linspace(0, room, windows).astype(int):
            first = start + int(offset)
            qs.append(q[first - 1 : first - 1 + gamma])
            ps.append(p[first - 1 : first + gamma])
            xs.append(text[first : first + gamma])
    return RecordedRows(jnp.stack(qs), jnp.stack(ps), jnp.stack(xs).astype(jnp.int32))


def continue_prompts(
    model: Llama, prompts: list[list[int]], num_tokens: int, key=None
) -> list[tuple[list[int], int]]:
    """Texts the model writes: each prompt continued by `num_tokens` tokens of plain
    decoding sampled from the model (at its own temperature), as `(tokens, start)`
    pairs for [`eqx_specdec.llm.record_rows`][].

    **Arguments:**

    - `model`: the [`eqx_specdec.llm.Llama`][] that writes.
    - `prompts`: token ids, one list per prompt.
    - `num_tokens`: tokens generated per prompt.
    - `key`: the sampling key; default `jax.random.key(0)` (prompt `i` samples with
        `fold_in(key, i)`).
    """
    key = jax.random.key(0) if key is None else key
    texts = []
    for i, prompt in enumerate(prompts):
        tokens = autoregressive_decode(
            model,
            jnp.asarray([prompt], jnp.int32),
            None,
            num_tokens,
            jax.random.fold_in(key, i),
            outputs="logits",
        )[0]
        texts.append(([*prompt, *np.asarray(tokens).tolist()], len(prompt)))
    return texts
