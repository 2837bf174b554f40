//! A small cluster decided in memory for the sweeper's tests: every partition's state folded from the real decider's
//! outcomes, the plan "sent" by deciding each due request in its partition at a log time the test sets. No log.

#![allow(dead_code)] // Each test crate uses what it needs of it.

use std::collections::BTreeMap;

use leasehold_domain::state::Resource;
use leasehold_domain::{Ctx, Decided, PartitionState, apply, continue_work, decide};
use leasehold_schemas::command::{Cascade, Register, SyncReport};
use leasehold_schemas::ids::{Key, Millis, ResourceRef, Timestamp};
use leasehold_schemas::outcome::Effect;
use leasehold_schemas::subjects::{partition_of_agent, partition_of_key};
use leasehold_schemas::{AgentName, Command, CommandId, Envelope, Issuer, Outcome, ResourceId, Uuid};
use leasehold_sweeper::plan::{self, Planned, States};

pub(crate) const PARTITIONS: u32 = 4;

/// Every partition of a small cluster, decided in memory.
pub(crate) struct World {
    pub(crate) states: States,
    pub(crate) cmd_seq: u64,
    pub(crate) now: Timestamp,
    pub(crate) obs: BTreeMap<AgentName, u64>,
    /// The adoption answers seen go by, as the sweeper's view keeps them beside the states.
    pub(crate) answers: BTreeMap<ResourceRef, Cascade>,
    /// Every outcome so far, in the order decided.
    pub(crate) outcomes: Vec<Outcome>,
}

impl World {
    pub(crate) fn new() -> World {
        World {
            states: (0..PARTITIONS).map(|p| (p, PartitionState::new(p, PARTITIONS))).collect(),
            cmd_seq: 0,
            // The ids the test makes are stamped with this machine's clock: the log's starts there too.
            now: Timestamp(
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
            ),
            obs: BTreeMap::new(),
            answers: BTreeMap::new(),
            outcomes: Vec::new(),
        }
    }

    /// Decides `body` from `issuer` in its partition now, with every part of a long decision; returns the outcome's
    /// first part (or `None` when nothing was appended).
    pub(crate) fn send(&mut self, issuer: &str, body: impl Into<Command>) -> Option<Outcome> {
        let body = body.into();
        let partition = partition_of_key(&body.key(), PARTITIONS);
        self.cmd_seq += 1;
        // Stamped with the log's time, as a producer's clock would be: a test that moves time on sends fresh ids.
        let mut entropy = [0u8; 10];
        entropy[2..].copy_from_slice(&self.cmd_seq.to_be_bytes());
        let id = CommandId::from_parts(self.now.0, entropy);
        let envelope = Envelope::new(id, Issuer::new(issuer).unwrap(), self.now, body);
        let ctx = Ctx { cmd_seq: self.cmd_seq, log_time: self.now };
        let first = match decide(&self.states[&partition], &ctx, &envelope).unwrap() {
            Decided::Append(outcome) => outcome,
            Decided::AlreadyDecided { .. } | Decided::Unchanged => return None,
        };
        let mut next = Some(first.clone());
        while let Some(outcome) = next {
            let state = self.states.get_mut(&partition).unwrap();
            apply(state, &outcome).unwrap();
            next = state.pending().is_some().then(|| continue_work(state).unwrap());
            self.note(partition, &outcome);
            self.outcomes.push(outcome);
        }
        Some(first)
    }

    /// What the sweeper's view keeps beside the states: adoption answers seen go by.
    fn note(&mut self, partition: u32, outcome: &Outcome) {
        let Key::Agent(agent) = &outcome.command.key else { return };
        for (position, effect) in outcome.positioned_effects() {
            if let Effect::ChildAdopted { parent, child, child_source, parent_state } = effect {
                let parent = ResourceRef::new(agent.clone(), *parent);
                let answer = plan::adoption_answer(partition, position, &parent, child, *child_source, *parent_state);
                self.answers.insert(child.clone(), answer);
            }
        }
    }

    pub(crate) fn plan(&self) -> Vec<Planned> {
        plan::plan(&self.states, &self.answers)
    }

    /// What is due now.
    pub(crate) fn due(&self) -> Vec<Planned> {
        self.plan().into_iter().filter(|p| p.due.is_none_or(|at| at <= self.now)).collect()
    }

    /// Sends every request due now, each twice (two sweepers), until none is due; returns how many were sent.
    pub(crate) fn settle(&mut self) -> usize {
        let mut sent = 0;
        for _ in 0..100 {
            let due = self.due();
            if due.is_empty() {
                return sent;
            }
            for item in due {
                self.send("sweeper:a", item.command.clone());
                self.send("sweeper:b", item.command);
                sent += 1;
            }
        }
        panic!("the plan never settles: {:#?}", self.plan());
    }

    /// A confused sweeper: what `view` (a view of some steps ago) plans due now, sent in an order shuffled by `order`
    /// (the order the requests reach their partitions), each twice when `twice` (a second sweeper); returns what it
    /// sent, for [`World::replay`].
    pub(crate) fn sweep_confused(&mut self, view: &States, order: u64, twice: bool) -> Vec<Command> {
        let mut due: Vec<Planned> =
            plan::plan(view, &BTreeMap::new()).into_iter().filter(|p| p.due.is_none_or(|at| at <= self.now)).collect();
        let mut seed = order | 1;
        for i in (1..due.len()).rev() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            due.swap(i, (seed % (i as u64 + 1)) as usize);
        }
        let mut sent = Vec::with_capacity(due.len());
        for item in due {
            self.send("sweeper:confused", item.command.clone());
            if twice {
                self.send("sweeper:twin", item.command.clone());
            }
            sent.push(item.command);
        }
        sent
    }

    /// Requests planned long ago sent again (a retry after the dedupe window, a sweeper restarted from an old state):
    /// `n` of `planned`, picked by `pick`.
    pub(crate) fn replay(&mut self, planned: &[Command], pick: u64, n: usize) {
        if planned.is_empty() {
            return;
        }
        for k in 0..n as u64 {
            let old = planned[(pick.wrapping_mul(k + 1) % planned.len() as u64) as usize].clone();
            self.send("sweeper:replay", old);
        }
    }

    pub(crate) fn advance(&mut self, by: Millis) {
        self.now = self.now.saturating_add(by);
    }

    pub(crate) fn state_of(&self, agent: &AgentName) -> &PartitionState {
        &self.states[&partition_of_agent(agent, PARTITIONS)]
    }

    /// Registers `name`, declaring `labels` and `capacity`.
    pub(crate) fn register_declaring(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        capacity: &[(&str, u32)],
    ) -> AgentName {
        let agent = AgentName::new(name).unwrap();
        let mut body = Register::new(agent.clone(), Uuid::from_u128(u128::from(self.cmd_seq) + 1));
        body.labels = labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        body.capacity = capacity.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect();
        self.send(name, body).expect("a registration is appended");
        self.obs.insert(agent.clone(), 0);
        agent
    }

    /// Registers `name`, declaring nothing.
    pub(crate) fn register(&mut self, name: &str) -> AgentName {
        self.register_declaring(name, &[], &[])
    }

    pub(crate) fn next_obs(&mut self, agent: &AgentName) -> u64 {
        let n = self.obs.get_mut(agent).unwrap();
        *n += 1;
        *n
    }

    /// The agent destroyed it: a sync report says so (its count and digest what the writer expects).
    pub(crate) fn destroyed(&mut self, agent: &AgentName, resource: ResourceId) {
        let state = self.state_of(agent);
        let epoch = state.agent(agent).unwrap().epoch;
        let watermark = state.last_position();
        let obs = self.next_obs(agent);
        let mut report = SyncReport::new(agent.clone(), epoch, obs, watermark);
        report.destroyed = vec![resource];
        let (count, digest) =
            leasehold_domain::expected_listing(self.state_of(agent), &report).expect("the report is judged");
        report.count = count;
        report.digest = digest;
        self.send(agent.as_str(), report);
    }

    pub(crate) fn effects(&self) -> impl Iterator<Item = &Effect> {
        self.outcomes.iter().flat_map(|o| o.effects())
    }
}

impl World {
    /// The `n`-th resource (counting round) among those `keep` takes, in every partition: what a step that picks "some
    /// resource" acts on.
    pub(crate) fn nth_resource(&self, n: usize, keep: impl Fn(&Resource) -> bool) -> Option<(AgentName, ResourceId)> {
        let picked: Vec<(AgentName, ResourceId)> = self
            .states
            .values()
            .flat_map(|s| s.resources())
            .filter(|r| keep(r))
            .map(|r| (r.agent.clone(), r.id))
            .collect();
        picked.get(n % picked.len().max(1)).cloned()
    }
}

/// What a confused sweeper works from: the partitions' states after each of the last steps (it plans from any of
/// them, as a sweeper whose view is behind would), and every request it sent (replayed later).
pub(crate) struct Confusion {
    views: Vec<States>,
    planned: Vec<Command>,
}

impl Confusion {
    /// The views a confused sweeper keeps.
    const VIEWS: usize = 8;

    pub(crate) fn new(w: &World) -> Confusion {
        Confusion { views: vec![w.states.clone()], planned: Vec::new() }
    }

    /// Sends what the view of `back` steps ago plans due now (see [`World::sweep_confused`]).
    pub(crate) fn sweep(&mut self, w: &mut World, back: usize, order: u64, twice: bool) {
        let view = &self.views[self.views.len().saturating_sub(1 + back)];
        self.planned.extend(w.sweep_confused(view, order, twice));
    }

    /// Sends again `n` of the requests sent so far (see [`World::replay`]).
    pub(crate) fn replay(&self, w: &mut World, pick: u64, n: usize) {
        w.replay(&self.planned, pick, n);
    }

    /// Keeps the states after a step, the last [`Confusion::VIEWS`] of them.
    pub(crate) fn remember(&mut self, w: &World) {
        self.views.push(w.states.clone());
        if self.views.len() > Self::VIEWS {
            self.views.remove(0);
        }
    }
}
