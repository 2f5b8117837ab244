// Renders the math that pymdownx.arithmatex marks, with the KaTeX copy shipped in the
// docs (no CDN: the site must work offline). Runs again on every instant-navigation page.
document$.subscribe(({ body }) => {
  renderMathInElement(body, {
    delimiters: [
      { left: "$$", right: "$$", display: true },
      { left: "$", right: "$", display: false },
      { left: "\\(", right: "\\)", display: false },
      { left: "\\[", right: "\\]", display: true },
    ],
  });
});
