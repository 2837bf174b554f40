//! Pools: definition, claims keyed by holder (idempotent), first-in-first-out waiters, claim tokens, frees that
//! must match holder and token, cool-down, least-recently-freed first, and `tick`.

use leasehold_schemas::command::{Claim, DefinePool, Free, TickPool};
use leasehold_schemas::ids::{PoolName, ResourceRef, Timestamp};
use leasehold_schemas::outcome::Effect;
use leasehold_schemas::pool::{PoolKind, PoolValue};
use leasehold_schemas::settings::DEFAULT_POOL_COOLDOWN;
use leasehold_schemas::{Rejection, RejectionKind};

use super::{Decider, MAX_POOL_EXCLUSIONS, Verdict, reject};
use crate::state::{Holding, Pool};

/// Identifiers a pool can hand out at `now`, in the order it hands them out: never-used ones first, then freed
/// ones whose cool-down has passed, least recently freed first.
fn available(pool: &Pool, now: Timestamp) -> impl Iterator<Item = PoolValue> + '_ {
    let fresh = (pool.next_fresh..pool.kind.size()).filter_map(|idx| pool.kind.value_at(idx));
    let cooled = pool
        .cooling
        .iter()
        .take_while(move |((freed_at, _), _)| freed_at.saturating_add(pool.cooldown) <= now)
        .map(|(_, value)| *value);
    fresh.chain(cooled)
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
        if let Err(problem) = command.kind.validate() {
            return reject(RejectionKind::Invalid, format!("pool {}: {problem}", command.pool));
        }
        let n_excluded = match &command.kind {
            PoolKind::Ipv4 { exclude, .. } => exclude.len(),
            PoolKind::Ports { exclude, .. } => exclude.len(),
            PoolKind::Slots { .. } => 0,
        };
        if n_excluded > MAX_POOL_EXCLUSIONS {
            return reject(
                RejectionKind::Invalid,
                format!(
                    "pool {} excludes {n_excluded} identifiers; at most {MAX_POOL_EXCLUSIONS} (split the range into \
                     several pools instead)",
                    command.pool
                ),
            );
        }
        let cooldown = command.cooldown.unwrap_or(DEFAULT_POOL_COOLDOWN);
        if let Some(existing) = self.state.pools.get(&command.pool) {
            if existing.kind.canonical() == command.kind.canonical() && existing.cooldown == cooldown {
                return reject(RejectionKind::AlreadyDone, format!("pool {} is already defined so", command.pool));
            }
            return reject(
                RejectionKind::AlreadyExists,
                format!("pool {} is already defined differently; pools are not redefined", command.pool),
            );
        }
        self.out.push(Effect::PoolDefined { kind: command.kind.clone(), cooldown });
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
        let no_cooldown = pool.cooldown.0 == 0;
        let mut values = available(pool, self.now).chain(freed.filter(|_| no_cooldown));
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
