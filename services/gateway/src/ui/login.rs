//! Who may look, when the gateway has tokens: `GET /ui/login` (the form), `POST /ui/login` (a token traded for a
//! read-only session, [`crate::session`]), `POST /ui/logout`, and the gate every other page is behind.
//!
//! The token travels in a POST body only, never in a URL (where it would stay in the browser's history, a proxy's
//! log and the `Referer` of the next request). After a login the browser is sent (303) to the page it asked for,
//! which must be a page of the view: an address of another site, or one a browser could read as one (`//host`,
//! `/\host`), is ignored, so that a link to the login page cannot send someone who trusts it elsewhere.

use std::sync::Arc;

use axum::Form;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use leasehold_log::Log;
use maud::{Markup, html};
use serde::Deserialize;
use tokio::time::Instant;

use super::{Page, Ui, encode, page, problem, signed_in};
use crate::auth::{bearer_of, reads};
use crate::session::Access;

/// The longest `next` taken: a page address with its filters, not a document.
const MAX_NEXT_LEN: usize = 2048;

/// Where a login sends the browser when it asked for nothing (or for something it may not be sent to).
const HOME: &str = "/ui";

/// The paths that need no session: the login page itself, logout (it only forgets), and the style sheet and script
/// the login page uses.
fn is_open(path: &str) -> bool {
    path == "/ui/login" || path == "/ui/logout" || path.starts_with("/ui/assets/")
}

/// `next` if it is a page of the view the browser may be sent to after a login, else the overview: a path under
/// `/ui` (not the login or logout page), of printable ASCII without backslashes (which some browsers read as `/`),
/// without dot segments, at most [`MAX_NEXT_LEN`] bytes. Being a path that starts with `/ui`, it cannot name another
/// host; without dot segments, it stays under `/ui` once the browser resolves it.
pub(crate) fn local_next(next: Option<&str>) -> &str {
    let Some(next) = next else { return HOME };
    let under_ui = next == "/ui" || next.starts_with("/ui/") || next.starts_with("/ui?");
    let plain = next.bytes().all(|b| b.is_ascii_graphic() && b != b'\\');
    let login_again = next.starts_with("/ui/login") || next.starts_with("/ui/logout");
    let path = next.split(['?', '#']).next().unwrap_or_default();
    let stays = !path.split('/').any(is_dot_segment);
    if under_ui && plain && stays && !login_again && next.len() <= MAX_NEXT_LEN { next } else { HOME }
}

/// Whether a path segment is one a browser resolves away (`.`) or up (`..`), percent-encoded dots included: the URL
/// standard reads `%2e` as a dot in them, so `/ui/%2e%2e/v1/export` is `/v1/export`.
fn is_dot_segment(segment: &str) -> bool {
    let decoded = segment.to_ascii_lowercase().replace("%2e", ".");
    decoded == "." || decoded == ".."
}

/// Lets a request for a page through when it carries a valid bearer token, or, when it only reads, the cookie of a
/// live session; the page is then rendered as that principal's ([`signed_in`]). A read without either is sent
/// (303) to the login page, which will send it back; anything else is refused (401). The login page, logout and
/// the assets need neither.
pub(crate) async fn gate(State(access): State<Arc<Access>>, request: Request, next: Next) -> Response {
    if is_open(request.uri().path()) {
        return next.run(request).await;
    }
    let principal = match bearer_of(&request) {
        Some(Some(token)) => access.tokens.principal_of(&token).cloned(),
        _ if reads(request.method()) => access.session_principal(request.headers(), Instant::now()),
        _ => None,
    };
    if let Some(principal) = principal {
        return signed_in(principal, next.run(request)).await;
    }
    if reads(request.method()) {
        let asked = request.uri().path_and_query().map_or(HOME, |p| p.as_str());
        return see_other(&format!("/ui/login?next={}", encode(local_next(Some(asked)))));
    }
    problem(
        StatusCode::UNAUTHORIZED,
        "Not logged in",
        html! { p { "The operator's view only reads. " a href="/ui/login" { "Log in" } " to look." } },
    )
}

/// A 303 to `location` (a path of this gateway).
fn see_other(location: &str) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    if let Ok(value) = HeaderValue::try_from(location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    response
}

#[derive(Debug, Deserialize)]
pub(crate) struct NextQuery {
    next: Option<String>,
}

#[derive(Deserialize)]
pub(crate) struct LoginForm {
    #[serde(default)]
    token: String,
    next: Option<String>,
}

impl std::fmt::Debug for LoginForm {
    // The token stays out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoginForm").field("next", &self.next).finish_non_exhaustive()
    }
}

/// `GET /ui/login?next=`: the form. Without tokens there is nothing to log in to: the page asked for.
pub(crate) async fn form<L: Log>(
    State(ui): State<Arc<Ui<L>>>,
    query: Result<Query<NextQuery>, QueryRejection>,
) -> Response {
    // A query that does not decode asks for nothing in particular: the overview.
    let next = query.as_ref().ok().and_then(|Query(q)| q.next.as_deref());
    let next = local_next(next);
    match &ui.access {
        None => see_other(next),
        Some(access) => login_page(StatusCode::OK, next, None, access).into_response(),
    }
}

/// `POST /ui/login` (`token`, `next`): with a token of the gateway's, a new session, its cookie, and a 303 to
/// `next`; with any other, 401 and the form again saying so, no cookie.
pub(crate) async fn login<L: Log>(
    State(ui): State<Arc<Ui<L>>>,
    headers: HeaderMap,
    form: Result<Form<LoginForm>, FormRejection>,
) -> Response {
    let Some(access) = &ui.access else { return see_other(HOME) };
    if let Some(refusal) = from_another_site(&headers) {
        return refusal;
    }
    let Form(form) = match form {
        Ok(form) => form,
        Err(e) => {
            let why = format!("The form could not be read ({}): send it from this page.", e.body_text());
            return login_page(StatusCode::BAD_REQUEST, HOME, Some(&why), access).into_response();
        }
    };
    let next = local_next(form.next.as_deref());
    let Some(principal) = access.tokens.principal_of(form.token.trim()).cloned() else {
        tracing::info!("refused a login to the operator's view: the token is not one this gateway knows");
        let why = "That token is not one this gateway knows: check it against the gateway's --tokens file.";
        return login_page(StatusCode::UNAUTHORIZED, next, Some(why), access).into_response();
    };
    let id = match access.sessions.begin(principal.clone(), Instant::now()) {
        Ok(id) => id,
        Err(e) => {
            tracing::error!(error = %e, "the operating system gave no random bytes for a session id");
            return problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "Unavailable",
                html! { p { "No session can be made now: the system's random source failed. Try again." } },
            );
        }
    };
    tracing::info!(principal = principal.as_str(), "a session of the operator's view began");
    let mut response = see_other(next);
    response.headers_mut().insert(header::SET_COOKIE, access.cookie(&id));
    response
}

/// `POST /ui/logout`: ends the request's session (it is forgotten by the gateway, not only by the browser), clears
/// the cookie, and shows the login page.
pub(crate) async fn logout<L: Log>(State(ui): State<Arc<Ui<L>>>, headers: HeaderMap) -> Response {
    let Some(access) = &ui.access else { return see_other(HOME) };
    if let Some(refusal) = from_another_site(&headers) {
        return refusal;
    }
    access.end_sessions_of(&headers);
    let mut response = see_other("/ui/login");
    response.headers_mut().insert(header::SET_COOKIE, access.cleared_cookie());
    response
}

/// A 403 for a form another site's page sent (a browser says so in `Sec-Fetch-Site`): logging someone in or out
/// is this view's own pages' business. A client that sends no such header (not a browser, or an old one) is taken.
fn from_another_site(headers: &HeaderMap) -> Option<Response> {
    let site = headers.get("sec-fetch-site")?.to_str().ok()?;
    if site == "same-origin" || site == "none" {
        return None;
    }
    Some(problem(
        StatusCode::FORBIDDEN,
        "Refused",
        html! { p { "This form is taken from the operator's view's own pages only. " a href="/ui/login" { "Log in here." } } },
    ))
}

/// The login page: the form (the token in a password field, sent by POST), what went wrong if something did, and
/// what a session allows.
fn login_page(status: StatusCode, next: &str, error: Option<&str>, access: &Access) -> (StatusCode, Markup) {
    let hours = access.sessions.ttl().as_secs() / 3600;
    let lasts =
        if hours >= 1 { format!("{hours} h") } else { format!("{} min", access.sessions.ttl().as_secs().div_ceil(60)) };
    let body = html! {
        section {
            form.login method="post" action="/ui/login" {
                @if let Some(error) = error {
                    p.error role="alert" { (error) }
                }
                label for="token" { "Token" }
                input id="token" name="token" type="password" autocomplete="current-password" required autofocus;
                input type="hidden" name="next" value=(next);
                button type="submit" { "Log in" }
            }
            p.note {
                "A token of the gateway's --tokens file. The session it opens only reads: commands still need the \
                 token itself (the command line). It ends at Log out, or after " (lasts) "."
            }
        }
    };
    (status, page(Page::new("Log in"), body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_pages_of_the_view_are_places_to_go_back_to() {
        for kept in [
            "/ui",
            "/ui/",
            "/ui/resources?state=active&agent=w1",
            "/ui?x=1",
            "/ui/agents/w%201",
            "/ui/resources?after=w1..x",
            "/ui/feed?key=..",
            "/ui/resources/w1.01a21f25-d79b-7604-a845-02dcc82f575c",
        ] {
            assert_eq!(local_next(Some(kept)), kept);
        }
        for refused in [
            "https://evil.example/ui",
            "//evil.example/ui",
            "/\\evil.example",
            "/ui\\..\\evil",
            "\\\\evil.example",
            "/uix",
            "javascript:alert(1)",
            "ui/resources",
            "/ui/login?next=https://evil.example",
            "/ui/logout",
            "/ui/a b",
            "/ui/\u{202e}",
            "",
            "/ui/../v1/export",
            "/ui/..//evil.example/x",
            "/ui/%2e%2e/v1/agents",
            "/ui/.%2E/metrics",
            "/ui/%2E./metrics",
            "/ui/./../v1/dlq?x=1",
            "/ui/..",
        ] {
            assert_eq!(local_next(Some(refused)), HOME, "{refused:?}");
        }
        assert_eq!(local_next(None), HOME);
        assert_eq!(local_next(Some(&format!("/ui/{}", "a".repeat(MAX_NEXT_LEN)))), HOME);
    }

    #[test]
    fn the_login_page_and_the_assets_are_open() {
        assert!(is_open("/ui/login") && is_open("/ui/logout") && is_open("/ui/assets/app.css"));
        assert!(!is_open("/ui") && !is_open("/ui/loginx") && !is_open("/ui/resources") && !is_open("/ui/assets"));
    }
}
