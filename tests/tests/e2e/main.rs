//! leasehold end to end: real `leasehold` processes, the embedded log and real nats-server processes on loopback.
//! One test binary; each module is one concern.

mod agents;
mod api;
mod auth;
mod authz;
mod browser;
mod cli;
mod crash;
mod dead_letters;
mod docker;
mod fences;
mod front_door;
mod health;
mod nats;
mod placement;
mod pools;
mod publish;
mod python_producer;
mod queues;
mod quotas;
mod readiness;
mod replay;
mod stopping;
mod support;
mod sweepers;
