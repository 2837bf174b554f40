//! Quotas: the most resources of each kind some principals may hold at once, across every partition. A quota is
//! recorded in every partition (`op.set-quota`) and counted by one `slots` pool per kind (`quota_pool`): an
//! allocation by one of its principals claims a slot through the pools' protocol, so two allocations never both fit
//! under the limit, wherever they are decided. The slot is the resource's from pending to its end (the pool holds an
//! orphan's slot until its destroy is confirmed, as `quota set` defines it), and returned as any claim is.
//!
//! Over quota, an allocation that gave a `wait` waits in the pool's queue, first come first served; one that gave
//! none is released as soon as its claim is queued (`sys.over-quota`, cause `over-quota` naming the quota and what
//! holds it).

use leasehold_schemas::command::{MAX_QUOTA_HOLDERS_NAMED, OverQuota, SetQuota, quota_pool};
use leasehold_schemas::ids::{Issuer, Key, PoolName, QuotaName};
use leasehold_schemas::outcome::{BreakReason, Effect, ReleaseCause};
use leasehold_schemas::subjects::partition_of_key;
use leasehold_schemas::{Rejection, RejectionKind};

use super::{Decider, Verdict, echo, reject};
use crate::state::{ClaimSlot, PendingClock, ResourceState};

/// The most principals one quota names.
pub const MAX_QUOTA_PRINCIPALS: usize = 64;
/// The most kinds one quota limits.
pub const MAX_QUOTA_KINDS: usize = 16;

/// What a principal's quota asks of an allocation of a kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum QuotaCharge {
    /// No quota limits this principal and kind.
    Free,
    /// A slot of this pool, claimed with the resource's other pools.
    Claim(PoolName),
    /// The quota allows none of this kind.
    Refused { quota: QuotaName, kind: String },
}

impl QuotaCharge {
    /// The cause of a release for a quota that allows none of the kind.
    pub(super) fn refused_cause(quota: &QuotaName, kind: &str) -> ReleaseCause {
        ReleaseCause::OverQuota { quota: quota.clone(), kind: kind.to_owned(), max: 0, held: 0, holders: vec![] }
    }
}

impl<'s> Decider<'s> {
    /// What the quota of `principal`, if it has one, asks of an allocation of `kind`.
    pub(super) fn quota_charge(&self, principal: Option<&Issuer>, kind: &str) -> QuotaCharge {
        let Some((name, quota)) = principal.and_then(|p| self.state.quota_of(p)) else {
            return QuotaCharge::Free;
        };
        match quota.max.get(kind) {
            None => QuotaCharge::Free,
            Some(0) => QuotaCharge::Refused { quota: name.clone(), kind: kind.to_owned() },
            // A kind a quota takes always has a pool name (checked when it was set).
            Some(_) => quota_pool(name, kind).map_or(QuotaCharge::Free, QuotaCharge::Claim),
        }
    }

    pub(super) fn set_quota(&mut self, command: &SetQuota) -> Verdict {
        if command.partition != self.state.partition {
            return reject(
                RejectionKind::WrongPartition,
                format!(
                    "quota {} for partition {} reached partition {}; route it with a key of that partition",
                    command.quota, command.partition, self.state.partition
                ),
            );
        }
        let name = &command.quota;
        let recorded = self.state.quotas.get(name);
        if command.max.is_empty() && command.principals.is_empty() {
            if recorded.is_none() {
                return reject(RejectionKind::AlreadyDone, format!("partition has no quota {name}"));
            }
            self.out.push(Effect::QuotaRemoved { quota: name.clone() });
            return Ok(());
        }
        if command.principals.is_empty() {
            return reject(RejectionKind::Invalid, format!("quota {name} names no principal: it would count nothing"));
        }
        if command.max.is_empty() {
            return reject(RejectionKind::Invalid, format!("quota {name} limits no kind: give at least one maximum"));
        }
        if command.principals.len() > MAX_QUOTA_PRINCIPALS {
            return reject(
                RejectionKind::Invalid,
                format!("quota {name} names {} principals; at most {MAX_QUOTA_PRINCIPALS}", command.principals.len()),
            );
        }
        if command.max.len() > MAX_QUOTA_KINDS {
            return reject(
                RejectionKind::Invalid,
                format!("quota {name} limits {} kinds; at most {MAX_QUOTA_KINDS}", command.max.len()),
            );
        }
        if command.principals.contains(self.issuer) {
            return reject(
                RejectionKind::Invalid,
                format!(
                    "quota {name} names its own sender {}: under a quota an issuer sends only a producer's requests, so \
                     it could not change or remove the quota again; set it as another issuer",
                    self.issuer
                ),
            );
        }
        let mut principals = command.principals.clone();
        principals.sort();
        principals.dedup();
        if principals.len() != command.principals.len() {
            return reject(RejectionKind::Invalid, format!("quota {name} names a principal twice"));
        }
        for kind in command.max.keys() {
            let Some(pool) = quota_pool(name, kind).filter(|_| super::resources::is_kind(kind)) else {
                return reject(
                    RejectionKind::Invalid,
                    format!(
                        "quota {name} cannot count kind {}: a quota's kind is [a-z0-9][a-z0-9_-]* with no dot, short \
                         enough that quota-{name}-<kind> is at most 63 bytes",
                        echo(kind)
                    ),
                );
            };
            if let Some((other, other_kind, _)) = self.state.quota_counted_by(&pool).filter(|(q, _, _)| *q != name) {
                return reject(
                    RejectionKind::InvalidState,
                    format!("pool {pool} already counts kind {other_kind} of quota {other}; rename one of the quotas"),
                );
            }
        }
        for principal in &principals {
            if let Some((other, _)) = self.state.quota_of(principal).filter(|(q, _)| *q != name) {
                return reject(
                    RejectionKind::InvalidState,
                    format!(
                        "principal {principal} is already under quota {other}; a principal is under one quota (remove \
                         it there first)"
                    ),
                );
            }
        }
        if recorded.is_some_and(|q| q.max == command.max && q.principals == principals) {
            return reject(RejectionKind::AlreadyDone, format!("quota {name} is already set so"));
        }
        self.out.push(Effect::QuotaSet { quota: name.clone(), max: command.max.clone(), principals });
        Ok(())
    }

    /// A holder's claim on a quota's pool was queued, and its allocation gave no wait (or its quota now allows none
    /// of its kind): it is released, naming the quota and what holds it.
    pub(super) fn over_quota(&mut self, command: &OverQuota) -> Verdict {
        let pool_home = partition_of_key(&Key::Pool(command.pool.clone()), self.state.partitions);
        if command.source.partition != pool_home {
            return reject(
                RejectionKind::Invalid,
                format!(
                    "pool {} lives in partition {pool_home}; its queue cannot be reported from {}",
                    command.pool, command.source
                ),
            );
        }
        if command.holders.len() > MAX_QUOTA_HOLDERS_NAMED {
            return reject(
                RejectionKind::Invalid,
                format!("{} holders named; at most {MAX_QUOTA_HOLDERS_NAMED}", command.holders.len()),
            );
        }
        let holder = &command.holder;
        let resource = self.resource(&holder.agent, holder.resource)?;
        let Some((quota, kind, max)) = self.state.quota_counted_by(&command.pool) else {
            return reject(
                RejectionKind::NothingToDo,
                format!("pool {} counts no quota recorded here; resource {holder} waits for it", command.pool),
            );
        };
        if resource.state != ResourceState::Pending {
            return reject(
                RejectionKind::AlreadyDone,
                format!("resource {holder} is {}, not waiting for quota {quota}", resource.state.name()),
            );
        }
        if !matches!(resource.claims.get(&command.pool), Some(ClaimSlot::Wanted { .. })) {
            return reject(
                RejectionKind::NothingToDo,
                format!("resource {holder} does not wait for a slot of pool {}", command.pool),
            );
        }
        // One that gave a wait waits, unless the quota now allows none of its kind (lowered to 0): nothing will come.
        if let Some(PendingClock::WaitsUntil(until)) = resource.pending_clock
            && max > 0
        {
            return reject(
                RejectionKind::NothingToDo,
                format!("resource {holder} may wait for quota {quota} until {until}"),
            );
        }
        let cause = ReleaseCause::OverQuota {
            quota: quota.clone(),
            kind: kind.to_owned(),
            max,
            held: command.held,
            holders: command.holders.clone(),
        };
        self.order_release(resource, cause, BreakReason::ResourceLeft);
        Ok(())
    }
}

impl Decider<'_> {
    /// Refuses a request that names a quota's pool among its own: a slot is claimed only through its issuer's
    /// quota, so nobody fills another's.
    pub(super) fn check_no_quota_pool(&self, pools: &[PoolName]) -> Verdict {
        if let Some((pool, (quota, _, _))) = pools.iter().find_map(|p| Some((p, self.state.quota_counted_by(p)?))) {
            return reject(
                RejectionKind::Invalid,
                format!(
                    "pool {pool} counts quota {quota}; a resource claims a slot of it only through its issuer's quota, \
                     never by naming it"
                ),
            );
        }
        Ok(())
    }
}

/// Why an allocation is refused at once: its principal's quota allows none of its kind.
pub(super) fn refusal(quota: &QuotaName, kind: &str, principal: &Issuer) -> Rejection {
    Rejection::new(
        RejectionKind::InvalidState,
        format!("quota {quota} of {principal} allows no {kind} (its maximum is 0); no allocation of it"),
    )
}
