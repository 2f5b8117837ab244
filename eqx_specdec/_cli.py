"""The command line: `python -m eqx_specdec` / `eqx-specdec`, with `demo` and
`evaluate`."""

import argparse
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from ._decoding import autoregressive_decode, speculative_decode
from ._evaluate import evaluate_verifier, synthetic_distributions, SYNTHETIC_KINDS
from ._models import builtin_models, BUILTIN_PROMPTS, decode, encode
from ._stages.prefix_counters import LastSuccessCounter
from ._stages.ratio_tests import (
    BlockRatioTest,
    GreedyRatioTest,
    LenientRatioTest,
    TypicalRatioTest,
)
from ._stages.samplers import ArgmaxSampler, GumbelSampler, TypicalSampler
from ._tree import IIDCandidates, TreeVerifier
from ._verifier import Verifier


def _verifiers(lenience: float) -> dict:
    """name -> (verifier, drafting, description); a tree's drafting is its shape."""
    return {
        "standard": (Verifier(), "sample", "standard rule, sampled drafts"),
        "one-hot": (Verifier(), "argmax", "standard rule, argmax drafter (one-hot)"),
        "block": (
            Verifier(BlockRatioTest(), LastSuccessCounter()),
            "sample",
            "block verification",
        ),
        "greedy": (
            Verifier(GreedyRatioTest(), residual_sampler=ArgmaxSampler()),
            "argmax",
            "greedy (temperature 0)",
        ),
        "lenient": (
            Verifier(LenientRatioTest(lenience)),
            "sample",
            f"lenience {lenience} (lossy)",
        ),
        "typical": (
            Verifier(TypicalRatioTest(), residual_sampler=ArgmaxSampler()),
            "sample",
            "typical acceptance (lossy)",
        ),
        "typical-sampled": (
            Verifier(TypicalRatioTest(), residual_sampler=TypicalSampler()),
            "sample",
            "typical, sampled correction (lossy)",
        ),
        "gumbel": (
            Verifier(residual_sampler=GumbelSampler()),
            "sample",
            "standard rule, Gumbel-max correction",
        ),
        "tree": (
            TreeVerifier(IIDCandidates()),
            DEMO_TREE,
            "2 i.i.d. candidates at the root, each continued to depth 4",
        ),
    }


# Two branches of depth 4: 8 draft tokens, at most 4 accepted per step.
DEMO_TREE = (-1, 0, 1, 2, -1, 4, 5, 6)


VERIFIER_NAMES = tuple(_verifiers(0.5))
# `evaluate` measures one verification step of a chain.
CHAIN_NAMES = tuple(n for n, v in _verifiers(0.5).items() if isinstance(v[1], str))
DEMO_DEFAULT = ("standard", "one-hot", "block", "tree", "greedy", "typical")


class _ProgressBar:
    """A one-line progress bar on stderr, drawn only on a terminal."""

    def __init__(self, total_tasks: int, stream=None):
        self.stream = sys.stderr if stream is None else stream
        self.enabled = self.stream.isatty()
        self.total_tasks = total_tasks
        self.task = 0
        self.label = ""

    def start(self, label: str):
        self.label = label
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


def _fail(message: str):
    print(f"eqx-specdec: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in VERIFIER_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown verifier(s) {unknown or text!r}; choose from "
            f"{', '.join(VERIFIER_NAMES)} (comma-separated)."
        )
    return names


def _positive(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
        return value

    return parse


def _lenience(text):
    value = _positive(float)(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must lie in (0, 1], got {text!r}")
    return value


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
    table = _verifiers(args.lenience)
    bar = _ProgressBar(len(args.verifiers))
    key = jax.random.key(args.seed)
    results = {}
    for name in args.verifiers:
        verifier, drafting, _ = table[name]
        if isinstance(drafting, tuple):
            options = dict(tree=drafting)
        else:
            options = dict(gamma=args.gamma, drafting=drafting)
        bar.start(name)
        start = time.perf_counter()
        result = speculative_decode(
            draft,
            target,
            tokens,
            lengths,
            args.tokens,
            key,
            verifier=verifier,
            progress=bar.update if bar.enabled else None,
            **options,
        )
        jax.block_until_ready(result.tokens)
        results[name] = (result, time.perf_counter() - start)
        bar.finish_task()

    print(
        f"Built-in models: character {target.order}-gram target and "
        f"{draft.order}-gram draft over {target.vocab_size} symbols, fit on the "
        "text shipped with the package."
    )
    print(
        f"Batch {args.batch}, {args.tokens} new tokens per row, gamma = {args.gamma}, "
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
        theory = result.theoretical_tokens_per_call()
        marks = {"exact": "", "lower bound": ">= ", "none": ""}
        shown_theory = (
            "n/a" if result.theory == "none" else f"{marks[result.theory]}{theory:.3f}"
        )
        drafting = table[name][1]
        if isinstance(drafting, tuple):
            drafting = "tree 2 x 4"
        print(
            f"| {name} | {drafting} | {result.tokens_per_call():.3f} | {shown_theory} | "
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
    return results


def _plot(results, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _fail(
            "--plot needs matplotlib: python -m pip install 'eqx_specdec[plot]' "
            "(or matplotlib)."
        )
    names = list(results)
    fig, axes = plt.subplots(
        1, len(names), figsize=(3.2 * len(names), 3.0), sharey=True, squeeze=False
    )
    for ax, name in zip(axes[0], names):
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
        ax.set_title(f"{name}: {result.tokens_per_call():.2f} tok/call", fontsize=10)
        ax.set_xlabel("accepted draft tokens n")
        ax.set_xticks(ks)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("fraction of steps")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _case(args):
    if args.case == "ngram":
        draft, target = builtin_models()
        text = encode("we hold these truths to be self-evident, that all men are ")
        start = args.seed % (len(text) - args.gamma - 1)
        positions = jnp.arange(start, start + args.gamma + 1)
        text = jnp.asarray(text)
        q = np.asarray(draft(text, positions[:-1]), np.float64)
        p = np.asarray(target(text, positions), np.float64)
        q, p = q / q.sum(-1, keepdims=True), p / p.sum(-1, keepdims=True)
        return q, p
    q, p, _ = synthetic_distributions(args.case, args.gamma, args.vocab, args.seed)
    return q, p


def run_evaluate(args) -> dict:
    verifier, drafting, description = _verifiers(args.lenience)[args.verifier]
    q, p = _case(args)
    law = q
    if drafting == "argmax":
        q = None
        law = np.eye(p.shape[1])[np.argmax(law, -1)]
    try:
        result = evaluate_verifier(
            verifier,
            q,
            p,
            draft_law=law,
            method=args.method,
            num_draws=args.draws,
            key=jax.random.key(args.seed),
        )
    except ValueError as error:
        _fail(str(error))
    result = {"verifier": args.verifier, "case": args.case, **result}
    if args.json:
        print(json.dumps(result, indent=2))
        return result
    print(f"verifier: {args.verifier} ({description}), drafts: {drafting}")
    print(
        f"case: {args.case}, gamma = {result['gamma']}, vocabulary {result['vocab']}, "
        f"seed {args.seed}"
    )
    how = (
        "exact quadrature"
        if result["method"] == "quadrature"
        else (f"Monte Carlo, {result['draws']} draws")
    )
    print(f"method: {how}")
    target = "greedy decoding of p" if args.verifier == "greedy" else "p"
    print(
        f"distance from the target ({target}), max TV over positions: "
        f"{result['distance']:.4g}"
    )
    per = " ".join(
        "-" if d is None else f"{d:.4g}" for d in result["distance_per_position"]
    )
    print(f"  per position: {per}")
    if "chi_square" in result:
        chi = result["chi_square"]
        cells = [
            f"{s:.1f}/{t:.1f}"
            for s, t in zip(chi["statistic"], chi["threshold"])
            if s is not None
        ]
        verdict = "consistent with p" if chi["passed"] else "REJECTED"
        print(f"  chi-square / threshold per position: {' '.join(cells)} ({verdict})")
    print(f"acceptance rate: {result['acceptance_rate']:.4f}")
    print(f"expected tokens per step: {result['tokens_per_step']:.4f}")
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eqx-specdec",
        description="Speculative decoding verification in JAX: run the end-to-end demo "
        "or measure a verifier.",
    )
    sub = parser.add_subparsers(dest="command", metavar="{demo,evaluate}")
    sub.required = True
    demo = sub.add_parser(
        "demo",
        help="speculative decoding with the built-in n-gram model pair",
        description="Generates text with the built-in character n-gram pair (a bigram "
        "draft, a 4-gram target) under several verifiers and prints tokens per target "
        "call, acceptance rate by position and the theoretical value.",
    )
    demo.add_argument(
        "--verifiers",
        type=_names,
        default=list(DEMO_DEFAULT),
        help=f"comma-separated, from: {', '.join(VERIFIER_NAMES)} "
        f"(default: {','.join(DEMO_DEFAULT)})",
    )
    demo.add_argument(
        "--batch", type=_positive(int), default=64, help="rows (default 64)"
    )
    demo.add_argument(
        "--tokens",
        type=_positive(int),
        default=256,
        help="new tokens per row (default 256)",
    )
    demo.add_argument(
        "--gamma", type=_positive(int), default=4, help="draft length (default 4)"
    )
    demo.add_argument(
        "--lenience", type=_lenience, default=0.5, help="for 'lenient' (default 0.5)"
    )
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.add_argument(
        "--samples", type=int, default=3, help="generated samples to print (default 3)"
    )
    demo.add_argument(
        "--plot", metavar="FILE.png", help="write the accepted-length figure"
    )
    demo.set_defaults(run=run_demo)

    evaluate = sub.add_parser(
        "evaluate",
        help="distance from the target and acceptance of one verifier",
        description="Measures one verifier on one row of synthetic or built-in "
        "distributions: distance of the emitted tokens from the target (exact "
        "quadrature on small cases, Monte Carlo otherwise), acceptance rate and "
        "expected tokens per step.",
    )
    evaluate.add_argument(
        "--verifier",
        choices=CHAIN_NAMES,
        default="standard",
        help="(default standard)",
    )
    evaluate.add_argument(
        "--case",
        choices=[k for k in SYNTHETIC_KINDS if k != "one-hot implicit"] + ["ngram"],
        default="peaked",
        help="synthetic distributions, or 'ngram': the built-in models along a built-in "
        "text (default peaked)",
    )
    evaluate.add_argument("--gamma", type=_positive(int), default=2, help="(default 2)")
    evaluate.add_argument(
        "--vocab",
        type=_positive(int),
        default=8,
        help="synthetic cases only (default 8)",
    )
    evaluate.add_argument(
        "--lenience", type=_lenience, default=0.5, help="(default 0.5)"
    )
    evaluate.add_argument("--seed", type=int, default=0, help="(default 0)")
    evaluate.add_argument(
        "--method",
        choices=("auto", "quadrature", "monte-carlo"),
        default="auto",
        help="auto: quadrature when V^G <= 256 and the rule allows it (default auto)",
    )
    evaluate.add_argument(
        "--draws",
        type=_positive(int),
        default=200_000,
        help="Monte Carlo draws (default 200000)",
    )
    evaluate.add_argument("--json", action="store_true", help="print JSON")
    evaluate.set_defaults(run=run_evaluate)
    return parser


def main(argv=None):
    """Entry point of `python -m eqx_specdec` and the `eqx-specdec` script."""
    args = build_parser().parse_args(argv)
    args.run(args)
    return 0
