// leasehold's operator view: the one script. Pages work without it; it only shows times in the browser's zone
// and follows the live feed. It never inserts markup: only text nodes and elements it builds itself.
"use strict";

// Every <time datetime="...Z"> rendered in UTC, shown in the browser's zone (the UTC time stays as its title).
function localiseTimes(root) {
  for (const el of root.querySelectorAll("time[datetime]")) {
    if (el.dataset.local) continue;
    const at = new Date(el.getAttribute("datetime"));
    if (Number.isNaN(at.getTime())) continue;
    el.title = el.textContent;
    el.textContent = at.toLocaleString(undefined, {
      year: "numeric", month: "2-digit", day: "2-digit",
      hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false, timeZoneName: "short",
    });
    el.dataset.local = "1";
  }
}

document.addEventListener("DOMContentLoaded", () => {
  localiseTimes(document);
});
