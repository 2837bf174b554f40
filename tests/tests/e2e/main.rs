//! leasehold end to end: real `leasehold` processes, the embedded log and real nats-server processes on loopback.
//! One test binary; each module is one concern.

mod auth;
mod crash;
mod dead_letters;
mod fences;
mod front_door;
mod python_producer;
mod support;
