"""Published numbers reproduced by the library: the tables and the figure on the docs'
"Published numbers" page (`docs/paper_numbers_table.txt`, `docs/khisti_fig2_table.txt`,
`docs/images/khisti_fig2.png`).

    python scripts/paper_numbers.py

On the binary toy of Sun et al. (ICLR 2025): a context-free target $p = (1/3, 2/3)$ and
draft $q = (2/3, 1/3)$ at every position, drafts of $G = 2, 3, 4$ tokens. For each $G$:

- the expected accepted draft tokens of the standard rule and of block verification,
  measured by the library's exact quadrature over the uniforms
  (`eqx_specdec.evaluation.emission_by_quadrature`), beside their exact fractions;
- Leviathan et al.'s Eq. 1, the expected tokens per step
  $(1 - \\alpha^{G + 1}) / (1 - \\alpha)$ with $\\alpha = \\sum_v \\min(p(v), q(v))$,
  beside the measured $1 + E[n]$ of the standard rule;
- the upper bound on any verifier's expected accepted tokens,
  $\\sum_{i=1}^{G} \\sum_{x_{1:i}} \\min(p(x_{1:i}), q(x_{1:i}))$ (no verifier accepts
  $i$ tokens more often than the $i$-token prefixes of the two laws can be coupled),
  computed exactly in fractions.

Khisti et al.'s Fig. 2 (ICLR 2025): three tokens, $p$ uniform, $K = 2$ i.i.d. drafts from
$q = (1/3, q_2, 2/3 - q_2)$ (left) and $q = (1/6, q_2, 5/6 - q_2)$ (right). For each $q_2$,
the probability that a draft is accepted: the optimum $\alpha^*$
(`eqx_specdec.evaluation.optimal_acceptance`), and SpecInfer's rule, SpecTr's K-SEQ and importance
sampling at a root with two children, by exact quadrature.

`tests/test_paper_numbers.py` checks the fractions against the papers' values, the
figure's optimum against the closed form of its panels, and the committed tables against
this script's output.
"""

import pathlib
from fractions import Fraction
from math import comb

import numpy as np

import eqx_specdec as es


DOCS = pathlib.Path(__file__).parent.parent / "docs"
OUT = DOCS / "paper_numbers_table.txt"
FIG2_TABLE = DOCS / "khisti_fig2_table.txt"
FIG2_PLOT = DOCS / "images" / "khisti_fig2.png"
P = (Fraction(1, 3), Fraction(2, 3))
Q = (Fraction(2, 3), Fraction(1, 3))
GAMMAS = (2, 3, 4)
BLOCK = es.Verifier(es.BlockRatioTest(), es.LastSuccessCounter())


def alpha() -> Fraction:
    """The standard rule's acceptance at one position: $\\sum_v \\min(p(v), q(v))$."""
    return sum(min(a, b) for a, b in zip(P, Q))


def standard_exact(gamma: int) -> Fraction:
    """Expected accepted draft tokens of the standard rule: $\\sum_{i=1}^G \\alpha^i$."""
    return sum(alpha() ** i for i in range(1, gamma + 1))


def leviathan(gamma: int) -> Fraction:
    """Leviathan et al.'s Eq. 1: expected tokens per step, $(1 - a^{G+1}) / (1 - a)$."""
    a = alpha()
    return (1 - a ** (gamma + 1)) / (1 - a)


def bound(gamma: int) -> Fraction:
    """$\\sum_{i=1}^G \\sum_{x_{1:i}} \\min(p(x_{1:i}), q(x_{1:i}))$, exactly: a prefix
    with $j$ first tokens has probability $p_0^j p_1^{i-j}$ under $p$."""
    total = Fraction(0)
    for i in range(1, gamma + 1):
        for j in range(i + 1):
            p = P[0] ** j * P[1] ** (i - j)
            q = Q[0] ** j * Q[1] ** (i - j)
            total += comb(i, j) * min(p, q)
    return total


def measured(gamma: int) -> tuple[float, float, float]:
    """Expected accepted draft tokens of the standard rule and of block verification
    by exact quadrature, and block verification's largest error against $p$."""
    p = np.tile(np.asarray(P, np.float64), (gamma + 1, 1))
    q = np.tile(np.asarray(Q, np.float64), (gamma, 1))
    standard = es.evaluation.emission_by_quadrature(es.Verifier(), q, p)
    block = es.evaluation.emission_by_quadrature(BLOCK, q, p)
    return (
        float(standard.reached[1:].sum()),
        float(block.reached[1:].sum()),
        float(block.max_error(p)),
    )


def block_exact(measured_value: float) -> Fraction:
    """The fraction a measured value is, to the quadrature's rounding (denominators
    $3^G$ on this toy)."""
    return Fraction(measured_value).limit_denominator(1000)


def table() -> str:
    header = (
        "| G | standard, exact | standard, measured | block, measured (as a fraction) "
        "| upper bound, exact | Leviathan's Eq. 1 | 1 + standard, measured "
        "| block's largest error vs $p$ |\n|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for gamma in GAMMAS:
        standard, block, error = measured(gamma)
        rows.append(
            f"| {gamma} | {standard_exact(gamma)} | {standard:.7f} "
            f"| {block:.7f} ({block_exact(block)}) | {bound(gamma)} "
            f"| {leviathan(gamma)} | {1 + standard:.7f} "
            f"| {'below 1e-6' if error < 1e-6 else f'{error:.1e}'} |"
        )
    return header + "\n".join(rows) + "\n"


# Khisti et al.'s Fig. 2: the first draft probability of each panel, and the q2 of the
# table (the plot samples each panel finely).
FIG2_PANELS = {"left": Fraction(1, 3), "right": Fraction(1, 6)}
FIG2_Q2 = (
    Fraction(0), Fraction(1, 12), Fraction(1, 6), Fraction(1, 4), Fraction(1, 3),
    Fraction(1, 2),
)  # fmt: skip
FIG2_RULES = {
    "SpecInfer": es.IIDCandidates(),
    "SpecTr (K-SEQ)": es.SpecTrKSeq(),
    "importance sampling": es.ImportanceSampling(2),
}


def fig2_draft(panel: str, q2: float) -> np.ndarray:
    first = float(FIG2_PANELS[panel])
    return np.array([first, q2, 1 - first - q2])


def fig2_point(panel: str, q2: float) -> dict[str, float]:
    """The optimum and each rule's root acceptance (exact quadrature) at one $q_2$."""
    p = np.full(3, 1 / 3)
    q = fig2_draft(panel, q2)
    values = {"optimum": float(es.evaluation.optimal_acceptance(p, q, 2))}
    for name, rule in FIG2_RULES.items():
        result = es.evaluation.evaluate_verifier(
            es.TreeVerifier(rule, tree=(-1, -1)),
            np.tile(q, (3, 1)),
            np.tile(p, (3, 1)),
            method="quadrature",
        )
        values[name] = result.root_acceptance
    return values


def fig2_table() -> str:
    names = ["optimum", *FIG2_RULES]
    header = (
        "| panel, $q$ | $q_2$ | " + " | ".join(names) + " |\n"
        "|---|---|" + "---|" * len(names) + "\n"
    )
    rows = []
    for panel, first in FIG2_PANELS.items():
        for q2 in FIG2_Q2:
            if q2 > 1 - first:
                continue
            values = fig2_point(panel, float(q2))
            cells = " | ".join(f"{values[n]:.4f}" for n in names)
            rows.append(
                f"| {panel}, $({first}, q_2, {1 - first} - q_2)$ | {q2} | {cells} |"
            )
    return header + "\n".join(rows) + "\n"


def fig2_plot(path: pathlib.Path, points: int = 49) -> None:
    """Both panels as curves in $q_2$ (matplotlib, the `[plot]` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 1, figsize=(6, 6.4), sharey=True)
    for axis, (panel, first) in zip(axes, FIG2_PANELS.items()):
        grid = np.linspace(0, 1 - float(first), points)
        curves = [fig2_point(panel, float(q2)) for q2 in grid]
        for name in curves[0]:
            axis.plot(grid, [c[name] for c in curves], label=name)
        axis.set_title(f"q = ({first}, q2, {1 - first} - q2)")
        axis.set_xlabel("q2")
        axis.grid(alpha=0.3)
    for axis in axes:
        axis.set_ylabel("P(a draft is accepted)")
    axes[0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


if __name__ == "__main__":
    text = table()
    OUT.write_text(text)
    print(text, end="")
    text = fig2_table()
    FIG2_TABLE.write_text(text)
    print(text, end="")
    fig2_plot(FIG2_PLOT)
