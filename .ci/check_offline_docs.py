"""Fails if the built site loads any script, stylesheet or font from the network.

The docs are read offline too, so KaTeX ships inside the site and Material's Google Fonts
are switched off (`theme.font: false`). Plain hyperlinks to other sites are fine.
"""

import pathlib
import re
import sys


site = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "site")
pages = sorted(site.rglob("*.html"))
loads = re.compile(
    r"<(?:script[^>]*\ssrc|link[^>]*\shref|img[^>]*\ssrc)=\"(https?:)?//[^\"]+\"", re.I
)
problems = [
    f"{page}: {match.group(0)}"
    for page in pages
    for match in loads.finditer(page.read_text())
]
for name in ("katex.min.js", "katex.min.css", "contrib/auto-render.min.js"):
    if not (site / "javascripts" / "katex" / name).is_file():
        problems.append(f"missing javascripts/katex/{name} in the built site")
math_pages = [p for p in pages if 'class="arithmatex"' in p.read_text()]
if not math_pages:
    problems.append("no page holds math: is pymdownx.arithmatex configured?")
if problems:
    print("The docs need the network:", *problems, sep="\n  ")
    sys.exit(1)
print(
    f"docs offline check: {len(pages)} pages, {len(math_pages)} with math, no remote loads"
)
