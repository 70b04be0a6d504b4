// posenc's search ranking (html_search_scorer): Sphinx's own scores, then a page's
// kind moves it. The task pages (getting started, tutorials, how-to guides) rise; the
// changelog, which names everything once, and the maintainers' pages sink; so do the
// command line page's argparse descriptions, which the index holds as long titles.
var Scorer = {
  score: (result) => {
    const [docname, title, anchor, descr, score, filename, kind] = result;
    let moved = score;
    if (/^(getting-started|tutorials\/|howto\/)/.test(docname)) moved += 8;
    if (docname === "changelog") moved -= 30;
    if (/^(dev\/|guides\/(architecture|gpu|benchmarks|explainer-internals))/.test(docname)) {
      moved -= 10;
    }
    if (docname === "cli" && title.length > 60) moved -= 20;
    return moved;
  },
  // Sphinx's defaults
  objNameMatch: 11,
  objPartialMatch: 6,
  objPrio: { 0: 15, 1: 5, 2: -5 },
  objPrioDefault: 0,
  title: 15,
  partialTitle: 7,
  term: 5,
  partialTerm: 2,
};
