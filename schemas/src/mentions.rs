//! What an effect is about: the resources, leases, pools and pool identifiers it names, in its own partition or
//! another's. The projector indexes what an outcome touched by it; the replay tool finds a thing's history by it.

use crate::ids::{LeaseId, PoolName, ResourceId};
use crate::outcome::Effect;
use crate::pool::PoolValue;

/// The things one effect names.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Mentions<'e> {
    /// Resources of the outcome's partition.
    pub resources: Vec<ResourceId>,
    /// Resources named by reference, usually of another partition (a pool's holders, a child, a parent).
    pub elsewhere: Vec<ResourceId>,
    pub leases: Vec<LeaseId>,
    /// Pools named by the effect (a pool's own outcomes name it by their key instead).
    pub pools: Vec<&'e PoolName>,
    /// Identifiers a pool's own effect hands out or takes back (`claim-granted`, `claim-freed`).
    pub pool_values: Vec<PoolValue>,
}

impl<'e> Mentions<'e> {
    /// What `effect` names.
    pub fn of(effect: &'e Effect) -> Self {
        let mut m = Mentions::default();
        match effect {
            Effect::ResourceAllocated { resource, parent, .. } => {
                m.resources.push(*resource);
                m.elsewhere.extend(parent.iter().map(|p| p.resource));
            }
            Effect::ClaimWanted { resource, pool } => {
                m.resources.push(*resource);
                m.pools.push(pool);
            }
            Effect::ClaimBound { resource, pool, .. }
            | Effect::ClaimPoolDefinition { resource, pool, .. }
            | Effect::ClaimReleasable { resource, pool, .. }
            | Effect::GrantReturned { resource, pool, .. }
            | Effect::ClaimOrphanPolicy { resource, pool, .. }
            | Effect::ClaimHeldForOrphan { resource, pool, .. }
            | Effect::ClaimReleaseCause { resource, pool, .. } => {
                m.resources.push(*resource);
                m.pools.push(pool);
            }
            Effect::CreateOrdered { resource }
            | Effect::ResourceActivated { resource, .. }
            | Effect::ResourceSeen { resource, .. }
            | Effect::ResourcePaused { resource, .. }
            | Effect::ResourceUnpaused { resource, .. }
            | Effect::ResourceUpdated { resource, .. }
            | Effect::ResourceSuspect { resource, .. }
            | Effect::HealthCheckRequested { resource }
            | Effect::ResourceHealthy { resource }
            | Effect::ResourceReleasing { resource, .. }
            | Effect::ResourceDestroyed { resource, .. }
            | Effect::ResourceLost { resource, .. }
            | Effect::ResourceOrphaned { resource }
            | Effect::ResourceFailed { resource, .. }
            | Effect::HandleReappeared { resource, .. }
            | Effect::AllocationWaitsUntil { resource, .. }
            | Effect::DestroyBlocked { resource, .. }
            | Effect::CapacityReserved { resource, .. }
            | Effect::ReservationEnded { resource, .. }
            | Effect::ResourceMaxLeaseChanged { resource, .. } => m.resources.push(*resource),
            // A placement's partition is not its resource's: the resource is made on the agent it binds.
            Effect::PlacementWaiting { resource, .. }
            | Effect::PlacementBound { resource, .. }
            | Effect::PlacementFailed { resource, .. }
            | Effect::PlacementCancelled { resource, .. }
            | Effect::PlacementClosed { resource } => m.elsewhere.push(*resource),
            Effect::PlacementWanted { request, .. } => {
                m.elsewhere.push(request.resource);
                m.elsewhere.extend(request.parent.iter().map(|p| p.resource));
                m.pools.extend(request.pools.iter());
            }
            Effect::GarbageDestroyOrdered { handle, .. }
            | Effect::GarbageDryRun { handle, .. }
            | Effect::GarbageDestroyed { handle, .. } => m.resources.push(*handle),
            Effect::UpstreamFlagged { resource, parent, .. } => {
                m.resources.push(*resource);
                m.elsewhere.push(parent.resource);
            }
            Effect::ChildAdopted { parent, child, .. } => {
                m.resources.push(*parent);
                m.elsewhere.push(child.resource);
            }
            Effect::LeaseWaiting { lease, resource, .. }
            | Effect::LeaseGranted { lease, resource, .. }
            | Effect::LeaseQueued { lease, resource, .. } => {
                m.leases.push(*lease);
                m.resources.push(*resource);
            }
            Effect::LeaseRenewed { lease, .. }
            | Effect::LeaseReleased { lease }
            | Effect::LeaseBroken { lease, .. }
            | Effect::LeaseExpired { lease }
            | Effect::LeaseFailed { lease } => m.leases.push(*lease),
            Effect::ClaimGranted { holder, value, .. } | Effect::ClaimFreed { holder, value, .. } => {
                m.elsewhere.push(holder.resource);
                m.pool_values.push(*value);
            }
            Effect::ClaimQueued { holder, .. }
            | Effect::ClaimWithdrawn { holder }
            | Effect::ClaimFreedBecause { holder, .. } => m.elsewhere.push(holder.resource),
            Effect::AgentRegistered { .. }
            | Effect::AgentSeen { .. }
            | Effect::AgentStalled { .. }
            | Effect::AgentRecovered {}
            | Effect::AgentGone { .. }
            | Effect::AgentRetired { .. }
            | Effect::AgentSuspect { .. }
            | Effect::AgentBreakerCleared { .. }
            | Effect::AgentBreakerRearmed {}
            | Effect::ResyncRequested { .. }
            | Effect::ObservationAccepted { .. }
            | Effect::PoolDefined { .. }
            | Effect::PoolUpdated { .. }
            | Effect::PoolDeleted {}
            | Effect::PoolOrphanPolicy { .. }
            | Effect::PartitionSettingsChanged { .. }
            | Effect::DecisionContinues { .. }
            | Effect::AgentDriverUnavailable { .. }
            | Effect::AgentDriverAvailable {}
            | Effect::AgentUnretired { .. }
            | Effect::AgentCordoned { .. }
            | Effect::AgentUncordoned { .. }
            | Effect::AgentDeclared { .. }
            | Effect::AgentDraining { .. }
            | Effect::GcModeChanged { .. }
            | Effect::PriorityCapsChanged { .. }
            | Effect::QuotaSet { .. }
            | Effect::QuotaRemoved { .. } => {}
        }
        m
    }

    /// Whether it names `resource`, here or elsewhere.
    pub fn names_resource(&self, resource: ResourceId) -> bool {
        self.resources.contains(&resource) || self.elsewhere.contains(&resource)
    }
}
