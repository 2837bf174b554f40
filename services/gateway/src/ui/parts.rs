//! Pieces the pages of resources, leases and commands share: a state, a stuck badge, a record's detail (JSON) as
//! text, attributes, an optional time, and the pages that say a request was refused.

use std::collections::BTreeMap;

use axum::extract::Path;
use axum::extract::rejection::PathRejection;
use axum::http::StatusCode;
use axum::response::Response;
use leasehold_projector::views::ResourceView;
use maud::{Markup, html};

use super::overview::stuck_for;
use super::{age, bdi, problem, timestamp};
use crate::commands::Refusal;

/// A state (of a resource or a lease), with the class `state-<state>` the style sheet colours it by.
pub(crate) fn state(state: &str) -> Markup {
    html! { span class={ "state-" (state) } { (state) } }
}

/// The "stuck for" badge of `resource` as of `now` (unix ms), if its state has a threshold and it is past it.
pub(crate) fn stuck_badge(resource: &ResourceView, now: u64) -> Markup {
    html! {
        @if let Some(waited) = stuck_for(resource, now) {
            span.badge.stuck title="In this state longer than the overview's threshold" {
                "stuck for " (age(now, now.saturating_sub(waited)))
            }
        }
    }
}

/// A log time, or a dash when there is none.
pub(crate) fn time_or_dash(ms: Option<u64>) -> Markup {
    html! {
        @match ms {
            Some(ms) => { (timestamp(ms)) }
            None => { "–" }
        }
    }
}

/// Attributes as `name=value`, each isolated (they are a producer's text).
pub(crate) fn attributes(attributes: &BTreeMap<String, String>) -> Markup {
    html! {
        @for (i, (name, value)) in attributes.iter().enumerate() {
            @if i > 0 { ", " }
            (bdi(name)) "=" (bdi(value))
        }
    }
}

/// Keys whose numbers are log times in unix ms (`agent_gone_at`, a pause's `until`): shown as times.
fn is_time_key(key: &str) -> bool {
    key.ends_with("_at") || matches!(key, "until" | "since" | "deadline")
}

/// A record's `detail` (JSON) for people: an object as its keys and values, a list as its items, a text isolated,
/// numbers under keys of times as times. Everything is text, escaped; nothing in it becomes markup.
pub(crate) fn detail(value: &serde_json::Value) -> Markup {
    detail_under(None, value)
}

fn detail_under(key: Option<&str>, value: &serde_json::Value) -> Markup {
    use serde_json::Value;
    html! {
        @match value {
            Value::Null => { "–" }
            Value::Bool(b) => { (if *b { "yes" } else { "no" }) }
            Value::Number(n) => {
                @match n.as_u64().filter(|_| key.is_some_and(is_time_key)) {
                    Some(ms) => { (timestamp(ms)) }
                    None => { (n.to_string()) }
                }
            }
            Value::String(text) => { (bdi(text)) }
            Value::Array(items) => {
                @if items.is_empty() { "none" }
                ul { @for item in items { li { (detail_under(None, item)) } } }
            }
            Value::Object(map) => {
                dl.fields {
                    @for (name, inner) in map {
                        dt { (bdi(name)) }
                        dd { (detail_under(Some(name), inner)) }
                    }
                }
            }
        }
    }
}

/// A page's one path parameter, or a 400 page when it cannot be decoded (not UTF-8 once percent-decoded).
pub(crate) fn path_param(path: Result<Path<String>, PathRejection>) -> Result<String, Response> {
    path.map(|Path(param)| param).map_err(|e| bad_request(&format!("bad path: {}", e.body_text())))
}

/// A page's one path parameter as a name `check` takes (an agent's, a pool's), or the 400 page saying why not.
pub(crate) fn name_param<T, E: std::fmt::Display>(
    path: Result<Path<String>, PathRejection>,
    what: &str,
    check: impl FnOnce(&str) -> Result<T, E>,
) -> Result<String, Response> {
    let name = path_param(path)?;
    match check(&name) {
        Ok(_) => Ok(name),
        Err(e) => Err(problem(
            StatusCode::BAD_REQUEST,
            "Bad request",
            html! { p.error { (bdi(&name)) " is not " (what) ": " (e.to_string()) } },
        )),
    }
}

/// A 400 page saying what is wrong with the request.
pub(crate) fn bad_request(message: &str) -> Response {
    problem(StatusCode::BAD_REQUEST, "Bad request", html! { p.error { (bdi(message)) } })
}

/// The page of a request the API would refuse, with its status and message: 400, 404, 503.
pub(crate) fn refused(refusal: Refusal) -> Response {
    let title = match refusal.status {
        StatusCode::BAD_REQUEST => "Bad request",
        StatusCode::NOT_FOUND => "Not found",
        _ => "Unavailable",
    };
    problem(refusal.status, title, html! { p.error { (bdi(&refusal.message)) } })
}

/// A 404 page: there is no `what` by that name.
pub(crate) fn not_found(what: &str, name: &str) -> Response {
    problem(StatusCode::NOT_FOUND, "Not found", html! { p.error { "No " (what) " " (bdi(name)) " is known." } })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_detail_is_text_whatever_it_holds() {
        let value = serde_json::json!({
            "release": "<b>x</b>\u{202e}",
            "agent_gone_at": 1_700_000_000_000_u64,
            "n": 3,
            "list": ["a", null],
        });
        let shown = detail(&value).into_string();
        assert!(shown.contains("<bdi>&lt;b&gt;x&lt;/b&gt;\u{202e}</bdi>"), "{shown}");
        assert!(shown.contains("<time datetime=\"2023-11-14T22:13:20.000Z\">"), "{shown}");
        assert!(shown.contains("<dd>3</dd>") && shown.contains("<li>–</li>"), "{shown}");
        assert!(!shown.contains("<b>"), "{shown}");
    }
}
