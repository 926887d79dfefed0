// A document page: turn a #char=a,b fragment into the server-side highlight (?char=a,b),
// then bring the highlighted words (sentence, table row, cue) into view; a transcript's
// <video>/<audio> starts at the cited cue.
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
  const media = document.querySelector("video.media, audio.media");
  if (media) {
    const t = parseFloat(media.dataset.start || "0");
    const seek = () => { if (t > 0 && Math.abs(media.currentTime - t) > 0.5) media.currentTime = t; };
    media.addEventListener("loadedmetadata", seek);
    document.querySelectorAll("li.cue").forEach((li) => {
      li.addEventListener("click", () => { media.currentTime = parseFloat(li.dataset.start); });
    });
  }
})();
