//! What leasehold's command lines (`leasehold`, `leasehold-replay`) share, and nothing a library should carry: how
//! they print (aligned tables, escaping for display, one JSON value on stdout, JSON errors), their logs on stderr,
//! the flags that choose a log (`--data`, `--nats` and its credentials) and outcomes in plain words.

#![forbid(unsafe_code)]

pub mod logs;
pub mod nats_args;
pub mod output;
pub mod timeline;
pub mod zone;
