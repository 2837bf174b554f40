//! Table tests: the resource life cycle (DESIGN section 5) and its rejections.

mod support;

use leasehold_schemas::command::*;
use leasehold_schemas::RejectionKind::*;
use support::*;
use Then::{Effects, Rejected};

#[test]
fn allocation() {
    check(vec![
        case(
            "allocate without pools orders the create at once",
            |w| {
                w.registered();
            },
            |w| {
                let cmd = w.allocate_cmd(&w.a());
                w.op(cmd)
            },
            Effects(&["resource-allocated", "create-ordered"]),
        ),
        case(
            "allocate with pools wants a claim from each and waits to create",
            |w| {
                w.registered();
            },
            |w| {
                let mut cmd = w.allocate_cmd(&w.a());
                cmd.pools = vec![pool_name("ips"), pool_name("slots")];
                w.op(cmd)
            },
            Effects(&["resource-allocated", "claim-wanted", "claim-wanted"]),
        ),
        case(
            "allocate on an unregistered agent",
            |_| {},
            |w| {
                let cmd = w.allocate_cmd(&w.a());
                w.op(cmd)
            },
            Rejected(Unknown, &["agent w1 has never registered"]),
        ),
        case(
            "allocate the same id twice",
            |w| {
                w.registered().pending();
            },
            |w| {
                let mut cmd = w.allocate_cmd(&w.a());
                cmd.resource = w.r();
                w.op(cmd)
            },
            Rejected(AlreadyExists, &["already exists"]),
        ),
        case(
            "allocate with a bad kind",
            |w| {
                w.registered();
            },
            |w| {
                let mut cmd = w.allocate_cmd(&w.a());
                cmd.kind = "Big Box".into();
                w.op(cmd)
            },
            Rejected(Invalid, &["kind \"Big Box\""]),
        ),
        case(
            "allocate a pool twice",
            |w| {
                w.registered();
            },
            |w| {
                let mut cmd = w.allocate_cmd(&w.a());
                cmd.pools = vec![pool_name("ips"), pool_name("ips")];
                w.op(cmd)
            },
            Rejected(Invalid, &["named twice"]),
        ),
        case(
            "allocate over the capacity limit",
            |w| {
                w.registered();
            },
            |w| {
                let mut cmd = w.allocate_cmd(&w.a());
                cmd.capacity = 5000;
                w.op(cmd)
            },
            Rejected(Invalid, &["capacity 5000"]),
        ),
        case(
            "allocate under a parent that is releasing",
            |w| {
                w.active();
                accepted(&w.release());
            },
            |w| {
                let mut cmd = w.allocate_cmd(&w.a());
                cmd.parent = Some(w.rref());
                w.op(cmd)
            },
            Rejected(InvalidState, &["releasing", "cannot take children"]),
        ),
    ]);
}

#[test]
fn release_pause_update() {
    check(vec![
        case("release an active resource breaks its leases", |w| {
            w.active().leased(None);
        }, |w| w.release(), Effects(&["resource-releasing", "lease-broken"])),
        case("release a pending resource", |w| {
            w.registered().pending();
        }, |w| w.release(), Effects(&["resource-releasing"])),
        case("a second release is already done", |w| {
            w.active();
            accepted(&w.release());
        }, |w| w.release(), Rejected(AlreadyDone, &["already releasing"])),
        case("release an unknown resource", |w| {
            w.registered();
            w.last_resource = Some(w.d.new_resource_id());
        }, |w| w.release(), Rejected(Unknown, &["is not known"])),
        case("pause an active resource", |w| {
            w.active();
        }, |w| {
            let (agent, resource) = (w.a(), w.r());
            w.op(Pause { agent, resource, reason: Some("disk swap".into()), until: None })
        }, Effects(&["resource-paused"])),
        case("pause a pending resource", |w| {
            w.registered().pending();
        }, |w| {
            let (agent, resource) = (w.a(), w.r());
            w.op(Pause { agent, resource, reason: None, until: None })
        }, Rejected(InvalidState, &["pending", "only an active resource can be paused"])),
        case("unpause a paused resource", |w| {
            w.active();
            let (agent, resource) = (w.a(), w.r());
            accepted(&w.op(Pause { agent, resource, reason: None, until: None }));
        }, |w| {
            let (agent, resource) = (w.a(), w.r());
            w.op(Unpause { agent, resource })
        }, Effects(&["resource-unpaused"])),
        case("update while paused", |w| {
            w.active();
            let (agent, resource) = (w.a(), w.r());
            accepted(&w.op(Pause { agent, resource, reason: None, until: None }));
        }, |w| {
            let (agent, resource) = (w.a(), w.r());
            w.op(Update { agent, resource, set: [("disk".into(), "200G".into())].into(), remove: vec![], capacity: Some(4) })
        }, Effects(&["resource-updated"])),
        case("update capacity below the live leases", |w| {
            w.active().leased(None).leased(None);
        }, |w| {
            let (agent, resource) = (w.a(), w.r());
            w.op(Update { agent, resource, set: Default::default(), remove: vec![], capacity: Some(1) })
        }, Rejected(InvalidState, &["below the 2 live leases"])),
    ]);
}
