//! A placement in Rust: a volume on whichever agent with `zone=a` has room, waiting up to a minute for room, through
//! a gateway (`cargo run -p leasehold-client --example place`, with `leasehold serve` and an agent started with
//! `--label zone=a --capacity volume=10`).

use leasehold_client::{Gateway, Producer};
use leasehold_schemas::{Millis, ResourceId, command::Place};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let producer = Producer::new(Gateway::new("http://127.0.0.1:7420")?, "ci:example".parse()?);
    let mut volume = Place::new(ResourceId::generate(), "volume", 1);
    volume.select.insert("zone".into(), "a".into());
    volume.wait = Some(Millis::from_mins(1));
    let placed = producer.place(volume.clone()).await?;
    println!("{}", placed.reference.as_deref().unwrap_or("not placed yet"));
    eprintln!("{}", placed.describe(&volume));
    Ok(())
}
