// The search page: POST /ask, then one card per cited source (or the NO ANSWER line).
"use strict";
const form = document.getElementById("ask-form");
const input = document.getElementById("question");
const state = document.getElementById("state");
const answerBox = document.getElementById("answer");
const sources = document.getElementById("sources");
const version = document.getElementById("version");

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function card(c) {
  const li = el("li", "card");
  const a = el("a", "card-link");
  a.href = c.url;
  const head = el("div", "card-head");
  head.append(el("span", "card-n", `[${c.index}]`), el("span", "card-doc", c.document_name));
  const where = el("div", "card-where", c.locator_label);
  const dist = el("span", "card-dist",
    c.cosine_distance === null ? "" : `d=${c.cosine_distance.toFixed(3)}`);
  head.append(dist);
  const quote = el("blockquote", "card-quote",
    c.quote.length > 360 ? c.quote.slice(0, 360) + "…" : c.quote);
  a.append(head, where, quote);
  li.append(a);
  return li;
}

async function ask(question) {
  state.textContent = "asking…";
  answerBox.hidden = true;
  answerBox.textContent = "";
  sources.replaceChildren();
  version.textContent = "";
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
    state.textContent = "";
    answerBox.hidden = false;
    answerBox.className = "answer no-answer";
    answerBox.textContent =
      `NO ANSWER: nothing under cosine distance ${body.threshold} for "${body.question}"`;
    return;
  }
  state.textContent = `${body.citations.length} source(s) under cosine distance ${body.threshold}`;
  if (body.answer && body.answer.text) {
    answerBox.hidden = false;
    answerBox.className = "answer";
    answerBox.textContent = body.answer.text;
  }
  for (const c of body.citations) sources.append(card(c));
}

form.addEventListener("submit", (ev) => {
  ev.preventDefault();
  const q = input.value.trim();
  if (q) ask(q);
});
