"""Fails if a page of the built site does not fit a laptop, or reads badly on a phone.

Opens every page from disk (`file://`) in headless Chromium at a laptop's width (1280 px)
and a phone's (412 px), and measures in the page itself, after its scripts ran:

- at 1280 px, every table and every code block: its scroll width against its client
  width. None may need sideways scrolling (no hidden column, no cut line);
- at 412 px, the page itself: it may not scroll sideways (tables scroll inside their own
  wrapper, as Material makes them), and every figure is shown at no less than three
  quarters of its natural width, so that its labels stay legible (a figure wider than the
  phone scrolls inside its own wrapper instead of shrinking).

    python .ci/check_docs_layout.py site [screenshots/]

With a second argument, it also writes a screenshot of each page at each width there, for a
person to look at. Needs Chromium (`apt-get install chromium`); `.ci/run` runs it when
Chromium is installed or installable, and says why not otherwise.
"""

import base64
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time


WIDTHS = {"laptop": 1280, "phone": 412}
# Measured in the page once it has loaded (KaTeX renders on DOMContentLoaded); the report
# is written into the DOM, where the check reads it.
PROBE = """<script>
window.addEventListener("load", () => {
  const over = (el) => el.scrollWidth - el.clientWidth;
  const report = {tables: 0, code: 0, math: 0, overflowing: [], figures: []};
  document.querySelectorAll("article table").forEach((table) => {
    report.tables += 1;
    const wrap = table.closest(".md-typeset__scrollwrap") || table.parentElement;
    const extra = Math.max(over(wrap), table.scrollWidth - wrap.clientWidth);
    if (extra > 1) {
      const head = table.rows.length ? table.rows[0].textContent : "";
      report.overflowing.push(["table", head.trim().replace(/\\n\\s*/g, " | ").slice(0, 60), extra]);
    }
  });
  document.querySelectorAll("article pre > code").forEach((code) => {
    report.code += 1;
    if (over(code) > 1) {
      const first = code.textContent.trim().split("\\n")[0].slice(0, 40);
      report.overflowing.push(["code", first, over(code)]);
    }
  });
  document.querySelectorAll("article .katex-display").forEach((math) => {
    report.math += 1;
    const box = math.parentElement;
    if (over(box) > 1) report.overflowing.push(["math", box.textContent.trim().slice(0, 40), over(box)]);
  });
  document.querySelectorAll("article img").forEach((img) => {
    report.figures.push([img.getAttribute("src"), img.naturalWidth, img.getBoundingClientRect().width]);
  });
  report.page = document.documentElement.scrollWidth - document.documentElement.clientWidth;
  document.body.setAttribute("data-layout", JSON.stringify(report));
});
</script>"""


def _browser() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class _Browser:
    """One headless Chromium, driven over its DevTools pipe (JSON messages ending in a
    NUL byte: commands on its fd 3, replies and events on its fd 4). Every page at every
    width is measured in this one process: launching Chromium once per page and width
    cost about a CPU-second each, most of the check's time."""

    def __init__(self, browser: str):
        commands_read, self._commands = os.pipe()
        self._replies, replies_write = os.pipe()
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
        # The child's fd 3 and 4 are its ends of the pipes, moved there by the shell.
        self._process = subprocess.Popen(
            [
                "/bin/sh", "-c",
                f'exec 3<&{commands_read} 4>&{replies_write}; exec "$0" "$@"',
                browser, *flags, "--remote-debugging-pipe", "about:blank",
            ],
            pass_fds=(commands_read, replies_write),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        os.close(commands_read)
        os.close(replies_write)
        self._buffer = b""
        self._next_id = 0
        target = self._send("Target.createTarget", url="about:blank")["targetId"]
        self._session = self._send(
            "Target.attachToTarget", targetId=target, flatten=True
        )["sessionId"]
        self._send("Page.enable", session=True)
        self._send("Emulation.setScrollbarsHidden", session=True, hidden=True)

    def _read(self) -> dict:
        while b"\0" not in self._buffer:
            chunk = os.read(self._replies, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed its DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def _send(self, method: str, session: bool = False, **params) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self._session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def _wait_for(self, event: str):
        while self._read().get("method") != event:
            pass

    def measure(self, page: pathlib.Path, width: int, shot: pathlib.Path | None):
        """The probe's report of `page` at `width` px (None if it reported nothing),
        after the page and its scripts loaded; a screenshot to `shot` if given."""
        self._send(
            "Emulation.setDeviceMetricsOverride", session=True,
            width=width, height=900, deviceScaleFactor=1, mobile=False,
        )  # fmt: skip
        self._send("Page.navigate", session=True, url=page.as_uri())
        self._wait_for("Page.loadEventFired")
        report = None
        for _ in range(100):  # the probe writes its report from a load listener
            report = self._send(
                "Runtime.evaluate", session=True, returnByValue=True,
                expression="document.body && document.body.getAttribute('data-layout')",
            )["result"].get("value")  # fmt: skip
            if report is not None:
                break
            time.sleep(0.02)
        if shot is not None:
            data = self._send("Page.captureScreenshot", session=True)["data"]
            shot.write_bytes(base64.b64decode(data))
        return None if report is None else json.loads(report)

    def close(self):
        os.close(self._commands)
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
        os.close(self._replies)


def check(site: pathlib.Path, browser: str, shots: pathlib.Path | None = None):
    """Measures every page of `site`: `(problems, summary)`."""
    with tempfile.TemporaryDirectory() as tmp:
        # A copy of the site with the probe in every page, so that links and assets
        # resolve as they do in the real one.
        copy = pathlib.Path(tmp) / "site"
        shutil.copytree(site, copy)
        pages = sorted(p for p in copy.rglob("*.html") if p.name != "404.html")
        for page in pages:
            page.write_text(page.read_text().replace("</body>", PROBE + "</body>", 1))
        jobs = [
            (page, label, width) for label, width in WIDTHS.items() for page in pages
        ]
        chromium = _Browser(browser)
        try:
            results = []
            for page, label, width in jobs:
                name = str(page.relative_to(copy)).replace("/", "-")
                name = name.removesuffix(".html")
                shot = shots / f"{name}-{label}.png" if shots is not None else None
                report = chromium.measure(page, width, shot)
                results.append(((page, label, width), report))
        finally:
            chromium.close()
    problems, counts = [], {"tables": 0, "code": 0, "math": 0, "figures": 0}
    for (page, label, width), report in results:
        name = page.relative_to(copy)
        if report is None:
            problems.append(f"{name} at {width} px: the page reported nothing")
            continue
        if label == "laptop":
            for key in ("tables", "code", "math"):
                counts[key] += report[key]
            counts["figures"] += len(report["figures"])
            for kind, what, extra in report["overflowing"]:
                problems.append(
                    f"{name} at {width} px: {kind} {what!r} overflows by {extra} px"
                )
        if report["page"] > 1:
            problems.append(
                f"{name} at {width} px: the page scrolls sideways by {report['page']} px"
            )
        for src, natural, shown in report["figures"]:
            if natural and shown < 0.75 * natural:
                problems.append(
                    f"{name} at {width} px: figure {src} shown at {shown:.0f} of "
                    f"{natural} px, too small to read"
                )
    summary = (
        f"{len(pages)} pages at {' and '.join(f'{w} px' for w in WIDTHS.values())}; "
        f"measured at 1280 px: {counts['tables']} tables, {counts['code']} code blocks, "
        f"{counts['math']} displayed equations, {counts['figures']} figures"
    )  # fmt: skip
    return problems, summary


# The self-test: a page that fits, and one whose table, code block and body are too wide.
_TEST_PAGE = """<!doctype html><html><head><meta name="viewport"
content="width=device-width, initial-scale=1"><style>
body {{ margin: 0 }} article {{ width: 90%; }}
.md-typeset__scrollwrap {{ overflow-x: auto }} pre > code {{ display: block; overflow: auto }}
</style></head><body><article>{}</article></body></html>"""
_WIDE = "x" * 400
_FITS = (
    "<div class='md-typeset__scrollwrap'><table><tr><td>a</td></tr></table></div>"
    "<pre><code>short = 1</code></pre>"
)
_OVERFLOWS = (
    f"<div class='md-typeset__scrollwrap'><table><tr><td>{_WIDE}</td></tr></table></div>"
    f"<pre><code>{_WIDE}</code></pre><p style='width: 2000px'>wide</p>"
)


def self_test(browser: str):
    """Exits unless the check passes a page that fits and finds each kind of overflow
    in one that does not (a check that finds nothing must not pass for one that
    works)."""
    with tempfile.TemporaryDirectory() as tmp:
        fits, overflows = pathlib.Path(tmp, "fits"), pathlib.Path(tmp, "overflows")
        for site, body in ((fits, _FITS), (overflows, _OVERFLOWS)):
            site.mkdir()
            (site / "page.html").write_text(_TEST_PAGE.format(body))
        problems, summary = check(fits, browser)
        if problems or "1 tables, 1 code blocks" not in summary:
            sys.exit(
                f"check_docs_layout self-test: a page that fits: {problems}, {summary}"
            )
        found = " ".join(check(overflows, browser)[0])
        for expected in ("1280 px: table", "1280 px: code", "412 px: the page scrolls"):
            if expected not in found:
                sys.exit(
                    f"check_docs_layout self-test: missed {expected!r} in {found!r}"
                )


def main():
    site = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "site").resolve()
    shots = pathlib.Path(sys.argv[2]).resolve() if len(sys.argv) > 2 else None
    browser = _browser()
    if browser is None:
        sys.exit("check_docs_layout: no chromium on PATH (apt-get install chromium)")
    if shots is not None:
        shots.mkdir(parents=True, exist_ok=True)
    self_test(browser)
    problems, summary = check(site, browser, shots)
    print(f"docs layout check (its self-test passed): {summary}")
    if problems:
        print("Pages that do not fit:", *problems, sep="\n  ")
        sys.exit(1)
    print(
        "none overflowing at 1280 px; no page scrolls sideways at 412 px; figures legible"
    )


if __name__ == "__main__":
    main()
