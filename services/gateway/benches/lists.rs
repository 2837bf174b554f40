//! How long a page of `GET /v1/resources` takes deep in a list of 100,000 resources beside the first page: a page is
//! read from its key on, so the ratio stays near 1 (a scan that skipped what comes before its key would grow with the
//! depth). Then the server time of the operator's resources page (`GET /ui/resources`, rendered HTML) at the same
//! size — its first page, a page deep in the list, and a page filtered by an attribute — as p50 and p99 of
//! [`UI_ROUNDS`] requests each; the goal is a p99 of at most 50 ms. Prints the figures and a JSON last line; not run
//! by the tests.
//!
//! `cargo bench -p leasehold-gateway --bench lists`

#[path = "../tests/lists/app.rs"]
mod app;

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;

use app::{get, listed};

const N_RESOURCES: usize = 100_000;
const ROUNDS: usize = 20;
/// Requests of each resources page timed.
const UI_ROUNDS: usize = 200;

/// The median of `ROUNDS` requests of `uri`.
async fn median(app: &axum::Router, uri: &str) -> Duration {
    let mut times = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let started = Instant::now();
        let (status, _, _) = get(app, uri).await;
        assert!(status.is_success(), "{uri}: {status}");
        times.push(started.elapsed());
    }
    times.sort();
    times[ROUNDS / 2]
}

/// The p50 and p99 of the server time of `UI_ROUNDS` requests of the page at `uri`: from the request to the last
/// byte of its HTML, which must hold `expected` rows.
async fn page_times(app: &axum::Router, uri: &str, expected: usize) -> (Duration, Duration) {
    let mut times = Vec::with_capacity(UI_ROUNDS);
    for _ in 0..UI_ROUNDS {
        let request = Request::builder().uri(uri).body(Body::empty()).expect("a request");
        let started = Instant::now();
        let response = app.clone().oneshot(request).await.expect("an answer");
        let status = response.status();
        let body = response.into_body().collect().await.expect("the body").to_bytes();
        times.push(started.elapsed());
        assert_eq!(status, StatusCode::OK, "{uri}");
        let rows = String::from_utf8_lossy(&body).matches("<td class=\"id\">").count();
        assert_eq!(rows, expected, "{uri}: rows");
    }
    times.sort();
    (times[UI_ROUNDS / 2], times[UI_ROUNDS * 99 / 100])
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let built = Instant::now();
    let listed = listed(N_RESOURCES);
    println!("projected {N_RESOURCES} resources in {:.1} s", built.elapsed().as_secs_f64());
    let first = median(&listed.app, "/v1/resources?limit=100").await;
    let deep_key = &listed.refs[N_RESOURCES - 1000];
    let deep = median(&listed.app, &format!("/v1/resources?limit=100&after={deep_key}")).await;
    let ratio = deep.as_secs_f64() / first.as_secs_f64();
    println!("a page of 100: first {first:?}, {} resources deep {deep:?} ({ratio:.2}x)", N_RESOURCES - 1000);

    let pages = [
        ("first", "/ui/resources".to_owned()),
        ("deep", format!("/ui/resources?after={deep_key}")),
        ("filtered", "/ui/resources?attr=shard%3D3".to_owned()),
    ];
    // The page's JSON fields, and the worst p99 of the three: what the goal is checked against.
    let (mut fields, mut worst) = (Vec::new(), 0.0_f64);
    for (name, uri) in &pages {
        let (p50, p99) = page_times(&listed.app, uri, 100).await;
        println!("/ui/resources, {name} page ({uri}): p50 {:.2} ms, p99 {:.2} ms", ms(p50), ms(p99));
        fields.push(format!("\"ui_{name}_p50_ms\": {:.3}, \"ui_{name}_p99_ms\": {:.3}", ms(p50), ms(p99)));
        worst = worst.max(ms(p99));
    }
    println!("/ui/resources: p99 {worst:.2} ms at worst (goal: at most 50 ms)");
    println!(
        "{{\"resources\": {N_RESOURCES}, \"first_page_s\": {:.6}, \"deep_page_s\": {:.6}, \"deep_over_first\": \
         {ratio:.3}, {}, \"ui_resources_p99_ms\": {worst:.3}}}",
        first.as_secs_f64(),
        deep.as_secs_f64(),
        fields.join(", ")
    );
    listed.shutdown.cancel();
}
