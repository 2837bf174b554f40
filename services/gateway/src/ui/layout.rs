//! What every page shares: the frame (head, navigation), and the small pieces pages are made of — a time, a text
//! from outside, a link carrying a name.

use maud::{DOCTYPE, Markup, html};

/// The navigation's entries: (path, label).
const NAV: &[(&str, &str)] = &[
    ("/ui", "Overview"),
    ("/ui/resources", "Resources"),
    ("/ui/agents", "Agents"),
    ("/ui/pools", "Pools"),
    ("/ui/feed", "Live feed"),
];

tokio::task_local! {
    /// Who the request being answered came from, when the gateway has tokens: set by the access gate of the pages
    /// around the whole handler, so that every page's header offers to log out without each page asking for it.
    static SIGNED_IN: leasehold_schemas::ids::Issuer;
}

/// Runs `answer` (a page's handler) as a request of `principal`: the pages it renders show who is signed in and a
/// "Log out" button.
pub(crate) async fn signed_in<F: std::future::Future>(
    principal: leasehold_schemas::ids::Issuer,
    answer: F,
) -> F::Output {
    SIGNED_IN.scope(principal, answer).await
}

/// A page's title, which navigation entry it belongs to, and who is signed in (with tokens; none without).
#[derive(Debug, Clone)]
pub(crate) struct Page {
    title: String,
    section: Option<&'static str>,
    signed_in: Option<leasehold_schemas::ids::Issuer>,
}

impl Page {
    /// A page titled `title`; who is signed in is the principal of the request being answered ([`signed_in`]).
    pub(crate) fn new(title: impl Into<String>) -> Self {
        Page { title: title.into(), section: None, signed_in: SIGNED_IN.try_with(Clone::clone).ok() }
    }

    /// Marks the navigation entry at `path` as the current section.
    pub(crate) fn under(mut self, path: &'static str) -> Self {
        self.section = Some(path);
        self
    }
}

/// A whole page: `body` in the frame every page shares. The title is escaped like any text.
pub(crate) fn page(page: Page, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (page.title) " · leasehold" }
                link rel="icon" href="/ui/assets/icon.svg" type="image/svg+xml";
                link rel="stylesheet" href="/ui/assets/app.css";
                script src="/ui/assets/app.js" defer {}
            }
            body {
                header.top {
                    a.brand href="/ui" { "leasehold" }
                    nav {
                        @for (path, label) in NAV {
                            @if page.section == Some(*path) {
                                a.current href=(path) aria-current="page" { (label) }
                            } @else {
                                a href=(path) { (label) }
                            }
                        }
                    }
                    @if let Some(principal) = &page.signed_in {
                        span.who { (bdi(principal.as_str())) }
                        form method="post" action="/ui/logout" {
                            button type="submit" { "Log out" }
                        }
                    }
                }
                main {
                    h1 { (page.title) }
                    (body)
                }
            }
        }
    }
}

/// A text from outside (a producer's, an agent's, an operator's): escaped by maud, and isolated so that bidi
/// controls in it cannot reorder what is around it.
pub(crate) fn bdi(text: &str) -> Markup {
    html! { bdi { (text) } }
}

/// A log time (unix ms) as `<time datetime=...>` in UTC; the script shows it in the browser's zone.
pub(crate) fn timestamp(ms: u64) -> Markup {
    let at = leasehold_schemas::ids::Timestamp(ms).to_string();
    let shown = at.replacen('T', " ", 1).trim_end_matches('Z').to_owned() + " UTC";
    html! { time datetime=(at) { (shown) } }
}

pub(crate) use crate::queries::encode;

/// A link to `prefix/<name>` (the name percent-encoded) showing the name isolated.
pub(crate) fn link(prefix: &str, name: &str) -> Markup {
    html! { a href={ (prefix) "/" (encode(name)) } { (bdi(name)) } }
}

/// How long ago `since` was, from `now` (both unix ms), in the largest whole unit: `3 s`, `12 min`, `5 h`, `2 d`.
pub(crate) fn age(now: u64, since: u64) -> String {
    let seconds = now.saturating_sub(since) / 1000;
    match seconds {
        0..60 => format!("{seconds} s"),
        60..3600 => format!("{} min", seconds / 60),
        3600..86_400 => format!("{} h", seconds / 3600),
        _ => format!("{} d", seconds / 86_400),
    }
}

/// This process's clock as unix ms (what "now" is on a page: the read models keep log times).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_text_is_escaped_and_isolated() {
        let shown = bdi("<script>alert(1)</script>\u{202e}evil").into_string();
        assert_eq!(shown, "<bdi>&lt;script&gt;alert(1)&lt;/script&gt;\u{202e}evil</bdi>");
        let linked = link("/ui/agents", "a b/\"c\"").into_string();
        assert_eq!(linked, "<a href=\"/ui/agents/a%20b%2F%22c%22\"><bdi>a b/&quot;c&quot;</bdi></a>");
    }

    #[test]
    fn times_are_utc_in_the_markup_and_ages_whole_units() {
        assert_eq!(
            timestamp(1_700_000_000_123).into_string(),
            "<time datetime=\"2023-11-14T22:13:20.123Z\">2023-11-14 22:13:20.123 UTC</time>"
        );
        assert_eq!(age(10_000, 1_000), "9 s");
        assert_eq!(age(3_600_000, 0), "1 h");
        assert_eq!(age(0, 5_000), "0 s");
        assert_eq!(age(3 * 86_400_000, 0), "3 d");
    }
}
