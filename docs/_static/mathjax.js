// MathJax typesets the page once, when it has loaded (its default `startup.typeset`).
// No `document$` handler: the site does not use instant navigation, so every page is a
// full load, and clearing MathJax's cache after it has typeset the page deletes the
// stylesheet that draws each character (the formulas are left blank).
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
