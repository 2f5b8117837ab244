"""The `demo` command: the end-to-end loop on the built-in models, its table and
figure."""

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from .._decoding.autoregressive import autoregressive_decode
from .._decoding.loop import speculative_decode
from .._decoding.speedup import measure_speedup, speedup_table
from .._proposal.chain import Chain
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
    terminal, one line per task otherwise (a log, CI)."""

    def __init__(self, total_tasks: int, stream=None):
        self.stream = sys.stderr if stream is None else stream
        self.enabled = self.stream.isatty()
        self.total_tasks = total_tasks
        self.task = 0
        self.label = ""

    def start(self, label: str):
        self.label = label
        if not self.enabled:
            self.stream.write(f"[{self.task + 1}/{self.total_tasks}] {label}...\n")
            self.stream.flush()
        self.update(0, 1)

    def update(self, done, total):
        if not self.enabled:
            return
        fraction = (self.task + int(done) / max(int(total), 1)) / self.total_tasks
        filled = int(30 * fraction)
        self.stream.write(
            f"\r[{'#' * filled}{'.' * (30 - filled)}] {100 * fraction:5.1f}%  "
            f"{self.label:<16}"
        )
        self.stream.flush()

    def finish_task(self):
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
    bar = ProgressBar(len(args.verifiers) + len(args.draft_lengths) + int(args.timing))
    key = jax.random.key(args.seed)

    def run(name, **options):
        bar.start(name)
        start = time.perf_counter()
        result = speculative_decode(
            draft,
            target,
            tokens,
            lengths,
            args.tokens,
            key,
            progress=bar.update if bar.enabled else None,
            **options,
        )
        jax.block_until_ready(result.tokens)
        bar.finish_task()
        return result, time.perf_counter() - start

    results = {}
    for name in args.verifiers:
        choice = table[name]
        proposal = choice.proposal(args.gamma)
        results[name] = run(name, verifier=choice.verifier, proposal=proposal)
    policies = {}
    for name in args.draft_lengths:
        policy, gamma = draft_length(name, args.gamma)
        policies[name] = run(name, proposal=Chain(gamma, draft_length=policy))[0]

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
    if args.timing:
        bar.start("wall clock")
        _print_timing(args.seed, args.full)
        bar.finish_task()
    return results


def _print_timing(seed: int, full: bool = False):
    """Wall-clock speculative decoding of the built-in transformer target, against
    plain decoding of it with the same cache: with the bigram draft, and with `full`
    the transformer draft too (two more compiled loops, a few seconds)."""
    draft_transformer, target = builtin_transformers()
    bigram = builtin_models(2, 4)[0]
    prompt = encode(BUILTIN_PROMPTS[0])[None]
    gamma, tokens = 3, 64
    rows = {"2-gram": (bigram, "probs")}
    if full:
        rows["transformer, 1 layer of 64"] = (draft_transformer, "logits")
    measured = {
        name: measure_speedup(
            draft,
            target,
            prompt,
            None,
            tokens,
            jax.random.key(seed),
            proposal=Chain(gamma),
            outputs=(outputs, "logits"),
            repeats=2,
        )
        for name, (draft, outputs) in rows.items()
    }
    print(
        "\nWall clock: the built-in transformer target (3 layers of width 320, a "
        f"key-value cache), one row, {tokens} tokens, G = {gamma}, against plain "
        "decoding of the same target (medians of 2 interleaved runs; benchmarks/bench_decoding.py measures more):\n"
    )
    print(speedup_table(measured))
    print(_timing_verdict(measured, gamma))


def _timing_verdict(measured, gamma) -> str:
    """What the wall-clock table shows, in words, from its own numbers: a speed-up, or
    none and why (a call on G + 1 tokens costs the built-in target several one-token
    calls, so accepted draft tokens are not free)."""
    best_name, best = max(measured.items(), key=lambda item: item[1].speedup)
    ratio = best.target_call_seconds / best.plain_call_seconds
    if best.speedup >= 1.1:
        return (
            f"\nMeasured: {best.speedup:.2f}x with the {best_name} draft "
            f"({best.tokens_per_call:.2f} tokens per target call; a call on "
            f"{gamma + 1} tokens costs {ratio:.1f} one-token calls)."
        )
    return (
        f"\nNo real speed-up here ({best.speedup:.2f}x at best; the cost model, from "
        f"the per-call times alone, predicts {best.predicted_speedup:.2f}x): the "
        f"built-in target is tiny (3.7M weights, {1e3 * best.plain_call_seconds:.1f} ms "
        f"a call), a call on {gamma + 1} tokens costs {ratio:.1f} one-token calls, and "
        "the step's other work (the draft's calls, verification, the loop) weighs as "
        f"much as the {best.tokens_per_call:.2f} tokens per target call save. "
        "Speculative decoding pays where a call costs about the same on a few tokens as "
        "on one, as for a real model bound by reading its weights: `python -m "
        "eqx_specdec chat` runs SmolLM2-135M (the [llm] extra).\n"
    )


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
