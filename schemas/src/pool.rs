//! Pools: what set of identifiers a pool hands out, and the identifiers themselves.

use std::fmt;
use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

/// The identifiers a pool holds. `0` is a valid slot (Arvados bug 12073).
///
/// `deny_unknown_fields` on the enum is what refuses unknown fields inside its struct variants: serde has no such
/// attribute for a single variant (it does not compile there). `struct_variants_refuse_unknown_fields` checks it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub enum PoolKind {
    /// The addresses of `network/prefix_len`, without the network and broadcast addresses (for prefixes up to
    /// /30) and without `exclude` (gateways, reserved addresses).
    Ipv4 { network: Ipv4Addr, prefix_len: u8, exclude: Vec<Ipv4Addr> },
    /// Slots `0..count`.
    Slots { count: u32 },
    /// Ports `first..=last` without `exclude`.
    Ports { first: u16, last: u16, exclude: Vec<u16> },
}

/// Why a pool definition was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolKindError {
    #[error("prefix length /{0} is not between /8 and /32")]
    Prefix(u8),
    #[error("{network}/{prefix_len} has host bits set; did you mean {canonical}/{prefix_len}?")]
    HostBits { network: Ipv4Addr, prefix_len: u8, canonical: Ipv4Addr },
    #[error("excluded address {0} is not in the subnet")]
    ExcludedOutside(Ipv4Addr),
    #[error("excluded port {0} is not in the range")]
    ExcludedPortOutside(u16),
    #[error("a slot pool needs at least one slot")]
    NoSlots,
    #[error("port range {first}..={last} is empty")]
    EmptyPorts { first: u16, last: u16 },
    #[error("the pool would hold no identifier at all")]
    Empty,
}

impl PoolKind {
    /// The same definition with its exclusions sorted and without repeats: two definitions are the same pool when
    /// their canonical forms are equal.
    pub fn canonical(&self) -> PoolKind {
        let mut kind = self.clone();
        match &mut kind {
            PoolKind::Ipv4 { exclude, .. } => {
                exclude.sort();
                exclude.dedup();
            }
            PoolKind::Ports { exclude, .. } => {
                exclude.sort();
                exclude.dedup();
            }
            PoolKind::Slots { .. } => {}
        }
        kind
    }

    /// Checks the definition; the error says what to change.
    pub fn validate(&self) -> Result<(), PoolKindError> {
        match self {
            PoolKind::Ipv4 { network, prefix_len, exclude } => {
                if !(8..=32).contains(prefix_len) {
                    return Err(PoolKindError::Prefix(*prefix_len));
                }
                let mask = Self::mask(*prefix_len);
                let canonical = Ipv4Addr::from(u32::from(*network) & mask);
                if canonical != *network {
                    return Err(PoolKindError::HostBits { network: *network, prefix_len: *prefix_len, canonical });
                }
                if let Some(outside) = exclude.iter().find(|a| u32::from(**a) & mask != u32::from(*network)) {
                    return Err(PoolKindError::ExcludedOutside(*outside));
                }
            }
            PoolKind::Slots { count } => {
                if *count == 0 {
                    return Err(PoolKindError::NoSlots);
                }
            }
            PoolKind::Ports { first, last, exclude } => {
                if first > last {
                    return Err(PoolKindError::EmptyPorts { first: *first, last: *last });
                }
                if let Some(outside) = exclude.iter().find(|p| !(*first..=*last).contains(*p)) {
                    return Err(PoolKindError::ExcludedPortOutside(*outside));
                }
            }
        }
        if self.n_usable() == 0 {
            return Err(PoolKindError::Empty);
        }
        Ok(())
    }

    /// How many identifiers the pool can hand out.
    pub fn n_usable(&self) -> u64 {
        match self {
            PoolKind::Ipv4 { network, prefix_len, exclude } => {
                let size = self.size();
                let reserved = if *prefix_len <= 30 { 2 } else { 0 };
                let excluded: std::collections::BTreeSet<u32> = exclude
                    .iter()
                    .map(|a| u32::from(*a).wrapping_sub(u32::from(*network)))
                    .filter(|idx| {
                        u64::from(*idx) < size
                            && !(reserved == 2 && (*idx == 0 || u64::from(*idx) == size.saturating_sub(1)))
                    })
                    .collect();
                size.saturating_sub(reserved + excluded.len() as u64)
            }
            PoolKind::Slots { count } => u64::from(*count),
            PoolKind::Ports { first, last, exclude } => {
                let excluded: std::collections::BTreeSet<u16> =
                    exclude.iter().copied().filter(|p| (*first..=*last).contains(p)).collect();
                self.size().saturating_sub(excluded.len() as u64)
            }
        }
    }

    fn mask(prefix_len: u8) -> u32 {
        if prefix_len == 0 { 0 } else { u32::MAX << (32 - u32::from(prefix_len)) }
    }

    /// How many index positions the pool spans (some may be excluded). 0 for a definition `validate` refuses
    /// (a prefix over /32, an empty port range): these methods never panic on what decoded.
    pub fn size(&self) -> u64 {
        match self {
            PoolKind::Ipv4 { prefix_len, .. } if *prefix_len > 32 => 0,
            PoolKind::Ipv4 { prefix_len, .. } => 1u64 << (32 - u32::from(*prefix_len)),
            PoolKind::Slots { count } => u64::from(*count),
            PoolKind::Ports { first, last, .. } if last < first => 0,
            PoolKind::Ports { first, last, .. } => u64::from(*last) - u64::from(*first) + 1,
        }
    }

    /// The identifier at index `idx`, or `None` if that index is excluded or out of range.
    pub fn value_at(&self, idx: u64) -> Option<PoolValue> {
        if idx >= self.size() {
            return None;
        }
        match self {
            PoolKind::Ipv4 { network, prefix_len, exclude } => {
                let size = self.size();
                if *prefix_len <= 30 && (idx == 0 || idx == size - 1) {
                    return None;
                }
                let addr = Ipv4Addr::from(u32::from(*network).checked_add(idx as u32)?);
                (!exclude.contains(&addr)).then_some(PoolValue::Ipv4(addr))
            }
            PoolKind::Slots { .. } => Some(PoolValue::Slot(idx as u32)),
            PoolKind::Ports { first, exclude, .. } => {
                let port = first.checked_add(idx as u16)?;
                (!exclude.contains(&port)).then_some(PoolValue::Port(port))
            }
        }
    }

    /// The index of `value` in this pool, if it is one the pool could hand out.
    pub fn index_of(&self, value: &PoolValue) -> Option<u64> {
        let idx = match (self, value) {
            (PoolKind::Ipv4 { network, .. }, PoolValue::Ipv4(addr)) => {
                u64::from(u32::from(*addr).wrapping_sub(u32::from(*network)))
            }
            (PoolKind::Slots { .. }, PoolValue::Slot(slot)) => u64::from(*slot),
            (PoolKind::Ports { first, .. }, PoolValue::Port(port)) => u64::from(port.wrapping_sub(*first)),
            _ => return None,
        };
        (self.value_at(idx) == Some(*value)).then_some(idx)
    }

    /// True when `value` is one this pool could hand out.
    pub fn contains(&self, value: &PoolValue) -> bool {
        self.index_of(value).is_some()
    }
}

/// What a pool does with the identifier of a holder that was orphaned (its agent declared gone), schema version 5.
/// The policy travels with each grant (`sys.bind-claim` `orphans`), so the holder's partition decides at orphaning
/// without asking the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OrphanPolicy {
    /// Freed at orphaning, as before version 5: an agent gone means its machine is gone.
    #[default]
    Release,
    /// Held until the orphan's agent returns and confirms the destroy, or an operator frees it on record
    /// (`op.free-orphan`): a machine cut off from the log may still use the identifier.
    Hold,
}

impl OrphanPolicy {
    pub fn name(self) -> &'static str {
        match self {
            OrphanPolicy::Release => "release",
            OrphanPolicy::Hold => "hold",
        }
    }
}

impl fmt::Display for OrphanPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for OrphanPolicy {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "release" => Ok(OrphanPolicy::Release),
            "hold" => Ok(OrphanPolicy::Hold),
            other => Err(format!("{other:?} is not an orphan policy: `release` (the default) or `hold`")),
        }
    }
}

/// One identifier of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PoolValue {
    Ipv4(Ipv4Addr),
    Slot(u32),
    Port(u16),
}

impl fmt::Display for PoolValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolValue::Ipv4(addr) => write!(f, "{addr}"),
            PoolValue::Slot(slot) => write!(f, "slot {slot}"),
            PoolValue::Port(port) => write!(f, "port {port}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slash_29_has_six_hosts_minus_exclusions() {
        let kind = PoolKind::Ipv4 {
            network: Ipv4Addr::new(10, 0, 0, 0),
            prefix_len: 29,
            exclude: vec![Ipv4Addr::new(10, 0, 0, 1)],
        };
        kind.validate().unwrap();
        let values: Vec<_> = (0..kind.size()).filter_map(|i| kind.value_at(i)).collect();
        assert_eq!(values.len(), 5);
        assert_eq!(values[0], PoolValue::Ipv4(Ipv4Addr::new(10, 0, 0, 2)));
        assert!(kind.contains(&PoolValue::Ipv4(Ipv4Addr::new(10, 0, 0, 6))));
        assert!(!kind.contains(&PoolValue::Ipv4(Ipv4Addr::new(10, 0, 0, 7))));
        assert!(!kind.contains(&PoolValue::Ipv4(Ipv4Addr::new(10, 0, 0, 1))));
        assert!(!kind.contains(&PoolValue::Slot(2)));
    }

    #[test]
    fn slot_zero_is_a_slot() {
        let kind = PoolKind::Slots { count: 2 };
        assert_eq!(kind.value_at(0), Some(PoolValue::Slot(0)));
        assert!(kind.contains(&PoolValue::Slot(0)));
        assert!(!kind.contains(&PoolValue::Slot(2)));
    }

    #[test]
    fn struct_variants_refuse_unknown_fields() {
        let known: PoolKind = serde_json::from_str(r#"{"slots":{"count":4}}"#).unwrap();
        assert_eq!(known, PoolKind::Slots { count: 4 });
        for (text, field) in [
            (r#"{"slots":{"count":4,"size":8}}"#, "size"),
            (r#"{"ports":{"first":80,"last":90,"exclude":[],"step":2}}"#, "step"),
            (r#"{"ipv4":{"network":"10.0.0.0","prefix_len":24,"exclude":[],"gateway":"10.0.0.1"}}"#, "gateway"),
        ] {
            let err = serde_json::from_str::<PoolKind>(text).unwrap_err().to_string();
            assert!(err.contains(&format!("unknown field `{field}`")), "{text}: {err}");
        }
    }

    #[test]
    fn a_kind_that_decoded_but_is_invalid_never_panics() {
        let kinds = [
            PoolKind::Ipv4 { network: Ipv4Addr::new(10, 0, 0, 0), prefix_len: 40, exclude: vec![] },
            PoolKind::Ipv4 { network: Ipv4Addr::new(255, 255, 255, 0), prefix_len: 8, exclude: vec![] },
            PoolKind::Ports { first: 30_099, last: 30_000, exclude: vec![30_050] },
            PoolKind::Ports { first: 65_535, last: 65_535, exclude: vec![] },
        ];
        for kind in kinds {
            let size = kind.size();
            let _ = kind.n_usable();
            for idx in [0, 1, size.saturating_sub(1), size, u64::MAX] {
                let _ = kind.value_at(idx);
            }
            let _ = kind.contains(&PoolValue::Ipv4(Ipv4Addr::new(255, 255, 255, 255)));
            let _ = kind.validate();
        }
        assert!(
            PoolKind::Ipv4 { network: Ipv4Addr::new(10, 0, 0, 0), prefix_len: 40, exclude: vec![] }.validate().is_err()
        );
    }

    #[test]
    fn bad_definitions_say_what_to_fix() {
        let host_bits = PoolKind::Ipv4 { network: Ipv4Addr::new(10, 0, 0, 5), prefix_len: 24, exclude: vec![] };
        assert!(host_bits.validate().unwrap_err().to_string().contains("did you mean 10.0.0.0/24"));
        assert_eq!(PoolKind::Slots { count: 0 }.validate(), Err(PoolKindError::NoSlots));
        let all_excluded = PoolKind::Ports { first: 80, last: 80, exclude: vec![80] };
        assert_eq!(all_excluded.validate(), Err(PoolKindError::Empty));
    }
}
