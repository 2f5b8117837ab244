"""`python -m eqx_specdec chat`: a real model (SmolLM2-135M-Instruct) answers a chat
prompt by speculative decoding with a prompt-lookup draft, its text printed as it is
accepted, then the run's table against plain decoding of the same model."""

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from .._chain.verifier import Verifier
from .._decoding.autoregressive import autoregressive_decode
from .._decoding.loop import speculative_decode
from .._models.prompt_lookup import PromptLookupDraft
from .._models.tempered import Tempered
from .._proposal.chain import Chain
from .._stages.greedy import ArgmaxSampler, GreedyRatioTest
from ..llm import (
    CHAT_PROMPTS,
    continue_prompts,
    fetch_smollm2,
    load_gguf,
    record_rows,
)
from .choices import fail


class TextStream:
    """Prints a row's text as its tokens arrive (the loop's `stream` callback): the
    whole text is decoded again each time and only its new end printed, held back while
    it ends inside a character."""

    def __init__(self, tokenizer, out=None):
        self.tokenizer = tokenizer
        self.out = out or sys.stdout
        self.ids: list[int] = []
        self.printed = ""
        self.times: list[float] = []  # when each step's tokens arrived
        self.counts: list[int] = []  # how many arrived

    def __call__(self, tokens):
        self.times.append(time.perf_counter())
        new = [int(t) for t in np.asarray(tokens)[0] if t >= 0]
        self.counts.append(len(new))
        self.ids.extend(new)
        text = self.tokenizer.decode(self.ids, skip_special=True)
        if text.endswith("\ufffd"):
            return
        self.out.write(text[len(self.printed) :])
        self.out.flush()
        self.printed = text


def run_chat(args) -> dict:
    start = time.perf_counter()
    model, tokenizer = load_gguf(args.model or fetch_smollm2())
    loaded = time.perf_counter() - start
    prompt = tokenizer.encode(tokenizer.chat(args.prompt))
    prompt_tokens = jnp.asarray([prompt], jnp.int32)
    if args.temperature == 0:
        verifier, key = (
            Verifier(GreedyRatioTest(), residual_sampler=ArgmaxSampler()),
            None,
        )
    else:
        verifier, key = Verifier(), jax.random.key(args.seed)
        model = Tempered(model, args.temperature)
    draft = PromptLookupDraft(model.config.vocab_size)
    # The lookup proposes each row's whole chain in one call: no draft loop, no
    # draft rows over the vocabulary.
    chain = Chain(args.gamma, drafting="propose", trim=True)
    print(
        f"SmolLM2-135M-Instruct (loaded in {loaded:.1f} s), temperature "
        f"{args.temperature:g}, prompt-lookup draft, G = {args.gamma}"
    )
    print(f"\nuser: {args.prompt}\n\nassistant: ", end="", flush=True)
    stream = TextStream(tokenizer)

    def speculative(stream=None, num_tokens=args.tokens):
        return speculative_decode(
            draft,
            model,
            prompt_tokens,
            None,
            num_tokens,
            jax.random.key(args.seed) if key is None else key,
            verifier=verifier,
            proposal=chain,
            outputs=("probs", "logits"),
            stop_tokens=tokenizer.stop_ids,
            stream=stream,
        )

    result = speculative(stream)
    print("\n")
    generated = int(result.lengths[0])
    seconds = (
        stream.times[-1] - stream.times[0] if len(stream.times) > 1 else float("nan")
    )
    rates = np.asarray(result.acceptance_rate())
    rows = [
        ("generated tokens", f"{generated} ({result.finish_reason_names()[0]})"),
        ("target calls", f"{int(result.target_calls[0])}"),
        ("tokens per target call", f"{result.tokens_per_call():.2f}"),
        ("acceptance by position", " ".join(f"{r:.2f}" for r in rates)),
        (
            "speculative tokens/s (streamed, after the first step)",
            f"{(generated - stream.counts[0]) / seconds:.1f}"
            if seconds == seconds
            else "-",
        ),
    ]
    if args.compare:

        def plain():
            return autoregressive_decode(
                model, prompt_tokens, None, generated, key, outputs="logits"
            )

        def timed():
            return speculative(num_tokens=generated)

        for run in (plain, timed):  # compiled first
            jax.block_until_ready(run())
        times = {"plain": [], "speculative": []}
        for _ in range(args.repeats):  # interleaved
            for name, run in (("plain", plain), ("speculative", timed)):
                t = time.perf_counter()
                jax.block_until_ready(run())
                times[name].append(time.perf_counter() - t)
        plain_s, spec_s = np.median(times["plain"]), np.median(times["speculative"])
        rows += [
            (
                f"plain decoding, {generated} tokens (median of {args.repeats})",
                f"{plain_s:.2f} s, {generated / plain_s:.1f} tokens/s",
            ),
            (
                "speculative decoding, the same tokens",
                f"{spec_s:.2f} s, {generated / spec_s:.1f} tokens/s",
            ),
            ("speed-up (wall clock, measured)", f"{plain_s / spec_s:.2f}x"),
        ]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    return {"result": result, "text": stream.printed}


def run_fetch(args) -> None:
    print(fetch_smollm2(args.dir))


def run_record(args) -> None:
    model, tokenizer = load_gguf(fetch_smollm2())
    prompts = [
        tokenizer.encode(tokenizer.chat(text))
        for texts in CHAT_PROMPTS.values()
        for text in texts[:1]
    ]
    if args.tokens < args.gamma + 1:
        fail(f"--tokens must be at least --gamma + 1 = {args.gamma + 1}.", "record")
    texts = continue_prompts(model, prompts, args.tokens, jax.random.key(args.seed))
    rows = record_rows(
        model,
        model.first_layers(args.draft_layers),
        texts,
        gamma=args.gamma,
        windows=args.windows,
    )
    rows.save(args.out)
    count, gamma = rows.tokens.shape
    print(
        f"wrote {args.out}: {count} windows of G = {gamma} (draft: the first "
        f"{args.draft_layers} of {model.config.layers} layers)"
    )
