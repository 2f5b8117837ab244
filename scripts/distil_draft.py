"""A trained draft for SmolLM2-135M: its first layers (an early exit) with a head
distilled from the full model on text the model generates, trained for acceptance with
the library's own objective.

    python scripts/distil_draft.py [--layers 6] [--steps 150]

1. SmolLM2 continues the built-in chat prompts (`eqx_specdec.llm.CHAT_PROMPTS`), sampled
   at temperature 1, several continuations each: the training text (the last prompt of
   each category is held out).
2. The full model's rows at every generated position are the teacher; the draft's
   features are the normalised output of the first `--layers` layers there.
3. The draft's head is `(norm(h) * s) @ (I + A) @ E^T`: the target's tied embedding `E`,
   frozen, with a trained norm scale `s` and a `dim x dim` map `A` (332K weights), the
   same as a `Llama` whose untied head is `(I + A) E^T`. Trained with Adam on
   `1 - sum_v min(p(v), q(v))`, the standard rule's per-position rejection probability
   (DistillSpec's objective, `eqx_specdec.evaluation.acceptance_by_position` for G = 1).
4. Reported: training time, the acceptance rate sum_v min(p, q) on held-out text before
   and after training, and the draft's call cost against the target's.

The draft is not shipped: on a 2-core CPU a draft that runs a fifth of the target's
layers and its whole output head costs about a third of a target call, more than its
acceptance pays back (see the printed cost model).
"""

import argparse
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import eqx_specdec as es
from eqx_specdec.llm import CHAT_PROMPTS, fetch_smollm2, load_gguf


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args(argv)

    model, tokenizer = load_gguf(fetch_smollm2())
    draft_base = model.first_layers(args.layers)
    train_texts = [t for texts in CHAT_PROMPTS.values() for t in texts[:-1]]
    held_texts = [texts[-1] for texts in CHAT_PROMPTS.values()]

    def generated(texts, seed):
        """Prompt + sampled continuation for each text, `--samples` times, decoded as
        one batch; and where each continuation starts."""
        prompts = [tokenizer.encode(tokenizer.chat(t)) for t in texts] * args.samples
        width = max(map(len, prompts))
        padded = np.zeros((len(prompts), width), np.int32)
        for i, prompt in enumerate(prompts):
            padded[i, : len(prompt)] = prompt
        lengths = jnp.asarray([len(r) for r in prompts], jnp.int32)
        keys = jax.random.split(jax.random.key(seed), len(prompts))
        tokens = np.asarray(
            es.autoregressive_decode(
                model, jnp.asarray(padded), lengths, args.tokens, keys, outputs="logits"
            )
        )
        return [
            (jnp.asarray([*prompt, *row.tolist()], jnp.int32), len(prompt))
            for prompt, row in zip(prompts, tokens)
        ]

    @eqx.filter_jit
    def rows_and_features(model, draft, text):
        p = jax.nn.log_softmax(model.logits(text), -1)
        h = draft.hidden(text)
        return p, h * jax.lax.rsqrt(jnp.mean(h * h, -1, keepdims=True) + 1e-5)

    start = time.perf_counter()

    def dataset(texts, seed):
        ps, fs = [], []
        sequences = generated(texts, seed)
        width = max(len(text) for text, _ in sequences)
        for text, first in sequences:
            # Padded to one width (the rows are causal), so that one program serves.
            padded = jnp.zeros((width,), jnp.int32).at[: len(text)].set(text)
            p, f = rows_and_features(model, draft_base, padded)
            ps.append(p[first - 1 : len(text) - 1])
            fs.append(f[first - 1 : len(text) - 1])
        return jnp.concatenate(ps), jnp.concatenate(fs)

    train_p, train_f = dataset(train_texts, 1)
    held_p, held_f = dataset(held_texts, 2)
    data_seconds = time.perf_counter() - start
    print(
        f"text: {len(train_p)} training positions, {len(held_p)} held out "
        f"({data_seconds:.0f} s to generate and read)"
    )
    embedding = model.embedding
    params = {
        "scale": draft_base.final_norm,
        "map": jnp.zeros((model.config.dim, model.config.dim), jnp.float32),
    }

    def draft_log_probs(params, features):
        x = (features * params["scale"][None]) @ (
            jnp.eye(features.shape[-1]) + params["map"]
        )
        return jax.nn.log_softmax(x @ embedding.T, -1)

    def acceptance(params, p, f):
        """Mean sum_v min(p, q): the standard rule's acceptance probability."""
        return jnp.mean(
            jnp.sum(jnp.minimum(jnp.exp(p), jnp.exp(draft_log_probs(params, f))), -1)
        )

    zeros = jax.tree.map(jnp.zeros_like, params)
    state = (zeros, zeros, jnp.zeros((), jnp.int32))

    @jax.jit
    def step(params, state, p, f):
        """One Adam step (learning rate 1e-3) on the rejection probability."""
        loss, grads = jax.value_and_grad(lambda q: 1 - acceptance(q, p, f))(params)
        m, v, t = state
        t = t + 1
        m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, grads)
        v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, v, grads)

        def update(w, m, v):
            m_hat, v_hat = m / (1 - 0.9**t), v / (1 - 0.999**t)
            return w - 1e-3 * m_hat / (jnp.sqrt(v_hat) + 1e-8)

        return jax.tree.map(update, params, m, v), (m, v, t), loss

    held = jax.jit(acceptance)
    before = float(held(params, held_p, held_f))
    start = time.perf_counter()
    rng = np.random.default_rng(0)
    for i in range(args.steps):
        batch = rng.choice(len(train_p), args.batch, replace=False)
        params, state, loss = step(params, state, train_p[batch], train_f[batch])
        if i % 50 == 0 or i == args.steps - 1:
            print(f"step {i}: training acceptance {1 - float(loss):.3f}")
    train_seconds = time.perf_counter() - start
    after = float(held(params, held_p, held_f))
    print(
        f"trained {args.steps} steps of {args.batch} positions in {train_seconds:.0f} s; "
        f"held-out acceptance sum_v min(p, q): {before:.3f} untrained (the first "
        f"{args.layers} layers and the target's own head) -> {after:.3f}"
    )

    # The draft as a Llama: the first layers, the trained scale, an untied head.
    head = (jnp.eye(model.config.dim) + params["map"]) @ embedding.T
    draft = eqx.tree_at(
        lambda m: (m.final_norm, m.head),
        draft_base,
        (params["scale"], head),
        is_leaf=lambda x: x is None,
    )
    state_d, state_t = draft.init_state(64), model.init_state(64)
    call = eqx.filter_jit(
        lambda m, s: m(
            jnp.arange(1, dtype=jnp.int32), jnp.arange(1, dtype=jnp.int32), s
        )
    )
    times = {}
    for name, m, s in (("draft", draft, state_d), ("target", model, state_t)):
        jax.block_until_ready(call(m, s))
        t = time.perf_counter()
        for _ in range(20):
            jax.block_until_ready(call(m, s))
        times[name] = (time.perf_counter() - t) / 20
    ratio = times["draft"] / times["target"]
    gamma = 3
    a = after
    tokens = sum(a**k for k in range(gamma + 1))
    predicted = tokens / (gamma * ratio + 1.1)
    print(
        f"one-token call: draft {1e3 * times['draft']:.1f} ms, target "
        f"{1e3 * times['target']:.1f} ms ({ratio:.2f}x); with G = {gamma} and the "
        f"held-out acceptance as every position's, {tokens:.2f} tokens per target call "
        f"and a predicted speed-up of {predicted:.2f}x (a call on {gamma + 1} tokens "
        "taken as 1.1 one-token calls)"
    )


if __name__ == "__main__":
    main()
