"""The docs' layout check (`.ci/check_docs_layout.py`) finds what it is meant to find: a
table or a code block wider than a laptop's page, a page that scrolls sideways on a phone,
a figure shrunk past legibility. It needs Chromium, which CI installs where it can."""

import pathlib
import shutil
import subprocess
import sys

import pytest


ROOT = pathlib.Path(__file__).parent.parent
WIDE = "x" * 400
PAGE = """<!doctype html><html><head><meta name="viewport"
content="width=device-width, initial-scale=1"><style>
body {{ margin: 0 }} article {{ width: 90%; }}
.md-typeset__scrollwrap {{ overflow-x: auto }} pre > code {{ display: block; overflow: auto }}
</style></head><body><article>{}</article></body></html>"""

needs_chromium = pytest.mark.skipif(
    shutil.which("chromium") is None and shutil.which("chromium-browser") is None,
    reason="no Chromium on this machine (apt-get install chromium); .ci/run installs it "
    "where it can and runs the layout check on the built site",
)


def _check(tmp_path, body):
    (tmp_path / "page.html").write_text(PAGE.format(body))
    return subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "check_docs_layout.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )


@needs_chromium
def test_the_layout_check_passes_a_page_that_fits(tmp_path):
    body = (
        "<div class='md-typeset__scrollwrap'><table><tr><td>a</td></tr></table></div>"
    )
    body += "<pre><code>short = 1</code></pre>"
    done = _check(tmp_path, body)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 tables, 1 code blocks" in done.stdout


@needs_chromium
def test_the_layout_check_finds_wide_tables_code_and_pages(tmp_path):
    body = f"<div class='md-typeset__scrollwrap'><table><tr><td>{WIDE}</td></tr></table></div>"
    body += f"<pre><code>{WIDE}</code></pre><p style='width: 2000px'>wide</p>"
    done = _check(tmp_path, body)
    assert done.returncode == 1
    assert "page.html at 1280 px: table" in done.stdout
    assert "page.html at 1280 px: code" in done.stdout
    assert "page.html at 412 px: the page scrolls sideways" in done.stdout
