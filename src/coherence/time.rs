//! Timestamps: the clock is passed in (the core never reads it), carried as milliseconds
//! since the Unix epoch and written as RFC 3339 UTC (`2026-11-30T12:16:33.123Z`).

use std::fmt;

/// A point in time, milliseconds since 1970-01-01T00:00:00Z.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(pub i64);

impl Timestamp {
    pub const fn from_millis(ms: i64) -> Self {
        Timestamp(ms)
    }

    pub const fn millis(self) -> i64 {
        self.0
    }

    /// The current time; for callers of the core (the core itself never calls this).
    pub fn now() -> Self {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp(d.as_millis() as i64)
    }

    pub fn plus(self, d: std::time::Duration) -> Self {
        Timestamp(self.0.saturating_add(d.as_millis() as i64))
    }

    /// RFC 3339, UTC, millisecond precision.
    pub fn rfc3339(self) -> String {
        let mut buf = [0u8; 24];
        match self.rfc3339_in(&mut buf) {
            Some(s) => s.to_owned(),
            None => self.rfc3339_fmt(),
        }
    }

    /// [`Timestamp::rfc3339`] written into `buf` without allocating (every event has a
    /// `ts`; `format!` was a third of encoding an event): `None` for a year outside
    /// 0..=9999, whose text is longer.
    fn rfc3339_in(self, buf: &mut [u8; 24]) -> Option<&str> {
        let secs = self.0.div_euclid(1000);
        let ms = self.0.rem_euclid(1000);
        let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
        if !(0..=9999).contains(&y) {
            return None;
        }
        let sod = secs.rem_euclid(86_400);
        let mut put = |at: usize, v: i64, width: usize| {
            let mut v = v;
            for i in (at..at + width).rev() {
                buf[i] = b'0' + (v % 10) as u8;
                v /= 10;
            }
        };
        put(0, y, 4);
        put(5, m, 2);
        put(8, d, 2);
        put(11, sod / 3600, 2);
        put(14, sod / 60 % 60, 2);
        put(17, sod % 60, 2);
        put(20, ms, 3);
        for (i, c) in [
            (4, b'-'),
            (7, b'-'),
            (10, b'T'),
            (13, b':'),
            (16, b':'),
            (19, b'.'),
        ] {
            buf[i] = c;
        }
        buf[23] = b'Z';
        std::str::from_utf8(buf).ok()
    }

    /// The general form (any year).
    fn rfc3339_fmt(self) -> String {
        let secs = self.0.div_euclid(1000);
        let ms = self.0.rem_euclid(1000);
        let days = secs.div_euclid(86_400);
        let sod = secs.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(days);
        format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
            sod / 3600,
            sod / 60 % 60,
            sod % 60
        )
    }

    /// Parses `YYYY-MM-DDTHH:MM:SS[.fff...](Z|±HH:MM)`.
    pub fn parse_rfc3339(s: &str) -> Option<Self> {
        let b = s.as_bytes();
        if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
            return None;
        }
        if b[13] != b':' || b[16] != b':' {
            return None;
        }
        let num = |r: std::ops::Range<usize>| -> Option<i64> {
            let t = s.get(r)?;
            if !t.bytes().all(|c| c.is_ascii_digit()) {
                return None;
            }
            t.parse().ok()
        };
        let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
        let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
        if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
            return None;
        }
        let mut i = 19;
        let mut ms = 0i64;
        if b.get(i) == Some(&b'.') {
            i += 1;
            let start = i;
            while i < b.len() && b[i].is_ascii_digit() {
                if i - start < 3 {
                    ms = ms * 10 + (b[i] - b'0') as i64;
                }
                i += 1;
            }
            if i == start {
                return None;
            }
            for _ in (i - start)..3 {
                ms *= 10;
            }
        }
        let offset_secs = match b.get(i) {
            Some(b'Z') | Some(b'z') if i + 1 == b.len() => 0,
            Some(&sign @ (b'+' | b'-')) if i + 6 == b.len() && b[i + 3] == b':' => {
                let oh = num(i + 1..i + 3)?;
                let om = num(i + 4..i + 6)?;
                let o = oh * 3600 + om * 60;
                if sign == b'+' {
                    o
                } else {
                    -o
                }
            }
            _ => return None,
        };
        let days = days_from_civil(y, mo, d);
        let secs = days * 86_400 + h * 3600 + mi * 60 + se - offset_secs;
        Some(Timestamp(secs * 1000 + ms))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = [0u8; 24];
        match self.rfc3339_in(&mut buf) {
            Some(s) => f.write_str(s),
            None => f.write_str(&self.rfc3339_fmt()),
        }
    }
}

impl serde::Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut buf = [0u8; 24];
        match self.rfc3339_in(&mut buf) {
            Some(t) => s.serialize_str(t),
            None => s.serialize_str(&self.rfc3339_fmt()),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Timestamp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // A visitor rather than `Cow<str>` (which always allocates): every log line has a
        // `ts`, and replaying a long log is dominated by parsing.
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Timestamp;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an RFC 3339 time")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Timestamp, E> {
                Timestamp::parse_rfc3339(s)
                    .ok_or_else(|| E::custom(format!("not an RFC 3339 time: {s}")))
            }
        }
        d.deserialize_str(V)
    }
}

// Proleptic Gregorian calendar <-> days since the epoch, by eras of 400 years.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants() {
        assert_eq!(Timestamp(0).rfc3339(), "1970-01-01T00:00:00.000Z");
        // 2000-02-29T12:34:56.789Z, computed by hand: 11016 days after the epoch.
        let t = Timestamp((11_016 * 86_400 + 12 * 3600 + 34 * 60 + 56) * 1000 + 789);
        assert_eq!(t.rfc3339(), "2000-02-29T12:34:56.789Z");
        assert_eq!(
            Timestamp::parse_rfc3339("2000-02-29T12:34:56.789Z"),
            Some(t)
        );
        assert_eq!(
            Timestamp::parse_rfc3339("2000-02-29T14:34:56.789+02:00"),
            Some(t)
        );
        assert_eq!(Timestamp(-1).rfc3339(), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn round_trip_over_centuries() {
        let mut ms = -5_000_000_000_000i64;
        while ms < 9_000_000_000_000 {
            let t = Timestamp(ms);
            assert_eq!(Timestamp::parse_rfc3339(&t.rfc3339()), Some(t), "{ms}");
            ms += 7_777_777_777;
        }
    }

    #[test]
    fn fast_form_equals_the_general_one() {
        let mut buf = [0u8; 24];
        // Year 0 to 9999 (and a step past each end, where only the general form answers).
        let (first, last) = (-62_167_219_200_000i64, 253_402_300_799_999i64);
        for ms in [first, first + 1, last, last - 1, 0, -1, 951_827_696_789] {
            assert_eq!(
                Timestamp(ms).rfc3339_in(&mut buf),
                Some(&*Timestamp(ms).rfc3339_fmt())
            );
        }
        assert_eq!(Timestamp(first - 1).rfc3339_in(&mut buf), None);
        assert_eq!(Timestamp(last + 1).rfc3339_in(&mut buf), None);
        assert_eq!(
            Timestamp(last + 1).rfc3339(),
            Timestamp(last + 1).rfc3339_fmt()
        );
        let mut ms = first;
        while ms <= last {
            let t = Timestamp(ms);
            assert_eq!(t.rfc3339_in(&mut buf), Some(&*t.rfc3339_fmt()), "{ms}");
            ms += 3_333_333_337;
        }
    }

    #[test]
    fn rejects_garbage() {
        for s in [
            "",
            "2020-13-01T00:00:00Z",
            "2020-01-01T00:00:00",
            "x020-01-01T00:00:00Z",
        ] {
            assert_eq!(Timestamp::parse_rfc3339(s), None, "{s}");
        }
    }
}
