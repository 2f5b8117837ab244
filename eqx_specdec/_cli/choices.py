"""What the command line offers: its verifiers and how the demo drafts for each."""

import sys
from typing import Literal, NamedTuple

from .._chain.verifier import Verifier
from .._proposal.abstract_proposal import default_proposal
from .._proposal.chain import Chain
from .._proposal.draft_length import FixedDraftLength, StopWhenUnlikely
from .._stages.block import BlockRatioTest, LastSuccessCounter
from .._stages.greedy import ArgmaxSampler, GreedyRatioTest
from .._stages.gumbel import GumbelSampler
from .._stages.threshold_rule import LenientRatioTest
from .._stages.typical import TypicalRatioTest, TypicalSampler
from .._tree.abstract_tree_verifier import AbstractTreeVerifier
from .._tree.multi_draft import GreedyMultiDraft
from .._tree.node_rules import IIDCandidates
from .._tree.top_down import TreeVerifier
from .._tree.traversal import TraversalVerifier


class Choice(NamedTuple):
    """One verifier the command line offers, and how the demo drafts for it."""

    verifier: Verifier | AbstractTreeVerifier
    drafts: str  # the demo table's "drafts" column
    description: str
    drafting: Literal["sample", "argmax"] = "sample"

    @property
    def is_tree(self) -> bool:
        """Whether the verifier's family drafts trees: its default proposal (each family
        registers its own) is not a chain."""
        return not isinstance(default_proposal(self.verifier), Chain)

    def proposal(self, gamma: int) -> Chain | None:
        """The `proposal` of `speculative_decode` for this choice: a chain of `gamma`
        tokens, or `None` for a tree verifier (it drafts the tree it holds)."""
        return None if self.is_tree else Chain(gamma, self.drafting)


def verifiers(lenience: float) -> dict[str, Choice]:
    typical = TypicalRatioTest()
    return {
        "standard": Choice(Verifier(), "sample", "standard rule, sampled drafts"),
        "one-hot": Choice(
            Verifier(),
            "argmax",
            "standard rule, argmax drafter (one-hot)",
            drafting="argmax",
        ),
        "block": Choice(
            Verifier(BlockRatioTest(), LastSuccessCounter()),
            "sample",
            "block verification",
        ),
        "greedy": Choice(
            Verifier(GreedyRatioTest(), residual_sampler=ArgmaxSampler()),
            "argmax",
            "greedy (temperature 0)",
            drafting="argmax",
        ),
        "lenient": Choice(
            Verifier(LenientRatioTest(lenience)),
            "sample",
            f"lenience {lenience} (lossy)",
        ),
        "typical": Choice(
            Verifier(typical, residual_sampler=ArgmaxSampler()),
            "sample",
            "typical acceptance (lossy)",
        ),
        "typical-sampled": Choice(
            Verifier(typical, residual_sampler=TypicalSampler()),
            "sample",
            "typical, sampled correction (lossy)",
        ),
        "gumbel": Choice(
            Verifier(residual_sampler=GumbelSampler()),
            "sample",
            "standard rule, Gumbel-max correction",
        ),
        "tree": Choice(
            TreeVerifier(IIDCandidates(), tree=DEMO_TREE),
            "tree 2 x 4",
            "2 i.i.d. candidates at the root, each continued to depth 4",
        ),
        "traversal": Choice(
            TraversalVerifier(tree=DEMO_TREE),
            "tree 2 x 4",
            "traversal verification of the same tree (drafted without replacement)",
        ),
        "multi-draft": Choice(
            TreeVerifier(GreedyMultiDraft(2), tree=DEMO_TREE),
            "tree 2 x 4",
            "greedy multi-draft, K = 2 at every node, on the same tree (the root's "
            "children: one sampled from the rest, then the draft's top token; a chain "
            "node's one child is the sampled one)",
        ),
    }


# Two branches of depth 4: 8 draft tokens, at most 4 accepted per step.
DEMO_TREE = (-1, 0, 1, 2, -1, 4, 5, 6)


VERIFIER_NAMES = tuple(verifiers(0.5))
# `evaluate` measures one verification step of a chain.
CHAIN_NAMES = tuple(n for n, c in verifiers(0.5).items() if not c.is_tree)
# The quick demo's verifiers (the default): a chain and a tree.
DEMO_QUICK = ("standard", "tree")
# `demo --full`: every family.
DEMO_DEFAULT = (
    "standard",
    "one-hot",
    "block",
    "tree",
    "traversal",
    "multi-draft",
    "greedy",
    "typical",
)


def fail(message: str, command: str):
    """Exits with one line on standard error, as argparse does for its own errors."""
    print(f"eqx-specdec {command}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


# The demo's draft-length policies, with the standard rule: fixed lengths and the
# stopping rule with either predictor, drafting at most the demo's `--gamma` tokens.
DRAFT_LENGTH_CAP = 8
DRAFT_LENGTH_DEFAULT = (
    "fixed-1",
    "fixed-2",
    "fixed-4",
    "fixed-8",
    "confidence-0.5",
    "oracle-0.5",
)
DRAFT_LENGTH_FORMS = "fixed-G (G = 1..8), confidence-H or oracle-H (H in [0, 1])"


def draft_length(name: str, gamma: int = DRAFT_LENGTH_CAP):
    """`(policy, gamma)` for a policy name (a stopping rule drafts at most `gamma`), or
    `None` if the name is not one."""
    kind, _, value = name.partition("-")
    try:
        number = float(value)
    except ValueError:
        return None
    if kind == "fixed" and number.is_integer() and 1 <= number <= DRAFT_LENGTH_CAP:
        return FixedDraftLength(), int(number)
    if kind in ("confidence", "oracle") and 0 <= number <= 1:
        return StopWhenUnlikely(number, kind), gamma
    return None
