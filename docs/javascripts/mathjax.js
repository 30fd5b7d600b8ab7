// MathJax settings for pymdownx.arithmatex (generic mode); re-typeset after Material's instant
// navigation. MathJax itself is the site's own copy (vendor/mathjax/, published by
// scripts/mkdocs_hooks.py from scripts/vendor_assets.py), and everything it loads at run time,
// fonts and TeX extensions, comes from that copy too: the site must render with no network.
(function () {
  // This file is site/javascripts/mathjax.js; the copy is site/vendor/mathjax/, at any page depth.
  var here = (document.currentScript && document.currentScript.src) || window.location.href;
  var root = new URL("../vendor/mathjax", here).href;
  window.MathJax = {
    loader: { paths: { mathjax: root } },
    tex: {
      inlineMath: [["\\(", "\\)"]], displayMath: [["\\[", "\\]"]],
      processEscapes: true, processEnvironments: true,
    },
    chtml: { fontURL: root + "/output/chtml/fonts/woff-v2" },
    options: { ignoreHtmlClass: ".*|", processHtmlClass: "arithmatex" },
  };
})();
if (typeof document$ !== "undefined") {
  document$.subscribe(() => {
    if (window.MathJax && MathJax.startup && MathJax.typesetPromise) {
      MathJax.startup.output.clearCache();
      MathJax.typesetClear();
      MathJax.texReset();
      MathJax.typesetPromise();
    }
  });
}
