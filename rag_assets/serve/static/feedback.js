// Verdicts under each answer (issue 33): POST /feedback with the answer's query_id.
// Answered: "this answers" under each source, "should be NO ANSWER", "none of these answers",
// "the answer is elsewhere". NO ANSWER: "right, not in the documents", "the answer is in the
// documents". For "elsewhere" the user finds the passage with the page's own search
// (GET /search), picks a hit, trims its text to the words that answer, and sends it as the quote.
"use strict";
(function () {
  const box = document.getElementById("feedback");
  const sourcesList = document.getElementById("sources");
  let current = null; // the /ask answer being judged

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function button(label, verdict, extra) {
    const b = el("button", "fb-button", label);
    b.type = "button";
    b.dataset.verdict = verdict;
    if (extra && extra.source !== undefined) b.dataset.source = extra.source;
    b.addEventListener("click", () => send(Object.assign({verdict}, extra || {})));
    return b;
  }

  function status(text, isError) {
    let line = box.querySelector(".fb-status");
    if (!line) {
      line = el("p", "fb-status");
      line.setAttribute("role", "status");
      box.append(line);
    }
    line.textContent = text;
    line.classList.toggle("fb-error", Boolean(isError));
  }

  async function send(verdict) {
    const body = Object.assign({query_id: current.query_id}, verdict);
    let res, out;
    try {
      res = await fetch("feedback", {
        method: "POST",
        headers: {"Content-Type": "application/json"},
        body: JSON.stringify(body),
      });
      out = await res.json();
    } catch (err) {
      status(`not recorded: ${err}`, true);
      return false;
    }
    if (!res.ok) {
      status(`not recorded: ${out.error}`, true);
      return false;
    }
    let text = `recorded: ${out.verdict}` + (out.source ? ` [${out.source}]` : "");
    if (out.replaced) text += ` (replaces ${out.replaced})`;
    const cal = out.calibration;
    if (cal && !cal.ready) {
      text += `; the cut is calibrated on reviews after ${cal.needed.answerable} more ` +
        `answerable and ${cal.needed.out_of_domain} more out-of-domain ones`;
    }
    status(text, false);
    box.dataset.recorded = out.verdict;
    return true;
  }

  function missedPanel() {
    // find the passage with the page's own search, then send its exact words as the quote
    const panel = el("div", "fb-missed");
    const form = el("form", "fb-find");
    const q = el("input", "fb-query");
    q.type = "search";
    q.value = current.question;
    q.setAttribute("aria-label", "search the documents for the passage that answers");
    const go = el("button", "", "Find");
    go.type = "submit";
    form.append(q, go);
    const hits = el("ol", "fb-hits");
    const pick = el("div", "fb-pick");
    pick.hidden = true;
    const doc = el("p", "fb-doc");
    const quote = el("textarea", "fb-quote");
    quote.rows = 4;
    quote.setAttribute("aria-label", "the exact words that answer (trim to them)");
    const sendQuote = el("button", "fb-send", "Send: the answer is here");
    sendQuote.type = "button";
    pick.append(doc, quote, sendQuote);
    panel.append(el("p", "fb-help",
      "Search for the passage that answers, pick it, and trim the text to the words that answer."),
      form, hits, pick);
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      hits.replaceChildren();
      // not a question: the page's search for a verdict's passage is not logged (issue 43)
      const params = new URLSearchParams({q: q.value, k: "5", log: "false"});
      const res = await fetch(`search?${params}`);
      const found = await res.json();
      if (!res.ok) {
        status(`search failed: ${found.error}`, true);
        return;
      }
      for (const h of found) {
        const li = el("li", "fb-hit");
        const text = (h.span && h.span.text) || h.quote;
        li.append(el("div", "fb-hit-doc", `${h.document_id}  ${h.locator_label}`),
          el("blockquote", "fb-hit-text", text));
        const use = el("button", "fb-use", "This passage");
        use.type = "button";
        use.addEventListener("click", () => {
          pick.hidden = false;
          pick.dataset.document = h.document_id;
          doc.textContent = h.document_id;
          quote.value = text;
        });
        li.append(use);
        hits.append(li);
      }
    });
    sendQuote.addEventListener("click", () =>
      send({verdict: "missed", document: pick.dataset.document, quote: quote.value}));
    return panel;
  }

  function show(answer) {
    clear();
    current = answer;
    if (!answer.query_id) return; // the query log is off: no feedback is kept
    box.hidden = false;
    box.append(el("h2", "fb-title", "Was this right?"));
    const row = el("div", "fb-row");
    const elsewhere = el("button", "fb-button", "");
    elsewhere.type = "button";
    elsewhere.dataset.verdict = "missed";
    if (answer.no_answer) {
      row.append(button("Right: the documents do not answer this", "right_refusal"));
      elsewhere.textContent = "The documents do answer this…";
    } else {
      for (const li of sourcesList.querySelectorAll("li.card")) {
        const n = Number(li.dataset.n);
        li.append(button(`[${n}] answers it`, "answered", {source: n}));
      }
      row.append(button("Should be NO ANSWER", "should_refuse"),
        button("None of these answers", "wrong"));
      elsewhere.textContent = "The answer is elsewhere…";
    }
    elsewhere.addEventListener("click", () => {
      if (!box.querySelector(".fb-missed")) box.insertBefore(missedPanel(), row.nextSibling);
    });
    row.append(elsewhere);
    box.append(row);
  }

  function clear() {
    current = null;
    box.hidden = true;
    box.replaceChildren();
    delete box.dataset.recorded;
  }

  window.ragFeedback = {show, clear};
})();
