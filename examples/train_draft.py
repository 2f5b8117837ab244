"""Training a draft for acceptance: the built-in bigram draft's table, fit by gradient
ascent on the expected accepted length against the built-in 4-gram target, compared
with the same table fit by maximum likelihood, in the decoding loop."""

import time

import jax
import jax.numpy as jnp
import numpy as np

import eqx_specdec as es


GAMMA, STEPS, LEARNING_RATE = 4, 1000, 0.05
mle_draft, target = (
    es.demo.builtin_models()
)  # bigram draft (maximum likelihood), 4-gram
corpus = jnp.asarray(es.demo.builtin_corpus())
vocab = mle_draft.vocab_size

# The objective's rows, teacher-forced along the text: at every position t of the
# corpus, the target's and the draft's next-token distributions for the G + 1 positions
# from t on.
positions = jnp.arange(corpus.shape[0] - GAMMA - 1)
windows = positions[:, None] + jnp.arange(GAMMA + 1)[None]
target_rows = target(corpus, jnp.arange(corpus.shape[0]))[windows]  # (W, G+1, V)
contexts = corpus[windows[:, :GAMMA]]  # a bigram draft reads the last token only


def loss(draft_logits):
    """Minus the mean expected accepted length over the windows of the text."""
    draft_rows = jax.nn.softmax(draft_logits, axis=-1)[contexts]  # (W, G, V)
    return -jnp.mean(es.evaluation.expected_accepted_length(draft_rows, target_rows))


@jax.jit
def adam_step(params, moments, step):
    value, grad = jax.value_and_grad(loss)(params)
    first, second = moments
    first = 0.9 * first + 0.1 * grad
    second = 0.999 * second + 0.001 * grad**2
    unbiased = first / (1 - 0.9**step) / (jnp.sqrt(second / (1 - 0.999**step)) + 1e-8)
    return params - LEARNING_RATE * unbiased, (first, second), value


start = time.perf_counter()
params = jnp.log(mle_draft.probs)  # start from the maximum-likelihood table
moments = (jnp.zeros_like(params), jnp.zeros_like(params))
for step in range(1, STEPS + 1):
    params, moments, value = adam_step(params, moments, step)
trained_draft = es.demo.NGramModel(jax.nn.softmax(params, axis=-1), order=2)
seconds = time.perf_counter() - start

prompts = [
    es.demo.encode(text) for text in es.demo.BUILTIN_PROMPTS
] * 8  # 8 rows per prompt
lengths = np.array([len(p) for p in prompts])
buffer = np.zeros((len(prompts), lengths.max()), np.int32)
for row, prompt in enumerate(prompts):
    buffer[row, : len(prompt)] = prompt

print(f"{STEPS} Adam steps on {positions.shape[0]} windows in {seconds:.1f} s")
print(f"{'draft':<20} {'objective 1 + E[n]':>18} {'tokens per target call':>23}")
for name, draft in (("maximum likelihood", mle_draft), ("trained", trained_draft)):
    objective = 1 - loss(jnp.log(draft.probs))
    result = es.speculative_decode(
        draft,
        target,
        buffer,
        lengths,
        num_tokens=256,
        key=jax.random.key(0),
        proposal=es.Chain(GAMMA),
    )
    print(f"{name:<20} {float(objective):>18.3f} {result.tokens_per_call():>23.3f}")
