//! `GET /v1/export?to=SEQ`: the whole log from its start (outcomes up to `to`, all when not given) as an export
//! file, the format of `leasehold-replay export`, streamed as it is read. This is what `leasehold-replay --server
//! URL` reads, so an audit of a running server never needs the data directory it locks.
//!
//! The body is produced while it is sent; a failure half-way ends it early, and the reader, finding no trailer,
//! says the stream was cut (the status line was sent before the first byte).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use leasehold_log::Log;
use serde::Deserialize;

use crate::{Api, error};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExportQuery {
    /// The last outcome sequence to include.
    to: Option<u64>,
}

pub(crate) async fn export<L: Log>(
    State(api): State<Arc<Api<L>>>,
    query: Result<Query<ExportQuery>, QueryRejection>,
) -> Response {
    let Query(query) = match query {
        Ok(query) => query,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("bad query: {}", e.body_text())),
    };
    let (write, read) = tokio::io::duplex(256 * 1024);
    let log = api.log.clone();
    tokio::spawn(async move {
        let source = "server";
        let written =
            leasehold_log::export::export(&log, query.to, leasehold_domain::DECIDER_VERSION, source, write, |_| {})
                .await;
        if let Err(e) = written {
            tracing::warn!(error = %e, "an export stream ended early");
        }
    });
    let body = Body::from_stream(tokio_util::io::ReaderStream::new(read));
    ([(header::CONTENT_TYPE, "application/x-leasehold-export")], body).into_response()
}
