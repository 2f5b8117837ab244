"""The example script of the docs (`examples/train_draft.py`) runs and prints what it claims."""

import pathlib
import subprocess
import sys

from helpers import default_xla_environment


EXAMPLES = pathlib.Path(__file__).parent.parent / "examples"


def test_training_a_draft_for_acceptance_raises_it():
    """The trained draft beats the maximum-likelihood one on the objective and in the
    decoding loop's measured tokens per target call, as the docs' table says. (Run as a
    user runs it, with XLA's default flags: its 1,000 training steps are the suite's
    heaviest computation, and the suite's quick compilation would slow them 5x.)"""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "train_draft.py")],
        capture_output=True,
        text=True,
        env=default_xla_environment(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {}
    for line in done.stdout.splitlines():
        for name in ("maximum likelihood", "trained"):
            if line.startswith(name):
                rows[name] = [float(v) for v in line[len(name) :].split()]
    (mle_objective, mle_tokens), (objective, tokens) = (
        rows["maximum likelihood"],
        rows["trained"],
    )
    assert objective > mle_objective + 0.1
    assert tokens > mle_tokens + 0.02
