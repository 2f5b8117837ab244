"""Every Python code block of README.md and of the docs pages runs as written.

A page's blocks run in order in one namespace, as a reader pastes them one after another;
the inputs they need are defined in a visible block of the page itself (most with
`eqx_specdec.example_inputs`). Blocks that include a file (`--8<--`) are the example
scripts, run by `test_examples_run.py`. A block may be marked as a sketch that cannot run
here by an HTML comment on the line before it, `<!-- not run: REASON -->`; the reasons are
listed below, and a new one fails this test until it is listed.
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
}


def _blocks(page):
    found = []
    for match in BLOCK.finditer(page.read_text()):
        code = match.group("code")
        if code.lstrip().startswith("--8<--"):
            continue
        line = page.read_text()[: match.start("code")].count("\n") + 1
        found.append((line, code, match.group("why")))
    return found


PAGES_WITH_CODE = [page for page in PAGES if _blocks(page)]


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


def _paste(code: str, namespace: dict):
    """Feeds `code` line by line to an interactive interpreter, as a reader pasting it
    at the Python prompt does (a blank line ends a block there), and returns the errors
    it printed."""
    import code as interactive
    import contextlib
    import io

    console = interactive.InteractiveConsole(namespace)
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors):
        more = False
        for line in code.splitlines():
            more = console.push(line)
        if more:
            console.push("")
    return errors.getvalue()


def test_the_readme_snippets_paste_into_the_python_prompt():
    namespace = {"__name__": "__console__"}
    for line, code, why in _blocks(ROOT / "README.md"):
        if why is None:
            errors = _paste(code, namespace)
            assert not errors, f"README.md:{line} fails when pasted:\n{errors}"
