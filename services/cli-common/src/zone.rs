//! The machine's time zone, so that tables show times as people read them: RFC 3339 in local time. Read from the
//! zoneinfo file of `TZ` or `/etc/localtime` (TZif, its 64-bit part and the POSIX rule at its end for times past its
//! last transition), or from a POSIX `TZ` string (`CET-1CEST,M3.5.0,M10.5.0/3`). Anything it cannot read is UTC: a
//! time is then still right, only shown with `Z`. No crate here reads the zone without `unsafe` or a lock on
//! threads, and a command line must not guess.

use std::path::Path;

/// A time zone: UTC offsets by instant.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Zone {
    /// `(from unix seconds, offset seconds)`, in time order.
    transitions: Vec<(i64, i32)>,
    /// The offset before the first transition (or always, without transitions).
    initial: i32,
    /// For times after the last transition (or always, without transitions): the POSIX rule.
    rule: Option<Rule>,
}

impl Zone {
    /// UTC.
    pub fn utc() -> Zone {
        Zone::default()
    }

    /// A fixed offset east of UTC, in seconds.
    pub fn fixed(offset_secs: i32) -> Zone {
        Zone { initial: offset_secs, ..Zone::default() }
    }

    /// This machine's zone: `TZ` (a zoneinfo name, `:name`, a path, or a POSIX rule), else `/etc/localtime`; UTC when
    /// neither can be read.
    pub fn local() -> Zone {
        match std::env::var("TZ") {
            Ok(tz) => Zone::named(&tz).unwrap_or_default(),
            Err(_) => Zone::from_file(Path::new("/etc/localtime")).unwrap_or_default(),
        }
    }

    /// The zone `TZ` names.
    fn named(tz: &str) -> Option<Zone> {
        let name = tz.strip_prefix(':').unwrap_or(tz);
        if name.is_empty() {
            return Some(Zone::utc());
        }
        if name.starts_with('/') {
            return Zone::from_file(Path::new(name));
        }
        if !name.split('/').any(|part| part == ".." || part.is_empty()) {
            for dir in ["/usr/share/zoneinfo", "/usr/lib/zoneinfo", "/usr/share/lib/zoneinfo"] {
                if let Some(zone) = Zone::from_file(&Path::new(dir).join(name)) {
                    return Some(zone);
                }
            }
        }
        Rule::parse(name).map(|rule| Zone { rule: Some(rule), ..Zone::default() })
    }

    fn from_file(path: &Path) -> Option<Zone> {
        Zone::from_tzif(&std::fs::read(path).ok()?)
    }

    /// A TZif file (RFC 8536), version 1 to 4.
    pub fn from_tzif(bytes: &[u8]) -> Option<Zone> {
        let header = Header::read(bytes)?;
        if header.version == 0 {
            return header.zone(bytes.get(44..)?, 4);
        }
        // Version 2+: skip the 32-bit part, read the 64-bit one and the footer after it.
        let second = bytes.get(44 + header.len(4)..)?;
        let header64 = Header::read(second)?;
        let body = second.get(44..)?;
        let mut zone = header64.zone(body, 8)?;
        let footer = body.get(header64.len(8)..)?;
        let footer = std::str::from_utf8(footer).ok()?;
        let rule = footer.trim_start_matches('\n').split('\n').next().unwrap_or("");
        zone.rule = if rule.is_empty() { None } else { Rule::parse(rule) };
        Some(zone)
    }

    /// The offset east of UTC, in seconds, at unix time `secs`.
    pub fn offset_at(&self, secs: i64) -> i32 {
        match self.transitions.partition_point(|(at, _)| *at <= secs) {
            0 if self.transitions.is_empty() => self.rule.as_ref().map_or(self.initial, |rule| rule.offset_at(secs)),
            0 => self.initial,
            n if n == self.transitions.len() => {
                self.rule.as_ref().map_or(self.transitions[n - 1].1, |rule| rule.offset_at(secs))
            }
            n => self.transitions[n - 1].1,
        }
    }

    /// Unix ms `ms` as RFC 3339 to the second in this zone: `2026-01-01T14:05:00+01:00` (`Z` for UTC).
    pub fn rfc3339(&self, ms: u64) -> String {
        let secs = i64::try_from(ms / 1000).unwrap_or(i64::MAX);
        let offset = self.offset_at(secs);
        let local = secs + i64::from(offset);
        let (days, of_day) = (local.div_euclid(86_400), local.rem_euclid(86_400));
        let (year, month, day) = civil_from_days(days);
        let zone = if offset == 0 {
            "Z".to_owned()
        } else {
            let sign = if offset < 0 { '-' } else { '+' };
            let abs = offset.unsigned_abs();
            format!("{sign}{:02}:{:02}", abs / 3600, abs % 3600 / 60)
        };
        format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}{zone}", of_day / 3600, of_day % 3600 / 60, of_day % 60)
    }

    /// The local time of day of unix ms `ms`: `14:05`.
    pub fn clock(&self, ms: u64) -> String {
        let secs = i64::try_from(ms / 1000).unwrap_or(i64::MAX);
        let local = (secs + i64::from(self.offset_at(secs))).rem_euclid(86_400);
        format!("{:02}:{:02}", local / 3600, local % 3600 / 60)
    }
}

struct Header {
    version: u8,
    isutcnt: usize,
    isstdcnt: usize,
    leapcnt: usize,
    timecnt: usize,
    typecnt: usize,
    charcnt: usize,
}

impl Header {
    fn read(bytes: &[u8]) -> Option<Header> {
        if bytes.get(..4)? != b"TZif" {
            return None;
        }
        let count =
            |at: usize| -> Option<usize> { Some(u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?) as usize) };
        Some(Header {
            version: match *bytes.get(4)? {
                0 => 0,
                v => v,
            },
            isutcnt: count(20)?,
            isstdcnt: count(24)?,
            leapcnt: count(28)?,
            timecnt: count(32)?,
            typecnt: count(36)?,
            charcnt: count(40)?,
        })
    }

    /// The length of the data block after the header, with times of `time_size` bytes.
    fn len(&self, time_size: usize) -> usize {
        self.timecnt * time_size
            + self.timecnt
            + self.typecnt * 6
            + self.charcnt
            + self.leapcnt * (time_size + 4)
            + self.isstdcnt
            + self.isutcnt
    }

    fn zone(&self, body: &[u8], time_size: usize) -> Option<Zone> {
        let times = body.get(..self.timecnt * time_size)?;
        let indices = body.get(self.timecnt * time_size..self.timecnt * (time_size + 1))?;
        let types = body.get(self.timecnt * (time_size + 1)..self.timecnt * (time_size + 1) + self.typecnt * 6)?;
        let offset_of =
            |idx: usize| -> Option<i32> { Some(i32::from_be_bytes(types.get(idx * 6..idx * 6 + 4)?.try_into().ok()?)) };
        let mut transitions = Vec::with_capacity(self.timecnt);
        for (n, idx) in indices.iter().enumerate() {
            let raw = times.get(n * time_size..(n + 1) * time_size)?;
            let at = if time_size == 8 {
                i64::from_be_bytes(raw.try_into().ok()?)
            } else {
                i64::from(i32::from_be_bytes(raw.try_into().ok()?))
            };
            transitions.push((at, offset_of(usize::from(*idx))?));
        }
        // The first non-DST type, as RFC 8536 says, is the time before the first transition; type 0 in practice.
        let initial = offset_of(0).unwrap_or(0);
        Some(Zone { transitions, initial, rule: None })
    }
}

/// A POSIX TZ rule: a standard offset, and a summer one between two dates of each year.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    std_offset: i32,
    dst: Option<Dst>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Dst {
    offset: i32,
    start: (Date, i32),
    end: (Date, i32),
}

/// `Mm.w.d` (the only form zoneinfo files write), `Jn` or `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Date {
    MonthWeekDay(u32, u32, u32),
    Julian1(u32),
    Julian0(u32),
}

impl Rule {
    fn parse(text: &str) -> Option<Rule> {
        let mut rest = text;
        skip_name(&mut rest)?;
        // POSIX offsets are west of UTC: `CET-1` is one hour east.
        let std_offset = -parse_hms(&mut rest)?;
        if rest.is_empty() {
            return Some(Rule { std_offset, dst: None });
        }
        skip_name(&mut rest)?;
        let dst_offset =
            if rest.starts_with(',') || rest.is_empty() { std_offset + 3600 } else { -parse_hms(&mut rest)? };
        let rest = rest.strip_prefix(',')?;
        let (start, end) = rest.split_once(',')?;
        Some(Rule {
            std_offset,
            dst: Some(Dst { offset: dst_offset, start: parse_when(start)?, end: parse_when(end)? }),
        })
    }

    fn offset_at(&self, secs: i64) -> i32 {
        let Some(dst) = &self.dst else { return self.std_offset };
        let (year, _, _) = civil_from_days((secs + i64::from(self.std_offset)).div_euclid(86_400));
        // The start is in local standard time, the end in local summer time.
        let start = day_of(dst.start.0, year) * 86_400 + i64::from(dst.start.1) - i64::from(self.std_offset);
        let end = day_of(dst.end.0, year) * 86_400 + i64::from(dst.end.1) - i64::from(dst.offset);
        let summer = if start < end { start <= secs && secs < end } else { !(end <= secs && secs < start) };
        if summer { dst.offset } else { self.std_offset }
    }
}

fn skip_name(rest: &mut &str) -> Option<()> {
    if let Some(quoted) = rest.strip_prefix('<') {
        let end = quoted.find('>')?;
        *rest = &quoted[end + 1..];
        return Some(());
    }
    let len = rest.find(|c: char| !c.is_ascii_alphabetic()).unwrap_or(rest.len());
    if len < 3 {
        return None;
    }
    *rest = &rest[len..];
    Some(())
}

/// `[+-]h[:mm[:ss]]` in seconds.
fn parse_hms(rest: &mut &str) -> Option<i32> {
    let (sign, text) = match rest.as_bytes().first()? {
        b'-' => (-1, &rest[1..]),
        b'+' => (1, &rest[1..]),
        _ => (1, *rest),
    };
    let len = text.find(|c: char| !(c.is_ascii_digit() || c == ':')).unwrap_or(text.len());
    let mut secs = 0i32;
    for (idx, part) in text[..len].split(':').enumerate() {
        let value: i32 = part.parse().ok()?;
        secs += value * [3600, 60, 1].get(idx)?;
    }
    *rest = &text[len..];
    Some(sign * secs)
}

fn parse_when(text: &str) -> Option<(Date, i32)> {
    let (date, time) = match text.split_once('/') {
        Some((date, time)) => (date, {
            let mut t = time;
            parse_hms(&mut t)?
        }),
        None => (text, 7200),
    };
    let date = if let Some(m) = date.strip_prefix('M') {
        let mut parts = m.split('.').map(|p| p.parse::<u32>().ok());
        Date::MonthWeekDay(parts.next()??, parts.next()??, parts.next()??)
    } else if let Some(j) = date.strip_prefix('J') {
        Date::Julian1(j.parse().ok()?)
    } else {
        Date::Julian0(date.parse().ok()?)
    };
    Some((date, time))
}

/// The day (days since 1970-01-01) a rule's date falls on in `year`.
fn day_of(date: Date, year: i64) -> i64 {
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    match date {
        Date::Julian1(n) => {
            // 1..=365, February 29 never counted.
            let n = i64::from(n);
            days_from_civil(year, 1, 1) + n - 1 + i64::from(leap && n >= 60)
        }
        Date::Julian0(n) => days_from_civil(year, 1, 1) + i64::from(n),
        Date::MonthWeekDay(month, week, weekday) => {
            let first = days_from_civil(year, month, 1);
            // 1970-01-01 was a Thursday (4).
            let first_weekday = (first + 4).rem_euclid(7);
            let mut day = first + (i64::from(weekday) - first_weekday).rem_euclid(7) + 7 * (i64::from(week) - 1);
            let next_month =
                if month == 12 { days_from_civil(year + 1, 1, 1) } else { days_from_civil(year, month + 1, 1) };
            while day >= next_month {
                day -= 7;
            }
            day
        }
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
pub(crate) fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year - era * 400;
    let month = i64::from(month);
    let doy = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(month <= 2), month, day)
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
        let berlin = Zone::named("CET-1CEST,M3.5.0,M10.5.0/3").unwrap();
        // 2026-03-29 01:00 UTC is the switch to summer time; 2026-10-25 01:00 UTC the switch back.
        assert_eq!(berlin.offset_at(1_774_745_999), 3600);
        assert_eq!(berlin.offset_at(1_774_746_000), 7200);
        assert_eq!(berlin.offset_at(1_792_889_999), 7200);
        assert_eq!(berlin.offset_at(1_792_890_000), 3600);
        assert_eq!(berlin.rfc3339(1_780_000_000_000), "2026-05-28T22:26:40+02:00");
        let sydney = Zone::named("AEST-10AEDT,M10.1.0,M4.1.0/3").unwrap();
        assert_eq!(sydney.offset_at(1_767_225_600), 11 * 3600, "summer in January in the south");
        assert_eq!(sydney.offset_at(1_780_000_000), 10 * 3600);
        assert_eq!(Zone::named("<+0530>-5:30").unwrap().offset_at(0), 5 * 3600 + 1800);
        assert_eq!(Zone::named("").unwrap(), Zone::utc());
        assert!(Zone::named("../../etc/passwd").is_none());
    }

    #[test]
    fn a_zoneinfo_file_is_read_when_there_is_one() {
        // Machines without tzdata have no files to read: then there is nothing to compare.
        let Some(berlin) = Zone::from_file(Path::new("/usr/share/zoneinfo/Europe/Berlin")) else { return };
        assert_eq!(berlin.offset_at(1_767_225_600), 3600);
        assert_eq!(berlin.offset_at(1_780_000_000), 7200);
        assert_eq!(berlin.offset_at(4_102_444_800 + 180 * 86_400), 7200, "2100: from the rule after the table");
        assert_eq!(berlin.offset_at(0), 3600);
    }

    #[test]
    fn dates_round_trip() {
        for days in [-800_000, -1, 0, 1, 10_957, 20_454, 2_932_896] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
        }
        assert_eq!(civil_from_days(20_454), (2026, 1, 1));
    }
}
