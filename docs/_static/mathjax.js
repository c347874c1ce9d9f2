window.MathJax = {
  loader: { load: ["[tex]/textmacros"] },
  tex: {
    // textmacros: `\_` and other text-mode macros inside `\text{}` / `\texttt{}`.
    packages: { "[+]": ["textmacros"] },
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex"
  }
};
// MathJax typesets a page once, when it has loaded. Clearing its output cache then
// (as on every `document$` event) deletes the stylesheet that draws the glyphs it has
// just typeset, leaving them blank: so only a page that replaces the first one
// without a reload (instant navigation) is typeset again.
let firstPage = true;
document$.subscribe(() => {
  if (firstPage) {
    firstPage = false;
    return;
  }
  MathJax.startup.promise.then(() => {
    MathJax.startup.output.clearCache();
    MathJax.typesetClear();
    MathJax.texReset();
    return MathJax.typesetPromise();
  });
});
