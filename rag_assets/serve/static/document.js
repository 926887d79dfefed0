// A document page: turn a #char=a,b fragment into the server-side highlight (?char=a,b),
// then bring the highlighted words into view.
"use strict";
(function () {
  const m = /^#char=(\d+),(\d+)$/.exec(location.hash);
  const params = new URLSearchParams(location.search);
  if (m && params.get("char") !== `${m[1]},${m[2]}`) {
    params.set("char", `${m[1]},${m[2]}`);
    location.replace(`${location.pathname}?${params}${location.hash}`);
    return;
  }
  const cite = document.getElementById("cite");
  if (cite) cite.scrollIntoView({block: "center"});
})();
