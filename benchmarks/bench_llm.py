"""A real model's wall-clock speed-up, measured as Spec-Bench measures it:
`python benchmarks/bench_llm.py`.

SmolLM2-135M-Instruct (`eqx_specdec.llm.fetch_smollm2`, float32 weights dequantised from
its GGUF file, or bfloat16 with `--dtype bfloat16`) answers chat prompts in five
categories (summarise, extract, edit code, continue, open question), greedily
(temperature 0), by

- **speculative decoding**: a prompt-lookup draft (`eqx_specdec.models.PromptLookupDraft`,
  n-grams of 3 down to 2) proposing each row's chain of G tokens in one call
  (`Chain(drafting="propose")`: the match's continuation; a row with no match drafts
  nothing; with `--draft suffix`, `eqx_specdec.models.SuffixDraft`, suffix decoding's
  chain over the row's context, 0 to G tokens), or with `--drafting sample` one token a
  draft call, stopping before the first position without a match
  (`StopWhenUnlikely(keep_crossing=False)`); the
  target called on one position when no row drafted and on G + 1 otherwise
  (`Chain(trim=True)`, on a CPU; on G + 1 every step elsewhere, `--trim`), the greedy
  rule, stopping at the chat's end-of-turn token;
- **plain decoding** of the same model (`eqx_specdec.autoregressive_decode`) for exactly
  the answer's tokens;
- **a straightforward loop** a user would write: `jax.jit` of a `lax.scan` calling the
  cached model directly (`vmap` over rows at B > 1). The speed-up is taken against
  the faster of the two plain loops in each round.

Each prompt's answer is first decoded plainly up to its end-of-turn token (at most
`--tokens`); then every run is given the answer's length as its number of tokens (the
plain loops generate exactly that many; the speculative one stops at the end-of-turn
token, there), so that all three hold caches of the same length; every program is
compiled before timing; then `--repeats` rounds time each run once, interleaved. Per
category: tokens/s, the mean accepted length (tokens per target call), the acceptance
rate per draft position, the speed-up mean and standard deviation over rounds and
prompts, the cost model's prediction (per-call times of the draft and of the target at
each width, measured in plain decoding's program at two lengths of the caches and taken
at the run's), and the equivalence check (the speculative tokens equal plain greedy
decoding's, or the first divergence and the target's top-2 margin there). With
`--llama-cpp PYTHON` (an interpreter with `llama-cpp-python`), llama.cpp's plain
decoding of the same file on the same machine is timed beside.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import eqx_specdec as es
from eqx_specdec._decoding.autoregressive import _autoregressive
from eqx_specdec._decoding.speedup import straightforward_jit
from eqx_specdec.llm import CHAT_PROMPTS, fetch_smollm2, load_gguf


GREEDY = es.Verifier(es.GreedyRatioTest(), residual_sampler=es.ArgmaxSampler())


def pad(rows, width):
    out = np.zeros((len(rows), width), np.int32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return jnp.asarray(out), jnp.asarray([len(r) for r in rows], jnp.int32)


def timed(run):
    start = time.perf_counter()
    jax.block_until_ready(run())
    return time.perf_counter() - start


def answer_length(tokens, stops):
    """Tokens up to and including the first stop token."""
    hits = np.flatnonzero(np.isin(tokens, stops))
    return int(hits[0]) + 1 if hits.size else len(tokens)


def llama_cpp_rate(python, path, prompts, tokens):
    """llama.cpp's plain greedy decoding of the same file, 2 threads: tokens/s of the
    generation after the prompt, in a subprocess of `python`."""
    script = f"""
import json, time, llama_cpp
llm = llama_cpp.Llama({str(path)!r}, n_ctx=1024, n_threads=2, verbose=False)
rates = []
for ids in {json.dumps(prompts)}:
    for _ in range(2):
        llm.reset(); llm.eval(ids)
        start = time.perf_counter()
        for _ in range({tokens}):
            token = int(llm.scores[llm.n_tokens - 1].argmax())
            llm.eval([token])
        rates.append({tokens} / (time.perf_counter() - start))
print(json.dumps({{"rate": sorted(rates)[len(rates) // 2], "version": llama_cpp.__version__}}))
"""
    done = subprocess.run(
        [python, "-c", script], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--gamma", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=2, help="per category at B = 1")
    parser.add_argument("--categories", nargs="+", default=list(CHAT_PROMPTS))
    parser.add_argument("--llama-cpp", metavar="PYTHON", default=None)
    parser.add_argument(
        "--min-ngram", type=int, default=2, help="the lookup's shortest n-gram"
    )
    parser.add_argument(
        "--draft",
        choices=("lookup", "suffix"),
        default="lookup",
        help="prompt lookup, or suffix decoding as a chain (models.SuffixDraft)",
    )
    parser.add_argument(
        "--drafting",
        choices=("propose", "sample"),
        default="propose",
        help="the chain proposed in one call, or drafted one token a call",
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="the weights' and caches' dtype (bfloat16 as a TPU serves it: with float32 "
        "weights XLA TPU converts them for every wide call inside the loop)",
    )
    parser.add_argument(
        "--trim",
        choices=("auto", "on", "off"),
        default="auto",
        help="on: the target called on one position in steps where no row drafted "
        "(Chain(trim=True)); off: every step calls it on G + 1; auto (default): on "
        "where that pays, a CPU (a wide call costs 1.7x a narrow one), off elsewhere (on "
        "a TPU the two cost alike, and two call sites make XLA relayout the caches and "
        "weights every step): `_proposal.chain.trim_pays`",
    )
    args = parser.parse_args(argv)
    trim = es._proposal.chain.trim_pays() if args.trim == "auto" else args.trim == "on"

    path = fetch_smollm2(quiet=True)
    model, tokenizer = load_gguf(path, dtype=jnp.dtype(args.dtype))
    stops = tokenizer.stop_ids
    encoded = {
        c: [tokenizer.encode(tokenizer.chat(p)) for p in CHAT_PROMPTS[c]]
        for c in args.categories
    }
    width = max(len(r) for rows in encoded.values() for r in rows)
    if args.draft == "suffix":
        draft = es.models.SuffixDraft(model.config.vocab_size, min_match=args.min_ngram)
        described = (
            f"suffix decoding (suffixes of {draft.min_match} to {draft.max_match} "
            f"tokens, {draft.occurrences} occurrences, paths of probability >= "
            f"{draft.min_probability}"
        )
    else:
        draft = es.models.PromptLookupDraft(
            model.config.vocab_size,
            max_ngram=max(3, args.min_ngram),
            min_ngram=args.min_ngram,
        )
        described = f"prompt lookup (n-grams of {draft.min_ngram} to {draft.max_ngram}"
    if args.drafting == "propose":
        chain = es.Chain(args.gamma, drafting="propose", trim=trim)
    else:
        chain = es.Chain(
            args.gamma,
            draft_length=es.StopWhenUnlikely(keep_crossing=False),
            trim=trim,
        )
    print(
        f"SmolLM2-135M-Instruct, {args.dtype}, JAX {jax.__version__} on "
        f"{jax.default_backend()}; greedy; {described}, drafting "
        f"{args.drafting!r}), "
        f"G = {args.gamma} "
        + (
            f"(trimmed: target widths {es._proposal.chain.trimmed_widths(args.gamma)})"
            if trim
            else f"(untrimmed: the target on {args.gamma + 1} tokens every step)"
        )
        + "; at most "
        f"{args.tokens} tokens per answer; prompts padded to {width} tokens; "
        f"{args.repeats} interleaved rounds\n"
    )

    def speculative(prompts, lengths, num_tokens):
        return es.speculative_decode(
            draft,
            model,
            prompts,
            lengths,
            num_tokens,
            jax.random.key(0),
            verifier=GREEDY,
            proposal=chain,
            outputs=("probs", "logits"),
            stop_tokens=stops,
        )

    def plain(prompts, lengths, num_tokens):
        return es.autoregressive_decode(
            model, prompts, lengths, num_tokens, outputs="logits", check_models=False
        )

    def calls(model_, prompts, lengths, num_tokens, width_, outputs):
        return _autoregressive(
            model_,
            prompts,
            lengths,
            jax.random.key(0),
            num_tokens,
            True,
            outputs,
            width_,
            False,
        )

    widths = es._proposal.chain.trimmed_widths(args.gamma)
    summary = []
    for batch in args.batches:
        # The cost model's per-call times, once per batch size: plain decoding's
        # program with every call on `w` tokens (and the draft's), at two lengths of
        # the caches (room for `short` and for `--tokens` answer tokens). A call's time
        # is affine in its caches' length (the attention reads the whole cache, masked;
        # on this CPU at B = 4 a call on one token a row took 70 ms with room for 32
        # answer tokens and 79 ms with room for 128), so each group's calls are priced
        # at its own caches' length by the line through the two. Every run below, plain and
        # speculative, has room for the answer's tokens only (`n`, as the plain loops
        # must be told how many tokens to generate), so their caches are alike.
        counts = (min(32, args.tokens), args.tokens)
        prompts, lengths = pad(encoded[args.categories[0]][:1] * batch, width)
        cost_runs = {
            "draft": lambda: calls(draft, prompts, lengths, counts[-1], 1, "probs"),
            "prefill": lambda: calls(model, prompts, lengths, 1, 1, "logits"),
        }
        for c in counts:
            for w in widths:
                cost_runs[w, c] = lambda w=w, c=c: calls(
                    model, prompts, lengths, c, w, "logits"
                )
        for run in cost_runs.values():
            jax.block_until_ready(run())
        total = {k: [] for k in cost_runs}
        for _ in range(args.repeats):  # interleaved: the host's speed drifts
            for k, run in cost_runs.items():
                total[k].append(timed(run))
        total = {k: statistics.median(v) for k, v in total.items()}
        # Each run holds the prefill (padded prompts, the same width for every prompt)
        # and its calls: the prefill's run has one call, the others `c`. A call on one
        # position from the prefill's run and the shorter run on one, then the prefill
        # alone, then each width's call with the prefill taken out (the draft's
        # prefill is one of its calls).
        one = (total[1, counts[0]] - total["prefill"]) / (counts[0] - 1)
        prefill = total["prefill"] - one
        measured = {(w, c): (total[w, c] - prefill) / c for c in counts for w in widths}
        draft_call = total["draft"] / counts[-1]

        def per_call(w, room):
            """A call on `w` tokens a row, with caches holding `room` answer tokens:
            on the line through the two measured lengths."""
            short, long = (measured[w, c] for c in counts)
            if counts[0] == counts[1]:
                return long
            return short + (long - short) * (room - counts[0]) / (counts[1] - counts[0])

        print(f"### B = {batch}\n")
        sizes = (
            es._proposal.chain.packed_sizes(model, batch, args.gamma) if trim else ()
        )
        packed = (
            f"; where a row drafted, the target is called packed, on {sizes} tokens "
            "(the cost model prices a call affinely in its tokens)"
            if sizes
            else ""
        )
        print(
            "Per-call times (ms, plain decoding's program, its prefill taken out, with "
            f"room for {counts[0]} / {counts[1]} answer tokens in the caches): draft "
            f"{1e3 * draft_call:.1f}; target on "
            + ", ".join(
                f"{w}: " + " / ".join(f"{1e3 * measured[w, c]:.2f}" for c in counts)
                for w in widths
            )
            + f" tokens per row; the prefill of {width} positions {1e3 * prefill:.0f}"
            + packed
            + "\n"
        )
        print(
            "| category | answer tokens | tokens/s: speculative / plain / "
            "straightforward | speed-up (mean ± std) | predicted | ceiling | mean accepted "
            "length | acceptance by position | left out of the model, ms a step | equal "
            "to greedy |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        for category in args.categories:
            rows = encoded[category]
            groups = (
                [[r] for r in rows[: args.prompts]] if batch == 1 else [rows[:batch]]
            )
            speedups, stats = [], []
            for group in groups:
                prompts, lengths = pad(group, width)
                reference = np.asarray(plain(prompts, lengths, args.tokens))
                n = max(answer_length(r, stops) for r in reference)
                spec = speculative(prompts, lengths, n)
                # Equivalence: each row's answer, token for token.
                equal, note = True, ""
                for b, row in enumerate(np.asarray(spec.tokens)):
                    k = int(spec.lengths[b])
                    if not np.array_equal(row[:k], reference[b, :k]):
                        at = int(np.argmax(row[:k] != reference[b, :k]))
                        context = np.concatenate(
                            [np.asarray(prompts[b, : lengths[b]]), reference[b, :at]]
                        )
                        logits = np.asarray(
                            eqx.filter_jit(lambda m, x: m.logits(x))(
                                model, jnp.asarray(context)
                            )[-1]
                        )
                        top2 = np.sort(logits)[-2:]
                        equal = False
                        note = f" (row {b} at {at}, margin {top2[1] - top2[0]:.2g})"
                runs = {
                    "speculative": lambda: speculative(prompts, lengths, n),
                    "plain": lambda: plain(prompts, lengths, n),
                    "straightforward": lambda: straightforward_jit(
                        model, prompts, lengths, jax.random.key(0), n, True
                    ),
                }
                for run in runs.values():
                    jax.block_until_ready(run())
                times = {name: [] for name in runs}
                for _ in range(args.repeats):
                    for name, run in runs.items():
                        times[name].append(timed(run))
                # Against the faster plain loop of the round: the library's, or the
                # straightforward one a user writes.
                for s, p, st in zip(*(times[k] for k in runs)):
                    speedups.append(min(p, st) / s)
                med = {k: statistics.median(v) for k, v in times.items()}
                steps = int(np.max(np.asarray(spec.target_calls)))
                drafted = float(np.sum(spec.drafted)) / float(np.sum(spec.target_calls))
                # Cost model (`Speedup.calls_seconds`): each step one draft call per
                # drafted token (the rows' mean), and one target call, its cost affine
                # in the tokens it scored between the calls on 1 and G + 1 tokens a
                # row: the row with the most steps ran in every step, so the largest
                # count is the whole run's.
                spec_cost = es.evaluation.Speedup(
                    speculative_seconds=med["speculative"],
                    plain_seconds=med["plain"],
                    batch=batch,
                    tokens=int(np.sum(spec.lengths)),
                    tokens_per_call=spec.tokens_per_call(),
                    steps=steps,
                    draft_call_seconds=draft_call,
                    target_call_seconds=per_call(widths[-1], n),
                    plain_call_seconds=per_call(1, n),
                    draft_calls_per_step=drafted,
                    gamma=args.gamma,
                    scored_tokens=int(np.max(np.asarray(spec.scored_tokens))),
                ).calls_seconds
                # Plain decoding as its own program prices it: the faster plain
                # loop's run.
                plain_cost = min(med["plain"], med["straightforward"])
                predicted = plain_cost / (prefill + spec_cost)
                # The ceiling: a draft that is always right (G + 1 tokens a wide
                # call), at the same per-call times.
                ceiling = plain_cost / (
                    prefill + -(-n // widths[-1]) * per_call(widths[-1], n)
                )
                stats.append(
                    {
                        "spec": med["speculative"],
                        "plain": med["plain"],
                        "straight": med["straightforward"],
                        "tokens": int(np.sum(spec.lengths)),
                        "tpc": spec.tokens_per_call(),
                        "rates": np.asarray(spec.acceptance_rate()),
                        "equal": equal,
                        "note": note,
                        "predicted": predicted,
                        "ceiling": ceiling,
                        # What the cost model leaves out: the run's time less its
                        # prefill and predicted calls, per step (the loop's own
                        # work, and calls costing otherwise inside it).
                        "rest": (med["speculative"] - prefill - spec_cost) / steps,
                    }
                )
            tokens = sum(s["tokens"] for s in stats)
            spec_rate = tokens / sum(s["spec"] for s in stats)
            plain_rate = tokens / sum(s["plain"] for s in stats)
            straight_rate = tokens / sum(s["straight"] for s in stats)
            with np.errstate(invalid="ignore"):  # positions never reached: NaN
                stacked = np.asarray([s["rates"] for s in stats])
                rates = np.nansum(stacked, 0) / np.sum(~np.isnan(stacked), 0)
            mean, std = statistics.mean(speedups), statistics.pstdev(speedups)
            predicted = statistics.mean(s["predicted"] for s in stats)
            ceiling = statistics.mean(s["ceiling"] for s in stats)
            ratio = sum(s["plain"] for s in stats) / sum(s["straight"] for s in stats)
            equal = all(s["equal"] for s in stats)
            print(
                f"| {category} | {tokens} | {spec_rate:.1f} / {plain_rate:.1f} / "
                f"{straight_rate:.1f} | **{mean:.2f}x ± {std:.2f}** | "
                f"{predicted:.2f}x | {ceiling:.2f}x | "
                f"{statistics.mean(s['tpc'] for s in stats):.2f} | "
                f"{' '.join('-' if r != r else f'{r:.2f}' for r in rates)} | "
                f"{1e3 * statistics.mean(s['rest'] for s in stats):.2f} | "
                f"{'yes' if equal else 'no' + stats[-1]['note']} |"
            )
            summary.append((batch, category, mean, std, predicted, ratio, equal))
        print()
    if args.llama_cpp:
        first = [encoded[c][0] for c in args.categories]
        out = llama_cpp_rate(args.llama_cpp, path, first, args.tokens)
        print(
            f"llama.cpp (llama-cpp-python {out['version']}, the same GGUF file, its "
            f"quantised weights, 2 threads), plain greedy decoding at B = 1: "
            f"{out['rate']:.1f} tokens/s (median over the categories' first prompts)\n"
        )
    print(
        "Speed-up: the faster plain loop's time (the library's or the straightforward "
        "one) over speculative time of the same answers, per round and prompt. "
        "Predicted: the cost model, plain decoding's own run over the speculative run's "
        "prefill and calls priced by the per-call times; left out of it: the "
        "speculative run's time less its prefill and predicted calls, per step. "
        "Ceiling: the cost "
        "model for a draft that is always right (G + 1 tokens a wide call). "
        "Straightforward: the jax.jit + lax.scan loop a user writes."
    )
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
