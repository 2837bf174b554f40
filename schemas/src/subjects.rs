//! Subjects (DESIGN section 9) and the partition function.
//!
//! Producers publish to `lh.in.<class>.<key>.<id>`; the stream transform maps that to
//! `lh.cmd.<partition>.<class>.<key>.<id>`, where `partition = fnv1a32(key) % P`, byte-for-byte what NATS's
//! `{{partition(P,2)}}` computes, so clients, the embedded log and the server agree.

use crate::command::{Command, SubjectId};
use crate::envelope::CommandClass;
use crate::ids::{AgentName, Issuer, Key};

const FNV_OFFSET: u32 = 0x811c_9dc5;

/// FNV-1a, 32 bits.
pub fn fnv1a32(bytes: &[u8]) -> u32 {
    fnv1a32_on(FNV_OFFSET, bytes)
}

/// FNV-1a of `bytes` following whatever gave `hash`: hashing a token in pieces, without putting them together.
fn fnv1a32_on(hash: u32, bytes: &[u8]) -> u32 {
    bytes.iter().fold(hash, |hash, byte| (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193))
}

fn in_range(hash: u32, partitions: u32) -> u32 {
    assert!(partitions > 0, "a log has at least one partition");
    hash % partitions
}

/// The partition of a subject token among `partitions` (which must be at least 1).
pub fn partition_of(token: &str, partitions: u32) -> u32 {
    in_range(fnv1a32(token.as_bytes()), partitions)
}

/// The partition that decides commands about `key`: that of its subject token ([`Key::token`]), hashed in place
/// (every command is checked against it, so no token is built).
pub fn partition_of_key(key: &Key, partitions: u32) -> u32 {
    match key {
        Key::Agent(agent) => partition_of_agent(agent, partitions),
        Key::Pool(pool) => in_range(fnv1a32_on(fnv1a32(b"@"), pool.as_str().as_bytes()), partitions),
        Key::Placement(resource) => partition_of(&format!("~{resource}"), partitions),
    }
}

/// The key that routes a partition's own settings (`op.set-partition-settings`) to `partition`: the first pool
/// name `lh-settings-<n>` that maps there. Deterministic, so every sender and reader agrees on it; no pool of that
/// name needs to exist.
pub fn settings_key(partition: u32, partitions: u32) -> Key {
    assert!(partition < partitions, "partition {partition} of {partitions} does not exist");
    (0u64..)
        .map(|n| Key::Pool(crate::ids::PoolName::new(format!("lh-settings-{n}")).expect("a valid pool name")))
        .find(|key| partition_of_key(key, partitions) == partition)
        .expect("every partition is reached by some name")
}

/// The partition of an agent and of its resources.
pub fn partition_of_agent(agent: &AgentName, partitions: u32) -> u32 {
    partition_of(agent.as_str(), partitions)
}

/// Where a producer publishes a command.
pub fn ingress_subject(class: CommandClass, key: &Key, id: SubjectId) -> String {
    format!("lh.in.{}.{}.{}", class.token(), key.token(), id)
}

/// Where a command is stored after the transform.
pub fn command_subject(partition: u32, class: CommandClass, key: &Key, id: SubjectId) -> String {
    format!("lh.cmd.{partition}.{}.{}.{}", class.token(), key.token(), id)
}

/// The ingress subject of a command.
pub fn ingress_subject_of(command: &Command) -> String {
    ingress_subject(command.class(), &command.key(), command.subject_id())
}

/// The class token of an `op` command published by a producer bound to `principal` (schema version 6):
/// `op@<principal>`. A NATS user made with `leasehold credentials producer NAME --principal P` may publish only on
/// `lh.in.op@P.>`, and the writer takes a command stored there only if its issuer is `P` and it is a producer's
/// request ([`Command::is_producer_request`]): the subject the server let the sender publish on is its identity, as
/// an agent's is. `None` when `principal` cannot be a subject token (it holds `.`, `*` or `>`).
pub fn bound_class_token(principal: &Issuer) -> Option<String> {
    is_bindable(principal.as_str()).then(|| format!("{}@{principal}", CommandClass::Op.token()))
}

/// True when `principal` can be a subject token, and so be bound to a NATS user.
pub fn is_bindable(principal: &str) -> bool {
    !principal.is_empty() && !principal.contains(['.', '*', '>']) && principal.bytes().all(|b| b.is_ascii_graphic())
}

/// Where a producer bound to `principal` publishes `command` (`lh.in.op@<principal>.<key>.<id>`); `None` when the
/// command is not an `op` command or the principal cannot be bound.
pub fn bound_ingress_subject(command: &Command, principal: &Issuer) -> Option<String> {
    if command.class() != CommandClass::Op {
        return None;
    }
    let class = bound_class_token(principal)?;
    Some(format!("lh.in.{class}.{}.{}", command.key().token(), command.subject_id()))
}

/// The tail of an ingress or stored subject after its prefix (`<class>.<key>.<id>`), or `None`.
fn subject_tail(subject: &str) -> Option<&str> {
    subject.strip_prefix("lh.in.").or_else(|| {
        let rest = subject.strip_prefix("lh.cmd.")?;
        let (partition, tail) = rest.split_once('.')?;
        // One spelling: a u32 in decimal, without leading zeros.
        partition.parse::<u32>().ok().filter(|p| p.to_string() == partition).map(|_| tail)
    })
}

/// The principal an ingress or stored subject binds its command to (`op@<principal>`), if it names one.
pub fn bound_principal(subject: &str) -> Option<&str> {
    let class = subject_tail(subject)?.split('.').next()?;
    class.strip_prefix("op@")
}

/// A subject that does not name the command it carries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("subject {subject:?} does not fit the {type_name} command it carries: expected {expected:?}")]
pub struct SubjectMismatch {
    pub subject: String,
    pub type_name: &'static str,
    pub expected: String,
}

/// Checks that an ingress (`lh.in.<class>.<key>.<id>`) or stored (`lh.cmd.<p>.<class>.<key>.<id>`) subject names
/// exactly the class, key and id of `command`, in canonical form. Identity comes from the subject the server let
/// the sender publish on, so a body about another agent, pool or resource is refused; and a resource's command
/// history stays one subject filter.
pub fn check_subject(subject: &str, command: &Command) -> Result<(), SubjectMismatch> {
    let key = command.key();
    let tail = subject_tail(subject);
    // Compared piece by piece, with no subject of its own built: every command a writer or `verify` takes comes
    // through here.
    let (class_token, id) = (command.class().token(), command.subject_id());
    if tail.is_some_and(|tail| spells(tail, format_args!("{class_token}.{}.{id}", key.token_display()))) {
        return Ok(());
    }
    let expected_tail = format!("{class_token}.{}.{id}", key.token());
    // An `op` command of a bound producer: `op@<principal>` in place of `op` (the principal is checked apart).
    let bound = tail.and_then(|tail| {
        let (class, rest) = tail.split_once('.')?;
        let principal = class.strip_prefix("op@").filter(|p| is_bindable(p))?;
        let unbound = format!("{}.{rest}", CommandClass::Op.token());
        (command.class() == CommandClass::Op && unbound == expected_tail).then_some(principal)
    });
    if bound.is_some() {
        return Ok(());
    }
    Err(SubjectMismatch {
        subject: subject.to_owned(),
        type_name: command.type_name(),
        expected: format!("lh.in.{expected_tail}"),
    })
}

/// Whether `text` is exactly what `pieces` writes, found without writing it out (`format_args!`): how the checks
/// every command and outcome goes through compare a stored token with what a body says.
pub fn spells(text: &str, pieces: std::fmt::Arguments<'_>) -> bool {
    /// What is left of the text to match; the writing stops at the first piece that differs.
    struct Rest<'a>(&'a str);
    impl std::fmt::Write for Rest<'_> {
        fn write_str(&mut self, piece: &str) -> std::fmt::Result {
            self.0 = self.0.strip_prefix(piece).ok_or(std::fmt::Error)?;
            Ok(())
        }
    }
    let mut rest = Rest(text);
    std::fmt::write(&mut rest, pieces).is_ok() && rest.0.is_empty()
}

/// The subject a writer consumes for one partition.
pub fn command_filter(partition: u32) -> String {
    format!("lh.cmd.{partition}.>")
}

/// Where the outcomes about one agent or pool are appended: one literal subject an agent can be allowed to read.
pub fn outcome_subject(partition: u32, key: &Key) -> String {
    format!("lh.evt.{partition}.{}", key.token())
}

/// Every outcome subject of a partition: the fence's `Nats-Expected-Last-Subject-Sequence-Subject`.
pub fn outcome_filter(partition: u32) -> String {
    format!("lh.evt.{partition}.>")
}

/// Where an undecodable command goes, mirroring its command subject.
pub fn dead_letter_subject(partition: u32, class: &str, key: &str, id: &str) -> String {
    format!("lh.dlq.{partition}.{class}.{key}.{id}")
}

/// The stream transform of `LH_CMD`: source and destination, for `partitions` partitions.
pub fn partition_transform(partitions: u32) -> (String, String) {
    (
        "lh.in.*.*.*".to_owned(),
        format!("lh.cmd.{{{{partition({partitions},2)}}}}.{{{{wildcard(1)}}}}.{{{{wildcard(2)}}}}.{{{{wildcard(3)}}}}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{AgentName, PoolName};

    #[test]
    fn matches_nats_partition_test_vector() {
        // nats-server 2.15 stored `cmd.sync.res-a` as `cmd.7.sync.res-a` for `{{partition(8,2)}}`.
        assert_eq!(partition_of("res-a", 8), 7);
    }

    #[test]
    fn a_key_is_in_the_partition_of_its_token() {
        let keys = ["w1", "worker-b", "a"]
            .map(|name| Key::Agent(AgentName::new(name).unwrap()))
            .into_iter()
            .chain(["ips", "overlay", "p"].map(|name| Key::Pool(PoolName::new(name).unwrap())));
        for key in keys {
            for partitions in [1, 2, 3, 8, 1000, u32::MAX] {
                assert_eq!(partition_of_key(&key, partitions), partition_of(&key.token(), partitions), "{key}");
            }
        }
    }

    #[test]
    fn fnv1a32_known_values() {
        assert_eq!(fnv1a32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a32(b"foobar"), 0xbf9c_f968);
    }

    #[test]
    fn a_subject_must_name_its_command() {
        use crate::command::Heartbeat;
        use crate::ids::Position;
        let heartbeat: Command = Heartbeat { agent: AgentName::new("w1").unwrap(), epoch: Position(1) }.into();
        assert!(check_subject("lh.in.agent.w1._", &heartbeat).is_ok());
        assert!(check_subject("lh.cmd.5.agent.w1._", &heartbeat).is_ok());
        let wrongs = [
            "lh.in.agent.w2._",
            "lh.in.op.w1._",
            "lh.in.agent.w1.x",
            "lh.cmd.x.agent.w1._",
            "lh.evt.5.w1",
            // The partition has one spelling too.
            "lh.cmd..agent.w1._",
            "lh.cmd.05.agent.w1._",
            "lh.cmd.99999999999999999999.agent.w1._",
        ];
        for wrong in wrongs {
            let err = check_subject(wrong, &heartbeat).unwrap_err();
            assert!(err.to_string().contains("expected \"lh.in.agent.w1._\""), "{err}");
        }
    }

    #[test]
    fn a_bound_producer_s_subject_names_its_principal() {
        use crate::command::Release;
        use crate::ids::ResourceId;
        let id: ResourceId = "019b76da-9478-7111-9111-111111111111".parse().unwrap();
        let release: Command = Release { agent: AgentName::new("w1").unwrap(), resource: id, reason: None }.into();
        let principal = Issuer::new("ci:team-a").unwrap();
        let subject = bound_ingress_subject(&release, &principal).unwrap();
        assert_eq!(subject, format!("lh.in.op@ci:team-a.w1.{id}"));
        assert!(check_subject(&subject, &release).is_ok());
        assert!(check_subject(&format!("lh.cmd.3.op@ci:team-a.w1.{id}"), &release).is_ok());
        assert_eq!(bound_principal(&subject), Some("ci:team-a"));
        assert_eq!(bound_principal(&format!("lh.cmd.3.op@ci:team-a.w1.{id}")), Some("ci:team-a"));
        assert_eq!(bound_principal(&format!("lh.in.op.w1.{id}")), None);
        // Only `op` commands are bound, to a principal that can be a token, and the rest must still fit.
        assert!(check_subject(&format!("lh.in.agent@ci:team-a.w1.{id}"), &release).is_err());
        assert!(check_subject(&format!("lh.in.op@.w1.{id}"), &release).is_err());
        assert!(check_subject(&format!("lh.in.op@ci:team-a.w2.{id}"), &release).is_err());
        assert_eq!(bound_ingress_subject(&release, &Issuer::new("a.b").unwrap()), None);
        use crate::command::Heartbeat;
        use crate::ids::Position;
        let heartbeat: Command = Heartbeat { agent: AgentName::new("w1").unwrap(), epoch: Position(1) }.into();
        assert_eq!(bound_ingress_subject(&heartbeat, &principal), None);
        assert!(check_subject("lh.in.op@ci:team-a.w1._", &heartbeat).is_err());
    }

    #[test]
    fn subjects_follow_the_layout() {
        let agent = Key::Agent(AgentName::new("w1").unwrap());
        let pool = Key::Pool(PoolName::new("ips").unwrap());
        assert_eq!(ingress_subject(CommandClass::Op, &agent, SubjectId::None), "lh.in.op.w1._");
        assert_eq!(outcome_subject(3, &pool), "lh.evt.3.@ips");
        assert_eq!(partition_of_key(&pool, 8), partition_of("@ips", 8));
        let (src, dest) = partition_transform(8);
        assert_eq!(src, "lh.in.*.*.*");
        assert_eq!(dest, "lh.cmd.{{partition(8,2)}}.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}");
    }
}
