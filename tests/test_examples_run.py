"""The example scripts shown in the README and the docs run and print what they claim."""

import pathlib
import runpy

import pytest


EXAMPLES = pathlib.Path(__file__).parent.parent / "examples"


@pytest.mark.parametrize(
    "script, expected",
    [
        ("quickstart.py", ["num_accepted:", "tokens:"]),
        (
            "custom_stage.py",
            [
                "lenience 1.00:",
                "lenience 0.25:",
                "(quadrature): distance from the target",
            ],
        ),
        ("end_to_end.py", ["'the ' -> '", "tokens per target call:", "theory:"]),
        ("your_own_variant.py", ["rescale=True", "): lossless", "): NOT lossless"]),
    ],
)
def test_example_runs(script, expected, capsys):
    runpy.run_path(str(EXAMPLES / script), run_name="__main__")
    printed = capsys.readouterr().out
    for text in expected:
        assert text in printed
