//! Calendar time in UTC from Unix seconds, without a time-zone database:
//! what tables and snapshot names show.

/// A UTC date and time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UtcTime {
    pub year: i64,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
}

impl UtcTime {
    /// The civil date of `unix_seconds` (Howard Hinnant's days-to-civil).
    pub fn from_unix(unix_seconds: u64) -> UtcTime {
        let days = (unix_seconds / 86_400) as i64;
        let of_day = unix_seconds % 86_400;
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let day_of_era = z.rem_euclid(146_097);
        let year_of_era =
            (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
        let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
        let month_index = (5 * day_of_year + 2) / 153;
        let day = (day_of_year - (153 * month_index + 2) / 5 + 1) as u32;
        let month = if month_index < 10 {
            month_index + 3
        } else {
            month_index - 9
        } as u32;
        let year = year_of_era + era * 400 + i64::from(month <= 2);
        UtcTime {
            year,
            month,
            day,
            hour: (of_day / 3600) as u32,
            minute: (of_day / 60 % 60) as u32,
            second: (of_day % 60) as u32,
        }
    }

    /// `2026-11-24 07:05:09`
    pub fn display(&self) -> String {
        format!(
            "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
            self.year, self.month, self.day, self.hour, self.minute, self.second
        )
    }

    /// `20261124-070509`, for names.
    pub fn compact(&self) -> String {
        format!(
            "{:04}{:02}{:02}-{:02}{:02}{:02}",
            self.year, self.month, self.day, self.hour, self.minute, self.second
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        assert_eq!(UtcTime::from_unix(0).display(), "1970-01-01 00:00:00");
        assert_eq!(
            UtcTime::from_unix(951_782_400).display(),
            "2000-02-29 00:00:00"
        );
        assert_eq!(
            UtcTime::from_unix(1_795_503_909).display(),
            "2026-11-24 07:05:09"
        );
        assert_eq!(
            UtcTime::from_unix(1_795_503_909).compact(),
            "20261124-070509"
        );
        assert_eq!(
            UtcTime::from_unix(4_107_542_399).display(),
            "2100-02-28 23:59:59"
        );
    }
}
