// The search page: POST /ask, then one card per cited source (or the NO ANSWER line).
// Each card shows the span that answers (the sentence, row or cue) first, the chunk's quote
// folded under it, and links to the document view highlighting that span. ?q= asks at once.
"use strict";
const form = document.getElementById("ask-form");
const input = document.getElementById("question");
const state = document.getElementById("state");
const answerBox = document.getElementById("answer");
const sources = document.getElementById("sources");
const version = document.getElementById("version");

// Which gate refused, in words, with the setting that moves it.
const GATES = {
  distance: "refused by the distance gate (RAG_DISTANCE_CUT)",
  judge: "refused by the answer check (RAG_ANSWER_CHECK)",
};

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function viewUrl(c) {
  // the service's document view of the span (a sheet's rows, a transcript's cues, a PDF page)
  const id = c.document_id.split("/").map(encodeURIComponent).join("/");
  const s = c.span || {from: c.from, to: c.to};
  return `documents/${id}?char=${s.from},${s.to}`;
}

function card(c) {
  const li = el("li", "card");
  li.dataset.n = c.index;
  const a = el("a", "card-link");
  a.href = viewUrl(c);
  const head = el("div", "card-head");
  head.append(el("span", "card-n", `[${c.index}]`), el("span", "card-doc", c.document_name));
  const dist = el("span", "card-dist",
    c.cosine_distance === null ? "" : `d=${c.cosine_distance.toFixed(3)}`);
  head.append(dist);
  const where = el("div", "card-where", c.locator_label);
  a.append(head, where);
  if (c.span) {
    a.append(el("div", "card-span-where", c.span.label));
    a.append(el("blockquote", "card-span", c.span.text));
  }
  li.append(a);
  const quote = el("details", "card-chunk");
  quote.append(el("summary", "", "whole chunk"));
  quote.append(el("blockquote", "card-quote", c.quote));
  li.append(quote);
  return li;
}

async function ask(question) {
  state.textContent = "asking…";
  answerBox.hidden = true;
  answerBox.textContent = "";
  sources.replaceChildren();
  version.textContent = "";
  if (window.ragFeedback) window.ragFeedback.clear();
  let res, body;
  try {
    res = await fetch("ask", {
      method: "POST",
      headers: {"Content-Type": "application/json"},
      body: JSON.stringify({question}),
    });
    body = await res.json();
  } catch (err) {
    state.textContent = `error: ${err}`;
    return;
  }
  if (!res.ok) {
    state.textContent = `error ${res.status}: ${body.error}`;
    return;
  }
  const pub = body.published;
  version.textContent = `answered by ${pub.table} @ v${pub.version}`;
  if (body.no_answer) {
    state.textContent = GATES[body.refused_by] || "";
    answerBox.hidden = false;
    answerBox.className = "answer no-answer";
    answerBox.dataset.refusedBy = body.refused_by || "";
    answerBox.textContent = body.message ||
      `NO ANSWER: ${body.reason} for "${body.question}"`;
    if (window.ragFeedback) window.ragFeedback.show(body);
    return;
  }
  state.textContent = `${body.citations.length} source(s) under cosine distance ${body.threshold}`;
  if (body.answer && body.answer.text) {
    answerBox.hidden = false;
    answerBox.className = "answer";
    answerBox.textContent = body.answer.text;
  }
  for (const c of body.citations) sources.append(card(c));
  if (window.ragFeedback) window.ragFeedback.show(body);  // verdicts (feedback.js)
}

form.addEventListener("submit", (ev) => {
  ev.preventDefault();
  const q = input.value.trim();
  if (!q) return;
  const params = new URLSearchParams(location.search);
  params.set("q", q);
  history.replaceState(null, "", `?${params}`); // the deep link of this question
  ask(q);
});

const deep = new URLSearchParams(location.search).get("q");
if (deep && deep.trim()) {
  input.value = deep;
  ask(deep.trim());
}
