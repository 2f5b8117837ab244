"""Fails if the built site cannot be read offline, from disk (`file://`).

- No script, stylesheet or font loads from the network: KaTeX ships inside the site and
  Material's Google Fonts are switched off (`theme.font: false`). Plain hyperlinks to other
  sites are fine.
- Every internal link and asset (`href`, `src`) resolves to a file of the site: no
  directory URLs, which a browser shows as a directory listing from disk
  (`use_directory_urls: false`), and no missing page or image.
- Search works without a server: the offline plugin's search index is in the site.
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
links = re.compile(r"\s(?:href|src)=\"([^\"]*)\"", re.I)
checked = 0
# 404.html is only ever shown by a server (its links are absolute, from the site's root).
for page in (p for p in pages if p.name != "404.html"):
    for target in links.findall(page.read_text()):
        if not target or target.startswith(("#", "mailto:", "javascript:", "data:")):
            continue
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("//"):
            continue  # another site: a plain hyperlink
        path = target.split("#", 1)[0].split("?", 1)[0]
        if not path:
            continue
        resolved = (page.parent / path).resolve()
        checked += 1
        if not resolved.is_file():
            what = "a directory" if resolved.is_dir() else "missing"
            problems.append(f"{page.relative_to(site)}: link {target!r} is {what}")
if not (site / "search" / "search_index.js").is_file():
    problems.append("no search/search_index.js: is the offline plugin on?")
math_pages = [p for p in pages if 'class="arithmatex"' in p.read_text()]
if not math_pages:
    problems.append("no page holds math: is pymdownx.arithmatex configured?")
if problems:
    print("The docs need the network:", *problems, sep="\n  ")
    sys.exit(1)
print(
    f"docs offline check: {len(pages)} pages, {len(math_pages)} with math, no remote "
    f"loads, {checked} internal links and assets all resolve to files"
)
