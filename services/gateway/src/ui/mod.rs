//! The operator's view: read-only HTML pages at `/ui`, served by the gateway from the same read models as the API.
//!
//! Pages are rendered on the server ([maud], which escapes every value it inserts); the CSS and the one script are
//! files of this crate, embedded in the binary and served under `/ui/assets/`. No page carries inline script or
//! style, so the `Content-Security-Policy` of every answer allows only this origin's files (no `unsafe-inline`), and
//! no page can be framed. Every page works without JavaScript; the script only shows times in the browser's zone
//! (they are rendered as UTC in `<time datetime>`) and follows the live feed.
//!
//! What a producer or an agent wrote (a holder, an attribute, a reason) is shown inside `<bdi>`, so a right-to-left
//! override in it cannot reorder the text around it; values carried in links are percent-encoded.

mod agents;
mod command;
mod feed;
mod layout;
mod lease;
mod login;
mod overview;
mod parts;
mod pools;
mod resource;
mod resources;
mod timeline;

use std::sync::Arc;

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use leasehold_log::Log;
use maud::{Markup, html};

use crate::session::Access;
use crate::{Api, Health};

pub(crate) use layout::{Page, age, bdi, encode, link, now_ms, page, signed_in, timestamp};

/// What the pages read: the API's state (log and read models) and the process's health (readiness, failures, the
/// writers' metrics when this process runs them).
pub(crate) struct Ui<L: Log> {
    pub(crate) api: Arc<Api<L>>,
    pub(crate) health: Health,
    /// The tokens and sessions, when the gateway has tokens: every page but the login page and the assets then
    /// needs a session (or a bearer token), [`login::gate`].
    pub(crate) access: Option<Arc<Access>>,
}

/// The pages, under `/ui`. With `access` (tokens), a page asked for without a session redirects to the login page.
pub(crate) fn router<L: Log>(api: Arc<Api<L>>, health: Health, access: Option<Arc<Access>>) -> Router {
    let ui = Arc::new(Ui { api, health, access: access.clone() });
    let pages = Router::new()
        .route("/ui", get(overview::get::<L>))
        .route("/ui/", get(overview::get::<L>))
        .route("/ui/resources", get(resources::get::<L>))
        .route("/ui/resources/{reference}", get(resource::get::<L>))
        .route("/ui/leases/{reference}", get(lease::get::<L>))
        .route("/ui/commands/{id}", get(command::get::<L>))
        .route("/ui/agents", get(agents::list::<L>))
        .route("/ui/agents/{name}", get(agents::one::<L>))
        .route("/ui/pools", get(pools::list::<L>))
        .route("/ui/pools/{name}", get(pools::one::<L>))
        .route("/ui/feed", get(feed::get::<L>))
        .route("/ui/assets/{file}", get(asset))
        .route("/ui/login", get(login::form::<L>).post(login::login::<L>))
        .route("/ui/logout", post(login::logout::<L>))
        .route("/ui/{*rest}", get(not_found))
        .with_state(ui);
    let pages = match access {
        Some(access) => pages.route_layer(axum::middleware::from_fn_with_state(access, login::gate)),
        None => pages,
    };
    pages.layer(axum::middleware::map_response(security_headers))
}

/// The headers every answer under `/ui` carries: only this origin's script, style and connections; no framing; no
/// sniffing of types; no referrer leaving the page; pages never cached (they are as of now).
async fn security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; \
             form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

const CSS: &str = include_str!("assets/app.css");
const SCRIPT: &str = include_str!("assets/app.js");
const ICON: &str = include_str!("assets/icon.svg");

/// `GET /ui/assets/{file}`: the style sheet and the script (cached for an hour: they change only with the binary).
async fn asset(Path(file): Path<String>) -> Response {
    let (body, kind) = match file.as_str() {
        "app.css" => (CSS, "text/css; charset=utf-8"),
        "app.js" => (SCRIPT, "text/javascript; charset=utf-8"),
        "icon.svg" => (ICON, "image/svg+xml"),
        _ => return not_found().await,
    };
    ([(header::CONTENT_TYPE, kind), (header::CACHE_CONTROL, "public, max-age=3600")], body).into_response()
}

async fn not_found() -> Response {
    problem(
        StatusCode::NOT_FOUND,
        "Not found",
        html! { p { "No such page. " a href="/ui" { "The overview" } " lists what there is." } },
    )
}

/// A page that says what went wrong, with `status`.
pub(crate) fn problem(status: StatusCode, title: &str, body: Markup) -> Response {
    (status, page(Page::new(title), body)).into_response()
}

/// A page for a read model that cannot be read now (503: the projection may be back soon).
pub(crate) fn unavailable(e: impl std::fmt::Display) -> Response {
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "Unavailable",
        html! { p { "The projection cannot be read: " bdi { (e.to_string()) } } },
    )
}
