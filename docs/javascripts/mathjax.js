// MathJax 4 settings for pymdownx.arithmatex (generic mode); re-typeset after Material's instant
// navigation. MathJax itself is the site's own copy (vendor/mathjax/, published by
// scripts/mkdocs_hooks.py from scripts/vendor_assets.py), and everything it loads at run time,
// its font (vendor/mathjax-newcm-font/), TeX extensions and speech rules, comes from that copy too:
// the site must render with no network. MathJax 4 breaks a long in-line formula across lines
// (output.linebreaks.inline, on by default), so none runs past a phone's column.
(function () {
  // This file is site/javascripts/mathjax.js; the copies are site/vendor/..., at any page depth.
  var here = (document.currentScript && document.currentScript.src) || window.location.href;
  var vendor = new URL("../vendor", here).href;
  window.MathJax = {
    // [fonts]/mathjax-newcm-font is where MathJax 4 looks for its default font
    loader: { paths: { mathjax: vendor + "/mathjax", fonts: vendor } },
    tex: {
      inlineMath: [["\\(", "\\)"]], displayMath: [["\\[", "\\]"]],
      processEscapes: true, processEnvironments: true,
    },
    output: { linebreaks: { inline: true } },
    options: { ignoreHtmlClass: ".*|", processHtmlClass: "arithmatex" },
  };
})();
// document$ also emits for the page as first loaded, which MathJax's startup typesets by itself:
// typesetting it again cost every page a second pass over all its formulas. Only a page that
// instant navigation swaps in (the emissions after the first) needs a new typeset.
if (typeof document$ !== "undefined") {
  var kmFirstPage = true;
  document$.subscribe(() => {
    if (kmFirstPage) {
      kmFirstPage = false;
      return;
    }
    if (window.MathJax && MathJax.startup && MathJax.typesetPromise) {
      MathJax.startup.output.clearCache();
      MathJax.typesetClear();
      MathJax.texReset();
      MathJax.typesetPromise();
    }
  });
}
