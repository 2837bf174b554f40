//! A thing's timeline on its page (a resource's, a lease's): who did what, when, and why, from the projection's
//! timeline index — the steps `GET /v1/.../history` answers, newest page first, oldest step first within a page.
//! Runs of routine steps (renewals, health checks, reports that changed nothing) fold into one line.

use leasehold_log::Log;
use leasehold_projector::At;
use leasehold_projector::timeline::Thing;
use maud::{Markup, html};

use super::{bdi, encode, timestamp};
use crate::Api;
use crate::history::{PageQuery, Step, Steps};

/// The steps one page of the UI shows.
pub(crate) const PAGE_STEPS: usize = 50;

/// Where the page's timeline starts and how many steps it shows, from the page's query: without `before` or `after`,
/// the newest steps. A bad query is the message of a 400 page.
pub(crate) fn page_of(query: &PageQuery) -> Result<(At, usize), String> {
    query.at(At::Last).map(|(at, limit)| (at, limit.min(PAGE_STEPS))).map_err(|e| format!("bad query: {e}"))
}

/// A page with a timeline (`/ui/resources/{ref}`, `/ui/leases/{ref}`): the reference of its path, the thing
/// `thing_of` reads it as, and the steps its query asks for, or the 400 page that says what is wrong with them.
pub(crate) fn asked(
    reference: Result<axum::extract::Path<String>, axum::extract::rejection::PathRejection>,
    query: Result<axum::extract::Query<PageQuery>, axum::extract::rejection::QueryRejection>,
    thing_of: fn(&str) -> Result<Thing, String>,
) -> Result<(String, Thing, (At, usize)), axum::response::Response> {
    let reference = super::parts::path_param(reference)?;
    let steps = match query {
        Ok(axum::extract::Query(query)) => page_of(&query).map_err(|message| super::parts::bad_request(&message))?,
        Err(e) => return Err(super::parts::bad_request(&format!("bad query: {}", e.body_text()))),
    };
    let thing = thing_of(&reference).map_err(|message| super::parts::bad_request(&message))?;
    Ok((reference, thing, steps))
}

/// The timeline section of `thing`'s page at `base` (its path: the pager's links go back to it with `?before=` or
/// `?after=`), from `at`, `limit` steps ([`page_of`]). A timeline that cannot be read says so in its section, and
/// the rest of the page still shows.
pub(crate) async fn for_thing<L: Log>(api: &Api<L>, thing: &Thing, (at, limit): (At, usize), base: &str) -> Markup {
    match crate::history::steps(api, thing, at, limit).await {
        // A page size asked for goes on in the pager's links; the default one is left out of them.
        Ok(steps) => section(&steps, base, (limit != PAGE_STEPS).then_some(limit)),
        Err(e) => unreadable(&e.to_string()),
    }
}

fn unreadable(why: &str) -> Markup {
    html! {
        section id="timeline" {
            h2 { "Timeline" }
            p.error { "The timeline cannot be shown: " (bdi(why)) }
        }
    }
}

/// One line of the list: a step, or a run of routine steps folded.
enum Line<'s> {
    Step(&'s Step),
    Routine(&'s [Step]),
}

/// Runs of two or more routine steps become one line; every other step is its own.
fn lines(steps: &[Step]) -> Vec<Line<'_>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < steps.len() {
        let run = steps[i..].iter().take_while(|s| s.routine).count();
        if run >= 2 {
            out.push(Line::Routine(&steps[i..i + run]));
            i += run;
        } else {
            out.push(Line::Step(&steps[i]));
            i += 1;
        }
    }
    out
}

/// The timeline section: `<section id="timeline">` with an `ol.timeline` of the page's steps, oldest first, and links
/// to the older and newer pages (back to `base`).
pub(crate) fn section(page: &Steps, base: &str, limit: Option<usize>) -> Markup {
    let limit = limit.map(|limit| format!("&limit={limit}")).unwrap_or_default();
    html! {
        section id="timeline" {
            h2 { "Timeline" }
            p.note {
                "Every step that concerns it, in log order: its own decisions, its leases' and its pool identifiers'. \
                 A rejected command is here when it names it. The state after each step is in "
                code { "leasehold-replay history" } "."
            }
            @if page.steps.is_empty() {
                p { "Nothing on record concerns it." }
            } @else {
                ol.timeline {
                    @for line in lines(&page.steps) {
                        @match line {
                            Line::Step(step) => (step_item(step)),
                            Line::Routine(run) => (routine_item(run)),
                        }
                    }
                }
            }
            @if page.older.is_some() || page.newer.is_some() {
                nav.pager aria-label="timeline pages" {
                    @if let Some(older) = page.older {
                        a href={ (base) "?before=" (older) (limit) "#timeline" } rel="prev" { "← older steps" }
                    }
                    @if let Some(newer) = page.newer {
                        a href={ (base) "?after=" (newer) (limit) "#timeline" } rel="next" { "newer steps →" }
                    }
                }
            }
        }
    }
}

/// One step: when, what, who, the verdict and why, the effects about the thing, a link to its command.
fn step_item(step: &Step) -> Markup {
    let row = &step.row;
    let class = if row.rejection.is_some() {
        Some("rejected")
    } else if step.routine {
        Some("routine")
    } else {
        None
    };
    html! {
        li class=[class] {
            (timestamp(step.at)) " · "
            strong { (bdi(&row.command)) }
            " by " (bdi(&row.issuer))
            @if row.part > 0 { " (part " (row.part) ")" }
            " · "
            @match &row.rejection {
                Some(reason) => span.error { "rejected: " (bdi(reason)) },
                None => span.ok { "accepted" },
            }
            " · "
            a href={ "/ui/commands/" (encode(&row.command_id)) } { "command" }
            span.note { " outcome " (row.seq) }
            @if let Some(correlation) = &row.correlation_id {
                span.note { " · correlation " (bdi(correlation)) }
            }
            @if !row.effects.is_empty() {
                ul.effects {
                    @for effect in &row.effects {
                        li { code { (bdi(effect)) } }
                    }
                }
            }
        }
    }
}

/// A run of routine steps as one line: how many, of what, from when to when.
fn routine_item(run: &[Step]) -> Markup {
    let (first, last) = (&run[0], &run[run.len() - 1]);
    let mut kinds: Vec<(&str, usize)> = Vec::new();
    for step in run {
        match kinds.iter_mut().find(|(kind, _)| *kind == step.row.command) {
            Some((_, n)) => *n += 1,
            None => kinds.push((&step.row.command, 1)),
        }
    }
    html! {
        li.routine {
            (run.len()) " routine steps from " (timestamp(first.at)) " to " (timestamp(last.at)) ": "
            @for (i, (kind, n)) in kinds.iter().enumerate() {
                @if i > 0 { ", " }
                (bdi(kind)) " ×" (n)
            }
            span.note { " (outcomes " (first.row.seq) " to " (last.row.seq) ")" }
        }
    }
}

#[cfg(test)]
mod tests {
    use leasehold_projector::timeline::Row;

    use super::*;

    fn step(seq: u64, command: &str, routine: bool, rejection: Option<&str>) -> Step {
        Step {
            row: Row {
                seq,
                partition: 0,
                time: String::new(),
                command: command.to_owned(),
                command_id: format!("id/{seq}"),
                issuer: "op:<script>alert(1)</script>\u{202e}".to_owned(),
                correlation_id: None,
                part: 0,
                outcome: if rejection.is_some() { "rejected" } else { "accepted" }.to_owned(),
                rejection: rejection.map(str::to_owned),
                effects: vec![format!("{seq} lease-renewed {{\"holder\":\"<b>\"}}")],
            },
            at: 1_700_000_000_000 + seq,
            routine,
        }
    }

    #[test]
    fn runs_of_routine_steps_fold_and_outside_text_is_escaped() {
        let steps = Steps {
            steps: vec![
                step(1, "op.acquire", false, None),
                step(2, "op.renew", true, None),
                step(3, "op.renew", true, None),
                step(4, "agent.sync", true, None),
                step(5, "op.renew", false, Some("token-mismatch: <i>no</i>")),
                step(6, "op.renew", true, None),
            ],
            older: Some(1),
            newer: None,
        };
        let html = section(&steps, "/ui/resources/a.x", None).into_string();
        assert_eq!(html.matches("<li class=\"routine\">").count(), 2, "one run folded, one routine step alone: {html}");
        assert!(html.contains("3 routine steps from"), "{html}");
        assert!(html.contains("<bdi>op.renew</bdi> ×2, <bdi>agent.sync</bdi> ×1"), "{html}");
        assert!(html.contains("<li class=\"rejected\">"), "{html}");
        assert!(!html.contains("<script>") && !html.contains("<i>no</i>") && !html.contains("<b>"), "{html}");
        assert!(html.contains("&lt;script&gt;") && html.contains("\u{202e}</bdi>"), "{html}");
        assert!(html.contains("href=\"/ui/commands/id%2F1\""), "the command id is percent-encoded: {html}");
        assert!(html.contains("href=\"/ui/resources/a.x?before=1#timeline\""), "{html}");
        assert!(!html.contains("?after="), "no newer page: {html}");
        let sized = section(&steps, "/ui/resources/a.x", Some(3)).into_string();
        assert!(
            sized.contains("href=\"/ui/resources/a.x?before=1&amp;limit=3#timeline\""),
            "the page size goes on: {sized}"
        );
    }

    #[test]
    fn an_empty_timeline_says_so() {
        let html = section(&Steps { steps: vec![], older: None, newer: None }, "/ui/leases/a.x", None).into_string();
        assert!(html.contains("Nothing on record concerns it."), "{html}");
        assert!(!html.contains("pager"), "{html}");
    }
}
