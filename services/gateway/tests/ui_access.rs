//! Who may look at the operator's view, and the bounds of the live feed.
//!
//! With tokens, `POST /ui/login` trades a token for a session: a cookie (`HttpOnly`, `SameSite=Strict`, `Path=/`,
//! `Max-Age`, `Secure` behind TLS) that reads the pages and the `/v1` reads, and never sends a command. A wrong token
//! gets no cookie; logout and expiry end a session; the page a login goes back to is a page of the view, never
//! another site; the token is never in a URL. The streams of events are bounded in number (one more is a 503), and a
//! client that stops reading is dropped, over a real TCP connection, and resumes after the last event it got.
//!
//! The gateway is built in-process over the embedded log (a projector, and a worker when outcomes are needed, run as
//! tasks) and called with `tower::ServiceExt::oneshot`, or served on 127.0.0.1 for the slow client.

mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use leasehold_gateway::{EventsMetrics, GatewayConfig, Tokens};
use leasehold_log::Log;
use leasehold_schemas::Envelope;
use leasehold_schemas::codec;
use leasehold_schemas::command::Allocate;
use leasehold_schemas::ids::{AgentName, CommandId, Issuer, ResourceId, Timestamp};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;
use tower::ServiceExt;

use support::Gateway;

const ALICE: &str = "alice-token-0123456789";
const TOKEN_FILE: &str = "op:alice alice-token-0123456789\n";
const DEADLINE: Duration = Duration::from_secs(30);

fn with_tokens() -> GatewayConfig {
    GatewayConfig {
        tokens: Some(Arc::new(Tokens::parse(TOKEN_FILE).expect("a good token file"))),
        ..GatewayConfig::default()
    }
}

/// An answer, its body as text.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Answer {
    fn location(&self) -> Option<&str> {
        self.headers.get(header::LOCATION).map(|v| v.to_str().expect("ASCII"))
    }

    fn set_cookie(&self) -> Option<&str> {
        self.headers.get(header::SET_COOKIE).map(|v| v.to_str().expect("ASCII"))
    }

    /// The `name=value` of the session cookie this answer sets.
    fn session_cookie(&self) -> String {
        let set = self.set_cookie().unwrap_or_else(|| panic!("no Set-Cookie: {self:?}"));
        let pair = set.split(';').next().expect("a pair").trim().to_owned();
        assert!(pair.starts_with("leasehold_session=") && pair.len() > "leasehold_session=".len(), "{set}");
        pair
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

async fn call(app: &Router, request: Request<Body>) -> Answer {
    let response = app.clone().oneshot(request).await.expect("the router answers");
    let (status, headers) = (response.status(), response.headers().clone());
    let bytes = response.into_body().collect().await.expect("read the body").to_bytes();
    Answer { status, headers, body: String::from_utf8_lossy(&bytes).into_owned() }
}

fn request(method: Method, uri: &str, cookie: Option<&str>) -> axum::http::request::Builder {
    let mut builder = Request::builder().method(method).uri(uri);
    if let Some(cookie) = cookie {
        builder = builder.header(header::COOKIE, cookie);
    }
    builder
}

async fn get(app: &Router, uri: &str, cookie: Option<&str>) -> Answer {
    call(app, request(Method::GET, uri, cookie).body(Body::empty()).expect("a request")).await
}

/// `text` percent-encoded for a form field.
fn form_value(text: &str) -> String {
    text.bytes()
        .map(|b| if b.is_ascii_alphanumeric() { char::from(b).to_string() } else { format!("%{b:02X}") })
        .collect()
}

/// `POST /ui/login` of the form a browser sends: `token`, and `next` when given.
async fn login(app: &Router, token: &str, next: Option<&str>) -> Answer {
    let mut body = format!("token={}", form_value(token));
    if let Some(next) = next {
        body.push_str(&format!("&next={}", form_value(next)));
    }
    let request = request(Method::POST, "/ui/login", None)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(body))
        .expect("a request");
    call(app, request).await
}

/// A fresh allocation on w1, whose agent never registers: the writer rejects it, which is an outcome all the same.
fn allocate() -> Envelope {
    let agent = AgentName::new("w1").expect("an agent name");
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    let now = Timestamp(u64::try_from(since.as_millis()).expect("fits"));
    let body = Allocate::new(agent, ResourceId::generate(), "container", 1);
    Envelope::new(CommandId::generate(), Issuer::new("op:test").expect("an issuer"), now, body)
}

#[track_caller]
fn assert_redirected_to_login(answer: &Answer, next: &str) {
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{answer:?}");
    assert_eq!(answer.location(), Some(format!("/ui/login?next={next}").as_str()), "{answer:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_token_trades_for_a_session_that_reads_and_never_commands() {
    let gw = Gateway::start_with(with_tokens(), false).await;
    let app = &gw.app;

    let answer = login(app, ALICE, Some("/ui/agents?state=live")).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{answer:?}");
    assert_eq!(answer.location(), Some("/ui/agents?state=live"));
    let set = answer.set_cookie().expect("a cookie");
    let attributes: Vec<&str> = set.split(';').skip(1).map(str::trim).collect();
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=43200"] {
        assert!(attributes.contains(&flag), "{flag} missing from {set}");
    }
    assert!(!attributes.contains(&"Secure"), "not behind TLS: {set}");
    assert!(!set.contains(ALICE), "the token is not the cookie: {set}");
    let cookie = answer.session_cookie();

    // The pages, with who is signed in and a way out.
    let overview = get(app, "/ui", Some(&cookie)).await;
    assert_eq!(overview.status, StatusCode::OK, "{overview:?}");
    assert!(overview.body.contains(r#"<form method="post" action="/ui/logout">"#), "{}", overview.body);
    assert!(overview.body.contains("Log out") && overview.body.contains("<bdi>op:alice</bdi>"), "{}", overview.body);
    let head = call(app, request(Method::HEAD, "/ui", Some(&cookie)).body(Body::empty()).expect("a request")).await;
    assert_eq!(head.status, StatusCode::OK);

    // The API's reads, and the live feed's stream (an EventSource sends the cookie, not a header).
    let resources = get(app, "/v1/resources", Some(&cookie)).await;
    assert_eq!(resources.status, StatusCode::OK, "{resources:?}");
    assert!(resources.json().is_array(), "{resources:?}");
    let events = app
        .clone()
        .oneshot(request(Method::GET, "/v1/events?from=1", Some(&cookie)).body(Body::empty()).expect("a request"))
        .await
        .expect("an answer");
    assert_eq!(events.status(), StatusCode::OK);
    assert_eq!(events.headers()[header::CONTENT_TYPE], "text/event-stream");
    drop(events);

    // Never a command: refused before anything is published.
    let before = gw.log.last_command_seq().await.expect("the command log");
    let command = codec::command_to_json(&allocate()).expect("encode");
    for uri in ["/v1/commands", "/v1/commands/batch"] {
        let body = if uri.ends_with("batch") { format!("[{command}]") } else { command.clone() };
        let post = request(Method::POST, uri, Some(&cookie))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body))
            .expect("a request");
        let answer = call(app, post).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{uri}: {answer:?}");
        assert!(answer.headers.contains_key(header::WWW_AUTHENTICATE), "{uri}");
        let error = answer.json()["error"].as_str().expect("a JSON error").to_owned();
        assert!(error.contains("only reads") && error.contains("Bearer"), "{uri}: {error}");
    }
    assert_eq!(gw.log.last_command_seq().await.expect("the command log"), before, "nothing was published");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_tls_the_cookie_is_secure() {
    let gw = Gateway::start_with(GatewayConfig { behind_tls: true, ..with_tokens() }, false).await;
    let answer = login(&gw.app, ALICE, None).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{answer:?}");
    assert_eq!(answer.location(), Some("/ui"));
    let set = answer.set_cookie().expect("a cookie");
    let attributes: Vec<&str> = set.split(';').skip(1).map(str::trim).collect();
    for flag in ["Secure", "HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=43200"] {
        assert!(attributes.contains(&flag), "{flag} missing from {set}");
    }
    let cookie = answer.session_cookie();
    let logout = request(Method::POST, "/ui/logout", Some(&cookie)).body(Body::empty()).expect("a request");
    let cleared = call(&gw.app, logout).await;
    assert!(cleared.set_cookie().is_some_and(|c| c.contains("Max-Age=0") && c.contains("Secure")), "{cleared:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_refused_and_gets_no_cookie() {
    let gw = Gateway::start_with(with_tokens(), false).await;
    for wrong in ["alice-token-0123456788", "alice-token-012345678", ""] {
        let answer = login(&gw.app, wrong, Some("/ui/pools")).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{wrong:?}: {answer:?}");
        assert_eq!(answer.set_cookie(), None, "{wrong:?}");
        assert_eq!(answer.location(), None, "{wrong:?}");
        assert!(answer.body.contains("not one this gateway knows"), "{}", answer.body);
        assert!(answer.body.contains(r#"<form class="login" method="post" action="/ui/login">"#), "{}", answer.body);
        assert!(answer.body.contains(r#"name="next" value="/ui/pools""#), "the page asked for stays: {}", answer.body);
        if !wrong.is_empty() {
            assert!(!answer.body.contains(wrong), "the token is not shown back");
        }
    }
    // A form that is not one: no cookie either.
    let json = request(Method::POST, "/ui/login", None)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(format!(r#"{{"token":"{ALICE}"}}"#)))
        .expect("a request");
    let answer = call(&gw.app, json).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
    assert_eq!(answer.set_cookie(), None);
    // Nor does a token in a URL log anyone in.
    let answer = get(&gw.app, &format!("/ui/login?token={ALICE}"), None).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.set_cookie(), None);
    // A login form another site's page sends is refused.
    let cross = request(Method::POST, "/ui/login", None)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header("sec-fetch-site", "cross-site")
        .body(Body::from(format!("token={ALICE}")))
        .expect("a request");
    let answer = call(&gw.app, cross).await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN, "{answer:?}");
    assert_eq!(answer.set_cookie(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logout_ends_the_session_on_the_gateway() {
    let gw = Gateway::start_with(with_tokens(), false).await;
    let cookie = login(&gw.app, ALICE, None).await.session_cookie();
    let other = login(&gw.app, ALICE, None).await.session_cookie();
    assert_ne!(cookie, other, "each login has its own session");
    assert_eq!(get(&gw.app, "/ui", Some(&cookie)).await.status, StatusCode::OK);

    let logout = request(Method::POST, "/ui/logout", Some(&cookie)).body(Body::empty()).expect("a request");
    let answer = call(&gw.app, logout).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{answer:?}");
    assert_eq!(answer.location(), Some("/ui/login"));
    let cleared = answer.set_cookie().expect("the cookie is cleared");
    assert!(cleared.starts_with("leasehold_session=;") && cleared.contains("Max-Age=0"), "{cleared}");

    // The old cookie, kept by a browser that ignored the clearing (or by someone who copied it), is refused.
    assert_redirected_to_login(&get(&gw.app, "/ui", Some(&cookie)).await, "%2Fui");
    assert_eq!(get(&gw.app, "/v1/resources", Some(&cookie)).await.status, StatusCode::UNAUTHORIZED);
    // The other session is another browser's: it stays.
    assert_eq!(get(&gw.app, "/ui", Some(&other)).await.status, StatusCode::OK);
}

/// A live feed opened under a session ends when the session does: a tab left open on the feed stops streaming at
/// logout (and at expiry, which ends the session the same way), with a last event saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logout_ends_a_live_feed_opened_under_the_session() {
    let gw = Gateway::start_with(with_tokens(), false).await;
    let cookie = login(&gw.app, ALICE, None).await.session_cookie();
    let feed = gw
        .app
        .clone()
        .oneshot(request(Method::GET, "/v1/events", Some(&cookie)).body(Body::empty()).expect("a request"));
    let feed = feed.await.expect("an answer");
    assert_eq!(feed.status(), StatusCode::OK);
    let mut body = feed.into_body();

    let logout = request(Method::POST, "/ui/logout", Some(&cookie)).body(Body::empty()).expect("a request");
    assert_eq!(call(&gw.app, logout).await.status, StatusCode::SEE_OTHER);

    // The stream says the session ended and ends: the body is whole within the deadline.
    let mut text = String::new();
    let read = tokio::time::timeout(DEADLINE, async {
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.expect("a frame").into_data() {
                text.push_str(&String::from_utf8_lossy(&data));
            }
        }
    });
    assert!(read.await.is_ok(), "the feed went on after logout: {text}");
    assert!(text.contains("event: error") && text.contains("the session ended"), "{text}");
}

/// Time is paused: the session expires when the clock is moved past its life, without waiting.
#[tokio::test(start_paused = true)]
async fn an_expired_session_is_refused() {
    let ttl = Duration::from_secs(3600);
    let gw = Gateway::start_with(GatewayConfig { ui_session_ttl: ttl, ..with_tokens() }, false).await;
    let answer = login(&gw.app, ALICE, None).await;
    assert!(answer.set_cookie().is_some_and(|c| c.contains("Max-Age=3600")), "{answer:?}");
    let cookie = answer.session_cookie();
    assert_eq!(get(&gw.app, "/ui", Some(&cookie)).await.status, StatusCode::OK);
    tokio::time::advance(ttl / 2).await;
    assert_eq!(get(&gw.app, "/v1/resources", Some(&cookie)).await.status, StatusCode::OK);
    tokio::time::advance(ttl / 2).await;
    assert_redirected_to_login(&get(&gw.app, "/ui", Some(&cookie)).await, "%2Fui");
    assert_eq!(get(&gw.app, "/v1/resources", Some(&cookie)).await.status, StatusCode::UNAUTHORIZED);
    // A new login works again.
    let cookie = login(&gw.app, ALICE, None).await.session_cookie();
    assert_eq!(get(&gw.app, "/ui", Some(&cookie)).await.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_goes_back_to_a_page_of_the_view_only() {
    let gw = Gateway::start_with(with_tokens(), false).await;
    for elsewhere in [
        "https://evil.example/ui",
        "//evil.example/ui",
        "/\\evil.example",
        "\\/evil.example",
        "/uievil",
        "javascript:alert(1)",
        "/ui/login",
    ] {
        let answer = login(&gw.app, ALICE, Some(elsewhere)).await;
        assert_eq!(answer.status, StatusCode::SEE_OTHER, "{elsewhere}: {answer:?}");
        assert_eq!(answer.location(), Some("/ui"), "{elsewhere}");
        let form = get(&gw.app, &format!("/ui/login?next={}", form_value(elsewhere)), None).await;
        assert!(form.body.contains(r#"name="next" value="/ui""#), "{elsewhere}: {}", form.body);
        assert!(!form.body.contains("evil"), "{elsewhere}: {}", form.body);
    }
}

/// Follows a browser from a page it asked for to the login and back: every address on the way, and the form,
/// keep the token out of the URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_is_never_in_a_url() {
    let gw = Gateway::start_with(with_tokens(), false).await;
    let asked = get(&gw.app, "/ui/resources?state=active&agent=w1", None).await;
    assert_redirected_to_login(&asked, "%2Fui%2Fresources%3Fstate%3Dactive%26agent%3Dw1");
    let form = get(&gw.app, asked.location().expect("a location"), None).await;
    assert_eq!(form.status, StatusCode::OK, "{form:?}");
    assert!(form.body.contains(r#"method="post" action="/ui/login""#), "{}", form.body);
    assert!(form.body.contains(r#"name="token" type="password""#), "{}", form.body);
    assert!(form.body.contains(r#"name="next" value="/ui/resources?state=active&amp;agent=w1""#), "{}", form.body);
    let answer = login(&gw.app, ALICE, Some("/ui/resources?state=active&agent=w1")).await;
    assert_eq!(answer.location(), Some("/ui/resources?state=active&agent=w1"));
    for location in [asked.location(), answer.location()] {
        assert!(!location.expect("a location").contains(ALICE));
    }
    let cookie = answer.session_cookie();
    let logout = request(Method::POST, "/ui/logout", Some(&cookie)).body(Body::empty()).expect("a request");
    let out = call(&gw.app, logout).await;
    assert!(!out.location().expect("a location").contains(ALICE));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_session_the_pages_send_to_the_login_and_its_assets_are_open() {
    let gw = Gateway::start_with(with_tokens(), false).await;
    assert_redirected_to_login(&get(&gw.app, "/ui", None).await, "%2Fui");
    assert_redirected_to_login(&get(&gw.app, "/ui/no-such-page", None).await, "%2Fui%2Fno-such-page");
    assert_redirected_to_login(&get(&gw.app, "/ui", Some("leasehold_session=made-up")).await, "%2Fui");
    for asset in ["/ui/assets/app.css", "/ui/assets/app.js"] {
        assert_eq!(get(&gw.app, asset, None).await.status, StatusCode::OK, "{asset}");
    }
    let form = get(&gw.app, "/ui/login", None).await;
    assert_eq!(form.status, StatusCode::OK);
    assert!(form.headers.contains_key(header::CONTENT_SECURITY_POLICY), "the login page has the view's headers");
    assert!(!form.body.contains(r#"action="/ui/logout""#), "nobody to log out: {}", form.body);
    // A page does not take a POST, with or without a session: refused, not redirected.
    let cookie = login(&gw.app, ALICE, None).await.session_cookie();
    for cookie in [None, Some(cookie.as_str())] {
        let post = request(Method::POST, "/ui", cookie).body(Body::empty()).expect("a request");
        let answer = call(&gw.app, post).await;
        assert!(answer.status.is_client_error() && answer.location().is_none(), "{answer:?}");
    }
    // A bearer token reads the pages too (a script, curl).
    let page = call(
        &gw.app,
        request(Method::GET, "/ui", None)
            .header(header::AUTHORIZATION, format!("Bearer {ALICE}"))
            .body(Body::empty())
            .expect("a request"),
    )
    .await;
    assert_eq!(page.status, StatusCode::OK, "{page:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tokens_the_view_is_open_and_offers_no_logout() {
    let gw = Gateway::start_with(GatewayConfig::default(), false).await;
    let overview = get(&gw.app, "/ui", None).await;
    assert_eq!(overview.status, StatusCode::OK, "{overview:?}");
    assert!(!overview.body.contains(r#"action="/ui/logout""#), "{}", overview.body);
    let form = get(&gw.app, "/ui/login?next=%2Fui%2Fagents", None).await;
    assert_eq!((form.status, form.location()), (StatusCode::SEE_OTHER, Some("/ui/agents")));
    let answer = login(&gw.app, ALICE, None).await;
    assert_eq!((answer.status, answer.set_cookie()), (StatusCode::SEE_OTHER, None));
}

/// Opens `GET /v1/events` in-process; the answer is held (its stream open) until dropped.
async fn open_stream(app: &Router) -> axum::response::Response {
    let request = Request::builder().uri("/v1/events").body(Body::empty()).expect("a request");
    app.clone().oneshot(request).await.expect("an answer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stream_of_events_past_the_bound_is_refused() {
    let metrics = EventsMetrics::default();
    let config = GatewayConfig { events_max_streams: 2, events_metrics: metrics.clone(), ..GatewayConfig::default() };
    let gw = Gateway::start_with(config, false).await;
    let first = open_stream(&gw.app).await;
    let second = open_stream(&gw.app).await;
    assert_eq!((first.status(), second.status()), (StatusCode::OK, StatusCode::OK));
    assert_eq!(metrics.streams(), 2);

    let third = open_stream(&gw.app).await;
    assert_eq!(third.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(third.headers()[header::RETRY_AFTER], "5");
    let body = third.into_body().collect().await.expect("read the body").to_bytes();
    let error: Value = serde_json::from_slice(&body).expect("a JSON error");
    let says = error["error"].as_str().expect("an error");
    assert!(says.contains("2 streams") && says.contains("--events-max-streams"), "{says}");
    assert_eq!(metrics.refused(), 1);

    // A client that goes gives its place back.
    drop(first);
    let deadline = Instant::now() + DEADLINE;
    while metrics.streams() != 1 {
        assert!(Instant::now() < deadline, "the stream of a client that went is still counted open");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(open_stream(&gw.app).await.status(), StatusCode::OK);
    drop(second);
}

/// The body of a chunked HTTP/1.1 answer, as far as it came (the last chunk may be cut short).
fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let Some(end) = raw.windows(2).position(|w| w == b"\r\n") else { return body };
        let size = std::str::from_utf8(&raw[..end]).ok().and_then(|s| usize::from_str_radix(s.trim(), 16).ok());
        let Some(size) = size else { return body };
        if size == 0 {
            return body;
        }
        raw = &raw[end + 2..];
        let take = size.min(raw.len());
        body.extend_from_slice(&raw[..take]);
        if take < size || raw.len() < size + 2 {
            return body;
        }
        raw = &raw[size + 2..];
    }
}

/// The ids of the whole `outcome` events of an SSE text (an event cut short at the end does not count, as for a
/// browser's EventSource).
fn outcome_ids(text: &str) -> Vec<u64> {
    let mut pieces: Vec<&str> = text.split("\n\n").collect();
    pieces.pop();
    pieces
        .iter()
        .filter(|event| event.lines().any(|line| line == "event: outcome"))
        .map(|event| {
            let id = event.lines().find_map(|line| line.strip_prefix("id: ")).expect("an id");
            id.parse().expect("a sequence")
        })
        .collect()
}

/// A client that reads the start of the stream and then stops is dropped within the bound: its stream is ended,
/// its connection closed, the drop counted; reading what reached it, it has whole events up to some id, and a
/// reconnect with that `Last-Event-ID` resumes with the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_dropped_and_resumes_after_its_last_id() {
    let metrics = EventsMetrics::default();
    let config = GatewayConfig {
        events_stall_timeout: Duration::from_millis(300),
        events_buffer: 4,
        events_metrics: metrics.clone(),
        ..GatewayConfig::default()
    };
    let gw = Gateway::start_with(config, true).await;

    // Small socket buffers on both sides (Linux gives accepted sockets the listener's), so that a client that does
    // not read fills them with a few dozen events.
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket.set_send_buffer_size(4096).expect("SO_SNDBUF");
    socket.bind("127.0.0.1:0".parse().expect("an address")).expect("bind");
    let listener = socket.listen(16).expect("listen");
    let address = listener.local_addr().expect("an address");
    let server = tokio::spawn(leasehold_gateway::serve(listener, gw.app.clone(), gw.shutdown.clone()));

    let client = tokio::net::TcpSocket::new_v4().expect("a socket");
    client.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    let mut client = client.connect(address).await.expect("connect");
    client.write_all(b"GET /v1/events?from=1 HTTP/1.1\r\nHost: leasehold\r\n\r\n").await.expect("send the request");
    let mut received = Vec::new();
    let mut buffer = [0u8; 1024];
    while !String::from_utf8_lossy(&received).contains("event: open") {
        let n =
            tokio::time::timeout(DEADLINE, client.read(&mut buffer)).await.expect("the stream opens").expect("read");
        assert!(n > 0, "the connection closed before the stream opened");
        received.extend_from_slice(&buffer[..n]);
    }
    let head = String::from_utf8_lossy(&received).into_owned();
    assert!(head.starts_with("HTTP/1.1 200") && head.contains("transfer-encoding: chunked"), "{head}");

    // The client reads no more. Outcomes come, in batches, until the gateway gives up on it.
    let deadline = Instant::now() + DEADLINE;
    let mut published = 0;
    while metrics.dropped() == 0 {
        assert!(Instant::now() < deadline, "a client that does not read was never dropped ({published} commands)");
        let batch: Vec<String> =
            (0..200).map(|_| codec::command_to_json(&allocate()).expect("encode")).collect::<Vec<_>>();
        let post = Request::post("/v1/commands/batch")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(format!("[{}]", batch.join(","))))
            .expect("a request");
        let answer = call(&gw.app, post).await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        published += batch.len();
        let settle = Instant::now() + Duration::from_secs(2);
        while metrics.dropped() == 0 && Instant::now() < settle {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert_eq!(metrics.dropped(), 1);
    let deadline = Instant::now() + DEADLINE;
    while metrics.streams() != 0 {
        assert!(Instant::now() < deadline, "the dropped stream still holds its place");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // What reached the client, then the end: the connection is closed.
    tokio::time::timeout(DEADLINE, client.read_to_end(&mut received))
        .await
        .expect("the connection ends")
        .expect("read what was sent");
    let split = received.windows(4).position(|w| w == b"\r\n\r\n").expect("the end of the head") + 4;
    let text = String::from_utf8(dechunk(&received[split..])).expect("UTF-8");
    let ids = outcome_ids(&text);
    let last = *ids.last().unwrap_or_else(|| panic!("no whole outcome reached the client: {text}"));
    assert_eq!(ids, (1..=last).collect::<Vec<u64>>(), "in order, none missed");
    assert!(last < u64::try_from(published).expect("fits"), "the client was dropped before the end: {last}");
    eprintln!("the client got outcomes 1 to {last} of {published} before it was dropped");

    // It comes back where it was.
    let request = Request::builder()
        .uri("/v1/events")
        .header("last-event-id", last.to_string())
        .body(Body::empty())
        .expect("a request");
    let response = gw.app.clone().oneshot(request).await.expect("an answer");
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut text = String::new();
    while outcome_ids(&text).is_empty() {
        let frame = tokio::time::timeout(DEADLINE, body.frame()).await.expect("an event").expect("data").expect("ok");
        if let Ok(data) = frame.into_data() {
            text.push_str(std::str::from_utf8(&data).expect("UTF-8"));
        }
    }
    assert!(text.starts_with(&format!("event: open\nid: {last}\n")), "{text}");
    assert_eq!(outcome_ids(&text)[0], last + 1, "{text}");
    gw.shutdown.cancel();
    tokio::time::timeout(DEADLINE, server).await.expect("the server stops").expect("no panic").expect("served");
}
