// Search ranking by a page's role (conf.py: html_search_scorer; Sphinx's own defaults otherwise).
//
// Sphinx scores a page 15 when a query word is in one of its section titles and 5 when it is only in its
// text, and keeps the best word. The reference pages (API, verification, releases, GPU runs, budgets) have
// titles full of this site's words ("check", "release", "step"), so a reader's error message ranked the
// guide below four of them although the guide is the page that answers it. Each page gets a fixed bonus
// by its role, whatever the query: the guide answers (+30), the examples show (+10), reference pages
// list (+0). Matches on one page keep their order; no page is left out of the results.
var Scorer = {
  roleBonus: [
    ["model/", 30],  // the guide
    ["auto_examples/plot_", 10],  // the examples
  ],
  score: (result) => {
    const [docname, , , , score] = result;
    const role = Scorer.roleBonus.find(([prefix]) => docname.startsWith(prefix));
    return score + (role ? role[1] : 0);
  },
  // Sphinx's defaults (sphinx/themes/basic/static/searchtools.js), unchanged
  objNameMatch: 11,
  objPartialMatch: 6,
  objPrio: { 0: 15, 1: 5, 2: -5 },
  objPrioDefault: 0,
  title: 15,
  partialTitle: 7,
  term: 5,
  partialTerm: 2,
};
