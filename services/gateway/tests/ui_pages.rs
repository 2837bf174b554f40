//! The HTML of the resource-centred pages of `/ui`: the resources list, one resource in each state, a lease and a
//! command. Text from outside shows as escaped, bidi-isolated text on every page; each state shows with what it
//! waits on; filters and pages follow `GET /v1/resources`; bad and unknown names get a 400 and a 404 page; every
//! answer carries the security headers.

#[path = "ui_pages/seed.rs"]
mod seed;

use axum::http::StatusCode;

use seed::{EVIL, EVIL_ESCAPED, get, page, seeded};

/// The states a resource waits in, the start of what each waits on, and whether ten minutes of it is stuck (a paused
/// resource waits on an operator and is never stuck).
const WAITING: &[(&str, &str, bool)] = &[
    ("pending", "waiting for w1 to create it; w1 last heard from", true),
    ("paused", "paused: waiting for an unpause", false),
    ("suspect", "waiting for its health check on w1", true),
    ("releasing", "waiting for w1 to confirm the destroy", true),
];

/// The `<tr>` of the table row that links to `reference`.
fn row<'h>(html: &'h str, reference: &str) -> &'h str {
    let at = html.find(&format!("href=\"/ui/resources/{reference}\"")).unwrap_or_else(|| panic!("no row {reference}"));
    let start = html[..at].rfind("<tr>").expect("a row starts");
    let end = at + html[at..].find("</tr>").expect("a row ends");
    &html[start..end]
}

/// Every reference a list page shows, in order.
fn listed(html: &str) -> Vec<String> {
    let tbody = html.split_once("<tbody>").map_or("", |(_, rest)| rest);
    tbody
        .split("<td class=\"id\"><a href=\"/ui/resources/")
        .skip(1)
        .map(|cell| cell.split('"').next().expect("a link").to_owned())
        .collect()
}

/// The `href` of the link whose text is `label`.
fn href_of(html: &str, label: &str) -> Option<String> {
    let at = html.find(&format!(">{label}</a>"))?;
    let start = html[..at].rfind("href=\"")? + "href=\"".len();
    Some(html[start..at].split('"').next()?.replace("&amp;", "&"))
}

/// Text from outside never shows raw: `EVIL` appears only escaped, and every escaped copy (and every U+202E) shown
/// as text is inside a `<bdi>` (one in an attribute, a form field's value, is a field of its own). The page's one
/// script is the UI's own file.
fn assert_shown_as_text(html: &str, what: &str) {
    assert!(!html.contains("<script>alert"), "{what}: raw markup in {html}");
    assert_eq!(html.matches("<script").count(), 1, "{what}: only the UI's script: {html}");
    assert!(html.contains("<script src=\"/ui/assets/app.js\""), "{what}: {html}");
    for needle in ["&lt;script&gt;", "\u{202e}"] {
        for (at, _) in html.match_indices(needle) {
            let in_a_tag = html[..at].rfind('<') > html[..at].rfind('>');
            if in_a_tag {
                let tag = &html[html[..at].rfind('<').expect("in a tag")..at];
                let in_value = tag.rfind("value=\"").is_some_and(|v| !tag[v + "value=\"".len()..].contains('"'));
                assert!(in_value, "{what}: {needle:?} in a tag, outside a field's value: {tag}");
                continue;
            }
            let open = html[..at].rfind("<bdi>");
            let close = html[..at].rfind("</bdi>");
            assert!(
                open.is_some_and(|open| close.is_none_or(|close| close < open)),
                "{what}: {needle:?} at {at} is outside a <bdi>: {}",
                &html[at.saturating_sub(200)..at + needle.len()]
            );
        }
    }
}

#[tokio::test]
async fn every_state_shows_with_what_it_waits_on() {
    let s = seeded().await;
    let list = page(&s.app, "/ui/resources").await;
    for (state, reference) in &s.by_state {
        let shown = row(&list, reference);
        assert!(shown.contains(&format!("class=\"state-{state}\">{state}</span>")), "{state}: {shown}");
        let own = page(&s.app, &format!("/ui/resources/{reference}")).await;
        assert!(own.contains(&format!("<span class=\"state-{state}\">{state}</span>")), "{state}: {own}");
        assert!(own.contains(&format!("<dd class=\"mono\">{reference}</dd>")), "{state}: {own}");
        match WAITING.iter().find(|(waiting, _, _)| waiting == state) {
            Some((_, on, stuck)) => {
                assert!(shown.contains(on), "{state} waits on {on:?} in the list: {shown}");
                assert!(own.contains(&format!("Waiting on: <bdi>{on}")), "{state} waits on {on:?}: {own}");
                let badge = "<span class=\"badge stuck\" title=\"In this state longer than the overview's threshold\">stuck for 10 min</span>";
                assert_eq!(own.contains(badge), *stuck, "{state}: {own}");
                assert_eq!(shown.contains(badge), *stuck, "{state} in the list: {shown}");
            }
            None => {
                assert!(own.contains("It waits on nothing."), "{state}: {own}");
                assert!(!own.contains("class=\"badge stuck\""), "{state} is never stuck: {own}");
            }
        }
        // Filtered by its state, the list shows it.
        let filtered = page(&s.app, &format!("/ui/resources?state={state}")).await;
        assert!(listed(&filtered).contains(reference), "{state}: {filtered}");
        assert!(filtered.contains(&format!("<option value=\"{state}\" selected>")), "the form keeps the filter");
    }
    // A pending resource with a claim waits on its pool, and links it.
    let on_pool = page(&s.app, &format!("/ui/resources/{}", s.pending_on_pool)).await;
    assert!(on_pool.contains("Waiting on: <bdi>waiting for an identifier of pool ips</bdi>"), "{on_pool}");
    assert!(on_pool.contains("<a href=\"/ui/pools/ips\"><bdi>ips</bdi></a>"), "{on_pool}");
    assert!(on_pool.contains("<td>wanted</td>"), "{on_pool}");
    // Why each ended, as text.
    let orphaned = page(&s.app, &format!("/ui/resources/{}", s.by_state["orphaned"])).await;
    assert!(orphaned.contains("freed_because"), "{orphaned}");
    let lost = page(&s.app, &format!("/ui/resources/{}", s.by_state["lost"])).await;
    assert!(lost.contains("found_missing_by") && lost.contains("<bdi>w-lost</bdi>"), "{lost}");
    s.shutdown.cancel();
}

#[tokio::test]
async fn text_from_outside_is_escaped_and_isolated_on_every_page() {
    let s = seeded().await;
    let pages = [
        ("the list", "/ui/resources".to_owned()),
        ("a holder", format!("/ui/resources/{}", s.by_state["active"])),
        ("an attribute", format!("/ui/resources/{}", s.by_state["pending"])),
        ("a pause's reason", format!("/ui/resources/{}", s.by_state["paused"])),
        ("an operator's report", format!("/ui/resources/{}", s.by_state["suspect"])),
        ("a release's reason", format!("/ui/resources/{}", s.by_state["destroyed"])),
        ("a driver's error", format!("/ui/resources/{}", s.by_state["failed"])),
        ("a lease's holder", format!("/ui/leases/{}", s.held_lease)),
        ("an effect", format!("/ui/commands/{}", s.acquire_command)),
        ("an attribute's effect", format!("/ui/commands/{}", s.allocate_command)),
        ("a dead letter's reason", format!("/ui/commands/{}", s.dead_command)),
    ];
    for (what, uri) in &pages {
        let html = page(&s.app, uri).await;
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{what} shows the text: {html}");
        assert_shown_as_text(&html, what);
    }
    // Where a value is a whole text, it is isolated whole.
    let holder = page(&s.app, &format!("/ui/leases/{}", s.held_lease)).await;
    assert!(holder.contains(&format!("<dd><bdi>{EVIL_ESCAPED}</bdi></dd>")), "{holder}");
    let list = page(&s.app, "/ui/resources").await;
    let active = row(&list, &s.by_state["active"]);
    assert!(active.contains(&format!("<bdi>{EVIL_ESCAPED}</bdi>")), "the holder in the list: {active}");
    let pending = row(&list, &s.by_state["pending"]);
    assert!(pending.contains(&format!("<bdi>note</bdi>=<bdi>{EVIL_ESCAPED}</bdi>")), "{pending}");
    // A filter value echoed in the form is an attribute value, escaped.
    let (status, _, echoed) = get(&s.app, &format!("/ui/resources?holder={}", encode(EVIL))).await;
    assert_eq!(status, StatusCode::OK);
    assert!(echoed.contains("value=\"&lt;script&gt;alert(1)&lt;/script&gt;\u{202e}evil\""), "{echoed}");
    assert_eq!(listed(&echoed), vec![s.by_state["active"].clone()], "the holder filter finds its resource");
    assert_shown_as_text(&echoed, "the holder filter");
    s.shutdown.cancel();
}

#[tokio::test]
async fn a_resource_links_its_agent_leases_queue_and_the_command_that_made_it() {
    let s = seeded().await;
    let active = &s.by_state["active"];
    let html = page(&s.app, &format!("/ui/resources/{active}")).await;
    assert!(html.contains("<a href=\"/ui/agents/w1\"><bdi>w1</bdi></a>"), "{html}");
    assert!(html.contains(&format!("href=\"/ui/leases/{}\"", s.held_lease)), "{html}");
    assert!(html.contains(&format!("href=\"/ui/leases/{}\"", s.queued_lease)), "{html}");
    assert!(html.contains("#1 in the queue"), "the queued lease is next: {html}");
    assert!(html.contains(&format!("command <a href=\"/ui/commands/{}\">", s.allocate_command)), "{html}");
    assert!(html.contains("<bdi>team</bdi>=<bdi>ci</bdi>"), "{html}");
    assert!(html.contains("<time datetime=\""), "times are <time>: {html}");

    let queued = page(&s.app, &format!("/ui/leases/{}", s.queued_lease)).await;
    assert!(queued.contains("<span class=\"state-waiting\">waiting</span>"), "{queued}");
    assert!(queued.contains("#1 in the queue"), "{queued}");
    assert!(queued.contains(&format!("<a href=\"/ui/resources/{active}\">")), "{queued}");
    let held = page(&s.app, &format!("/ui/leases/{}", s.held_lease)).await;
    assert!(held.contains("<span class=\"state-active\">active</span>") && !held.contains("in the queue"), "{held}");
    let broken = page(&s.app, &format!("/ui/leases/{}", s.broken_lease)).await;
    assert!(broken.contains("<span class=\"state-broken\">broken</span>"), "{broken}");
    assert!(broken.contains("<dt>Why</dt>") && broken.contains("<dt>Ended</dt><dd><time"), "why it ended: {broken}");
    s.shutdown.cancel();
}

#[tokio::test]
async fn a_command_shows_its_outcome_with_links_or_its_dead_letter() {
    let s = seeded().await;
    let html = page(&s.app, &format!("/ui/commands/{}", s.allocate_command)).await;
    assert!(html.contains("<dt>Status</dt><dd>accepted</dd>"), "{html}");
    assert!(html.contains("<dt>Issuer</dt><dd><bdi>op:alice</bdi></dd>"), "{html}");
    assert!(html.contains("resource-allocated"), "{html}");
    let active = &s.by_state["active"];
    assert!(html.contains(&format!("<a href=\"/ui/resources/{active}\">")), "what it names is linked: {html}");
    assert!(html.contains("<a href=\"/ui/agents/w1\">"), "{html}");

    let acquired = page(&s.app, &format!("/ui/commands/{}", s.acquire_command)).await;
    assert!(acquired.contains(&format!("<a href=\"/ui/leases/{}\">", s.held_lease)), "{acquired}");

    let rejected = page(&s.app, &format!("/ui/commands/{}", s.rejected_command)).await;
    assert!(rejected.contains("<dt>Status</dt><dd>rejected</dd>") && rejected.contains("rejected, "), "{rejected}");

    let dead = page(&s.app, &format!("/ui/commands/{}", s.dead_command)).await;
    assert!(dead.contains("<dt>Status</dt><dd>dead-lettered</dd>"), "{dead}");
    assert!(dead.contains(&format!("<dd class=\"error\"><bdi>{EVIL_ESCAPED}</bdi></dd>")), "{dead}");
    assert!(dead.contains(&format!("<bdi>lh.cmd.0.w1.{}</bdi>", s.dead_command)), "its subject: {dead}");
    s.shutdown.cancel();
}

#[tokio::test]
async fn the_list_pages_by_key_as_the_api_does_and_keeps_its_filters() {
    let s = seeded().await;
    // Every resource of w1 a page of three at a time, following "Next page": the API's order, nothing twice.
    let (_, _, api) = get(&s.app, "/v1/resources?agent=w1&limit=1000").await;
    let api: serde_json::Value = serde_json::from_str(&api).expect("JSON");
    let every: Vec<String> =
        api.as_array().expect("a list").iter().map(|r| r["ref"].as_str().expect("a ref").to_owned()).collect();
    assert!(every.len() > 6, "{every:?}");
    let (mut uri, mut seen, mut pages) = (Some("/ui/resources?agent=w1&limit=3".to_owned()), Vec::new(), 0);
    while let Some(at) = uri.take() {
        let html = page(&s.app, &at).await;
        let shown = listed(&html);
        assert!(shown.len() <= 3, "{shown:?}");
        seen.extend(shown);
        pages += 1;
        if pages > 1 {
            assert_eq!(href_of(&html, "First page").as_deref(), Some("/ui/resources?agent=w1&limit=3"));
        } else {
            assert_eq!(href_of(&html, "First page"), None, "the first page links no first page");
        }
        uri = href_of(&html, "Next page");
        if let Some(next) = &uri {
            let last = seen.last().expect("a full page");
            assert_eq!(next, &format!("/ui/resources?agent=w1&limit=3&after={}", encode(last)), "the API's key");
        }
        assert!(pages <= every.len(), "the pages end");
    }
    assert_eq!(seen, every);

    // Empty fields of the form are no filter; attributes filter as the API's do.
    let form = page(&s.app, "/ui/resources?agent=&state=&kind=&attr=team%3Dci&attr=&holder=").await;
    assert_eq!(listed(&form), vec![s.by_state["active"].clone()]);
    assert!(form.contains("name=\"attr\" value=\"team=ci\""), "the form keeps the attribute: {form}");

    // What ended over an hour ago shows only with `all`.
    let recent = page(&s.app, "/ui/resources?state=destroyed").await;
    assert_eq!(listed(&recent), vec![s.by_state["destroyed"].clone()]);
    let all = page(&s.app, "/ui/resources?state=destroyed&all=true").await;
    let mut both = vec![s.by_state["destroyed"].clone(), s.ended_long_ago.clone()];
    both.sort();
    assert_eq!(listed(&all), both);
    assert!(all.contains("name=\"all\" value=\"true\" checked"), "{all}");
    s.shutdown.cancel();
}

#[tokio::test]
async fn bad_names_are_400_pages_and_unknown_ones_404_pages() {
    let s = seeded().await;
    let unknown_resource = format!("w1.{}", leasehold_schemas::ResourceId::generate());
    let unknown_lease = format!("w1.{}", leasehold_schemas::ids::LeaseId::generate());
    let unknown_command = leasehold_schemas::ids::CommandId::generate().to_string();
    let cases = [
        ("/ui/resources?state=bogus".to_owned(), StatusCode::BAD_REQUEST, "state &quot;bogus&quot; is not one of"),
        ("/ui/resources?agent=a%20b".to_owned(), StatusCode::BAD_REQUEST, "bad query: agent:"),
        ("/ui/resources?attr=novalue".to_owned(), StatusCode::BAD_REQUEST, "is not name=value"),
        ("/ui/resources?limit=0".to_owned(), StatusCode::BAD_REQUEST, "is not a positive number"),
        ("/ui/resources?colour=red".to_owned(), StatusCode::BAD_REQUEST, "unknown parameter"),
        ("/ui/resources/nonsense".to_owned(), StatusCode::BAD_REQUEST, "is not a resource reference"),
        (format!("/ui/resources/{unknown_resource}"), StatusCode::NOT_FOUND, "No resource"),
        ("/ui/leases/nonsense".to_owned(), StatusCode::BAD_REQUEST, "is not a lease reference"),
        (format!("/ui/leases/{unknown_lease}"), StatusCode::NOT_FOUND, "No lease"),
        ("/ui/commands/nonsense".to_owned(), StatusCode::BAD_REQUEST, "is not a command id"),
        (format!("/ui/commands/{unknown_command}"), StatusCode::NOT_FOUND, "no outcome and no dead letter"),
    ];
    for (uri, status, says) in &cases {
        let (got, headers, html) = get(&s.app, uri).await;
        assert_eq!(got, *status, "{uri}: {html}");
        assert!(html.contains(says), "{uri} says {says:?}: {html}");
        assert!(html.starts_with("<!DOCTYPE html>"), "{uri}: a page, not JSON: {html}");
        assert!(headers["content-type"].to_str().expect("ASCII").starts_with("text/html"), "{uri}");
    }
    s.shutdown.cancel();
}

#[tokio::test]
async fn pages_carry_the_security_headers() {
    let s = seeded().await;
    for uri in [
        "/ui/resources".to_owned(),
        format!("/ui/resources/{}", s.by_state["active"]),
        format!("/ui/leases/{}", s.held_lease),
        format!("/ui/commands/{}", s.allocate_command),
        "/ui/resources/nonsense".to_owned(),
    ] {
        let (_, headers, _) = get(&s.app, &uri).await;
        let csp = headers["content-security-policy"].to_str().expect("ASCII");
        assert!(csp.contains("frame-ancestors 'none'") && csp.contains("script-src 'self'"), "{uri}: {csp}");
        assert!(!csp.contains("unsafe-inline"), "{uri}: {csp}");
        assert_eq!(headers["x-content-type-options"], "nosniff", "{uri}");
    }
    s.shutdown.cancel();
}

/// `text` percent-encoded as the pages encode what their links carry.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|byte| {
            if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
                char::from(byte).to_string()
            } else {
                format!("%{byte:02X}")
            }
        })
        .collect()
}

/// The `<section id="timeline">` of a page.
fn timeline(html: &str) -> &str {
    let start = html.find("<section id=\"timeline\">").unwrap_or_else(|| panic!("no timeline in {html}"));
    let end = start + html[start..].find("</section>").expect("the section ends");
    &html[start..end]
}

/// How many lines the timeline's list holds: steps (each opens with its time and its command) and folded runs.
fn steps_shown(section: &str) -> usize {
    section.matches("</time> · <strong>").count() + section.matches(" routine steps from ").count()
}

#[tokio::test]
async fn a_resource_and_a_lease_show_their_timelines_in_pages() {
    let s = seeded().await;
    let active = &s.by_state["active"];
    let html = page(&s.app, &format!("/ui/resources/{active}")).await;
    let section = timeline(&html);
    assert!(section.contains("<ol class=\"timeline\">"), "{section}");
    for command in ["op.allocate", "agent.report-created", "op.acquire"] {
        assert!(section.contains(&format!("<bdi>{command}</bdi>")), "{command} in {section}");
    }
    assert!(section.contains("href=\"/ui/commands/"), "each step links its command: {section}");
    assert!(section.contains(EVIL_ESCAPED), "the lease's holder, in its grant's effect: {section}");
    assert!(section.contains("<time datetime=\""), "{section}");
    assert!(!section.contains("rel=\"prev\""), "every step on one page: {section}");

    // One step a page: the newest, with a link to the older ones, whose page links back to the newer.
    let newest = page(&s.app, &format!("/ui/resources/{active}?limit=1")).await;
    let section = timeline(&newest);
    assert_eq!(steps_shown(section), 1, "{section}");
    let older = href_of(section, "← older steps").expect("a link to the older steps");
    assert!(older.starts_with(&format!("/ui/resources/{}?before=", encode(active))), "{older}");
    // The older pages keep the page size asked for, one step each, back to the allocation; each links to the newer.
    assert!(older.contains("&limit=1#timeline"), "the page size goes on: {older}");
    let mut older = Some(older);
    let mut walked = 0;
    let mut reached_the_allocation = false;
    while let Some(link) = older.take() {
        walked += 1;
        assert!(walked < 20, "more older pages than the resource has steps");
        let before = page(&s.app, link.split('#').next().expect("a path")).await;
        let section = timeline(&before);
        assert_eq!(steps_shown(section), 1, "the older steps, one a page: {section}");
        assert!(href_of(section, "newer steps →").is_some(), "{section}");
        reached_the_allocation |= section.contains("<bdi>op.allocate</bdi>");
        older = href_of(section, "← older steps");
    }
    assert!(reached_the_allocation, "the oldest page holds the allocation");

    // A lease's page: its own steps, from its acquire.
    let html = page(&s.app, &format!("/ui/leases/{}", s.held_lease)).await;
    let section = timeline(&html);
    assert!(section.contains("<bdi>op.acquire</bdi>") && section.contains(EVIL_ESCAPED), "{section}");
    assert!(!section.contains("op.allocate"), "not its resource's other steps: {section}");
    assert_shown_as_text(&html, "a lease's timeline");

    // A query the timeline does not take is a 400 page.
    for bad in ["?before=soon", "?after=1&before=2", "?colour=red"] {
        let (status, _, body) = get(&s.app, &format!("/ui/resources/{active}{bad}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }
}
