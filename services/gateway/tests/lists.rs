//! `GET /v1/resources` a page at a time by key: a page holds the references right after its key, in order, its `Link`
//! names the page after it, the last names none, and a filter goes on from page to page. (How a page deep in a long
//! list compares with the first, at 100,000 resources, is measured by `cargo bench -p leasehold-gateway --bench
//! lists`.)

#[path = "lists/app.rs"]
mod app;

use axum::http::StatusCode;

use app::{get, listed};

const N_RESOURCES: usize = 3_000;

#[tokio::test]
async fn a_page_is_read_from_its_key_and_names_the_next() {
    let listed = listed(N_RESOURCES);
    let (app, every) = (&listed.app, &listed.refs);

    // A page from the middle on: the next 1,000 references after the key, in order; its `Link` names the page after.
    let middle = &every[N_RESOURCES / 2];
    let (status, link, page) = get(app, &format!("/v1/resources?limit=1000&after={middle}")).await;
    assert_eq!(status, StatusCode::OK);
    let refs: Vec<&str> =
        page.as_array().expect("an array").iter().map(|r| r["ref"].as_str().expect("a ref")).collect();
    assert_eq!(refs, every[N_RESOURCES / 2 + 1..N_RESOURCES / 2 + 1001].to_vec());
    let link = link.expect("a full page names the next");
    let next = link.split_once('<').and_then(|(_, rest)| rest.split_once('>')).expect("<target>").0;
    assert_eq!(next, format!("/v1/resources?limit=1000&after={}", every[N_RESOURCES / 2 + 1000]));
    let (_, link, last) = get(app, &format!("/v1/resources?limit=1000&after={}", every[N_RESOURCES - 2])).await;
    assert_eq!((last.as_array().map(Vec::len), link), (Some(1), None), "the last page names no next");

    // An attribute filter on the gateway: every tenth resource, a page of them.
    let (_, link, shard) = get(app, "/v1/resources?attr=shard%3D3&limit=100").await;
    let shard = shard.as_array().expect("an array");
    assert!(shard.len() == 100 && shard.iter().all(|r| r["attrs"]["shard"] == "3"), "{shard:?}");
    assert!(link.is_some_and(|l| l.contains("attr=shard%3D3&limit=100&after=")), "the filter goes on to the next page");
    listed.shutdown.cancel();
}
