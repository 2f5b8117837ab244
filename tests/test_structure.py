"""The package's structure: every public class abstract or final, capabilities declared
on the abstract bases, no import cycles, no module-level mutable state, no special cases
of the library's own stages by name."""

import ast
import collections
import inspect
import pathlib
import subprocess
import sys
import warnings

import equinox as eqx
import pytest

import eqx_specdec
import eqx_specdec.demo
from eqx_specdec._capabilities import has_capability


def _public_classes(module):
    return [
        obj
        for name, obj in vars(module).items()
        if inspect.isclass(obj)
        and not name.startswith("_")
        and not issubclass(obj, (Exception, eqx.Enumeration))
    ]


PUBLIC_CLASSES = [
    cls
    for module in (
        eqx_specdec,
        eqx_specdec.evaluation,
        eqx_specdec.families,
        eqx_specdec.models,
        eqx_specdec.demo,
    )
    for cls in _public_classes(module)
]
PACKAGE = pathlib.Path(eqx_specdec.__file__).parent
MODULES = sorted(PACKAGE.rglob("*.py"))


def _is_abstract(cls) -> bool:
    return bool(getattr(cls, "__abstractmethods__", ()))


def test_the_public_api_is_what_the_docs_list():
    names = {cls.__name__ for cls in _public_classes(eqx_specdec)}
    assert names == {
        "AbstractRatioTest", "AbstractThresholdRule", "RatioTest",
        "AbstractPrefixCounter", "PrefixCounter",
        "AbstractResidualSampler", "ResidualSampler",
        "AbstractTokenAssembler", "TokenAssembler",
        "Verdict", "Verifier", "Warp",
        "GreedyRatioTest", "LenientRatioTest", "TypicalRatioTest", "BlockRatioTest",
        "LastSuccessCounter", "AbstractNodeRule", "IIDCandidates",
        "WithoutReplacementCandidates", "DeterministicCandidates", "TreeVerifier",
        "AbstractTreeVerifier", "TraversalVerifier", "GreedyMultiDraft", "SpecHub",
        "SpecTrKSeq", "ImportanceSampling", "ResidualState", "DynamicTree",
        "ArgmaxSampler", "GumbelSampler", "TypicalSampler",
        "DecodeResult", "ShardedVerifier", "AbstractVerifier",
        "VocabShard", "RowContext", "RowSums", "SyntheticRatioTest",
        "AbstractDraftLength", "FixedDraftLength", "StopWhenUnlikely",
        "TopNRelaxedRatioTest", "FLyRatioTest", "ScheduledRatioTest",
        "AbstractProposal", "Chain", "Tree",
        "LogProbs",
        "Probabilities", "Logits", "Draft", "Uniforms", "Verification",
    }  # fmt: skip
    # The measuring tools, and the models and vocabularies, in their submodules.
    assert {cls.__name__ for cls in _public_classes(eqx_specdec.evaluation)} == {
        "ChiSquare", "EmissionEstimate", "Evaluation", "Speedup",
    }  # fmt: skip
    assert {cls.__name__ for cls in _public_classes(eqx_specdec.models)} == {
        "AbstractCachedModel", "AbstractPackedModel", "Packing", "PromptLookupDraft",
        "SuffixDraft", "Tempered", "Warped", "DraftVocabulary", "SharedVocabulary",
        "StringLevelDraft",
    }  # fmt: skip
    assert {cls.__name__ for cls in _public_classes(eqx_specdec.families)} == {
        "AbstractEvaluationFamily", "Problem", "StepOptions",
    }  # fmt: skip
    # At most 65 top-level names: what users call (the demo's and the real model's
    # submodules load on first use).
    names = [
        name
        for name, obj in vars(eqx_specdec).items()
        if not name.startswith("_")
        and not (
            inspect.ismodule(obj) and name not in ("evaluation", "families", "models")
        )
    ]
    assert len(names) <= 65, sorted(names)
    # The demo's models, corpus, codec and training live in their own submodule.
    assert {cls.__name__ for cls in _public_classes(eqx_specdec.demo)} == {
        "NGramModel",
        "Transformer",
    }
    assert issubclass(eqx_specdec.MissingCapabilityError, NotImplementedError)
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
def test_abstract_bases_declare_abstract_methods_and_capabilities(abstract):
    """A base has abstract methods; each of its capabilities is marked by the one
    capability mechanism: a class that does not override it lacks it, and its default
    raises MissingCapabilityError naming it. (Its other methods have working defaults:
    `in_decoding_loop`, `draw_and_sum`, `checked_call`, ...)"""
    assert abstract.__abstractmethods__
    for name, member in vars(abstract).items():
        if not getattr(member, "__capability_default__", False):
            continue
        assert not has_capability(_Bare.of(abstract), name)
        with pytest.raises(eqx_specdec.MissingCapabilityError, match=name):
            member(None)


class _Bare:
    """Stand-ins for "an object of a class that implements nothing optional"."""

    @staticmethod
    def of(abstract):
        return type("Bare" + abstract.__name__, (), dict(vars(abstract)))()


def _imports(path: pathlib.Path):
    """(module-level?, imported eqx_specdec module) for each import in `path`."""
    tree = ast.parse(path.read_text())
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    package = parts[:-1] if parts[-1] != "__init__" else parts
    top_level = set(map(id, tree.body))
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        base = package[: len(package) - node.level + 1]
        target = ".".join(base + tuple(node.module.split(".") if node.module else ()))
        yield id(node) in top_level, target


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_the_package_imports_have_no_cycle_and_no_function_level_imports():
    graph = {}
    for path in MODULES:
        edges = set()
        for top_level, target in _imports(path):
            assert top_level, f"{path.name} imports {target} inside a function"
            edges.add(target)
        graph[_module_name(path)] = edges
    # Depth-first search for a cycle among the package's own modules.
    state = {}

    def visit(module, trail):
        state[module] = "open"
        for target in graph.get(module, ()):
            if target not in graph or target == "eqx_specdec":
                continue
            if state.get(target) == "open":
                raise AssertionError(f"import cycle: {' -> '.join(trail + [target])}")
            if target not in state:
                visit(target, trail + [target])
        state[module] = "done"

    for module in graph:
        if module not in state:
            visit(module, [module])


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_every_module_compiles_without_warnings(path):
    """No invalid escape sequence (a docstring's `\\s` meant as LaTeX) or other
    compile-time warning: Python will make them errors."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compile(path.read_text(), str(path), "exec")
    # Nor an escape that is valid Python but not the LaTeX meant (`\\tilde` written
    # `\tilde` is a tab, `\\beta` written `\beta` a backspace): no control character in
    # any docstring.
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for node in ast.walk(ast.parse(path.read_text())):
        doc = ast.get_docstring(node, clean=False) if isinstance(node, kinds) else None
        bad = set(doc or "") & set("\t\a\b\f\v\r")
        assert not bad, (path.name, getattr(node, "name", "module"), bad)


def test_no_module_level_mutable_state():
    for path in MODULES:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                value = node.value
                mutable = isinstance(
                    value, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp)
                )
                call = isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                mutable |= call and value.func.id in ("list", "dict", "set")
                assert not mutable, f"{path.name}:{node.lineno} {ast.unparse(node)}"


_MUTABLE = (dict, list, set, collections.OrderedDict, collections.deque)


def _package_closure(value):
    """The closure cells of a function and of the functions it wraps, where they were
    written in the package (not the wrappers of the test run's runtime type checks)."""
    while value is not None:
        code = getattr(value, "__code__", None)
        if code is not None and code.co_filename.startswith(str(PACKAGE)):
            yield from value.__closure__ or ()
        value = getattr(value, "__wrapped__", None)


def test_no_module_level_cache_but_the_compiled_programs():
    """At run time too: no module-level object of the package, and no closure of a
    module-level function, holds a mutable container (the compiled programs are
    Equinox's `eqx.filter_jit` wrappers, whose caches are JAX's), and every
    `functools` cache is bounded (the demo's loaders keep their last few results)."""
    import eqx_specdec.demo  # noqa: F401  (its loaders are the package's caches)

    programs, caches = 0, []
    for module in list(sys.modules.values()):
        if not getattr(module, "__name__", "").startswith("eqx_specdec"):
            continue
        for name, value in vars(module).items():
            if name.startswith("__"):
                continue
            assert not isinstance(value, _MUTABLE), f"{module.__name__}.{name}"
            if hasattr(value, "cache_parameters"):
                bound = value.cache_parameters()["maxsize"]
                assert bound is not None and bound <= 8, f"{module.__name__}.{name}"
                caches.append(name)
            for cell in _package_closure(value):
                held = cell.cell_contents
                assert not isinstance(held, _MUTABLE), f"{module.__name__}.{name}"
                programs += type(held).__name__ == "_JitWrapper"
            programs += type(value).__name__ == "_JitWrapper"
    assert programs >= 5  # the entry points were found
    assert {"builtin_models", "builtin_corpus", "builtin_transformers"} <= set(caches)


def _concrete_library_stages() -> dict:
    """Concrete stage classes, by name, with the file that defines each."""
    bases = (
        eqx_specdec.AbstractRatioTest,
        eqx_specdec.AbstractPrefixCounter,
        eqx_specdec.AbstractResidualSampler,
        eqx_specdec.AbstractTokenAssembler,
        eqx_specdec.AbstractNodeRule,
    )
    return {
        cls.__name__: pathlib.Path(inspect.getfile(cls)).name
        for cls in PUBLIC_CLASSES
        if issubclass(cls, bases) and not cls.__name__.startswith("Abstract")
    }


def test_no_type_test_against_a_library_stage_outside_its_own_file():
    """What the library knows about a stage is on the stage's class: no `isinstance`
    or `type(...)` ladder over the library's own stages elsewhere."""
    stages = _concrete_library_stages()
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            names = set()
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") in (
                "isinstance",
                "issubclass",
            ):
                names = {
                    n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)
                }
            if isinstance(node, ast.Compare) and any(
                isinstance(n, ast.Call) and getattr(n.func, "id", "") == "type"
                for n in ast.walk(node)
            ):
                names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            for name in names & set(stages):
                assert stages[name] == path.name, (
                    f"{path.name}:{node.lineno} tests against {name}"
                )


def test_benchmarks_live_outside_the_installed_package():
    assert not list(PACKAGE.glob("bench*.py"))
    assert (PACKAGE.parent / "benchmarks" / "bench.py").is_file()


def test_the_library_does_not_import_the_demo():
    """`import eqx_specdec` loads no demo model, corpus or weights; `eqx_specdec.demo`
    imports the submodule on first use."""
    code = (
        "import sys, eqx_specdec; "
        "assert not any(m.startswith('eqx_specdec.demo') for m in sys.modules); "
        "assert eqx_specdec.demo.VOCABULARY[1] == 'a'; "
        "assert 'eqx_specdec.demo' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_tools_ask_no_verifier_its_kind():
    """The evaluation tools and the decoding loop reach each verifier family through
    one open dispatch (`evaluation_family`, `default_proposal`, `verification_step`):
    no branch on `isinstance` of a verifier kind there (an argument check that raises
    is not a branch), so a family of one's own registers and is as first-class as the
    library's chains and trees."""
    kinds = {"AbstractTreeVerifier", "AbstractVerifier", "TreeVerifier", "Verifier"}
    for folder in ("_evaluation", "_decoding"):
        for path in sorted((PACKAGE / folder).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, (ast.If, ast.IfExp)):
                    continue
                if isinstance(node, ast.If) and isinstance(node.body[0], ast.Raise):
                    continue
                for call in ast.walk(node.test):
                    if (
                        isinstance(call, ast.Call)
                        and getattr(call.func, "id", None) == "isinstance"
                        and len(call.args) == 2
                    ):
                        named = {getattr(n, "id", None) for n in ast.walk(call.args[1])}
                        assert not named & kinds, f"{path.name}:{node.lineno}"
