"""Every Python code block of README.md and of the docs pages runs as written.

A page's blocks run in order in one namespace, as a reader pastes them one after another;
the inputs they need are defined in a visible block of the page itself (most with
`eqx_specdec.example_inputs`). Blocks that include a file (`--8<--`) are the example
scripts, run by `test_examples_run.py`. A block may be marked as a sketch that cannot run
here by an HTML comment on the line before it, `<!-- not run: REASON -->`; the reasons are
listed below, and a new one fails this test until it is listed.

Each block is also fed line by line to the interactive interpreter, as a reader pasting it
at the Python prompt does (where a blank line ends a class or function body), with the
example scripts shown as listings: README's blocks run there, the other pages' are compiled
statement by statement as the prompt would (running them twice would only double the
suite's time).
"""

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


def _blocks(page, listings=False):
    """`(line, code, why)` for each Python block of `page`; with `listings`, the blocks
    that include an example script too, with the script's text."""
    found = []
    for match in BLOCK.finditer(page.read_text()):
        code = match.group("code")
        if code.lstrip().startswith("--8<--"):
            if not listings:
                continue
            path = re.search(r'--8<-- "([^":]+)', code).group(1)
            code = (ROOT / path).read_text()
        line = page.read_text()[: match.start("code")].count("\n") + 1
        found.append((line, code, match.group("why")))
    return found


PAGES_WITH_CODE = [page for page in PAGES if _blocks(page)]
PAGES_WITH_LISTINGS = [page for page in PAGES if _blocks(page, listings=True)]


def test_every_page_with_snippets_is_covered():
    names = {page.name for page in PAGES_WITH_CODE}
    assert {"README.md", "variants.md", "trees.md", "scaling_out.md"} <= names


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


@pytest.mark.parametrize("page", PAGES_WITH_LISTINGS, ids=lambda p: p.name)
def test_snippets_paste_into_the_python_prompt(page):
    # Every block, sketches and the example scripts shown as listings included (a reader
    # pastes those too). README's blocks also run, pasted: they are the first a newcomer
    # tries.
    console = _Console({"__name__": "__console__"}, run=page.name == "README.md")
    for line, code, _ in _blocks(page, listings=True):
        errors = console.paste(code)
        assert not errors, f"{page.name}:{line} fails when pasted:\n{errors}"
