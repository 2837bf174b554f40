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

// `text` percent-encoded as the server encodes a path segment or a query value (every byte but the unreserved).
function encode(text) {
  return encodeURIComponent(text).replace(/[!'()*]/g, (c) => "%" + c.charCodeAt(0).toString(16).toUpperCase());
}

// An element with `children`: strings become text nodes, never markup.
function el(tag, className, ...children) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  for (const child of children) node.append(typeof child === "string" ? document.createTextNode(child) : child);
  return node;
}

// A text from outside, isolated as the server isolates it.
function bdi(text) {
  return el("bdi", "", String(text));
}

// A link to `prefix/<name>` showing the name isolated.
function linkTo(prefix, name) {
  const a = el("a", "", bdi(name));
  a.href = prefix + "/" + encode(name);
  return a;
}

// A log time (unix ms) as the server renders it: UTC in <time datetime>, localised afterwards.
function timeOf(ms) {
  const at = new Date(ms).toISOString();
  const node = el("time", "", at.replace("T", " ").replace("Z", "") + " UTC");
  node.setAttribute("datetime", at);
  return node;
}

// One outcome of the feed as a line, as the server makes it (feed.rs, `line`), from an event's data.
function feedLine(seq, outcome, about, routine) {
  const command = outcome.command;
  const rejection = outcome.decision && outcome.decision.rejected;
  const li = el("li", rejection ? "rejected new" : routine.includes(command.type_name) ? "routine new" : "new");
  li.dataset.seq = String(seq);
  const number = el("a", "seq", "#" + seq);
  number.href = "/ui/commands/" + encode(command.id);
  li.append(number, " ", timeOf(outcome.decided_at), " ", el("code", "", command.type_name), " on ");
  const key = String(command.key);
  if (key.startsWith("@")) li.append("@", linkTo("/ui/pools", key.slice(1)));
  else if (key.startsWith("~")) li.append("placement " + key.slice(1));
  else li.append(linkTo("/ui/agents", key));
  li.append(" by ", bdi(command.issuer));
  if (outcome.part > 0) li.append(" (part " + (outcome.part + 1) + ")");
  li.append(": ");
  if (rejection) {
    li.append(el("span", "badge bad", "rejected"), " ", bdi(rejection.kind + ": " + rejection.message));
  } else {
    const n = outcome.decision && outcome.decision.accepted ? outcome.decision.accepted.effects.length : 0;
    li.append(el("span", "badge good", "accepted"), " " + n + (n === 1 ? " effect" : " effects"));
  }
  const resources = about.resources || [];
  const leases = about.leases || [];
  const pools = (about.pools || []).filter((p) => "@" + p !== key);
  if (resources.length || leases.length || pools.length) {
    const effects = el("div", "effects", "about ");
    const groups = [[resources, "resource ", "/ui/resources"], [leases, "lease ", "/ui/leases"], [pools, "pool ", "/ui/pools"]];
    let first = true;
    for (const [names, word, prefix] of groups) {
      if (!names.length) continue;
      if (!first) effects.append("; ");
      first = false;
      names.forEach((name, i) => effects.append(i > 0 ? ", " : "", word, linkTo(prefix, name)));
    }
    if (about.more > 0) effects.append(" and " + about.more + " more");
    li.append(effects);
  }
  return li;
}

// The live feed: follows the events after the last outcome the page read (`data-events`), keeps those the page's
// filters keep, adds each at the top marked new, and keeps at most `data-max` lines. The status line says whether
// it follows.
function followFeed(list) {
  const status = document.getElementById("feed-status");
  const say = (text) => { if (status) status.textContent = text; };
  const key = list.dataset.key || "";
  const type = list.dataset.type || "";
  const rejectedOnly = list.dataset.rejected === "1";
  const max = Number(list.dataset.max) || 200;
  const routine = (list.dataset.routine || "").split(" ").filter(Boolean);
  if (typeof EventSource === "undefined") {
    say("Not following: this browser cannot follow events; reload the page for newer outcomes.");
    return;
  }
  const source = new EventSource(list.dataset.events);
  // Leaving the page closes the stream, so a page kept in the back-forward cache holds none of the gateway's bounded
  // streams; coming back to such a page reloads it, to render what was decided meanwhile and follow again.
  window.addEventListener("pagehide", () => source.close());
  window.addEventListener("pageshow", (event) => { if (event.persisted) window.location.reload(); });
  // Both the connection's own open and the stream's first event (`open`) mean it follows.
  source.addEventListener("open", () => say("Following: each outcome decided from now on is added at the top."));
  source.addEventListener("outcome", (event) => {
    let data;
    try { data = JSON.parse(event.data); } catch (_) { return; }
    const outcome = data && data.outcome;
    if (!outcome || !outcome.command) return;
    const rejected = Boolean(outcome.decision && outcome.decision.rejected);
    if (key && outcome.command.key !== key) return;
    if (type && outcome.command.type_name !== type) return;
    if (rejectedOnly && !rejected) return;
    const line = feedLine(data.seq, outcome, data.about || {}, routine);
    list.insertBefore(line, list.firstChild);
    localiseTimes(line);
    while (list.children.length > max) list.removeChild(list.lastChild);
    for (const empty of document.querySelectorAll("p.empty")) empty.remove();
  });
  source.addEventListener("error", (event) => {
    if (event.data) {
      // The gateway's last event: it cannot go on.
      let message = "";
      try { message = JSON.parse(event.data).error || ""; } catch (_) { message = ""; }
      source.close();
      say("Stopped: " + message + " Reload the page to follow again.");
      return;
    }
    say(source.readyState === EventSource.CLOSED
      ? "Stopped: the connection was refused. Reload the page to follow again."
      : "Reconnecting…");
  });
}

document.addEventListener("DOMContentLoaded", () => {
  localiseTimes(document);
  const feed = document.getElementById("feed");
  if (feed && feed.dataset.events) followFeed(feed);
});
