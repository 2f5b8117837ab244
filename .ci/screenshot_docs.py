"""Screenshots of a few pages of the built site, opened from disk (`file://`) in headless
Chromium, for a person to look at: the demo figure at the page's width, the wide tables,
code in tables, math. Not part of CI (it needs Chromium: `apt-get install chromium`).

    python .ci/screenshot_docs.py site screenshots/

Writes one PNG per page at a laptop's width (1280 px) and one at a phone's (412 px), and
fails if Chromium writes no image or a blank one.
"""

import pathlib
import shutil
import subprocess
import sys


# Each page and how much of it to capture (pixels of page height at the laptop width).
PAGES = {
    "index.html": 2400,
    "end_to_end.html": 9000,  # down to the demo's table and figure
    "variants.html": 4000,
    "performance.html": 4000,
    "cli.html": 2400,
}
WIDTHS = {"laptop": 1280, "phone": 412}


def main():
    site = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "site").resolve()
    out = pathlib.Path(sys.argv[2] if len(sys.argv) > 2 else "screenshots").resolve()
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        sys.exit("screenshot_docs: no chromium on PATH (apt-get install chromium)")
    out.mkdir(parents=True, exist_ok=True)
    problems = []
    for page, height in PAGES.items():
        for label, width in WIDTHS.items():
            image = out / f"{page.removesuffix('.html')}-{label}.png"
            subprocess.run(
                [browser, "--headless", "--no-sandbox", "--disable-gpu",
                 "--hide-scrollbars", f"--window-size={width},{height}",
                 "--virtual-time-budget=5000", f"--screenshot={image}",
                 (site / page).as_uri()],
                capture_output=True, check=False, timeout=120,
            )  # fmt: skip
            if not image.is_file() or image.stat().st_size < 20_000:
                problems.append(f"{page} ({label}): no image, or a blank one")
            else:
                print(f"{image} ({width} px wide)")
    if problems:
        sys.exit("screenshot_docs: " + "; ".join(problems))


if __name__ == "__main__":
    main()
