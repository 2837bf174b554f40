//! A Rust producer in ten lines: allocate a volume on agent w1 through a gateway, wait for the outcome, print the
//! resource's reference (`cargo run -p leasehold-client --example producer`, with `leasehold serve` running).

use leasehold_client::{Gateway, Producer};
use leasehold_schemas::{ResourceId, command::Allocate};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let producer = Producer::new(Gateway::new("http://127.0.0.1:7420")?, "ci:example".parse()?);
    let volume = Allocate::new("w1".parse()?, ResourceId::generate(), "volume", 1);
    let reference = producer.allocate(volume).await?;
    println!("{reference}");
    Ok(())
}
