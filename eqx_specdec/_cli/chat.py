"""`python -m eqx_specdec chat`: a real model (SmolLM2-135M-Instruct) answers a chat
prompt by speculative decoding with a prompt-lookup (or suffix-decoding) draft, its text
printed as it is accepted, then the run's table against plain decoding of the same
model."""

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from .._chain.verifier import Verifier
from .._decoding.autoregressive import autoregressive_decode
from .._decoding.loop import speculative_decode
from .._decoding.speedup import straightforward_jit
from .._models.prompt_lookup import PromptLookupDraft
from .._models.suffix import SuffixDraft
from .._models.tempered import Tempered
from .._proposal.chain import Chain, trim_pays
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


def say(message: str) -> None:
    """A progress line, on stderr: stdout keeps the answer and its table."""
    print(message, file=sys.stderr, flush=True)


def answer_rows(result, row: int = 0) -> list[tuple[str, str]]:
    """The table of one row's answer: its tokens (to the stop token, which the answer
    includes), the target calls, their quotient, and the acceptance at each draft
    position (the steps that accepted it over the steps that reached it; `-` for a
    position no step reached)."""
    generated = int(result.lengths[row])
    calls = int(result.target_calls[row])
    hist = np.asarray(result.accepted_histogram[row], np.int64)
    reached = hist[::-1].cumsum()[::-1]  # steps that accepted at least k draft tokens
    rates = [
        f"{reached[k + 1] / reached[k]:.2f}" if reached[k] else "-"
        for k in range(len(hist) - 1)
    ]
    reason = result.finish_reason_names()[row]
    return [
        ("answer tokens", f"{generated} (finished by {reason})"),
        ("target calls", f"{calls}"),
        ("answer tokens per target call", f"{generated / calls:.2f}"),
        ("acceptance by draft position", " ".join(rates)),
    ]


def timing_rows(tokens: int, plain: list, speculative: list) -> list[tuple[str, str]]:
    """The table of the timed runs: `plain[i]` and `speculative[i]`, the seconds of
    run `i` of each (interleaved, compiled), decoding the same `tokens`. Tokens per
    second is `tokens` over the median seconds; the speed-up is the median of the runs'
    ratios, with their least and greatest."""
    plain_s, spec_s = float(np.median(plain)), float(np.median(speculative))
    ratios = np.asarray(plain) / np.asarray(speculative)
    runs = len(ratios)
    spread = (
        f" (from {ratios.min():.2f}x to {ratios.max():.2f}x over {runs} runs)"
        if runs > 1
        else " (one run: no spread measured)"
    )
    return [
        ("plain decoding", f"{plain_s:.2f} s, {tokens / plain_s:.1f} tokens/s"),
        ("speculative decoding", f"{spec_s:.2f} s, {tokens / spec_s:.1f} tokens/s"),
        ("speed-up (wall clock)", f"{float(np.median(ratios)):.2f}x{spread}"),
    ]


# The width of the table's first column: its longest name, of either part.
_WIDTH = len("answer tokens per target call")


def print_rows(rows) -> None:
    for name, value in rows:
        print(f"  {name:<{_WIDTH}}  {value}", flush=True)


def run_chat(args) -> dict:
    start = time.perf_counter()
    say("loading SmolLM2-135M-Instruct...")
    model, tokenizer = load_gguf(args.model or fetch_smollm2())
    loaded = time.perf_counter() - start
    prompt = tokenizer.encode(tokenizer.chat(args.prompt))
    prompt_tokens = jnp.asarray([prompt], jnp.int32)
    vocab = model.config.vocab_size  # (a `Tempered` wrapper below has no config)
    if args.temperature == 0:
        verifier, key = (
            Verifier(GreedyRatioTest(), residual_sampler=ArgmaxSampler()),
            None,
        )
    else:
        verifier, key = Verifier(), jax.random.key(args.seed)
        model = Tempered(model, args.temperature)
    suffix = args.draft == "suffix"
    draft = SuffixDraft(vocab) if suffix else PromptLookupDraft(vocab)
    # Either draft proposes each row's whole chain in one call: no draft loop, no
    # draft rows over the vocabulary; trimmed where that pays (a CPU).
    chain = Chain(args.gamma, drafting="propose", trim=trim_pays())
    print(
        f"SmolLM2-135M-Instruct (loaded in {loaded:.1f} s), temperature "
        f"{args.temperature:g}, {'suffix-decoding' if suffix else 'prompt-lookup'} "
        f"draft, G = {args.gamma}"
    )
    print(f"\nuser: {args.prompt}\n")
    say(
        "(compiling the decoding loop: about 10 s on 2 CPU cores; the answer streams "
        "after it)"
    )
    print("assistant: ", end="", flush=True)
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
    print_rows(answer_rows(result))
    if not args.compare:
        return {"result": result, "text": stream.printed}

    def plain():
        # The bare loop, as speculative decoding runs here: no check of the rows.
        return autoregressive_decode(
            model,
            prompt_tokens,
            None,
            generated,
            key,
            outputs="logits",
            check_models=False,
        )

    def straightforward():
        # The loop a user writes: `jax.jit` of a `lax.scan` of one-token calls.
        return straightforward_jit(
            model,
            prompt_tokens,
            jnp.full((1,), len(prompt), jnp.int32),
            jax.random.key(args.seed) if key is None else key,
            generated,
            key is None,
        )

    def timed():
        return speculative(num_tokens=generated)

    say(
        f"timing plain against speculative decoding of these {generated} tokens "
        "(--no-compare skips it): compiling both..."
    )
    runs = (
        ("plain", plain),
        ("straightforward", straightforward),
        ("speculative", timed),
    )
    compiled = time.perf_counter()
    for _, run in runs:  # compiled, and run once
        jax.block_until_ready(run())
    times = {name: [] for name, _ in runs}
    for i in range(args.repeats):  # interleaved
        if i == 0:
            say(
                f"compiled in {time.perf_counter() - compiled:.0f} s; {args.repeats} runs"
            )
        for name, run in runs:
            t = time.perf_counter()
            jax.block_until_ready(run())
            times[name].append(time.perf_counter() - t)
        say(
            f"  run {i + 1}/{args.repeats}: plain {times['plain'][-1]:.2f} s "
            f"(straightforward loop {times['straightforward'][-1]:.2f} s), "
            f"speculative {times['speculative'][-1]:.2f} s"
        )
    # Plain decoding's time in each run: the faster of the two loops.
    plain_times = np.minimum(times["plain"], times["straightforward"])
    print_rows(timing_rows(generated, list(plain_times), times["speculative"]))
    return {"result": result, "text": stream.printed}


def run_fetch(args) -> None:
    print(fetch_smollm2(args.dir))


def run_record(args) -> None:
    say("loading SmolLM2-135M-Instruct...")
    model, tokenizer = load_gguf(fetch_smollm2())
    prompts = [
        tokenizer.encode(tokenizer.chat(text))
        for texts in CHAT_PROMPTS.values()
        for text in texts[:1]
    ]
    if args.tokens < args.gamma + 1:
        fail(f"--tokens must be at least --gamma + 1 = {args.gamma + 1}.", "record")
    say(
        f"SmolLM2 continues {len(prompts)} prompts by {args.tokens} tokens (sampled, "
        "temperature 1; compiling first, about 10 s)..."
    )
    texts = continue_prompts(model, prompts, args.tokens, jax.random.key(args.seed))
    say(
        f"reading the texts with SmolLM2 and its first {args.draft_layers} layers, "
        f"{args.windows} windows of G = {args.gamma} per prompt..."
    )
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
