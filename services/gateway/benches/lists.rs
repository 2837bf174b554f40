//! How long a page of `GET /v1/resources` takes deep in a list of 100,000 resources beside the first page: a page is
//! read from its key on, so the ratio stays near 1 (a scan that skipped what comes before its key would grow with the
//! depth). Prints the figures and a JSON last line; not run by the tests.
//!
//! `cargo bench -p leasehold-gateway --bench lists`

#[path = "../tests/lists/app.rs"]
mod app;

use std::time::{Duration, Instant};

use app::{get, listed};

const N_RESOURCES: usize = 100_000;
const ROUNDS: usize = 20;

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
    println!(
        "{{\"resources\": {N_RESOURCES}, \"first_page_s\": {:.6}, \"deep_page_s\": {:.6}, \"deep_over_first\": {ratio:.3}}}",
        first.as_secs_f64(),
        deep.as_secs_f64()
    );
    listed.shutdown.cancel();
}
