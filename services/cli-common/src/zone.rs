//! The machine's time zone, so that tables show times as people read them: RFC 3339 in local time. jiff reads it
//! (`TZ`, a zoneinfo name, path or POSIX rule; else `/etc/localtime`); anything it cannot read is UTC: a time is then
//! still right, only shown with `Z`.

/// A time zone: UTC offsets by instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Zone(jiff::tz::TimeZone);

impl Default for Zone {
    fn default() -> Self {
        Zone::utc()
    }
}

impl Zone {
    /// UTC.
    pub fn utc() -> Zone {
        Zone(jiff::tz::TimeZone::UTC)
    }

    /// A fixed offset east of UTC, in seconds (UTC when out of range).
    pub fn fixed(offset_secs: i32) -> Zone {
        jiff::tz::Offset::from_seconds(offset_secs).map_or_else(|_| Zone::utc(), |o| Zone(jiff::tz::TimeZone::fixed(o)))
    }

    /// This machine's zone; UTC when it cannot be read.
    pub fn local() -> Zone {
        jiff::tz::TimeZone::try_system().map_or_else(|_| Zone::utc(), Zone)
    }

    /// A POSIX `TZ` rule (`CET-1CEST,M3.5.0,M10.5.0/3`).
    pub fn posix(rule: &str) -> Option<Zone> {
        jiff::tz::TimeZone::posix(rule).ok().map(Zone)
    }

    /// The offset east of UTC, in seconds, at unix time `secs`.
    pub fn offset_at(&self, secs: i64) -> i32 {
        jiff::Timestamp::from_second(secs).map_or(0, |at| self.0.to_offset(at).seconds())
    }

    /// Unix ms `ms` as RFC 3339 to the second in this zone: `2026-01-01T14:05:00+01:00` (`Z` for UTC).
    pub fn rfc3339(&self, ms: u64) -> String {
        let Some(at) = timestamp(ms) else { return format!("{ms} ms") };
        let local = self.0.to_datetime(at).strftime("%Y-%m-%dT%H:%M:%S");
        let offset = self.0.to_offset(at).seconds();
        if offset == 0 {
            return format!("{local}Z");
        }
        let sign = if offset < 0 { '-' } else { '+' };
        let abs = offset.unsigned_abs();
        format!("{local}{sign}{:02}:{:02}", abs / 3600, abs % 3600 / 60)
    }

    /// The local time of day of unix ms `ms`: `14:05`.
    pub fn clock(&self, ms: u64) -> String {
        timestamp(ms).map_or_else(|| format!("{ms} ms"), |at| self.0.to_datetime(at).strftime("%H:%M").to_string())
    }
}

/// Unix ms `ms` at the second, if jiff can hold it.
fn timestamp(ms: u64) -> Option<jiff::Timestamp> {
    jiff::Timestamp::from_second(i64::try_from(ms / 1000).ok()?).ok()
}

/// Unix ms of an RFC 3339 time in UTC (`2026-01-01T00:09:50Z`, `...50.000Z`).
pub(crate) fn parse_utc(text: &str) -> Option<u64> {
    let at: jiff::Timestamp = text.parse().ok()?;
    u64::try_from(at.as_millisecond()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_and_fixed_offsets_read_as_rfc_3339() {
        assert_eq!(Zone::utc().rfc3339(1_767_225_601_999), "2026-01-01T00:00:01Z");
        assert_eq!(Zone::fixed(3600).rfc3339(1_767_225_601_000), "2026-01-01T01:00:01+01:00");
        assert_eq!(Zone::fixed(-(5 * 3600 + 1800)).rfc3339(1_767_225_601_000), "2025-12-31T18:30:01-05:30");
        assert_eq!(Zone::utc().rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(Zone::fixed(3600).clock(1_767_225_601_000), "01:00");
    }

    #[test]
    fn a_posix_rule_switches_to_summer_time_and_back() {
        let berlin = Zone::posix("CET-1CEST,M3.5.0,M10.5.0/3").unwrap();
        // 2026-03-29 01:00 UTC is the switch to summer time; 2026-10-25 01:00 UTC the switch back.
        assert_eq!(berlin.offset_at(1_774_745_999), 3600);
        assert_eq!(berlin.offset_at(1_774_746_000), 7200);
        assert_eq!(berlin.offset_at(1_792_889_999), 7200);
        assert_eq!(berlin.offset_at(1_792_890_000), 3600);
        assert_eq!(berlin.rfc3339(1_780_000_000_000), "2026-05-28T22:26:40+02:00");
        let sydney = Zone::posix("AEST-10AEDT,M10.1.0,M4.1.0/3").unwrap();
        assert_eq!(sydney.offset_at(1_767_225_600), 11 * 3600, "summer in January in the south");
        assert_eq!(sydney.offset_at(1_780_000_000), 10 * 3600);
        assert_eq!(Zone::posix("<+0530>-5:30").unwrap().offset_at(0), 5 * 3600 + 1800);
    }

    #[test]
    fn utc_times_in_text_are_read() {
        assert_eq!(parse_utc("2026-01-01T00:00:01Z"), Some(1_767_225_601_000));
        assert_eq!(parse_utc("2026-01-01T00:00:01.250Z"), Some(1_767_225_601_250));
        assert_eq!(parse_utc("2026-13-01T00:00:01Z"), None);
    }
}
