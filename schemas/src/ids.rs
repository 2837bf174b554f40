//! Names, identifiers, positions and log time: the nouns every message is built from.
//!
//! Every identifier refuses bad input when it is built, from a string, from JSON or from bincode, so a value of
//! one of these types is always valid.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Why a name or an identifier was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("{what} {value:?} is not a valid name: use 1 to 63 characters from [a-z0-9_-], starting with [a-z0-9]")]
    BadName { what: &'static str, value: String },
    #[error("{what} {value:?} is not a UUID: {reason}")]
    NotUuid { what: &'static str, value: String, reason: String },
    #[error("{what} {value:?} is not in canonical form: write it lower-case and hyphenated, like {canonical}")]
    NotCanonical { what: &'static str, value: String, canonical: Uuid },
    #[error("{what} {value} is a UUID of version {version}; leasehold ids are UUIDv7 (time-ordered)")]
    NotV7 { what: &'static str, value: Uuid, version: usize },
    #[error("resource reference {value:?} must look like <agent>.<resource id>")]
    BadRef { value: String },
    #[error(
        "issuer {value:?} is not valid: use 1 to 128 printable ASCII characters without spaces, quotes or backslashes"
    )]
    BadIssuer { value: String },
}

/// True when `s` matches `[a-z0-9][a-z0-9_-]{0,62}`: safe as a NATS subject token, a file name and a label.
pub fn is_safe_token(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_' || *b == b'-')
}

macro_rules! safe_name {
    ($(#[$meta:meta])* $name:ident, $what:literal) => {
        $(#[$meta])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            pub fn new(value: impl Into<String>) -> Result<Self, IdError> {
                let value = value.into();
                if is_safe_token(&value) {
                    Ok(Self(value))
                } else {
                    Err(IdError::BadName { what: $what, value })
                }
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(value: String) -> Result<Self, IdError> {
                Self::new(value)
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                Self::new(s)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }
    };
}

safe_name!(
    /// A machine that holds resources: `[a-z0-9][a-z0-9_-]{0,62}`.
    AgentName,
    "agent name"
);
safe_name!(
    /// A pool of identifiers (a subnet, a slot range, a port range): `[a-z0-9][a-z0-9_-]{0,62}`.
    /// On subjects it appears as `@<name>`, so it never collides with an agent name.
    PoolName,
    "pool name"
);

safe_name!(
    /// A quota: limits, per resource kind, on what some principals may hold at once (schema version 6):
    /// `[a-z0-9][a-z0-9_-]{0,62}`.
    QuotaName,
    "quota name"
);

/// Parses the one spelling of a UUID that leasehold accepts as text: 36 lower-case characters with hyphens, the
/// way every id is printed and every subject spells it. Upper-case, braced, `urn:uuid:` and unhyphenated forms would
/// name the same id with different text, and so a different subject or audit record: they are refused.
pub fn parse_canonical_uuid(what: &'static str, text: &str) -> Result<Uuid, IdError> {
    let uuid =
        Uuid::parse_str(text).map_err(|e| IdError::NotUuid { what, value: text.to_owned(), reason: e.to_string() })?;
    let mut buffer = Uuid::encode_buffer();
    if *uuid.hyphenated().encode_lower(&mut buffer) != *text {
        return Err(IdError::NotCanonical { what, value: text.to_owned(), canonical: uuid });
    }
    Ok(uuid)
}

/// `deserialize_with` for a plain UUID field: only the canonical text in JSON; in bincode, `uuid`'s own form (its
/// 16 bytes), which is what the field's default serialize side writes.
pub(crate) fn canonical_uuid<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Uuid, D::Error> {
    if deserializer.is_human_readable() {
        let text = String::deserialize(deserializer)?;
        parse_canonical_uuid("UUID", &text).map_err(serde::de::Error::custom)
    } else {
        Uuid::deserialize(deserializer)
    }
}

/// [`canonical_uuid`] for an optional field (`null` or absent in JSON is `None`; the field needs `#[serde(default)]`
/// to stay optional, since serde treats a field with `deserialize_with` as required).
pub(crate) fn canonical_uuid_option<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Uuid>, D::Error> {
    if deserializer.is_human_readable() {
        match Option::<String>::deserialize(deserializer)? {
            Some(text) => parse_canonical_uuid("UUID", &text).map(Some).map_err(serde::de::Error::custom),
            None => Ok(None),
        }
    } else {
        Option::<Uuid>::deserialize(deserializer)
    }
}

macro_rules! v7_id {
    ($(#[$meta:meta])* $name:ident, $what:literal) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(Uuid);

        impl $name {
            /// Accepts only a UUID of version 7.
            pub fn new(value: Uuid) -> Result<Self, IdError> {
                match value.get_version_num() {
                    7 => Ok(Self(value)),
                    version => Err(IdError::NotV7 { what: $what, value, version }),
                }
            }

            /// A fresh id from the system clock and the thread's random generator. Producers call this; the
            /// domain never does (it takes ids from commands).
            pub fn generate() -> Self {
                Self(Uuid::now_v7())
            }

            /// A deterministic id: `unix_ms` as its time part and `entropy` as the rest. For fixtures,
            /// simulations and ids the writer derives from the log.
            pub fn from_parts(unix_ms: u64, entropy: [u8; 10]) -> Self {
                Self(uuid::Builder::from_unix_timestamp_millis(unix_ms, &entropy).into_uuid())
            }

            pub fn as_uuid(&self) -> Uuid {
                self.0
            }

            /// The id's time part (ms since the Unix epoch), as its issuer's clock saw it.
            pub fn unix_ms(&self) -> u64 {
                let bytes = self.0.as_bytes();
                bytes[..6].iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
            }

            /// The id's time part as a [`Timestamp`]: when its issuer's clock says it was made.
            pub fn time(&self) -> Timestamp {
                Timestamp(self.unix_ms())
            }
        }

        impl TryFrom<Uuid> for $name {
            type Error = IdError;
            fn try_from(value: Uuid) -> Result<Self, IdError> {
                Self::new(value)
            }
        }

        impl From<$name> for Uuid {
            fn from(value: $name) -> Uuid {
                value.0
            }
        }

        /// Only the canonical text (see [`parse_canonical_uuid`]).
        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                Self::new(parse_canonical_uuid($what, s)?)
            }
        }

        /// `uuid`'s own serde form: the canonical text in JSON, 16 bytes in bincode.
        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                self.0.serialize(serializer)
            }
        }

        /// The canonical text in JSON (nothing else, unlike `uuid`'s own); `uuid`'s 16 bytes in bincode.
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                if deserializer.is_human_readable() {
                    let text = String::deserialize(deserializer)?;
                    text.parse().map_err(serde::de::Error::custom)
                } else {
                    Self::new(Uuid::deserialize(deserializer)?).map_err(serde::de::Error::custom)
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }
    };
}

v7_id!(
    /// A resource, chosen by the issuer of `allocate`. Its handle on the agent is this id.
    ResourceId,
    "resource id"
);
v7_id!(
    /// A lease, chosen by the issuer of `acquire`.
    LeaseId,
    "lease id"
);
v7_id!(
    /// A command. A command id seen within the outcome horizon gets its first outcome back.
    CommandId,
    "command id"
);

/// `<agent>.<resource id>`: where a resource lives and what it is. In JSON it is that text; in bincode, the pair.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceRef {
    pub agent: AgentName,
    pub resource: ResourceId,
}

impl ResourceRef {
    pub fn new(agent: AgentName, resource: ResourceId) -> Self {
        Self { agent, resource }
    }
}

impl fmt::Display for ResourceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.agent, self.resource)
    }
}

impl Serialize for ResourceRef {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            serializer.collect_str(self)
        } else {
            (&self.agent, &self.resource).serialize(serializer)
        }
    }
}

impl<'de> Deserialize<'de> for ResourceRef {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        if deserializer.is_human_readable() {
            let text = String::deserialize(deserializer)?;
            text.parse().map_err(serde::de::Error::custom)
        } else {
            let (agent, resource) = <(AgentName, ResourceId)>::deserialize(deserializer)?;
            Ok(ResourceRef { agent, resource })
        }
    }
}

impl fmt::Debug for ResourceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ResourceRef({self})")
    }
}

impl FromStr for ResourceRef {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        let (agent, resource) = s.split_once('.').ok_or_else(|| IdError::BadRef { value: s.to_owned() })?;
        Ok(Self { agent: agent.parse()?, resource: resource.parse()? })
    }
}

/// Who sent a command: an operator, a producer, an agent (its name) or a sweeper. Kept for the audit trail; for
/// class `agent` it must be the agent's own name, taken from the subject the server let it publish on.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Issuer(String);

impl Issuer {
    pub fn new(value: impl Into<String>) -> Result<Self, IdError> {
        let value = value.into();
        let ok = !value.is_empty()
            && value.len() <= 128
            && value.bytes().all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\');
        if ok { Ok(Self(value)) } else { Err(IdError::BadIssuer { value }) }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Issuer {
    type Error = IdError;
    fn try_from(value: String) -> Result<Self, IdError> {
        Self::new(value)
    }
}

impl From<Issuer> for String {
    fn from(value: Issuer) -> String {
        value.0
    }
}

impl From<&AgentName> for Issuer {
    fn from(agent: &AgentName) -> Issuer {
        Issuer(agent.as_str().to_owned())
    }
}

impl FromStr for Issuer {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        Self::new(s)
    }
}

impl fmt::Display for Issuer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Issuer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Issuer({})", self.0)
    }
}

/// What a command is about, and so which partition decides it: an agent (with its resources and leases), a
/// pool, or a placement (an allocation that names no agent, keyed by its resource id; schema version 4). On
/// subjects and in JSON an agent is its name, a pool is `@<name>` and a placement is `~<resource id>`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Key {
    Agent(AgentName),
    Pool(PoolName),
    Placement(ResourceId),
}

impl Key {
    /// The subject token: `w1` for an agent, `@ips` for a pool, `~<resource id>` for a placement.
    pub fn token(&self) -> String {
        match self {
            Key::Agent(agent) => agent.as_str().to_owned(),
            Key::Pool(_) | Key::Placement(_) => self.token_display().to_string(),
        }
    }

    /// [`Key::token`], written where it is wanted without a `String` of its own (a subject checked piece by piece).
    pub fn token_display(&self) -> impl fmt::Display + '_ {
        struct Token<'a>(&'a Key);
        impl fmt::Display for Token<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self.0 {
                    Key::Agent(agent) => f.write_str(agent.as_str()),
                    Key::Pool(pool) => write!(f, "@{pool}"),
                    Key::Placement(resource) => write!(f, "~{resource}"),
                }
            }
        }
        Token(self)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Agent(agent) => write!(f, "agent {agent}"),
            Key::Pool(pool) => write!(f, "pool {pool}"),
            Key::Placement(resource) => write!(f, "placement {resource}"),
        }
    }
}

#[derive(Serialize, Deserialize)]
enum KeyWire {
    Agent(AgentName),
    Pool(PoolName),
    Placement(ResourceId),
}

impl Serialize for Key {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            serializer.serialize_str(&self.token())
        } else {
            match self {
                Key::Agent(agent) => KeyWire::Agent(agent.clone()),
                Key::Pool(pool) => KeyWire::Pool(pool.clone()),
                Key::Placement(resource) => KeyWire::Placement(*resource),
            }
            .serialize(serializer)
        }
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        if deserializer.is_human_readable() {
            let text = String::deserialize(deserializer)?;
            text.parse().map_err(serde::de::Error::custom)
        } else {
            Ok(match KeyWire::deserialize(deserializer)? {
                KeyWire::Agent(agent) => Key::Agent(agent),
                KeyWire::Pool(pool) => Key::Pool(pool),
                KeyWire::Placement(resource) => Key::Placement(resource),
            })
        }
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", self.token())
    }
}

impl FromStr for Key {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        if let Some(pool) = s.strip_prefix('@') {
            return Ok(Key::Pool(pool.parse()?));
        }
        if let Some(resource) = s.strip_prefix('~') {
            return Ok(Key::Placement(resource.parse()?));
        }
        Ok(Key::Agent(s.parse()?))
    }
}

/// A dense counter per partition (1, 2, 3...) that `decide` assigns to every effect. Lease tokens, claim tokens,
/// epochs, creation positions and watermarks are positions. `0` means "before every effect".
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Position(pub u64);

impl Position {
    pub const ZERO: Position = Position(0);

    pub fn next(self) -> Position {
        Position(self.0 + 1)
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

impl fmt::Debug for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// An instant, in milliseconds since the Unix epoch. Decisions only ever see log time.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(pub u64);

impl Timestamp {
    pub fn saturating_add(self, duration: Millis) -> Timestamp {
        Timestamp(self.0.saturating_add(duration.0))
    }

    pub fn saturating_sub(self, duration: Millis) -> Timestamp {
        Timestamp(self.0.saturating_sub(duration.0))
    }

    /// How long from `earlier` to `self`, zero if `earlier` is later.
    pub fn since(self, earlier: Timestamp) -> Millis {
        Millis(self.0.saturating_sub(earlier.0))
    }
}

/// RFC 3339 in UTC with milliseconds: `2027-01-15T08:00:00.000Z`.
impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0;
        let secs = ms / 1000;
        let (year, month, day) = civil_from_days((secs / 86_400) as i64);
        let in_day = secs % 86_400;
        write!(
            f,
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
            in_day / 3600,
            in_day % 3600 / 60,
            in_day % 60,
            ms % 1000
        )
    }
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (the "days from civil" inverse over 400-year eras).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_index + 2) / 5 + 1) as u32;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t{}", self.0)
    }
}

/// A duration in milliseconds.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Millis(pub u64);

impl Millis {
    pub const fn from_secs(secs: u64) -> Millis {
        Millis(secs * 1000)
    }

    pub const fn from_mins(mins: u64) -> Millis {
        Millis(mins * 60_000)
    }

    pub const fn from_hours(hours: u64) -> Millis {
        Millis(hours * 3_600_000)
    }
}

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0;
        if ms != 0 && ms.is_multiple_of(3_600_000) {
            write!(f, "{}h", ms / 3_600_000)
        } else if ms != 0 && ms.is_multiple_of(60_000) {
            write!(f, "{}min", ms / 60_000)
        } else if ms != 0 && ms.is_multiple_of(1000) {
            write!(f, "{}s", ms / 1000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

impl fmt::Debug for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Orders an agent's observations: the epoch (position of its registration) first, then the observation number
/// the incarnation gave it. Any observation of an earlier epoch is older than every observation of a later one.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObsStamp {
    pub epoch: Position,
    pub obs: u64,
}

impl fmt::Display for ObsStamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "epoch {} obs {}", self.epoch, self.obs)
    }
}

impl fmt::Debug for ObsStamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "obs({}:{})", self.epoch.0, self.obs)
    }
}

/// Where a cross-partition command comes from: the partition and position of the effect that caused it. A target
/// ignores anything from a source that is not newer than what it last saw from that source about the same thing.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    pub partition: u32,
    pub position: Position,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "partition {} {}", self.partition, self.position)
    }
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "src({}:{})", self.partition, self.position.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_names_follow_the_token_rule() {
        for good in ["w1", "0", "a-b_c", &"x".repeat(63)] {
            assert!(AgentName::new(good).is_ok(), "{good}");
        }
        for bad in ["", "W1", "-w", "_w", "w.1", "w 1", "w*", "w>", "@w", &"x".repeat(64)] {
            let err = AgentName::new(bad).unwrap_err();
            assert!(err.to_string().contains("not a valid name"), "{bad}: {err}");
        }
    }

    #[test]
    fn ids_must_be_uuid_v7() {
        let v4 = Uuid::from_u128(0x1234_5678_9abc_4def_8000_0000_0000_0001);
        assert!(matches!(ResourceId::new(v4), Err(IdError::NotV7 { version: 4, .. })));
        let id = ResourceId::from_parts(1_700_000_000_123, [7; 10]);
        assert_eq!(id.unix_ms(), 1_700_000_000_123);
        assert_eq!(id.to_string().parse::<ResourceId>().unwrap(), id);
        assert!("not-a-uuid".parse::<LeaseId>().is_err());
    }

    /// The spellings `uuid` accepts besides the canonical one, for the canonical `text`.
    fn other_spellings(text: &str) -> [String; 4] {
        [text.to_uppercase(), format!("{{{text}}}"), format!("urn:uuid:{text}"), text.replace('-', "")]
    }

    #[test]
    fn ids_have_one_spelling() {
        let id = ResourceId::from_parts(1_700_000_000_123, [7; 10]);
        let text = id.to_string();
        assert_eq!(text.parse::<ResourceId>().unwrap(), id);
        assert_eq!(serde_json::from_str::<ResourceId>(&format!("{text:?}")).unwrap(), id);
        for other in other_spellings(&text) {
            assert_eq!(Uuid::parse_str(&other).unwrap(), id.as_uuid(), "uuid itself accepts {other}");
            let err = other.parse::<ResourceId>().unwrap_err();
            assert_eq!(
                err,
                IdError::NotCanonical { what: "resource id", value: other.clone(), canonical: id.as_uuid() }
            );
            let message = err.to_string();
            assert!(message.contains("write it lower-case and hyphenated, like"), "{message}");
            assert!(message.ends_with(&text), "{message}");
            assert!(matches!(other.parse::<LeaseId>(), Err(IdError::NotCanonical { what: "lease id", .. })));
            assert!(matches!(other.parse::<CommandId>(), Err(IdError::NotCanonical { what: "command id", .. })));
            let json_err = serde_json::from_str::<ResourceId>(&format!("{other:?}")).unwrap_err().to_string();
            assert!(json_err.contains("not in canonical form"), "{other}: {json_err}");
            let reference = format!("w1.{other}");
            assert!(matches!(reference.parse::<ResourceRef>(), Err(IdError::NotCanonical { .. })), "{reference}");
            let json_err = serde_json::from_str::<ResourceRef>(&format!("{reference:?}")).unwrap_err().to_string();
            assert!(json_err.contains("not in canonical form"), "{reference}: {json_err}");
        }
    }

    #[test]
    fn plain_uuid_fields_have_one_spelling_too() {
        #[derive(Debug, Deserialize)]
        struct Fields {
            #[serde(deserialize_with = "canonical_uuid")]
            one: Uuid,
            #[serde(default, deserialize_with = "canonical_uuid_option")]
            maybe: Option<Uuid>,
        }
        let text = "0190a0b0-0000-4000-8000-00000000000a";
        let uuid = Uuid::parse_str(text).unwrap();
        let ok: Fields = serde_json::from_str(&format!(r#"{{"one":"{text}","maybe":"{text}"}}"#)).unwrap();
        assert_eq!((ok.one, ok.maybe), (uuid, Some(uuid)));
        let absent: Fields = serde_json::from_str(&format!(r#"{{"one":"{text}"}}"#)).unwrap();
        assert_eq!(absent.maybe, None);
        let null: Fields = serde_json::from_str(&format!(r#"{{"one":"{text}","maybe":null}}"#)).unwrap();
        assert_eq!(null.maybe, None);
        for other in other_spellings(text) {
            for json in [format!(r#"{{"one":"{other}"}}"#), format!(r#"{{"one":"{text}","maybe":"{other}"}}"#)] {
                let err = serde_json::from_str::<Fields>(&json).unwrap_err().to_string();
                assert!(err.contains(&format!("UUID {other:?} is not in canonical form")), "{json}: {err}");
                assert!(err.contains(&format!("like {text}")), "{json}: {err}");
            }
        }
    }

    #[test]
    fn the_binary_form_of_ids_is_uuids_own() {
        let config = bincode::config::standard();
        let id = LeaseId::from_parts(1_700_000_000_000, [9; 10]);
        let ours = bincode::serde::encode_to_vec(id, config).unwrap();
        assert_eq!(ours, bincode::serde::encode_to_vec(id.as_uuid(), config).unwrap());
        assert_eq!(ours.len(), 17, "a length byte and the 16 bytes");
        let (back, _): (LeaseId, usize) = bincode::serde::decode_from_slice(&ours, config).unwrap();
        assert_eq!(back, id);
        let v4 = bincode::serde::encode_to_vec(Uuid::from_u128(0x1234_5678_9abc_4def_8000_0000_0000_0001), config);
        let err = bincode::serde::decode_from_slice::<LeaseId, _>(&v4.unwrap(), config).unwrap_err();
        assert!(err.to_string().contains("UUIDv7"), "{err}");
    }

    #[test]
    fn resource_refs_round_trip_through_text() {
        let r = ResourceRef::new(AgentName::new("w1").unwrap(), ResourceId::from_parts(1, [1; 10]));
        let text = r.to_string();
        assert!(text.starts_with("w1."));
        assert_eq!(text.parse::<ResourceRef>().unwrap(), r);
        assert!(matches!("w1".parse::<ResourceRef>(), Err(IdError::BadRef { .. })));
        assert!("W1.0190a0b0-0000-7000-8000-000000000000".parse::<ResourceRef>().is_err());
    }

    #[test]
    fn keys_parse_from_subject_tokens() {
        assert_eq!("@ips".parse::<Key>().unwrap(), Key::Pool(PoolName::new("ips").unwrap()));
        assert_eq!("w1".parse::<Key>().unwrap(), Key::Agent(AgentName::new("w1").unwrap()));
        assert_eq!(Key::Pool(PoolName::new("ips").unwrap()).token(), "@ips");
    }

    #[test]
    fn timestamps_print_as_utc_dates() {
        assert_eq!(Timestamp(0).to_string(), "1970-01-01T00:00:00.000Z");
        assert_eq!(Timestamp(951_782_400_000).to_string(), "2000-02-29T00:00:00.000Z");
        assert_eq!(Timestamp(1_800_000_000_123).to_string(), "2027-01-15T08:00:00.123Z");
        assert_eq!(Timestamp(4_102_444_799_999).to_string(), "2099-12-31T23:59:59.999Z");
    }

    #[test]
    fn issuers_refuse_spaces_and_quotes() {
        assert!(Issuer::new("op:alice@example").is_ok());
        for bad in ["", "a b", "a\"b", "a\\b", &"x".repeat(129)] {
            assert!(Issuer::new(bad).is_err(), "{bad}");
        }
    }
}
