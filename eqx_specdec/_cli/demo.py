"""The `demo` command: the end-to-end loop on the built-in models, its table and
figure."""

import concurrent.futures
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

from .._chain.verifier import Verifier
from .._decoding.autoregressive import autoregressive_decode
from .._decoding.loop import speculative_decode
from .._decoding.speedup import measure_speedup, speedup_table
from .._models.prompt_lookup import PromptLookupDraft
from .._proposal.chain import Chain, trim_pays
from .._stages.greedy import ArgmaxSampler, GreedyRatioTest
from ..demo import (
    builtin_models,
    BUILTIN_PROMPTS,
    builtin_transformers,
    decode,
    encode,
)
from .choices import draft_length, verifiers


class ProgressBar:
    """Progress on stderr while the demo compiles and runs: a one-line bar on a
    terminal, one line per task otherwise (a log, CI). Tasks may run on several
    threads: the bar counts those finished."""

    def __init__(self, total_tasks: int, stream=None):
        self.stream = sys.stderr if stream is None else stream
        self.enabled = self.stream.isatty()
        self.total_tasks = total_tasks
        self.task = 0  # finished
        self.started = 0
        self.label = ""
        self.lock = threading.Lock()

    def start(self, label: str):
        with self.lock:
            self.label = label
            self.started += 1
            if not self.enabled:
                self.stream.write(f"[{self.started}/{self.total_tasks}] {label}...\n")
                self.stream.flush()
        self.update(0, 1)

    def update(self, done, total):
        if not self.enabled:
            return
        with self.lock:
            fraction = (self.task + int(done) / max(int(total), 1)) / self.total_tasks
            filled = int(30 * fraction)
            self.stream.write(
                f"\r[{'#' * filled}{'.' * (30 - filled)}] {100 * fraction:5.1f}%  "
                f"{self.label:<16}"
            )
            self.stream.flush()

    def finish_task(self):
        with self.lock:
            self.task += 1
            if self.enabled and self.task == self.total_tasks:
                self.stream.write("\r" + " " * 60 + "\r")
                self.stream.flush()


def _prompt_batch(batch: int):
    prompts = [encode(BUILTIN_PROMPTS[i % len(BUILTIN_PROMPTS)]) for i in range(batch)]
    width = max(len(p) for p in prompts)
    tokens = np.zeros((batch, width), np.int32)
    for i, p in enumerate(prompts):
        tokens[i, : len(p)] = p
    return tokens, np.asarray([len(p) for p in prompts], np.int32)


def _format_rates(rates) -> str:
    return " ".join("-" if np.isnan(r) else f"{r:.2f}" for r in rates)


def run_demo(args) -> dict:
    draft, target = builtin_models()
    tokens, lengths = _prompt_batch(args.batch)
    table = verifiers(args.lenience)
    timing = _timing_rows(args.full) if args.timing else {}
    bar = ProgressBar(len(args.verifiers) + len(args.draft_lengths) + len(timing))
    key = jax.random.key(args.seed)

    def run(name, **options):
        bar.start(name)
        start = time.perf_counter()
        result = speculative_decode(
            draft, target, tokens, lengths, args.tokens, key, **options
        )
        jax.block_until_ready(result.tokens)
        bar.finish_task()
        return result, time.perf_counter() - start

    def warm(name):
        # A workload's programs (its loop and its plain-decoding programs) compiled and
        # run once beside the other tasks; the timing itself runs afterwards, alone.
        bar.start(f"compiling: {name}")
        measure_speedup(**timing[name], repeats=1)
        bar.finish_task()

    # Compiling is most of the demo's time, one program at a time per thread: two
    # threads keep both cores of a small machine busy (the first workload's programs on
    # one, the rest as the threads come free).
    names = list(timing)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        warmed = [pool.submit(warm, name) for name in names[:1]]
        runs = {}
        for name in args.verifiers:
            choice = table[name]
            runs[name] = pool.submit(
                run,
                name,
                verifier=choice.verifier,
                proposal=choice.proposal(args.gamma),
            )
        policy_runs = {}
        for name in args.draft_lengths:
            policy, gamma = draft_length(name, args.gamma)
            policy_runs[name] = pool.submit(
                run, name, proposal=Chain(gamma, draft_length=policy)
            )
        warmed += [pool.submit(warm, name) for name in names[1:]]
        results = {name: future.result() for name, future in runs.items()}
        policies = {name: future.result()[0] for name, future in policy_runs.items()}
        for future in warmed:
            future.result()

    print(
        f"Built-in models: character {target.order}-gram target and "
        f"{draft.order}-gram draft over {target.vocab_size} symbols, fit on the "
        "text shipped with the package."
    )
    print(
        f"Batch {args.batch}, {args.tokens} new tokens per row, G = {args.gamma}, "
        f"seed {args.seed}.\n"
    )
    shown = min(args.samples, args.batch)
    if shown:
        first = args.verifiers[0]
        print(f"Samples ({first}):")
        for i in range(shown):
            prompt = decode(tokens[i, : lengths[i]])
            text = decode(results[first][0].tokens[i])
            print(f"  {prompt!r} -> {text!r}")
        print()
    print(
        "| verifier | drafts | tokens per target call | theory | "
        "acceptance rate by position | target calls | seconds |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in args.verifiers:
        result, seconds = results[name]
        if result.theory == "none":
            shown_theory = "n/a"
        else:
            mark = ">= " if result.theory == "lower bound" else ""
            shown_theory = f"{mark}{result.theoretical_tokens_per_call():.3f}"
        print(
            f"| {name} | {table[name].drafts} | {result.tokens_per_call():.3f} | {shown_theory} | "
            f"{_format_rates(result.acceptance_rate())} | "
            f"{int(np.asarray(result.target_calls).sum())} | {seconds:.2f} |"
        )
    print(
        f"| autoregressive target (baseline) | - | 1.000 | 1.000 | - | "
        f"{args.batch * args.tokens} | - |"
    )
    print(
        "\ntheory: 1 + sum_k E[P(n >= k | prefix)], from the models' distributions at "
        "every step (standard rule: 1 + sum_k E[prod_{j<k} beta_j]); '>=' marks the "
        "standard rule's value, a lower bound for block verification."
    )
    if policies:
        _print_policies(policies, args.gamma)
    if "greedy" in results:
        greedy = autoregressive_decode(target, tokens, lengths, args.tokens)
        same = bool(jnp.all(greedy == results["greedy"][0].tokens))
        print(
            "greedy speculative decoding equals greedy decoding of the target: "
            f"{'yes' if same else 'NO'}"
        )
    if args.plot:
        _plot(results, args.plot)
        print(f"figure written to {args.plot}")
    if timing:
        _print_timing(timing)
    return results


# The wall clock's prompt and length: one row of the built-in transformer target.
_TIMING_PROMPT = "we hold these "
_TIMING_TOKENS, _TIMING_GAMMA = 64, 3


def _timing_rows(full: bool) -> dict:
    """The wall clock's workloads, as `measure_speedup`'s arguments: the prompt-lookup
    draft on the built-in transformer target, where it pays (greedy decoding of this
    small target repeats itself, which the lookup copies) and where it does not
    (sampled at temperature 1: nothing to copy); with `full`, the bigram and small
    transformer drafts too."""
    draft_transformer, target = builtin_transformers()
    lookup = PromptLookupDraft(target.embedding.shape[0])
    common = dict(
        target_model=target,
        prompt_tokens=encode(_TIMING_PROMPT)[None],
        prompt_lengths=None,
        num_tokens=_TIMING_TOKENS,
        key=jax.random.key(0),
    )
    propose = Chain(_TIMING_GAMMA, drafting="propose", trim=trim_pays())
    greedy = Verifier(GreedyRatioTest(), residual_sampler=ArgmaxSampler())
    rows = {
        "prompt lookup, greedy": dict(
            draft_model=lookup, verifier=greedy, proposal=propose, **common
        ),
        "prompt lookup, sampled": dict(
            draft_model=lookup, verifier=Verifier(), proposal=propose, **common
        ),
    }
    if full:
        sampled = dict(proposal=Chain(_TIMING_GAMMA), verifier=Verifier(), **common)
        rows["2-gram, sampled"] = dict(draft_model=builtin_models(2, 4)[0], **sampled)
        rows["transformer, 1 layer of 64, sampled"] = dict(
            draft_model=draft_transformer, outputs=("logits", "logits"), **sampled
        )
    for row in rows.values():
        row.setdefault("outputs", ("probs", "logits"))
    return rows


def _print_timing(rows: dict):
    """Each workload timed against plain decoding of the same target (the faster of
    the library's loop and the one a user writes; its programs
    compiled already), one after the other, nothing else running."""
    measured = {name: measure_speedup(**row, repeats=2) for name, row in rows.items()}
    print(
        "\nWall clock: the built-in transformer target (3 layers of width 320, a "
        f"key-value cache), one row, {_TIMING_TOKENS} tokens after "
        f"{_TIMING_PROMPT!r}, G = {_TIMING_GAMMA}, against plain decoding of the same "
        "target, the faster of the library's loop and a straightforward jax.jit + "
        "lax.scan loop (medians of 2 interleaved runs; benchmarks/bench_decoding.py "
        "measures more):\n"
    )
    print(speedup_table(measured))
    print(_timing_verdict(measured))


def _timing_verdict(measured) -> str:
    """What the wall-clock table shows, in words, from its own numbers: where
    speculative decoding paid and where it did not, and why (the tokens per target
    call against what a call on G + 1 tokens costs)."""
    ordered = sorted(measured.items(), key=lambda item: item[1].speedup)
    (worst_name, worst), (best_name, best) = ordered[0], ordered[-1]
    ratio = best.target_call_seconds / best.plain_call_seconds
    text = (
        f"\nMeasured: {best.speedup:.2f}x with {best_name} "
        f"({best.tokens_per_call:.2f} tokens per target call), {worst.speedup:.2f}x "
        f"with {worst_name} ({worst.tokens_per_call:.2f}). A call on "
        f"{_TIMING_GAMMA + 1} tokens costs {ratio:.1f} one-token calls of this tiny "
        "target, so speculation pays where drafts are accepted well above that"
    )
    if best_name.startswith("prompt lookup") and worst_name.startswith("prompt lookup"):
        text += (
            ": the lookup copies text the context already holds, which greedy "
            "decoding of this small target produces (it repeats itself) and sampling "
            "does not"
        )
    return text + ". `python -m eqx_specdec chat` runs a real model (the [llm] extra)."


def _print_policies(policies, gamma):
    print(
        "\n| draft length (standard rule) | tokens per target call | theory | "
        "draft calls per token | mean draft length |"
    )
    print("|---|---|---|---|---|")
    for name, result in policies.items():
        steps = int(np.asarray(result.target_calls).sum())
        mean = float(np.asarray(result.drafted).sum()) / steps
        print(
            f"| {name} | {result.tokens_per_call():.3f} | "
            f"{result.theoretical_tokens_per_call():.3f} | "
            f"{result.draft_calls_per_token():.3f} | {mean:.2f} |"
        )
    print(
        f"\nconfidence-H and oracle-H: stop drafting (at most G = {gamma} tokens) "
        "once the "
        "predicted probability that some draft token is rejected exceeds H "
        "(SpecDec++); the predictor is the draft's confidence max q, or the oracle "
        "sum min(p, q) (an upper bound: it reads the target)."
    )


def _plot(results, path):
    # matplotlib is optional: `--plot` checked that it is installed before the demo ran.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    # A grid three panels wide, 7.2 inches at 100 dpi: the width of a documentation page,
    # so that 9-point labels read at the size the page shows them.
    columns = min(3, len(names))
    rows = -(-len(names) // columns)
    fig, axes = plt.subplots(
        rows,
        columns,
        figsize=(7.2, 0.5 + 2.3 * rows),
        sharey=True,
        squeeze=False,
        layout="constrained",
    )
    fig.suptitle(
        "Accepted draft tokens per step: observed (bars) and predicted (line)",
        fontsize=11,
    )
    for ax in axes.flat[len(names) :]:
        ax.set_visible(False)
    for ax, name in zip(axes.flat, names):
        result = results[name][0]
        ks = np.arange(result.accepted_histogram.shape[1])
        ax.bar(
            ks, result.accepted_length_distribution(), color="#7aa6d6", label="observed"
        )
        if result.theory != "none":
            label = "theory" if result.theory == "exact" else "standard rule"
            ax.plot(
                ks,
                result.theoretical_accepted_length_distribution(),
                "o-",
                color="#c0392b",
                label=label,
            )
        ax.set_title(f"{name}: {result.tokens_per_call():.2f} tokens/call", fontsize=10)
        ax.set_xlabel("accepted draft tokens n", fontsize=9)
        ax.set_xticks(ks)
        ax.tick_params(labelsize=9)
        ax.legend(fontsize=8)
    for row in axes:
        row[0].set_ylabel("fraction of steps", fontsize=9)
    fig.savefig(path, dpi=100)
    plt.close(fig)
