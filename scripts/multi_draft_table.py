"""Multi-draft verifiers compared on SmolLM2's recorded rows: the table on the docs'
"Published numbers" page (`docs/multi_draft_table.txt`), beside Khisti et al.'s Table 3.

    python scripts/multi_draft_table.py [--rows rows.npz]

Without `--rows` it records them first, as `python -m eqx_specdec record` does (SmolLM2
continues one prompt per category; the draft is its first 20 of 30 layers; G = 4 positions
per window). Every recorded position is one node with $K$ i.i.d. drafts from its $q$. For
$K = 2, 4, 8$, the probability that a draft is accepted, averaged over the positions:

- over the whole vocabulary: the optimum $\\alpha^*$ (`eqx_specdec.evaluation.optimal_acceptance`),
  SpecTr's K-SEQ ($1 - (1 - \\beta)^K$ at the $\\rho$ that `eqx_specdec.SpecTrKSeq`
  finds) and SpecInfer's rule (the recursion over its evolving residual);
- on each row restricted to the 12 tokens of highest $p + q$ and renormalised (importance
  sampling enumerates the law of its selected draft, which needs a small vocabulary):
  the same three, and importance sampling ($\\sum \\min(p, q_Y)$ with
  `eqx_specdec.ImportanceSampling.selected_law`).

A second table takes as the draft the target's own rows at temperature 1.2 (Khisti et al.'s
drafts sample at 1.2): a drafter as close to the target as theirs.

`tests/test_paper_numbers.py` checks these closed forms against each rule's exact
quadrature on small rows.
"""

import argparse
import pathlib

import jax
import jax.numpy as jnp

import eqx_specdec as es


OUT = pathlib.Path(__file__).resolve().parent.parent / "docs" / "multi_draft_table.txt"
DRAFTS = (2, 4, 8)
KEPT = 12
# Khisti et al. (ICLR 2025), Table 3: OPT drafts and target, (XSum, Dolly), K = 2, 4, 8.
PAPER = {
    "optimum": ((0.5009, 0.5226, 0.5419), (0.6384, 0.6731, 0.6962)),
    "importance sampling": ((0.4933, 0.5145, 0.5333), (0.6348, 0.6691, 0.6919)),
    "SpecTr (K-SEQ)": ((0.4889, 0.5083, 0.5263), (0.6246, 0.6560, 0.6800)),
    "SpecInfer": ((0.4875, 0.5058, 0.5227), (0.6202, 0.6489, 0.6722)),
}


def spec_infer(p, q, k: int):
    """SpecInfer's rule with `k` i.i.d. drafts: each accepted with
    $\\sum \\min(r, q)$ against the evolving residual $r$, which becomes
    $\\operatorname{norm}((r - q)_+)$ after a rejection. Rows `(..., V)`."""
    residual, left, accepted = p, jnp.ones(p.shape[:-1]), jnp.zeros(p.shape[:-1])
    for _ in range(k):
        beta = jnp.sum(jnp.minimum(residual, q), -1)
        accepted = accepted + left * beta
        left = left * (1 - beta)
        rest = jnp.maximum(residual - q, 0)
        total = jnp.sum(rest, -1, keepdims=True)
        residual = jnp.where(total > 0, rest / jnp.where(total > 0, total, 1), residual)
    return accepted


def k_seq(p, q, k: int):
    """K-SEQ with `k` i.i.d. drafts: $1 - (1 - \\beta)^K$ at the rule's $\\rho$."""

    def one(p, q):
        state = es.SpecTrKSeq().init(p, q, jnp.zeros(k, jnp.int32), jnp.ones(k, bool))
        return 1 - (1 - state.beta) ** k

    return jax.vmap(one)(p.reshape(-1, p.shape[-1]), q.reshape(-1, q.shape[-1]))


def importance(p, q, k: int):
    """Importance sampling with `k` i.i.d. drafts: $\\sum \\min(p, q_Y)$."""
    rule = es.ImportanceSampling(k)

    def one(p, q):
        return jnp.sum(jnp.minimum(p, rule.selected_law(p, q, jnp.int32(k))))

    return jax.vmap(one)(p.reshape(-1, p.shape[-1]), q.reshape(-1, q.shape[-1]))


def optimum(p, q, k: int):
    return es.evaluation.optimal_acceptance(p, q, k)


def restricted(p, q, kept: int):
    """Each row pair restricted to its `kept` tokens of highest $p + q$, renormalised."""
    _, top = jax.lax.top_k(p + q, kept)
    p, q = jnp.take_along_axis(p, top, -1), jnp.take_along_axis(q, top, -1)
    return p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)


def tempered(p, temperature: float):
    """The rows at a temperature: $p^{1/T}$, renormalised."""
    logits = jnp.log(jnp.maximum(p, 1e-30)) / temperature
    return jax.nn.softmax(jnp.where(p > 0, logits, -jnp.inf), -1)


def table(q, p, source: str) -> str:
    p = p[:, : q.shape[1]].reshape(-1, p.shape[-1]).astype(jnp.float32)
    q = q.reshape(-1, q.shape[-1]).astype(jnp.float32)
    drafts = {
        "the draft: its first 20 of 30 layers": q,
        "the draft: its own rows at temperature 1.2": tempered(p, 1.2),
    }
    lines = [
        f"SmolLM2-135M-Instruct's rows ({p.shape[0]} positions, from {source}), K "
        "i.i.d. drafts per position: P(a draft is accepted), averaged over the positions",
    ]
    for title, draft in drafts.items():
        lines += ["", f"**{title}**", ""] + _section(p, draft)
    return "\n".join(lines) + "\n"


def _section(p, q) -> list[str]:
    small_p, small_q = restricted(p, q, KEPT)
    methods = {"optimum": optimum, "SpecTr (K-SEQ)": k_seq, "SpecInfer": spec_infer}
    lines = [
        "| method | vocabulary | K = 2 | K = 4 | K = 8 | paper, XSum (K = 2, 4, 8) "
        "| paper, Dolly (K = 2, 4, 8) |",
        "|---|---|---|---|---|---|---|",
    ]

    def row(name, where, values):
        xsum, dolly = PAPER[name]
        cells = " | ".join(f"{v:.4f}" for v in values)
        lines.append(
            f"| {name} | {where} | {cells} | {', '.join(f'{x:.4f}' for x in xsum)} "
            f"| {', '.join(f'{x:.4f}' for x in dolly)} |"
        )

    for name, method in methods.items():
        row(
            name,
            f"all {p.shape[-1]:,}",
            [float(method(p, q, k).mean()) for k in DRAFTS],
        )
    for name, method in {**methods, "importance sampling": importance}.items():
        values = [float(method(small_p, small_q, k).mean()) for k in DRAFTS]
        row(name, f"top {KEPT}", values)
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=None)
    args = parser.parse_args(argv)
    # The recording is recorded_rows_table.py's (this script's folder is on the path
    # when it runs).
    from recorded_rows_table import load_or_record

    rows, source = load_or_record(args.rows)
    text = table(rows.draft_probs, rows.target_probs, source)
    OUT.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
