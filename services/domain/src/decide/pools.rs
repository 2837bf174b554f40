//! Pools: definition, claims keyed by holder (idempotent), first-in-first-out waiters, claim tokens, frees that
//! must match holder and token, cool-down, least-recently-freed first, and `tick`; and the pool's life cycle:
//! grow, change exclusions or cool-down, delete once empty.
//!
//! A pool is lazy: identifiers never handed out are an index (`next_fresh`) over `kind.value_at`, never a list, so
//! a /16 costs the same as a /30 until it is used.

use std::collections::BTreeSet;

use leasehold_schemas::command::{Claim, DefinePool, DeletePool, Free, TickPool, UpdatePool};
use leasehold_schemas::ids::{Millis, PoolName, ResourceRef, Timestamp};
use leasehold_schemas::outcome::{Effect, FreeCause};
use leasehold_schemas::pool::{OrphanPolicy, PoolKind, PoolValue};
use leasehold_schemas::{Rejection, RejectionKind};

use super::{Decider, MAX_POOL_EXCLUSIONS, Verdict, reject};
use crate::state::{Holding, Pool};

/// Identifiers a pool can hand out at `now`, in the order it hands them out: never-used ones first, then
/// recovered ones, then freed ones whose cool-down has passed, least recently freed first.
fn available(pool: &Pool, now: Timestamp) -> impl Iterator<Item = PoolValue> + '_ {
    available_as(pool, &pool.kind, pool.cooldown, &[], now).take(pool.room_as(&pool.kind, 0))
}

/// What `pool` could hand out at `now` were it defined as `kind` with `cooldown` and had `extra` recovered: what an
/// update serves its waiters from, before the state has the new definition.
fn available_as<'a>(
    pool: &'a Pool,
    kind: &'a PoolKind,
    cooldown: Millis,
    extra: &'a [PoolValue],
    now: Timestamp,
) -> impl Iterator<Item = PoolValue> + 'a {
    let fresh = (pool.next_fresh..kind.size()).filter_map(|idx| kind.value_at(idx));
    let recovered = pool.recovered.iter().chain(extra).copied().filter(|value| kind.contains(value));
    let cooled = pool
        .cooling
        .iter()
        .take_while(move |((freed_at, _), _)| freed_at.saturating_add(cooldown) <= now)
        .map(|(_, value)| *value)
        .filter(|value| kind.contains(value));
    fresh.chain(recovered).chain(cooled)
}

/// Why `new` is not a grown (or equal) `old`, if it is not: a pool never shrinks or moves, since what it handed
/// out must stay its own.
fn grows_from(old: &PoolKind, new: &PoolKind) -> Result<(), String> {
    match (old, new) {
        (
            PoolKind::Ipv4 { network, prefix_len, .. },
            PoolKind::Ipv4 { network: new_network, prefix_len: new_prefix, .. },
        ) => {
            if new_network != network {
                return Err(format!(
                    "it is {network}/{prefix_len}; a pool keeps its network address ({new_network} differs)"
                ));
            }
            if new_prefix > prefix_len {
                return Err(format!(
                    "it is {network}/{prefix_len}; /{new_prefix} would shrink it (pools only grow: a shorter prefix)"
                ));
            }
        }
        // Slots may be fewer: a quota is lowered so. A slot above the new count stays with its holder until freed,
        // and is handed out again only if the count grows back over it.
        (PoolKind::Slots { .. }, PoolKind::Slots { .. }) => {}
        (PoolKind::Ports { first, last, .. }, PoolKind::Ports { first: new_first, last: new_last, .. }) => {
            if new_first != first {
                return Err(format!("it starts at port {first}; a pool keeps its first port ({new_first} differs)"));
            }
            if new_last < last {
                return Err(format!(
                    "it is ports {first}..={last}; ..={new_last} would shrink it (pools only grow: a later last port)"
                ));
            }
        }
        _ => return Err("a pool keeps its kind (ipv4, slots or ports); define a new pool instead".to_owned()),
    }
    Ok(())
}

/// Indices in the range of `kind` that it does not hand out: its exclusions and reserved addresses. Bounded by the
/// exclusions (at most `MAX_POOL_EXCLUSIONS`) plus two.
fn unusable_indices(kind: &PoolKind) -> BTreeSet<u64> {
    match kind {
        PoolKind::Ipv4 { network, prefix_len, exclude } => {
            let size = kind.size();
            let mut indices: BTreeSet<u64> =
                exclude.iter().map(|a| u64::from(u32::from(*a).wrapping_sub(u32::from(*network)))).collect();
            if *prefix_len <= 30 {
                indices.extend([0, size.saturating_sub(1)]);
            }
            indices.retain(|idx| *idx < size);
            indices
        }
        PoolKind::Ports { first, exclude, .. } => {
            exclude.iter().map(|p| u64::from(p.wrapping_sub(*first))).filter(|idx| *idx < kind.size()).collect()
        }
        PoolKind::Slots { .. } => BTreeSet::new(),
    }
}

/// Identifiers below `next_fresh` that `new` makes usable and that nobody holds: without them, they would never be
/// handed out again (only indices from `next_fresh` on are fresh).
fn recovered_by(pool: &Pool, new: &PoolKind) -> Vec<PoolValue> {
    // Slots handed out before their pool was made smaller are beyond its size, below the fresh index.
    let beyond = pool.kind.size()..pool.next_fresh;
    unusable_indices(&pool.kind)
        .into_iter()
        .chain(beyond)
        .filter(|idx| *idx < pool.next_fresh)
        .filter_map(|idx| new.value_at(idx))
        .filter(|value| !pool.held.contains_key(value) && !pool.recovered.contains(value))
        .collect()
}

impl<'s> Decider<'s> {
    fn pool(&self, name: &PoolName) -> Result<&'s Pool, Rejection> {
        self.state
            .pools
            .get(name)
            .ok_or_else(|| Rejection::new(RejectionKind::Unknown, format!("pool {name} is not defined")))
    }

    /// Grants available identifiers to waiting holders, first in first out, and returns the identifiers left.
    fn serve_waiters(
        &mut self,
        pool: &Pool,
        values: &mut impl Iterator<Item = PoolValue>,
        except: Option<&ResourceRef>,
    ) -> usize {
        let mut n_served = 0;
        for holder in pool.waiters.values().filter(|h| Some(*h) != except) {
            if self.out.over_cap() {
                break;
            }
            let Some(value) = values.next() else { break };
            let Some(Holding::Waiting { source, .. }) = pool.holders.get(holder) else {
                continue;
            };
            self.out.push(Effect::ClaimGranted { holder: holder.clone(), value, source: *source });
            n_served += 1;
        }
        n_served
    }

    pub(super) fn define_pool(&mut self, command: &DefinePool) -> Verdict {
        check_kind(&command.pool, &command.kind)?;
        // A pool defined without a cool-down takes the policy's now; `update-pool` changes it later.
        let cooldown = command.cooldown.unwrap_or(self.state.policy().claim_cooldown);
        if let Some(existing) = self.state.pools.get(&command.pool) {
            if existing.kind.canonical() == command.kind.canonical()
                && existing.cooldown == cooldown
                && existing.orphans == command.orphans
            {
                return reject(RejectionKind::AlreadyDone, format!("pool {} is already defined so", command.pool));
            }
            return reject(
                RejectionKind::AlreadyExists,
                format!("pool {} is already defined differently; change it with `leasehold pool update`", command.pool),
            );
        }
        self.out.push(Effect::PoolDefined { kind: command.kind.clone(), cooldown });
        if command.orphans != OrphanPolicy::Release {
            self.out.push(Effect::PoolOrphanPolicy { orphans: command.orphans });
        }
        Ok(())
    }

    /// Grows a pool, changes its exclusions or its cool-down. Waiters are served at once from what the change makes
    /// available.
    pub(super) fn update_pool(&mut self, command: &UpdatePool) -> Verdict {
        let pool = self.pool(&command.pool)?;
        // A slot pool may be closed (0 slots: a quota lowered to none), though none is defined so: its holders keep
        // their slots until they let go, and nothing is handed out.
        if command.kind != (PoolKind::Slots { count: 0 }) {
            check_kind(&pool.name, &command.kind)?;
        }
        if let Err(problem) = grows_from(&pool.kind, &command.kind) {
            return reject(RejectionKind::Invalid, format!("pool {}: {problem}", pool.name));
        }
        let cooldown = command.cooldown.unwrap_or(pool.cooldown);
        let orphans = command.orphans.unwrap_or(pool.orphans);
        let same_kind = pool.kind.canonical() == command.kind.canonical() && cooldown == pool.cooldown;
        if same_kind && orphans == pool.orphans {
            return reject(RejectionKind::AlreadyDone, format!("pool {} is already defined so", pool.name));
        }
        if orphans != pool.orphans {
            // Holders bound before keep the policy their grant carried: it is theirs, on their partition's record.
            self.out.push(Effect::PoolOrphanPolicy { orphans });
        }
        if same_kind {
            return Ok(());
        }
        let recovered = recovered_by(pool, &command.kind);
        self.out.push(Effect::PoolUpdated { kind: command.kind.clone(), cooldown, recovered: recovered.clone() });
        let mut values =
            available_as(pool, &command.kind, cooldown, &recovered, self.now).take(pool.room_as(&command.kind, 0));
        self.serve_waiters(pool, &mut values, None);
        Ok(())
    }

    /// Removes a pool nobody holds or waits for.
    pub(super) fn delete_pool(&mut self, command: &DeletePool) -> Verdict {
        let pool = self.pool(&command.pool)?;
        if !pool.held.is_empty() || !pool.waiters.is_empty() {
            const SHOWN: usize = 3;
            let holders: Vec<String> = pool.held.iter().take(SHOWN).map(|(v, h)| format!("{h} ({v})")).collect();
            let more = pool.held.len().saturating_sub(SHOWN);
            let named = match (holders.is_empty(), more) {
                (true, _) => String::new(),
                (false, 0) => format!(" by {}", holders.join(", ")),
                (false, more) => format!(" by {} and {more} more", holders.join(", ")),
            };
            return reject(
                RejectionKind::InvalidState,
                format!(
                    "pool {} is in use: {} identifiers held{named}, {} holders waiting; release those resources first",
                    pool.name,
                    pool.held.len(),
                    pool.waiters.len()
                ),
            );
        }
        self.out.push(Effect::PoolDeleted {});
        Ok(())
    }

    pub(super) fn claim(&mut self, command: &Claim) -> Verdict {
        let pool = self.pool(&command.pool)?;
        let holder = &command.holder;
        self.check_from_home(holder, &holder.agent, command.source, "a claim about it")?;
        match pool.holders.get(holder) {
            Some(Holding::Granted { value, token, .. }) => {
                return reject(
                    RejectionKind::AlreadyDone,
                    format!("{holder} already holds {value} of pool {} (claim token {token})", pool.name),
                );
            }
            Some(Holding::Waiting { queued_at, .. }) => {
                let place = pool.waiters.range(..=*queued_at).count();
                return reject(
                    RejectionKind::AlreadyDone,
                    format!("{holder} is already waiting for pool {} (place {place} in the queue)", pool.name),
                );
            }
            None => {}
        }
        // The claim that ended, sent again, is stale. Any other claim of the holder is served: a holder has one
        // claim per pool in its life (its `claim-wanted`), and its partition binds only a grant of that one, so a
        // grant of a made-up claim goes straight back; refusing every claim not newer than a made-up one would keep
        // the holder's real claim waiting for ever.
        if let Some((source, _)) = pool.released.get(holder).filter(|(ended, _)| command.source == *ended) {
            return reject(
                RejectionKind::StaleSource,
                format!(
                    "the claim of {holder} on pool {} already ended (claimed from {source}); this claim is stale",
                    pool.name
                ),
            );
        }
        let mut values = available(pool, self.now);
        self.serve_waiters(pool, &mut values, None);
        match values.next() {
            Some(value) if !self.out.over_cap() => {
                self.out.push(Effect::ClaimGranted { holder: holder.clone(), value, source: command.source });
            }
            _ => {
                self.out.push(Effect::ClaimQueued { holder: holder.clone(), source: command.source });
            }
        }
        Ok(())
    }

    pub(super) fn free(&mut self, command: &Free) -> Verdict {
        let pool = self.pool(&command.pool)?;
        let holder = &command.holder;
        self.check_from_home(holder, &holder.agent, command.source, "a free about it")?;
        let mut freed = None;
        match (pool.holders.get(holder), command.token) {
            (Some(Holding::Granted { value, token, .. }), Some(given)) if *token == given => {
                self.out.push(Effect::ClaimFreed { holder: holder.clone(), value: *value, token: given });
                if command.cause != (FreeCause::Released {}) {
                    self.out.push(Effect::ClaimFreedBecause { holder: holder.clone(), cause: command.cause.clone() });
                }
                freed = Some(*value);
            }
            (Some(Holding::Granted { token, .. }), given) => {
                let given = given.map(|g| g.to_string()).unwrap_or_else(|| "none".to_owned());
                return reject(
                    RejectionKind::TokenMismatch,
                    format!("{holder} holds its claim on pool {} with token {token}, not {given}", pool.name),
                );
            }
            (Some(Holding::Waiting { source, .. }), None) if command.source <= *source => {
                return reject(
                    RejectionKind::StaleSource,
                    format!(
                        "{holder} claimed from {source}; a withdrawal from {} is older than the claim",
                        command.source
                    ),
                );
            }
            (Some(Holding::Waiting { .. }), None) => {
                self.out.push(Effect::ClaimWithdrawn { holder: holder.clone() });
            }
            (Some(Holding::Waiting { .. }), Some(given)) => {
                return reject(
                    RejectionKind::TokenMismatch,
                    format!("{holder} is still waiting for pool {}; it holds no token {given}", pool.name),
                );
            }
            (None, _) if pool.released.contains_key(holder) => {
                return reject(
                    RejectionKind::AlreadyDone,
                    format!("the claim of {holder} on pool {} was already freed", pool.name),
                );
            }
            (None, _) => {
                return reject(RejectionKind::Unknown, format!("{holder} holds no claim on pool {}", pool.name));
            }
        }
        // Others may be ready for the waiters already; the freed identifier joins them (last: it is the most
        // recently freed) only if the pool has no cool-down. The holder that just left the queue is skipped.
        // An identifier excluded while it was held is never handed out again.
        let no_cooldown = pool.cooldown.0 == 0;
        let leaving = usize::from(freed.is_some());
        let freed = freed.filter(|value| no_cooldown && pool.kind.contains(value));
        let mut values = available_as(pool, &pool.kind, pool.cooldown, &[], self.now)
            .chain(freed)
            .take(pool.room_as(&pool.kind, leaving));
        self.serve_waiters(pool, &mut values, Some(holder));
        Ok(())
    }

    pub(super) fn tick_pool(&mut self, command: &TickPool) -> Verdict {
        let pool = self.pool(&command.pool)?;
        if pool.waiters.is_empty() {
            return reject(RejectionKind::NothingToDo, format!("nobody waits for pool {}", pool.name));
        }
        let mut values = available(pool, self.now);
        if self.serve_waiters(pool, &mut values, None) > 0 {
            return Ok(());
        }
        if pool.room_as(&pool.kind, 0) == 0 && pool.next_cooled_at().is_some() {
            return reject(
                RejectionKind::NothingToDo,
                format!(
                    "pool {} hands out nothing more until fewer than its {} are held ({} are); {} holders wait",
                    pool.name,
                    pool.kind.n_usable(),
                    pool.held.len(),
                    pool.waiters.len()
                ),
            );
        }
        match pool.next_cooled_at() {
            Some(at) => reject(
                RejectionKind::NotYetDue,
                format!("pool {}: the next identifier finishes its cool-down at {at}", pool.name),
            ),
            None => reject(
                RejectionKind::NothingToDo,
                format!("pool {} has no identifier free or cooling; {} holders wait", pool.name, pool.waiters.len()),
            ),
        }
    }
}

/// Checks a definition for `pool`: valid, and not too many exclusions to repeat in its effects.
fn check_kind(pool: &PoolName, kind: &PoolKind) -> Verdict {
    if let Err(problem) = kind.validate() {
        return reject(RejectionKind::Invalid, format!("pool {pool}: {problem}"));
    }
    let n_excluded = match kind {
        PoolKind::Ipv4 { exclude, .. } => exclude.len(),
        PoolKind::Ports { exclude, .. } => exclude.len(),
        PoolKind::Slots { .. } => 0,
    };
    if n_excluded > MAX_POOL_EXCLUSIONS {
        return reject(
            RejectionKind::Invalid,
            format!(
                "pool {pool} excludes {n_excluded} identifiers; at most {MAX_POOL_EXCLUSIONS} (split the range into \
                 several pools instead)"
            ),
        );
    }
    Ok(())
}
