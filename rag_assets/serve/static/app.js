// The search page: POST /ask, then one card per cited source (or the NO ANSWER line).
// Each card shows the span that answers (the sentence, row or cue) first, the chunk's quote
// folded under it, and links to the document view highlighting that span. ?q= asks at once
// (?nearest=1 ticks the toggle that lists the closest sources below the bar, issue 31).
// Issue 34: a folder and key=value filters narrow the question to documents whose metadata
// match; GET /filters lists the folders and keys of the documents this caller may see.
"use strict";
const form = document.getElementById("ask-form");
const input = document.getElementById("question");
const folderSel = document.getElementById("folder");
const filterIn = document.getElementById("filter");
const keysList = document.getElementById("filter-keys");
const state = document.getElementById("state");
const answerBox = document.getElementById("answer");
const sources = document.getElementById("sources");
const version = document.getElementById("version");
const showNearest = document.getElementById("show-nearest");
const nearestBox = document.getElementById("nearest");
const nearestList = document.getElementById("nearest-sources");
const cutNote = document.getElementById("cut-note");

// Which gate refused, in words, with the setting that moves it.
const GATES = {
  distance: "refused by the distance gate (RAG_DISTANCE_CUT)",
  judge: "refused by the answer check (RAG_ANSWER_CHECK)",
  verification: "refused: no sentence of the written answer is supported (RAG_ANSWER_VERIFY)",
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

function card(c, below) {
  // below: a source under the bar (issue 31): no [n], marked, its distance over the cut
  const li = el("li", below ? "card below-bar" : "card");
  if (!below) li.dataset.n = c.index;
  const a = el("a", "card-link");
  a.href = viewUrl(c);
  const head = el("div", "card-head");
  if (!below) head.append(el("span", "card-n", `[${c.index}]`));
  head.append(el("span", "card-doc", c.document_name));
  let d = c.cosine_distance === null ? "" : `d=${c.cosine_distance.toFixed(3)}`;
  if (below && c.over_cut !== null && c.over_cut >= 0) d += ` (+${c.over_cut.toFixed(3)} over the cut)`;
  const dist = el("span", "card-dist", d);
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

// the folders and metadata keys of the documents this caller may see (GET /filters)
async function loadFilters() {
  let f;
  try {
    const res = await fetch("filters");
    if (!res.ok) return;
    f = await res.json();
  } catch (err) {
    return;
  }
  for (const path of f.folders) folderSel.append(new Option(path, path));
  for (const [key, values] of Object.entries(f.keys)) {
    if (!values.length) keysList.append(new Option(`${key}=`));
    for (const v of values) keysList.append(new Option(`${key}=${v}`));
  }
}

// {"folder": ..., "key": value or [values], "modified>=": ...} from the two controls
function scopeFilter() {
  const filter = {};
  const add = (key, value) => {
    if (!(key in filter)) filter[key] = value;
    else filter[key] = [].concat(filter[key], value);
  };
  if (folderSel.value) add("folder", folderSel.value);
  for (const item of filterIn.value.split(";")) {
    const m = item.trim().match(/^([A-Za-z][A-Za-z0-9_-]*)\s*(>=|<=|>|<|=)(.*)$/);
    if (m) add(m[2] === "=" ? m[1] : m[1] + m[2], m[3].trim());
    else if (item.trim()) add(item.trim(), ""); // refused by the service with its reason
  }
  return Object.keys(filter).length ? filter : null;
}

async function ask(question) {
  state.textContent = "asking…";
  answerBox.hidden = true;
  answerBox.textContent = "";
  sources.replaceChildren();
  nearestList.replaceChildren();
  nearestBox.hidden = true;
  cutNote.hidden = true;
  version.textContent = "";
  if (window.ragFeedback) window.ragFeedback.clear();
  let res, body;
  try {
    res = await fetch("ask", {
      method: "POST",
      headers: {"Content-Type": "application/json"},
      body: JSON.stringify({question, show_nearest: showNearest.checked, filter: scopeFilter()}),
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
  // issue 51: the index's own version (1, 2, 3 ...), as `status` says it; the table for detail
  version.textContent = pub.index_version
    ? `answered by version ${pub.index_version} (${pub.table})`
    : `answered by ${pub.table}`;
  if (body.no_answer) {
    // issue 31: how close it came (nearest distance, the cut, a near miss) beside the gate
    state.textContent = [GATES[body.refused_by] || "", body.closeness || ""]
      .filter(Boolean).join(": ");
    answerBox.hidden = false;
    answerBox.className = body.near_miss ? "answer no-answer near-miss" : "answer no-answer";
    answerBox.dataset.refusedBy = body.refused_by || "";
    answerBox.textContent = body.message ||
      `NO ANSWER: ${body.reason} for "${body.question}"`;
    showBelow(body);
    if (window.ragFeedback) window.ragFeedback.show(body);
    return;
  }
  state.textContent = body.threshold == null  // a group token is not shown the cut (issue 43)
    ? `${body.citations.length} source(s)`
    : `${body.citations.length} source(s) under cosine distance ${body.threshold}`;
  if (body.answer && body.answer.text) {
    answerBox.hidden = false;
    answerBox.className = "answer";
    if (Array.isArray(body.sentences)) showVerified(body);
    else answerBox.textContent = body.answer.text;
  }
  for (const c of body.citations) sources.append(card(c));
  // issue 53: a cut no question set checked yet says so beside the answer
  cutNote.textContent = body.cut_note ? `Note: ${body.cut_note}.` : "";
  cutNote.hidden = !body.cut_note;
  showBelow(body);
  if (window.ragFeedback) window.ragFeedback.show(body);  // verdicts (feedback.js)
}

// Issue 50: the written answer sentence by sentence, each checked against the source it cites:
// an unsupported one is flagged with its reason (a changed number, a negation, a swapped term,
// a statement from elsewhere), an uncited one marked; a dropped one (RAG_ANSWER_VERIFY=drop)
// is not shown, only counted.
function showVerified(body) {
  const text = el("p", "answer-text");
  let dropped = 0;
  for (const s of body.sentences) {
    if (s.dropped) { dropped += 1; continue; }
    const span = el("span", `sentence ${s.verdict}`, s.text);
    span.dataset.verdict = s.verdict;
    if (s.evidence) span.title = `source [${s.evidence.source}]: ${s.evidence.quote}`;
    text.append(span);
    if (s.verdict !== "supported") {
      const flag = el("span", "verdict-flag", s.verdict === "unsupported" ? "unsupported" : "uncited");
      flag.append(el("span", "verdict-reason", `: ${s.reason}`));
      text.append(" ", flag);
    }
    text.append(" ");
  }
  answerBox.append(text);
  const v = body.verification || {};
  let line = `${v.supported} of ${v.total} sentence(s) supported by their sources`;
  if (dropped) line += `; ${dropped} unsupported sentence(s) dropped`;
  answerBox.append(el("p", "verified", line));
}

function showBelow(body) {
  const below = body.nearest || [];
  for (const c of below) nearestList.append(card(c, true));
  nearestBox.hidden = below.length === 0;
}

form.addEventListener("submit", (ev) => {
  ev.preventDefault();
  const q = input.value.trim();
  if (!q) return;
  const params = new URLSearchParams(location.search);
  params.set("q", q);
  if (showNearest.checked) params.set("nearest", "1"); else params.delete("nearest");
  for (const [name, el] of [["folder", folderSel], ["filter", filterIn]]) {
    if (el.value) params.set(name, el.value);
    else params.delete(name);
  }
  history.replaceState(null, "", `?${params}`); // the deep link of this question
  ask(q);
});

const params = new URLSearchParams(location.search);
const deep = params.get("q");
filterIn.value = params.get("filter") || "";
showNearest.checked = params.get("nearest") === "1";
if (deep) input.value = deep;  // shown at once; asked once the folder list is known
loadFilters().then(() => {
  if (params.get("folder")) {
    if (![...folderSel.options].some((o) => o.value === params.get("folder"))) {
      folderSel.append(new Option(params.get("folder"), params.get("folder")));
    }
    folderSel.value = params.get("folder");
  }
  if (deep && deep.trim()) ask(deep.trim());
});
