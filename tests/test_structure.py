"""Every public class is abstract (cannot be instantiated) or final (never subclassed)."""

import inspect
import pathlib
import re

import equinox as eqx
import pytest

import eqx_specdec


PUBLIC_CLASSES = [
    obj
    for name, obj in vars(eqx_specdec).items()
    if inspect.isclass(obj) and not name.startswith("_")
]


def _is_abstract(cls) -> bool:
    return bool(getattr(cls, "__abstractmethods__", ()))


def test_the_public_api_is_what_the_docs_list():
    names = {cls.__name__ for cls in PUBLIC_CLASSES}
    assert names == {
        "AbstractRatioTest", "RatioTest",
        "AbstractPrefixCounter", "PrefixCounter",
        "AbstractResidualSampler", "ResidualSampler",
        "AbstractTokenAssembler", "TokenAssembler",
        "Verdict", "Verifier", "EmissionEstimate", "Warp",
        "GreedyRatioTest", "LenientRatioTest", "TypicalRatioTest", "BlockRatioTest",
        "LastSuccessCounter", "AbstractNodeRule", "IIDCandidates",
        "WithoutReplacementCandidates", "DeterministicCandidates", "TreeVerifier",
        "ArgmaxSampler", "GumbelSampler", "TypicalSampler",
        "DecodeResult", "NGramModel", "ShardedVerifier",
    }  # fmt: skip
    assert callable(eqx_specdec.speculative_accept)
    assert isinstance(eqx_specdec.__version__, str)


@pytest.mark.parametrize("cls", PUBLIC_CLASSES, ids=lambda c: c.__name__)
def test_abstract_or_final(cls):
    assert issubclass(cls, eqx.Module)
    if cls.__name__.startswith("Abstract"):
        assert _is_abstract(cls)
        with pytest.raises(TypeError):
            cls()
    else:
        assert not _is_abstract(cls)
        # No public class (abstract or not) derives from a concrete class.
        for other in PUBLIC_CLASSES:
            if other is not cls:
                assert not issubclass(other, cls), (
                    f"{other.__name__} subclasses {cls.__name__}"
                )
        # Its own bases are abstract ones (or Module itself).
        for base in cls.__mro__[1:]:
            if base.__module__.startswith("eqx_specdec"):
                assert _is_abstract(base), (
                    f"{cls.__name__} derives from concrete {base}"
                )


@pytest.mark.parametrize(
    "abstract",
    [c for c in PUBLIC_CLASSES if c.__name__.startswith("Abstract")],
    ids=lambda c: c.__name__,
)
def test_abstract_bases_declare_only_abstract_methods(abstract):
    assert abstract.__abstractmethods__
    for name, member in vars(abstract).items():
        # Dunder methods (the generated dataclass `__init__`) are not stage methods.
        if inspect.isfunction(member) and not name.startswith("__"):
            assert getattr(member, "__isabstractmethod__", False), name


def test_ci_runs_the_readme_test_command():
    """CI must run exactly the command the README gives for the tests."""
    root = pathlib.Path(__file__).parent.parent
    readme = (root / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, re.S)
    test_commands = [b for b in blocks if "pytest" in b]
    assert len(test_commands) == 1
    ci_lines = (root / ".ci" / "run").read_text().splitlines()
    assert test_commands[0] in ci_lines


def test_docs_snippet_includes_are_well_formed():
    """Every `--8<--` include names a file that exists (a formatter once broke them)."""
    root = pathlib.Path(__file__).parent.parent
    for page in (root / "docs").rglob("*.md"):
        text = page.read_text()
        assert "--8 <" not in text, page
        for target in re.findall(r'^--8<-- "(.*)"$', text, re.M):
            assert (root / target).is_file(), (page, target)
