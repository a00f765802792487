/* mpguide: three small reading aids, no network and no library.
 *
 * 1. Figures enlarge on click, tap, Enter or Space: an overlay shows the image at its own pixel size
 *    (scaled down only to fit a desktop window; on a phone it keeps its size and the overlay scrolls),
 *    so that legends and axis labels are readable. Escape, a click or the close button closes it. A
 *    figure drawn at under 3/4 of its own width says so in a hint line under it.
 * 2. A table wider than its column gets a "scroll sideways" hint above it and shadows on the sides
 *    that hide content (the scroll container itself is the theme's .pst-scrollable-table-container).
 * 3. The in-page table of contents keeps the highlighted section in view: when the reader scrolls
 *    the page, the sidebar scrolls with it.
 * 4. On a gallery page, a long code block whose lines are short (the reader's cells are formatted at
 *    46 columns to fit a phone, mpguide_build.gallery_format) is set in two columns when two of its
 *    longest lines fit side by side (a desktop): lines never wrap, the block is half as tall, the second
 *    column starts at a top-level statement where one is near the middle, and the copy button still copies
 *    the block's text. Measured in tests/test_browser.py.
 */
(function () {
  "use strict";

  var FIGURES = ".bd-article img.sphx-glr-single-img, .bd-article img.sphx-glr-multi-img, " +
    ".bd-article .cell_output img, .bd-article figure img, .bd-article img.align-center";

  function openLightbox(img) {
    var opener = document.activeElement;
    var box = document.createElement("div");
    box.className = "mpguide-lightbox";
    box.setAttribute("role", "dialog");
    box.setAttribute("aria-modal", "true");
    box.setAttribute("aria-label", "Enlarged figure: " + (img.alt || ""));
    var close = document.createElement("button");
    close.type = "button";
    close.className = "mpguide-lightbox-close";
    close.setAttribute("aria-label", "Close the enlarged figure");
    close.textContent = "\u00d7";
    var big = document.createElement("img");
    big.src = img.currentSrc || img.src;
    big.alt = img.alt || "";
    var natural = img.naturalWidth || img.width;
    var wide = window.innerWidth >= 768;
    // desktop: the image's own size, scaled down to fit the window; phone: its own size, scrolled
    var width = wide ? Math.min(natural, window.innerWidth * 0.96,
      (window.innerHeight * 0.9) * natural / Math.max(1, img.naturalHeight || img.height)) : natural;
    big.style.width = Math.max(width, img.getBoundingClientRect().width * 1.25) + "px";
    box.appendChild(close);
    box.appendChild(big);
    function shut() {
      box.remove();
      document.removeEventListener("keydown", onKey);
      document.body.classList.remove("mpguide-lightbox-open");
      if (opener && opener.focus) opener.focus();
    }
    function onKey(event) {
      if (event.key === "Escape") shut();
    }
    box.addEventListener("click", function (event) {
      if (event.target === box || event.target === close) shut();
    });
    big.addEventListener("click", function () { if (wide) shut(); });
    document.addEventListener("keydown", onKey);
    document.body.appendChild(box);
    document.body.classList.add("mpguide-lightbox-open");
    // phone: the figure is wider than the screen; open it at its middle, where matplotlib centres the title
    if (!wide) box.scrollLeft = Math.max(0, (box.scrollWidth - box.clientWidth) / 2);
    close.focus({preventScroll: true});
  }

  // A figure drawn at under 3/4 of its own width (a phone shows most at a third) says that it enlarges:
  // a hint line under it, removed again when the window grows (its labels are readable inline then).
  function markShrunk(img) {
    var shrunk = img.naturalWidth > 0 && img.getBoundingClientRect().width < 0.75 * img.naturalWidth;
    var hint = img.nextElementSibling;
    var has = hint && hint.classList.contains("mpguide-zoom-hint");
    if (shrunk && !has) {
      hint = document.createElement("span");
      hint.className = "mpguide-zoom-hint";
      hint.setAttribute("aria-hidden", "true");
      hint.textContent = "Tap or click the figure to enlarge it";
      img.insertAdjacentElement("afterend", hint);
    } else if (!shrunk && has) {
      hint.remove();
    }
  }

  function setupFigures() {
    document.querySelectorAll(FIGURES).forEach(function (img) {
      if (img.closest("a")) return; // thumbnails and logos that are links keep their link
      img.classList.add("mpguide-zoomable");
      img.tabIndex = 0;
      img.setAttribute("role", "button");
      img.title = "Click or tap to enlarge";
      img.addEventListener("click", function () { openLightbox(img); });
      if (img.complete) markShrunk(img); else img.addEventListener("load", function () { markShrunk(img); });
      img.addEventListener("keydown", function (event) {
        if (event.key === "Enter" || event.key === " ") {
          event.preventDefault();
          openLightbox(img);
        }
      });
    });
  }

  function markWideTables() {
    document.querySelectorAll(".bd-article .pst-scrollable-table-container").forEach(function (box) {
      var wide = box.scrollWidth > box.clientWidth + 1;
      box.classList.toggle("mpguide-wide", wide);
      box.classList.toggle("mpguide-at-start", box.scrollLeft <= 1);
      box.classList.toggle("mpguide-at-end", box.scrollLeft + box.clientWidth >= box.scrollWidth - 1);
      if (!box.dataset.mpguideListen) {
        box.dataset.mpguideListen = "1";
        box.addEventListener("scroll", function () {
          box.classList.toggle("mpguide-at-start", box.scrollLeft <= 1);
          box.classList.toggle("mpguide-at-end", box.scrollLeft + box.clientWidth >= box.scrollWidth - 1);
        }, { passive: true });
      }
    });
  }

  //: A block is set in two columns from this many lines (a short block reads better in one).
  var TWO_COLUMNS_FROM_LINES = 24;

  function twoColumnCode() {
    if (!document.querySelector(".sphx-glr-example-title")) return;
    document.querySelectorAll(".bd-article div.highlight-Python pre").forEach(function (pre) {
      if (pre.closest("details")) return;
      var lines = pre.textContent.replace(/\n$/, "").split("\n");
      var longest = lines.reduce(function (a, line) { return Math.max(a, line.length); }, 0);
      pre.classList.remove("mpguide-two-columns");
      if (lines.length < TWO_COLUMNS_FROM_LINES) return;
      var probe = document.createElement("span");
      probe.textContent = "0".repeat(100);
      pre.appendChild(probe);
      var charWidth = probe.getBoundingClientRect().width / 100;
      pre.removeChild(probe);
      var style = getComputedStyle(pre);
      var inner = pre.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
      var gap = 1.2 * parseFloat(style.fontSize);  // the column gap in mpguide.css (1.2em)
      var two = 2 * longest * charWidth + gap <= inner;
      if (two && !pre.querySelector(".mpguide-column-break")) two = markColumnBreak(pre, lines);
      pre.classList.toggle("mpguide-two-columns", two);
    });
  }

  // The second column starts at a statement, never inside one: at a line outside every bracket (a scan that
  // skips strings and comments). Preferred: a top-level line after a blank line (a class, a def, an import),
  // then any statement after a blank line, within 3 lines (or 5 %) of the block's middle; else the statement
  // nearest the middle within 1/6 of the block's length; else, inside one long statement, the start of an
  // element of its outermost list or call (the line after a comma). Without one the block stays in one column
  // (returns false). The mark is an empty element: the block's text, which the copy button copies, stays.
  function bracketDepths(lines) {  // the bracket depth at the start of each line, -1 inside a string
    var depth = 0, quote = null, depths = [];
    lines.forEach(function (line) {
      depths.push(quote === null ? depth : -1);
      for (var k = 0; k < line.length; k++) {
        var c = line[k];
        if (quote) {
          if (c === "\\") k++;
          else if (line.substr(k, quote.length) === quote) { k += quote.length - 1; quote = null; }
        } else if (c === "#") break;
        else if (c === "'" || c === '"') {
          quote = line.substr(k, 3) === c + c + c ? c + c + c : c;
          k += quote.length - 1;
        } else if ("([{".indexOf(c) >= 0) depth++;
        else if (")]}".indexOf(c) >= 0) depth = Math.max(0, depth - 1);
      }
      if (quote && quote.length === 1) quote = null;  // a one-quote string ends with its line
    });
    return depths;
  }
  function markColumnBreak(pre, lines) {
    var middle = lines.length / 2, depths = bracketDepths(lines);
    function opens(i) { return /\S/.test(lines[i]) && !/^\s*[)\]}]/.test(lines[i]); }
    function indent(i) { return lines[i].length - lines[i].replace(/^\s+/, "").length; }
    function nearest(accept, reach) {
      var best = -1;
      for (var i = 1; i < lines.length; i++) {
        if (opens(i) && accept(i) && Math.abs(i - middle) <= reach &&
            (best < 0 || Math.abs(i - middle) < Math.abs(best - middle))) best = i;
      }
      return best;
    }
    function statement(i) { return depths[i] === 0; }
    var near = Math.max(3, lines.length / 20), far = Math.max(3, lines.length / 6);
    var best = nearest(function (i) { return statement(i) && indent(i) === 0 && lines[i - 1] === ""; }, near);
    if (best < 0) best = nearest(function (i) { return statement(i) && lines[i - 1] === ""; }, near);
    if (best < 0) best = nearest(statement, far);
    if (best < 0) {
      var element = function (i) { return depths[i] > 0 && /,\s*$/.test(lines[i - 1]); };
      var outer = Infinity;
      for (var i = 1; i < lines.length; i++) {
        if (opens(i) && element(i) && Math.abs(i - middle) <= far) outer = Math.min(outer, depths[i]);
      }
      best = nearest(function (i) { return element(i) && depths[i] === outer; }, far);
    }
    if (best < 0) return false;
    var offset = lines.slice(0, best).join("\n").length + 1;  // the first character of line `best`
    var walker = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
    var seen = 0;
    while (walker.nextNode()) {
      var node = walker.currentNode;
      if (seen + node.nodeValue.length >= offset) {
        var rest = node.splitText(offset - seen);
        var mark = document.createElement("span");
        mark.className = "mpguide-column-break";
        rest.parentNode.insertBefore(mark, rest);
        return true;
      }
      seen += node.nodeValue.length;
    }
    return false;
  }

  function followToc() {
    var toc = document.querySelector(".bd-sidebar-secondary");
    var nav = document.querySelector("#pst-page-toc-nav");
    if (!toc || !nav) return;
    var pending = false;
    new MutationObserver(function () {
      if (pending) return;
      pending = true;
      window.requestAnimationFrame(function () {
        pending = false;
        var links = nav.querySelectorAll("a.active");
        var active = links[links.length - 1];
        if (!active) return;
        var box = toc.getBoundingClientRect();
        var rect = active.getBoundingClientRect();
        if (rect.top < box.top + 40 || rect.bottom > box.bottom - 40) {
          toc.scrollTop += rect.top - box.top - box.height / 3;
        }
      });
    }).observe(nav, { subtree: true, attributes: true, attributeFilter: ["class"] });
  }

  function start() {
    setupFigures();
    markWideTables();
    followToc();
    twoColumnCode();
    window.addEventListener("resize", markWideTables);
    window.addEventListener("resize", twoColumnCode);
    window.addEventListener("resize", function () {
      document.querySelectorAll(".mpguide-zoomable").forEach(markShrunk);
    });
    window.addEventListener("load", markWideTables);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
