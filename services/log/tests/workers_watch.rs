//! The live workers' watch on JetStream when it stalls while this process's own puts still succeed (its ordered
//! consumer lost with a stream leader, or deleted): the stall must be found out and the bucket listed, never a live
//! worker counted gone. Without `nats-server` on `PATH` it prints a notice and passes, except in CI.

use std::time::Duration;

use futures::StreamExt;
use leasehold_log::Log;
use leasehold_log::jetstream::{JetStream, JetStreamConfig};
use leasehold_log::nats_server::NatsServer;
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_watch_never_makes_a_live_worker_look_gone() {
    let Some(server) = NatsServer::start() else { return };
    let config = JetStreamConfig { priority_timeout: Duration::from_secs(2), ..JetStreamConfig::new(server.url(), 2) };
    let a = JetStream::connect(config.clone()).await.unwrap();
    let b = JetStream::connect(config).await.unwrap();
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        a.workers("a", true).await.unwrap();
        b.workers("b", true).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(a.workers("a", true).await.unwrap(), vec!["a".to_owned(), "b".to_owned()]);
    // Delete every consumer of the bucket's stream: the watches' ordered consumers are gone, and notice only after
    // two missed idle heartbeats (10 s).
    let client = async_nats::connect(server.url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let stream = js.get_stream("KV_LH_WORKERS").await.unwrap();
    let names: Vec<String> = stream.consumer_names().map(|n| n.unwrap()).collect().await;
    for name in &names {
        stream.delete_consumer(name).await.unwrap();
    }
    let deleted = Instant::now();
    let mut missing = Vec::new();
    while deleted.elapsed() < Duration::from_secs(12) {
        let seen = a.workers("a", true).await.unwrap();
        b.workers("b", true).await.unwrap();
        if !seen.contains(&"b".to_owned()) {
            missing.push(deleted.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "b missing from a's live workers {} times, first at {:?}, last at {:?}",
        missing.len(),
        missing.first(),
        missing.last()
    );
    assert!(missing.is_empty(), "a live worker looked gone");
}
