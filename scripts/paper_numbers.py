"""Published numbers reproduced by the library: the table on the docs' "Published numbers"
page (`docs/paper_numbers_table.txt`).

    python scripts/paper_numbers.py

On the binary toy of Sun et al. (ICLR 2025): a context-free target $p = (1/3, 2/3)$ and
draft $q = (2/3, 1/3)$ at every position, drafts of $G = 2, 3, 4$ tokens. For each $G$:

- the expected accepted draft tokens of the standard rule and of block verification,
  measured by the library's exact quadrature over the uniforms
  (`eqx_specdec.emission_by_quadrature`), beside their exact fractions;
- Leviathan et al.'s Eq. 1, the expected tokens per step
  $(1 - \\alpha^{G + 1}) / (1 - \\alpha)$ with $\\alpha = \\sum_v \\min(p(v), q(v))$,
  beside the measured $1 + E[n]$ of the standard rule;
- the upper bound on any verifier's expected accepted tokens,
  $\\sum_{i=1}^{G} \\sum_{x_{1:i}} \\min(p(x_{1:i}), q(x_{1:i}))$ (no verifier accepts
  $i$ tokens more often than the $i$-token prefixes of the two laws can be coupled),
  computed exactly in fractions.

`tests/test_paper_numbers.py` checks the fractions against the papers' values, and the
committed table against this script's output.
"""

import pathlib
from fractions import Fraction
from math import comb

import numpy as np

import eqx_specdec as es


OUT = pathlib.Path(__file__).parent.parent / "docs" / "paper_numbers_table.txt"
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
    standard = es.emission_by_quadrature(es.Verifier(), q, p)
    block = es.emission_by_quadrature(BLOCK, q, p)
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


if __name__ == "__main__":
    text = table()
    OUT.write_text(text)
    print(text, end="")
