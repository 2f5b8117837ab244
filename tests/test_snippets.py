"""Every Python code block of README.md and of the docs pages runs as written, in the raw
Markdown as on the site: no block includes a file (`--8<--`, which a reader of the raw file
would paste as code), and each block imports what it uses.

A page's blocks run in order in one namespace, as a reader pastes them one after another;
the inputs they need are defined in a visible block of the page itself (most with
`eqx_specdec.example_inputs`), and every module a block uses is imported in the block
itself. A block may be marked as a sketch that cannot run here by an HTML comment on the
line before it, `<!-- not run: REASON -->`; the reasons are listed below, and a new one
fails this test until it is listed.

Each block is also fed line by line to the interactive interpreter, as a reader pasting it
at the Python prompt does (where a blank line ends a class or function body): README's
blocks run there, the other pages' are compiled statement by statement as the prompt would
(running them twice would only double the suite's time).
"""

import ast
import pathlib
import re

import jax
import pytest


ROOT = pathlib.Path(__file__).parent.parent
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
BLOCK = re.compile(
    r"(?:<!-- not run: (?P<why>.*?) -->\n)?```python\n(?P<code>.*?)```", re.S
)
SKETCHES = {
    "a sketch for several processes (tests/test_multihost.py runs these calls in two)",
    "a sketch with Flax NNX, which the test environment does not install",
    "loads the real model (tests/test_llm.py runs these calls)",
    "reads rows.npz, which the command above writes (tests/test_llm.py runs these calls)",
}


def _blocks(page):
    """`(line, code, why)` for each Python block of `page`."""
    text = page.read_text()
    return [
        (
            text[: match.start("code")].count("\n") + 1,
            match.group("code"),
            match.group("why"),
        )
        for match in BLOCK.finditer(text)
    ]


PAGES_WITH_CODE = [page for page in PAGES if _blocks(page)]


def test_every_page_with_snippets_is_covered():
    names = {page.name for page in PAGES_WITH_CODE}
    assert {"README.md", "variants.md", "trees.md", "scaling_out.md"} <= names


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=lambda p: p.name)
def test_each_block_shows_its_code_and_imports_what_it_uses(page):
    """No include line in a Python block, and no module used that the block itself does
    not import (a name some block of the page binds by `import` is a module)."""
    modules = set()
    for _, code, _ in _blocks(page):
        modules |= _imported(ast.parse(code))
    for line, code, _ in _blocks(page):
        assert "--8<--" not in code, f"{page.name}:{line} includes a file"
        tree = ast.parse(code)
        bound = _imported(tree) | {
            node.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)
        }
        used = {
            node.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
        }
        missing = (used & modules) - bound
        assert not missing, f"{page.name}:{line} uses {sorted(missing)} unimported"


def _imported(tree) -> set:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names.add((alias.asname or alias.name).split(".")[0])
    return names


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=lambda p: p.name)
def test_snippets_run(page):
    namespace = {"__name__": "__snippet__"}
    ran = 0
    for line, code, why in _blocks(page):
        if why is not None:
            assert why in SKETCHES, f"{page.name}:{line}: unlisted sketch {why!r}"
            continue
        if "make_mesh((2, 4)" in code and len(jax.devices()) < 8:
            pytest.fail("the sharding snippet needs the test suite's 8 CPU devices")
        try:
            exec(compile(code, f"{page.name}:{line}", "exec"), namespace)
        except Exception as error:
            raise AssertionError(
                f"{page.name}, the block at line {line} fails: {error!r}"
            ) from error
        ran += 1
    assert ran


class _Console:
    """The interactive interpreter a reader pastes into (`code.InteractiveConsole`): a
    blank line ends a block there. With `run=False` each statement it would run is only
    compiled (`test_snippets_run` already ran every block)."""

    def __init__(self, namespace: dict, run: bool):
        import code as interactive

        class Console(interactive.InteractiveConsole):
            def runcode(self, compiled):
                if run:
                    super().runcode(compiled)

        self.console = Console(namespace)

    def paste(self, code: str) -> str:
        """Feeds `code` line by line and returns what the interpreter printed as errors."""
        import contextlib
        import io

        errors = io.StringIO()
        with contextlib.redirect_stderr(errors):
            more = False
            for line in code.splitlines():
                more = self.console.push(line)
            if more:
                self.console.push("")
        return errors.getvalue()


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=lambda p: p.name)
def test_snippets_paste_into_the_python_prompt(page):
    # Every block, sketches included (a reader pastes those too). README's blocks also
    # run, pasted: they are the first a newcomer tries.
    console = _Console({"__name__": "__console__"}, run=page.name == "README.md")
    for line, code, _ in _blocks(page):
        errors = console.paste(code)
        assert not errors, f"{page.name}:{line} fails when pasted:\n{errors}"
