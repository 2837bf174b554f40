//! The codec: one fixed bincode configuration, a byte limit, no trailing bytes. JSON for producers in other
//! languages. Nothing outside this module encodes commands or outcomes (the log's export file frames them as opaque
//! bytes in its own container, `leasehold_log::export`).
//!
//! Command wire form (bincode):
//!
//! ```text
//! [format tag 0x01][schema version: varint u16][header][body]
//! header = type name (string), command id, class, issuer, issuer time, correlation id?, causation id?
//! body   = the struct of the command named by the type name
//! ```
//!
//! A payload whose first byte is `{` is the JSON form (see `schemas/README.md`). It is decoded strictly: unknown
//! fields, duplicate keys and ids not in canonical text are refused, and an error names the field's path (`body.`
//! and the field for the body) and the value. Outcomes are
//! `[format tag 0x01][schema version][outcome]`. bincode is unmaintained upstream (RUSTSEC-2025-0141); the format
//! tag is what lets a later codec coexist with this one.

use std::collections::BTreeMap;
use std::fmt;

use bincode::config::{Configuration, Limit, LittleEndian, Varint};
use serde::de::{DeserializeOwned, IgnoredAny};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::command::Command;
use crate::envelope::{CommandClass, Envelope};
use crate::ids::{CommandId, Issuer, Timestamp};
use crate::outcome::Outcome;

/// The first byte of every bincode payload this build writes.
pub const FORMAT_BINCODE_V1: u8 = 0x01;
/// The first byte of a JSON payload.
pub const FORMAT_JSON: u8 = b'{';
/// The largest command accepted (NATS's default `max_payload`).
pub const MAX_COMMAND_BYTES: usize = 1 << 20;
/// The largest outcome part a writer appends (DESIGN section 9); a larger decision continues in the next part.
pub const MAX_OUTCOME_BYTES: usize = 512 * 1024;

const DECODE_LIMIT: usize = 1 << 20;
type Config = Configuration<LittleEndian, Varint, Limit<DECODE_LIMIT>>;
const CONFIG: Config = bincode::config::standard().with_limit::<DECODE_LIMIT>();

/// What went wrong, for programs: a dead-letter reason, or "stop this partition" for a newer schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CodecErrorKind {
    Empty,
    UnknownFormat,
    /// Written by a newer leasehold: not garbage, so a worker stops the partition instead of dead-lettering it.
    NewerSchema,
    UnknownType,
    ClassMismatch,
    Malformed,
    TrailingBytes,
    TooLarge,
    Encode,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{detail}")]
pub struct CodecError {
    kind: CodecErrorKind,
    detail: String,
    /// The schema version a [`CodecErrorKind::NewerSchema`] payload names.
    newer_version: Option<u16>,
}

impl CodecError {
    pub(crate) fn new(kind: CodecErrorKind, detail: impl Into<String>) -> Self {
        CodecError { kind, detail: detail.into(), newer_version: None }
    }

    pub fn kind(&self) -> CodecErrorKind {
        self.kind
    }

    /// The schema version of a payload written by a newer leasehold (`NewerSchema`).
    pub fn newer_version(&self) -> Option<u16> {
        self.newer_version
    }

    pub(crate) fn unknown_type(type_name: &str) -> Self {
        Self::new(CodecErrorKind::UnknownType, format!("unknown command type {type_name:?}"))
    }

    pub(crate) fn json(error: serde_json::Error) -> Self {
        Self::new(CodecErrorKind::Malformed, format!("bad JSON: {error}"))
    }

    /// A JSON decoding error with the path of the field it is about (`body.capacity: invalid type...`).
    fn json_at(error: serde_path_to_error::Error<serde_json::Error>) -> Self {
        Self::new(CodecErrorKind::Malformed, format!("bad JSON: {error}"))
    }
}

impl fmt::Display for CodecErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

pub(crate) fn encode_into<T: Serialize>(value: &T, out: &mut impl std::io::Write) -> Result<(), CodecError> {
    bincode::serde::encode_into_std_write(value, out, CONFIG)
        .map(|_| ())
        .map_err(|e| CodecError::new(CodecErrorKind::Encode, format!("cannot encode: {e}")))
}

/// Decodes a value from the start of `bytes`. The payload's size was checked before, so a length inside it that
/// passes the limit is a corrupt length, not a large message: `Malformed`.
pub(crate) fn decode_from<T: DeserializeOwned>(bytes: &[u8]) -> Result<(T, usize), CodecError> {
    bincode::serde::decode_from_slice::<T, _>(bytes, CONFIG).map_err(|e| {
        let what = std::any::type_name::<T>();
        let detail = match e {
            bincode::error::DecodeError::LimitExceeded => {
                format!("cannot decode {what}: a length inside the message is larger than the message")
            }
            e => format!("cannot decode {what}: {e}"),
        };
        CodecError::new(CodecErrorKind::Malformed, detail)
    })
}

/// For fields whose enum never carries data: in JSON only the plain string (`"left"`), not `{"left": null}`;
/// in bincode the variant index, as derived.
pub(crate) fn unit_variant<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    use serde::de::IntoDeserializer;
    if deserializer.is_human_readable() {
        let text = String::deserialize(deserializer)?;
        let plain: serde::de::value::StrDeserializer<'_, serde::de::value::Error> = text.as_str().into_deserializer();
        T::deserialize(plain).map_err(serde::de::Error::custom)
    } else {
        T::deserialize(deserializer)
    }
}

/// [`unit_variant`] for an optional field: `null` or absent is `None`.
pub(crate) fn unit_variant_option<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    use serde::de::IntoDeserializer;
    if deserializer.is_human_readable() {
        let Some(text) = Option::<String>::deserialize(deserializer)? else {
            return Ok(None);
        };
        let plain: serde::de::value::StrDeserializer<'_, serde::de::value::Error> = text.as_str().into_deserializer();
        T::deserialize(plain).map(Some).map_err(serde::de::Error::custom)
    } else {
        Option::<T>::deserialize(deserializer)
    }
}

/// The list fields of a JSON command: the only places a JSON array may stand, and only of plain values. serde
/// would read any struct from an array of its fields in order (`"source": [5, 118]`), which no name checks: that is
/// refused, so that every object of a command is read by its field names.
const JSON_LISTS: &[&str] = &[
    "pools",
    "remove",
    "created",
    "missing",
    "destroyed",
    "in_flight",
    "held",
    "exclude",
    "handles",
    "principals",
    "holders",
];

fn refuse_positional(value: &serde_json::Value, path: &str) -> Result<(), CodecError> {
    use serde_json::Value;
    let Value::Object(fields) = value else {
        return Ok(());
    };
    for (name, value) in fields {
        let at = if path.is_empty() { name.clone() } else { format!("{path}.{name}") };
        match value {
            Value::Array(items) if JSON_LISTS.contains(&name.as_str()) => {
                if let Some(i) = items.iter().position(|item| item.is_array() || item.is_object()) {
                    return Err(CodecError::new(
                        CodecErrorKind::Malformed,
                        format!("bad JSON: {at}[{i}]: a list of {name} holds plain values, not arrays or objects"),
                    ));
                }
            }
            Value::Array(_) => {
                return Err(CodecError::new(
                    CodecErrorKind::Malformed,
                    format!(
                        "bad JSON: {at}: an array where an object or a value is expected; write an object with named fields"
                    ),
                ));
            }
            Value::Object(_) => refuse_positional(value, &at)?,
            _ => {}
        }
    }
    Ok(())
}

/// The bincode size of a value, without allocating it: how the decider keeps an outcome under its cap.
pub fn encoded_len<T: Serialize>(value: &T) -> usize {
    let mut writer = bincode::enc::write::SizeWriter::default();
    match bincode::serde::encode_into_writer(value, &mut writer, CONFIG) {
        Ok(()) => writer.bytes_written,
        Err(_) => usize::MAX,
    }
}

/// Decodes a JSON value from the whole payload (only whitespace may follow it); an error names the path of the
/// field it is about.
fn from_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(CodecError::json_at)?;
    deserializer.end().map_err(CodecError::json)?;
    Ok(value)
}

/// Only the `body` of a JSON command, read from the whole payload, so that an error's path starts with `body.` and
/// its line and column count from the payload's start. The other envelope fields are checked by [`JsonEnvelope`].
#[derive(Deserialize)]
struct JsonBody<T> {
    body: T,
}

/// Decodes the body of a JSON command, as a `T`, from the whole payload.
pub(crate) fn body_from_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    from_json::<JsonBody<T>>(bytes).map(|json| json.body)
}

/// `deserialize_with` for a map in a command: a repeated key is refused (serde's own map keeps the last one
/// silently). The serialize side stays the default, so the bincode form (length, then the pairs) is unchanged.
pub(crate) fn unique_keys<'de, D, K, V>(deserializer: D) -> Result<BTreeMap<K, V>, D::Error>
where
    D: serde::Deserializer<'de>,
    K: Deserialize<'de> + Ord + fmt::Debug,
    V: Deserialize<'de>,
{
    struct UniqueKeys<K, V>(std::marker::PhantomData<(K, V)>);

    impl<'de, K, V> serde::de::Visitor<'de> for UniqueKeys<K, V>
    where
        K: Deserialize<'de> + Ord + fmt::Debug,
        V: Deserialize<'de>,
    {
        type Value = BTreeMap<K, V>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a map without repeated keys")
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(key) = map.next_key::<K>()? {
                if out.contains_key(&key) {
                    return Err(serde::de::Error::custom(format!("duplicate key {key:?}")));
                }
                let value = map.next_value()?;
                out.insert(key, value);
            }
            Ok(out)
        }
    }

    deserializer.deserialize_map(UniqueKeys(std::marker::PhantomData))
}

/// [`unique_keys`] for an optional map: `None`, or a map without repeated keys.
pub(crate) fn unique_keys_option<'de, D, K, V>(deserializer: D) -> Result<Option<BTreeMap<K, V>>, D::Error>
where
    D: serde::Deserializer<'de>,
    K: Deserialize<'de> + Ord + fmt::Debug,
    V: Deserialize<'de>,
{
    #[derive(Deserialize)]
    #[serde(bound(deserialize = "K: Deserialize<'de> + Ord + fmt::Debug, V: Deserialize<'de>"))]
    struct Unique<K, V>(#[serde(deserialize_with = "unique_keys")] BTreeMap<K, V>);
    Ok(Option::<Unique<K, V>>::deserialize(deserializer)?.map(|unique| unique.0))
}

/// Decodes a whole value: every byte must be used.
fn decode_exact<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    let (value, read) = decode_from::<T>(bytes)?;
    if read != bytes.len() {
        return Err(CodecError::new(
            CodecErrorKind::TrailingBytes,
            format!("{} trailing bytes after the message", bytes.len() - read),
        ));
    }
    Ok(value)
}

fn check_size(bytes: &[u8], limit: usize, what: &str) -> Result<(), CodecError> {
    if bytes.len() > limit {
        return Err(CodecError::new(
            CodecErrorKind::TooLarge,
            format!("{what} of {} bytes is over the limit of {limit} bytes", bytes.len()),
        ));
    }
    Ok(())
}

fn check_version(version: u16) -> Result<(), CodecError> {
    if version > crate::SCHEMA_VERSION {
        let mut error = CodecError::new(
            CodecErrorKind::NewerSchema,
            format!(
                "schema version {version} is newer than this build understands ({}); a newer leasehold must decide it",
                crate::SCHEMA_VERSION
            ),
        );
        error.newer_version = Some(version);
        return Err(error);
    }
    if version == 0 {
        return Err(CodecError::new(CodecErrorKind::Malformed, "schema version 0 does not exist"));
    }
    Ok(())
}

/// Refuses a command stamped with a schema version older than the one that expresses it (a type, a field or a
/// variant added later): a leasehold of that version would not read it, so its producer did not write that version.
fn check_expressed_in(version: u16, type_name: &str, body: &Command) -> Result<(), CodecError> {
    let needs = crate::command::legacy::oldest_version(body);
    if version < needs {
        return Err(CodecError::new(
            CodecErrorKind::Malformed,
            format!(
                "{type_name} as written needs schema version {needs} (a type, field or value added then), but says \
                 schema version {version}; write schema_version {needs}"
            ),
        ));
    }
    Ok(())
}

#[derive(Serialize, Deserialize)]
struct Header {
    type_name: String,
    command_id: CommandId,
    class: CommandClass,
    issuer: Issuer,
    issued_at: Timestamp,
    correlation_id: Option<Uuid>,
    causation_id: Option<Uuid>,
}

fn check_class(type_name: &str, declared: CommandClass, body: &Command) -> Result<(), CodecError> {
    if declared != body.class() {
        return Err(CodecError::new(
            CodecErrorKind::ClassMismatch,
            format!("{type_name} is a {} command, but the envelope says {declared}", body.class()),
        ));
    }
    Ok(())
}

/// Encodes a command in the bincode form, in the oldest schema version that expresses it (whatever version it was
/// read in: the types are always the current ones), so that a leasehold of an older version reads every command that
/// needs nothing newer.
pub fn encode_command(envelope: &Envelope) -> Result<Vec<u8>, CodecError> {
    encode_command_in(crate::command::legacy::oldest_version(&envelope.body), envelope)
}

/// Encodes a command in the layout of schema `version`.
fn encode_command_in(version: u16, envelope: &Envelope) -> Result<Vec<u8>, CodecError> {
    let mut out = vec![FORMAT_BINCODE_V1];
    encode_command_after_tag(version, envelope, &mut out)?;
    check_size(&out, MAX_COMMAND_BYTES, "command")?;
    Ok(out)
}

/// Writes a command in the layout of schema `version`, after its format tag, to `out`.
fn encode_command_after_tag(
    version: u16,
    envelope: &Envelope,
    out: &mut impl std::io::Write,
) -> Result<(), CodecError> {
    encode_into(&version, out)?;
    let header = Header {
        type_name: envelope.type_name().to_owned(),
        command_id: envelope.command_id,
        class: envelope.class,
        issuer: envelope.issuer.clone(),
        issued_at: envelope.issued_at,
        correlation_id: envelope.correlation_id,
        causation_id: envelope.causation_id,
    };
    encode_into(&header, out)?;
    crate::command::legacy::encode_body(version, &envelope.body, out)
}

/// A writer that compares what it is given with `expected`, from its start, instead of keeping it: whether an
/// encoding gives exactly some bytes, without a second copy of them.
struct SameAs<'a> {
    expected: &'a [u8],
    /// Whether everything written so far is `expected`'s start.
    same: bool,
}

impl std::io::Write for SameAs<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self.expected.strip_prefix(buf) {
            Some(rest) if self.same => self.expected = rest,
            _ => self.same = false,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Decodes a command in either form (bincode, or JSON if it starts with `{`).
pub fn decode_command(bytes: &[u8]) -> Result<Envelope, CodecError> {
    check_size(bytes, MAX_COMMAND_BYTES, "command")?;
    match bytes.first() {
        None => Err(CodecError::new(CodecErrorKind::Empty, "empty payload")),
        Some(&FORMAT_BINCODE_V1) => decode_command_bincode(&bytes[1..]),
        Some(&FORMAT_JSON) => command_from_json(bytes),
        Some(other) => Err(json_prefix_error(bytes).unwrap_or_else(|| {
            CodecError::new(
                CodecErrorKind::UnknownFormat,
                format!("unknown format tag 0x{other:02x} (expected 0x01 for bincode or '{{' for JSON)"),
            )
        })),
    }
}

/// The command id of a payload that may not decode as a whole (a dead letter: a newer body, a refused subject, a
/// payload over [`MAX_COMMAND_BYTES`]), read from its header alone; `None` when not even that can be read. For finding
/// a command, never for deciding. No size limit applies: bincode reads only the header, and JSON is scanned for its
/// top-level `command_id` without building the document (values are skipped, nothing is kept), stopping there, so a
/// huge or broken body after the id does not hide it.
pub fn peek_command_id(bytes: &[u8]) -> Option<CommandId> {
    match *bytes.first()? {
        FORMAT_BINCODE_V1 => {
            let rest = bytes.get(1..)?;
            let (_, read_version) = decode_from::<u16>(rest).ok()?;
            let (header, _) = decode_from::<Header>(rest.get(read_version..)?).ok()?;
            Some(header.command_id)
        }
        FORMAT_JSON => peek_json_command_id(bytes),
        _ => None,
    }
}

/// The top-level `command_id` of a JSON object, scanned key by key (see [`peek_command_id`]).
fn peek_json_command_id(bytes: &[u8]) -> Option<CommandId> {
    use serde::de::{self, Deserializer as _, MapAccess, Visitor};

    /// Reads the object's keys, skipping values, until `command_id`; then stops (with an error, so the rest of
    /// the payload is never read) and leaves the id in `found`.
    struct Scan<'a> {
        found: &'a mut Option<CommandId>,
    }

    impl<'de> Visitor<'de> for Scan<'_> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            // Only top-level keys and the id are read as text (a few short strings); every value is skipped.
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if key == "command_id" {
                    *self.found = map.next_value::<std::borrow::Cow<'de, str>>()?.parse().ok();
                    return Err(de::Error::custom("stop: the command id is read"));
                }
                map.next_value::<IgnoredAny>()?;
            }
            Ok(())
        }
    }

    let mut found = None;
    // The answer is in `found` whatever this returns: an error after the id is how the scan stops.
    let _ = serde_json::Deserializer::from_slice(bytes).deserialize_map(Scan { found: &mut found });
    found
}

/// The first byte is what tells the forms apart, so JSON gets no leading whitespace or byte-order mark. A payload
/// that starts with either is most likely JSON from a producer that added it: the error says so.
fn json_prefix_error(bytes: &[u8]) -> Option<CodecError> {
    const NO_PREFIX: &str = "a JSON command must start with '{': no leading whitespace or byte-order mark";
    let detail = match bytes {
        [0xef, 0xbb, 0xbf, ..] => format!("{NO_PREFIX} (this one starts with the UTF-8 byte-order mark EF BB BF)"),
        [first @ (b' ' | b'\t' | b'\n' | b'\r'), ..] => {
            format!("{NO_PREFIX} (this one starts with whitespace, 0x{first:02x})")
        }
        _ => return None,
    };
    Some(CodecError::new(CodecErrorKind::UnknownFormat, detail))
}

fn decode_command_bincode(bytes: &[u8]) -> Result<Envelope, CodecError> {
    let (schema_version, read_version) = decode_from::<u16>(bytes)?;
    check_version(schema_version)?;
    let rest = &bytes[read_version..];
    let (header, read_header) = decode_from::<Header>(rest)?;
    let rest = &rest[read_header..];
    let (body, read_body) = match crate::command::legacy::decode_body(schema_version, &header.type_name, rest) {
        Some(decoded) => decoded?,
        None => Command::decode_body(&header.type_name, rest)?,
    };
    if read_body != rest.len() {
        return Err(CodecError::new(
            CodecErrorKind::TrailingBytes,
            format!("{} trailing bytes after the {} body", rest.len() - read_body, header.type_name),
        ));
    }
    check_class(&header.type_name, header.class, &body)?;
    check_expressed_in(schema_version, &header.type_name, &body)?;
    let envelope = Envelope {
        schema_version,
        command_id: header.command_id,
        class: header.class,
        issuer: header.issuer,
        issued_at: header.issued_at,
        correlation_id: header.correlation_id,
        causation_id: header.causation_id,
        body,
    };
    // One layout per command, as the README says (a number in as few bytes as it takes, map keys in order): a
    // command has one byte form, so its bytes name it.
    let mut same = SameAs { expected: bytes, same: true };
    encode_command_after_tag(schema_version, &envelope, &mut same)?;
    if !(same.same && same.expected.is_empty()) {
        return Err(CodecError::new(
            CodecErrorKind::Malformed,
            "not in the canonical bincode form: a number written in more bytes than it takes, or map keys out of order",
        ));
    }
    Ok(envelope)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEnvelope {
    schema_version: u16,
    #[serde(rename = "type")]
    type_name: String,
    command_id: CommandId,
    #[serde(deserialize_with = "unit_variant")]
    class: CommandClass,
    issuer: Issuer,
    issued_at: Timestamp,
    #[serde(default, deserialize_with = "crate::ids::canonical_uuid_option")]
    correlation_id: Option<Uuid>,
    #[serde(default, deserialize_with = "crate::ids::canonical_uuid_option")]
    causation_id: Option<Uuid>,
    /// Checked here for its syntax only: [`JsonBody`] decodes it once the type is known.
    #[serde(rename = "body")]
    _body: IgnoredAny,
}

#[derive(Serialize)]
struct JsonEnvelopeOut<'a> {
    schema_version: u16,
    #[serde(rename = "type")]
    type_name: &'a str,
    command_id: CommandId,
    class: CommandClass,
    issuer: &'a Issuer,
    issued_at: Timestamp,
    correlation_id: Option<Uuid>,
    causation_id: Option<Uuid>,
    body: crate::command::BodyRef<'a>,
}

/// The JSON form of a command, as producers in other languages write it (in the oldest schema version that
/// expresses it, as the bincode form is).
pub fn command_to_json(envelope: &Envelope) -> Result<String, CodecError> {
    let json = JsonEnvelopeOut {
        schema_version: crate::command::legacy::oldest_version(&envelope.body),
        type_name: envelope.type_name(),
        command_id: envelope.command_id,
        class: envelope.class,
        issuer: &envelope.issuer,
        issued_at: envelope.issued_at,
        correlation_id: envelope.correlation_id,
        causation_id: envelope.causation_id,
        body: crate::command::BodyRef(&envelope.body),
    };
    let text = serde_json::to_string(&json).map_err(CodecError::json)?;
    // JSON is larger than bincode: a command within the limit in one form may not be in the other.
    check_size(text.as_bytes(), MAX_COMMAND_BYTES, "command in JSON")?;
    Ok(text)
}

/// Decodes the JSON form of a command: it must start with `{`, like every payload [`decode_command`] takes as JSON.
pub fn command_from_json(bytes: &[u8]) -> Result<Envelope, CodecError> {
    check_size(bytes, MAX_COMMAND_BYTES, "command")?;
    match bytes.first() {
        None => return Err(CodecError::new(CodecErrorKind::Empty, "empty payload")),
        Some(&FORMAT_JSON) => {}
        Some(other) => {
            return Err(json_prefix_error(bytes).unwrap_or_else(|| {
                CodecError::new(
                    CodecErrorKind::UnknownFormat,
                    format!("a JSON command must start with '{{', not with the byte 0x{other:02x}"),
                )
            }));
        }
    }
    // The version is read first, so a newer producer's fields are reported as "newer", not as garbage.
    #[derive(Deserialize)]
    struct VersionOnly {
        schema_version: u16,
    }
    let version: VersionOnly = from_json(bytes)?;
    check_version(version.schema_version)?;
    let shape: serde_json::Value = from_json(bytes)?;
    refuse_positional(&shape, "")?;
    // The envelope, then the body: its type is known only once `type` is read, wherever it stands in the object.
    let json: JsonEnvelope = from_json(bytes)?;
    let body = Command::body_from_json(&json.type_name, bytes)?;
    check_class(&json.type_name, json.class, &body)?;
    check_expressed_in(json.schema_version, &json.type_name, &body)?;
    Ok(Envelope {
        schema_version: json.schema_version,
        command_id: json.command_id,
        class: json.class,
        issuer: json.issuer,
        issued_at: json.issued_at,
        correlation_id: json.correlation_id,
        causation_id: json.causation_id,
        body,
    })
}

/// Encodes an outcome; refuses one over [`MAX_OUTCOME_BYTES`].
pub fn encode_outcome(outcome: &Outcome) -> Result<Vec<u8>, CodecError> {
    let mut out = vec![FORMAT_BINCODE_V1];
    encode_into(&outcome.oldest_schema_version(), &mut out)?;
    encode_into(outcome, &mut out)?;
    check_size(&out, MAX_OUTCOME_BYTES, "outcome")?;
    Ok(out)
}

/// The format tag of a snapshot of partition state.
pub const FORMAT_SNAPSHOT_V1: u8 = b'S';
const SNAPSHOT_LIMIT: usize = 1 << 30;
type SnapshotConfig = Configuration<LittleEndian, Varint, Limit<SNAPSHOT_LIMIT>>;
const SNAPSHOT_CONFIG: SnapshotConfig = bincode::config::standard().with_limit::<SNAPSHOT_LIMIT>();

/// Encodes a snapshot (a cache of folded state, never a message between processes): the same codec, with its own
/// format tag and a limit of 1 GiB.
pub fn encode_snapshot<T: Serialize>(value: &T) -> Result<Vec<u8>, CodecError> {
    let mut out = vec![FORMAT_SNAPSHOT_V1];
    bincode::serde::encode_into_std_write(value, &mut out, SNAPSHOT_CONFIG)
        .map_err(|e| CodecError::new(CodecErrorKind::Encode, format!("cannot encode the snapshot: {e}")))?;
    Ok(out)
}

/// Decodes a snapshot; every byte must be used.
pub fn decode_snapshot<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    match bytes.split_first() {
        Some((&FORMAT_SNAPSHOT_V1, rest)) => {
            let (value, read) = bincode::serde::decode_from_slice::<T, _>(rest, SNAPSHOT_CONFIG)
                .map_err(|e| CodecError::new(CodecErrorKind::Malformed, format!("bad snapshot: {e}")))?;
            if read != rest.len() {
                return Err(CodecError::new(
                    CodecErrorKind::TrailingBytes,
                    format!("{} trailing bytes after the snapshot", rest.len() - read),
                ));
            }
            Ok(value)
        }
        _ => Err(CodecError::new(CodecErrorKind::UnknownFormat, "not a snapshot")),
    }
}

/// Decodes an outcome. An outcome that cannot be decoded must stop whoever reads it: it is never skipped.
pub fn decode_outcome(bytes: &[u8]) -> Result<Outcome, CodecError> {
    check_size(bytes, MAX_OUTCOME_BYTES, "outcome")?;
    match bytes.first() {
        None => Err(CodecError::new(CodecErrorKind::Empty, "empty payload")),
        Some(&FORMAT_BINCODE_V1) => {
            let (schema_version, read) = decode_from::<u16>(&bytes[1..])?;
            check_version(schema_version)?;
            decode_exact::<Outcome>(&bytes[1 + read..])
        }
        Some(other) => {
            Err(CodecError::new(CodecErrorKind::UnknownFormat, format!("unknown outcome format tag 0x{other:02x}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{Heartbeat, MarkStalled};
    use crate::ids::{AgentName, Position};

    #[test]
    fn the_command_id_is_read_from_a_header_whose_body_does_not_decode() {
        let envelope = heartbeat();
        let mut bincode = encode_command(&envelope).unwrap();
        bincode.push(0);
        assert!(decode_command(&bincode).is_err());
        assert_eq!(peek_command_id(&bincode), Some(envelope.command_id));
        let json = command_to_json(&envelope).unwrap().replace(r#""epoch":4"#, r#""epoch":"four""#);
        assert!(decode_command(json.as_bytes()).is_err());
        assert_eq!(peek_command_id(json.as_bytes()), Some(envelope.command_id));
        assert_eq!(peek_command_id(b"\x07garbage"), None);
        assert_eq!(peek_command_id(b""), None);
    }

    /// A valid allocation whose attribute puts it over the codec's limit in both forms: what a
    /// producer with a larger `max_payload` can store and a writer must dead-letter.
    fn oversized_allocation() -> (Envelope, Vec<u8>, String) {
        use crate::command::Allocate;
        use crate::ids::ResourceId;
        let (agent, resource) = (AgentName::new("w1").unwrap(), ResourceId::from_parts(1_700_000_000_000, [5; 10]));
        let mut allocate = Allocate::new(agent.clone(), resource, "container", 1);
        allocate.attributes.insert("blob".to_owned(), "x".repeat(MAX_COMMAND_BYTES + 1000));
        let envelope = Envelope::new(
            CommandId::from_parts(1_700_000_000_000, [9; 10]),
            Issuer::new("op:big").unwrap(),
            Timestamp(1_700_000_000_000),
            allocate,
        );
        assert_eq!(encode_command(&envelope).unwrap_err().kind(), CodecErrorKind::TooLarge);
        // The bincode form as `encode_command` lays it out, without its size check.
        let mut bincode = vec![FORMAT_BINCODE_V1];
        encode_into(&crate::SCHEMA_VERSION, &mut bincode).unwrap();
        let header = Header {
            type_name: envelope.type_name().to_owned(),
            command_id: envelope.command_id,
            class: envelope.class,
            issuer: envelope.issuer.clone(),
            issued_at: envelope.issued_at,
            correlation_id: None,
            causation_id: None,
        };
        encode_into(&header, &mut bincode).unwrap();
        envelope.body.encode_body(&mut bincode).unwrap();
        // The JSON form likewise: the small allocation's text with the attribute put in.
        let small = command_to_json(&Envelope {
            body: Allocate::new(agent, resource, "container", 1).into(),
            ..envelope.clone()
        })
        .unwrap();
        let blob = format!(r#""attributes":{{"blob":"{}"}}"#, "x".repeat(MAX_COMMAND_BYTES + 1000));
        assert_eq!(small.matches(r#""attributes":{}"#).count(), 1, "{small}");
        let json = small.replace(r#""attributes":{}"#, &blob);
        (envelope, bincode, json)
    }

    #[test]
    fn the_command_id_of_an_oversized_payload_is_read_from_its_header() {
        let (envelope, bincode, json) = oversized_allocation();
        let id = Some(envelope.command_id);
        assert!(bincode.len() > MAX_COMMAND_BYTES && json.len() > MAX_COMMAND_BYTES);
        assert_eq!(decode_command(&bincode).unwrap_err().kind(), CodecErrorKind::TooLarge);
        assert_eq!(decode_command(json.as_bytes()).unwrap_err().kind(), CodecErrorKind::TooLarge);
        assert_eq!(peek_command_id(&bincode), id, "bincode over the limit");
        assert_eq!(peek_command_id(json.as_bytes()), id, "JSON over the limit");

        // Cut in the middle of its body: the header (bincode) or the top-level field before the cut (JSON) is read.
        assert_eq!(peek_command_id(&bincode[..bincode.len() / 2]), id, "bincode cut short");
        assert_eq!(peek_command_id(&json.as_bytes()[..json.len() / 2]), id, "JSON cut short");

        // In JSON the id may stand after the huge body (serde_json's own maps sort their keys: `body` first).
        let sorted = serde_json::to_string(&serde_json::from_str::<serde_json::Value>(&json).unwrap()).unwrap();
        assert!(sorted.find(r#""body""#) < sorted.find(r#""command_id""#), "the body comes first");
        assert_eq!(peek_command_id(sorted.as_bytes()), id, "JSON with the id after the body");

        // Only the top level names the command; an id that is no command id is none.
        let text = envelope.command_id.to_string();
        assert_eq!(peek_command_id(format!(r#"{{"body":{{"command_id":"{text}"}}}}"#).as_bytes()), None);
        assert_eq!(peek_command_id(br#"{"command_id":"not-an-id","body":{}}"#), None);
        assert_eq!(peek_command_id(br#"{"command_id":7}"#), None);
        assert_eq!(peek_command_id(br#"["command_id"]"#), None);
        assert_eq!(peek_command_id(format!(r#"{{"x":[1,{{"y":"}}"}}],"command_id":"{text}""#).as_bytes()), id);
    }

    fn heartbeat() -> Envelope {
        Envelope::new(
            CommandId::from_parts(1_700_000_000_000, [3; 10]),
            Issuer::new("w1").unwrap(),
            Timestamp(1_700_000_000_000),
            Heartbeat { agent: AgentName::new("w1").unwrap(), epoch: Position(4) },
        )
    }

    #[test]
    fn commands_round_trip_in_both_forms() {
        let env = heartbeat();
        let bytes = encode_command(&env).unwrap();
        assert_eq!(bytes[0], FORMAT_BINCODE_V1);
        assert_eq!(decode_command(&bytes).unwrap(), env);
        let json = command_to_json(&env).unwrap();
        assert!(json.contains(r#""type":"agent.heartbeat""#), "{json}");
        assert_eq!(decode_command(json.as_bytes()).unwrap(), env);
    }

    #[test]
    fn bad_payloads_say_why() {
        let bytes = encode_command(&heartbeat()).unwrap();
        assert_eq!(decode_command(&[]).unwrap_err().kind(), CodecErrorKind::Empty);
        assert_eq!(decode_command(&[0x7f, 1, 2]).unwrap_err().kind(), CodecErrorKind::UnknownFormat);
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert_eq!(decode_command(&trailing).unwrap_err().kind(), CodecErrorKind::TrailingBytes);
        for cut in 1..bytes.len() {
            let err = decode_command(&bytes[..cut]).unwrap_err();
            assert_eq!(err.kind(), CodecErrorKind::Malformed, "cut at {cut}: {err}");
        }
        let huge = vec![FORMAT_BINCODE_V1; MAX_COMMAND_BYTES + 1];
        assert_eq!(decode_command(&huge).unwrap_err().kind(), CodecErrorKind::TooLarge);
    }

    #[test]
    fn a_newer_schema_is_not_garbage() {
        let mut bytes = encode_command(&heartbeat()).unwrap();
        assert_eq!(bytes[1], 1, "a heartbeat needs nothing newer than version 1, and is written in it");
        bytes[1] = u8::try_from(crate::SCHEMA_VERSION + 1).unwrap(); // the varint schema version
        assert_eq!(decode_command(&bytes).unwrap_err().kind(), CodecErrorKind::NewerSchema);
        assert_eq!(decode_command(&bytes).unwrap_err().newer_version(), Some(crate::SCHEMA_VERSION + 1));
        let json = command_to_json(&heartbeat()).unwrap().replace(r#""schema_version":1"#, r#""schema_version":9"#);
        assert_eq!(decode_command(json.as_bytes()).unwrap_err().kind(), CodecErrorKind::NewerSchema);
    }

    /// A command written in version 1 by an older leasehold reads into today's types, and today's command that needs
    /// nothing newer is written in version 1 byte for byte as then; one that uses a field of version 2 is written in
    /// version 2, and a version 1 payload cannot pass for it.
    #[test]
    fn commands_are_written_in_the_oldest_version_that_expresses_them() {
        use crate::command::Allocate;
        let agent = AgentName::new("w1").unwrap();
        let resource = crate::ResourceId::from_parts(1_767_225_600_000, [1; 10]);
        let id = CommandId::from_parts(1_767_225_600_000, [2; 10]);
        let issuer = Issuer::new("op:alice").unwrap();
        let plain = Envelope::new(id, issuer.clone(), Timestamp(1), Allocate::new(agent.clone(), resource, "vm", 1));
        let bytes = encode_command(&plain).unwrap();
        assert_eq!((bytes[1], plain.schema_version), (1, 1));
        assert_eq!(decode_command(&bytes).unwrap(), plain);
        let waits = Allocate { wait: Some(crate::Millis::from_secs(30)), ..Allocate::new(agent, resource, "vm", 1) };
        let waits = Envelope::new(id, issuer, Timestamp(1), waits);
        let bytes = encode_command(&waits).unwrap();
        assert_eq!((bytes[1], waits.schema_version), (2, 2));
        assert_eq!(decode_command(&bytes).unwrap(), waits);
        // Stamped version 1, the same bytes would be a version 1 allocation with trailing bytes: refused.
        let mut relabelled = bytes.clone();
        relabelled[1] = 1;
        assert!(decode_command(&relabelled).is_err());
        let json = command_to_json(&waits).unwrap();
        assert!(json.contains(r#""schema_version":2"#), "{json}");
        assert_eq!(decode_command(json.as_bytes()).unwrap(), waits);
    }

    #[test]
    fn the_class_must_match_the_type() {
        let mut env = Envelope::new(
            CommandId::from_parts(1, [0; 10]),
            Issuer::new("sweeper").unwrap(),
            Timestamp(1),
            MarkStalled { agent: AgentName::new("w1").unwrap() },
        );
        env.class = CommandClass::Agent;
        let bytes = encode_command(&env).unwrap();
        let err = decode_command(&bytes).unwrap_err();
        assert_eq!(err.kind(), CodecErrorKind::ClassMismatch);
        assert!(err.to_string().contains("sys.mark-stalled is a sys command"), "{err}");
    }

    #[test]
    fn unknown_types_and_fields_are_refused_in_json() {
        let json = command_to_json(&heartbeat()).unwrap();
        let unknown = json.replace("agent.heartbeat", "agent.dance");
        assert_eq!(decode_command(unknown.as_bytes()).unwrap_err().kind(), CodecErrorKind::UnknownType);
        let extra = json.replace(r#""epoch":4"#, r#""epoch":4,"colour":"red""#);
        assert_eq!(decode_command(extra.as_bytes()).unwrap_err().kind(), CodecErrorKind::Malformed);
        let bad_name = json.replace(r#""agent":"w1""#, r#""agent":"W 1""#);
        let err = decode_command(bad_name.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("not a valid name"), "{err}");
    }

    #[test]
    fn unique_keys_keep_the_bincode_form() {
        #[derive(Debug, Serialize, Deserialize)]
        struct Strict {
            #[serde(deserialize_with = "unique_keys")]
            map: BTreeMap<String, String>,
        }
        let pairs = |keys: [&str; 2]| -> Vec<(String, String)> {
            keys.iter().enumerate().map(|(i, k)| ((*k).to_owned(), i.to_string())).collect()
        };
        let map: BTreeMap<String, String> = pairs(["a", "b"]).into_iter().collect();
        let mut plain = Vec::new();
        encode_into(&map, &mut plain).unwrap();
        let mut strict = Vec::new();
        encode_into(&Strict { map: map.clone() }, &mut strict).unwrap();
        assert_eq!(strict, plain);
        assert_eq!(decode_exact::<Strict>(&strict).unwrap().map, map);

        // A map is its length and its pairs, like a list of pairs: that is how a repeated key gets into bincode.
        let mut repeated = Vec::new();
        encode_into(&pairs(["a", "a"]), &mut repeated).unwrap();
        assert_eq!(decode_exact::<BTreeMap<String, String>>(&repeated).unwrap().len(), 1, "serde's own map");
        let err = decode_exact::<Strict>(&repeated).unwrap_err();
        assert_eq!(err.kind(), CodecErrorKind::Malformed);
        assert!(err.to_string().contains("duplicate key"), "{err}");
        let err = serde_json::from_str::<Strict>(r#"{"map":{"a":"0","b":"1","a":"2"}}"#).unwrap_err();
        assert!(err.to_string().contains(r#"duplicate key "a""#), "{err}");
    }

    #[test]
    fn leading_whitespace_or_a_bom_is_named() {
        let json = command_to_json(&heartbeat()).unwrap();
        for prefix in ["\u{feff}", " ", "\n"] {
            let err = decode_command(format!("{prefix}{json}").as_bytes()).unwrap_err();
            assert_eq!(err.kind(), CodecErrorKind::UnknownFormat);
            assert!(err.to_string().starts_with("a JSON command must start with '{': no leading whitespace"), "{err}");
        }
        let err = decode_command(&[0x7f, 1, 2]).unwrap_err();
        assert_eq!(err.to_string(), "unknown format tag 0x7f (expected 0x01 for bincode or '{' for JSON)");
    }

    #[test]
    fn encoded_len_matches_the_encoding() {
        let env = heartbeat();
        let Command::Heartbeat(body) = &env.body else { unreachable!() };
        let mut out = Vec::new();
        encode_into(body, &mut out).unwrap();
        assert_eq!(encoded_len(body), out.len());
    }
}
