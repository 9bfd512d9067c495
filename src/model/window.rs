//! Rollout windows (docs/design.md, "Rollout windows"): when a watch
//! rollout may go. `config-snapshot.io/rollout-window` holds one or more
//! windows separated by `;`, each a standard 5-field cron schedule that
//! opens it and a Go duration it stays open for:
//!
//! ```text
//! 0 22 * * 1-5 for 8h; 0 0 * * 6,0 for 24h
//! ```
//!
//! and `config-snapshot.io/rollout-window-zone` the IANA time zone the
//! schedules are read in (UTC if absent). This is how Argo CD's sync
//! windows (`schedule`, `duration`, `timeZone`) and a CronJob
//! (`schedule`, `.spec.timeZone`) say it, so users read it without a guide.
//!
//! The policy parses the windows at the workload's admission and refuses
//! one it cannot parse, naming the token; the host evaluates them against
//! the clock in the zone when a rollout is due (it holds the zone
//! database, which the policy does not carry).

use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;

use crate::model::duration::parse_go_duration;
use crate::model::keys;

/// At most this many windows in one annotation, and this many bytes.
pub(crate) const MAX_WINDOWS: usize = 16;
pub(crate) const MAX_TEXT: usize = 1024;
/// A window stays open between a minute and 31 days.
pub(crate) const MIN_OPEN_SECS: u64 = 60;
pub(crate) const MAX_OPEN_SECS: u64 = 31 * 24 * 3600;

/// One window: when it opens, and for how long.
#[derive(Debug, Clone)]
pub struct Window {
    pub opens: Cron,
    pub open_secs: u64,
}

/// Why a rollout-window annotation was refused; each names the annotation
/// and the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    #[error("{annotation}: {len} bytes, at most {MAX_TEXT}", annotation = keys::ROLLOUT_WINDOW)]
    TooLong { len: usize },
    #[error("{annotation}: {count} windows, at most {MAX_WINDOWS}", annotation = keys::ROLLOUT_WINDOW)]
    TooMany { count: usize },
    #[error("{annotation}: bad token {window:?}: write SCHEDULE for DURATION, e.g. 0 22 * * 1-5 for 8h", annotation = keys::ROLLOUT_WINDOW)]
    Form { window: String },
    #[error("{annotation}: bad schedule {schedule:?}: {why}", annotation = keys::ROLLOUT_WINDOW)]
    Schedule { schedule: String, why: String },
    #[error("{annotation}: bad duration {duration:?}: a Go duration from 1m to 744h", annotation = keys::ROLLOUT_WINDOW)]
    Duration { duration: String },
    #[error("{annotation}: bad zone {zone:?}: an IANA time zone name such as Europe/Berlin", annotation = keys::ROLLOUT_WINDOW_ZONE)]
    Zone { zone: String },
}

/// The windows a `rollout-window` annotation holds.
pub fn parse(text: &str) -> Result<Vec<Window>, WindowError> {
    if text.len() > MAX_TEXT {
        return Err(WindowError::TooLong { len: text.len() });
    }
    let parts: Vec<&str> = text.split(';').map(str::trim).filter(|p| !p.is_empty()).collect();
    if parts.len() > MAX_WINDOWS {
        return Err(WindowError::TooMany { count: parts.len() });
    }
    if parts.is_empty() {
        return Err(WindowError::Form {
            window: text.to_string(),
        });
    }
    // Exactly five fields: minutes to weekdays, as crontab and a CronJob
    // have them (no seconds, no years).
    let parser = CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .build();
    parts
        .into_iter()
        .map(|part| {
            let (schedule, duration) = part.rsplit_once(" for ").ok_or_else(|| WindowError::Form {
                window: part.to_string(),
            })?;
            let (schedule, duration) = (schedule.trim(), duration.trim());
            if schedule.split_whitespace().count() != 5 {
                return Err(WindowError::Schedule {
                    schedule: schedule.to_string(),
                    why: "five fields: minute hour day-of-month month day-of-week".into(),
                });
            }
            let opens = parser.parse(schedule).map_err(|e| WindowError::Schedule {
                schedule: schedule.to_string(),
                why: e.to_string(),
            })?;
            let open_secs = parse_go_duration(duration)
                .ok()
                .filter(|s| (MIN_OPEN_SECS..=MAX_OPEN_SECS).contains(s))
                .ok_or_else(|| WindowError::Duration {
                    duration: duration.to_string(),
                })?;
            Ok(Window { opens, open_secs })
        })
        .collect()
}

/// The shape of an IANA zone name (`Europe/Berlin`, `UTC`,
/// `America/Argentina/Buenos_Aires`); whether the zone exists is the
/// host's to say.
pub fn check_zone(zone: &str) -> Result<(), WindowError> {
    let ok = !zone.is_empty()
        && zone.len() <= 64
        && zone
            .split('/')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-+".contains(&b)));
    if ok {
        Ok(())
    } else {
        Err(WindowError::Zone { zone: zone.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_parse_as_crontab_and_a_duration() {
        let w = parse("0 22 * * 1-5 for 8h; 0 0 * * 6,0 for 24h").unwrap();
        assert_eq!(w.len(), 2);
        assert_eq!((w[0].open_secs, w[1].open_secs), (8 * 3600, 24 * 3600));
        assert!(parse("30 2 * * SUN for 90m").is_ok(), "names of days, as crontab");
    }

    #[test]
    fn a_bad_window_names_its_token() {
        let err = |t: &str| parse(t).unwrap_err();
        assert!(matches!(err("0 22 * * 1-5"), WindowError::Form { .. }));
        assert!(matches!(err("0 22 * * for 8h"), WindowError::Schedule { .. }));
        assert!(
            matches!(err("0 0 22 * * 1-5 for 8h"), WindowError::Schedule { .. }),
            "no seconds field"
        );
        assert!(matches!(err("61 22 * * * for 8h"), WindowError::Schedule { .. }));
        assert!(
            matches!(err("0 22 * * * for 10s"), WindowError::Duration { .. }),
            "shorter than a minute"
        );
        assert!(matches!(err("0 22 * * * for 32d"), WindowError::Duration { .. }));
        assert!(matches!(err("0 22 * * * for 800h"), WindowError::Duration { .. }));
        assert!(matches!(
            err(&"0 1 * * * for 1h;".repeat(17)),
            WindowError::TooMany { count: 17 }
        ));
        assert!(matches!(err(&"x".repeat(2000)), WindowError::TooLong { .. }));
        assert!(matches!(err(" ; "), WindowError::Form { .. }));
        let text = err("61 22 * * * for 8h").to_string();
        assert!(
            text.starts_with("config-snapshot.io/rollout-window: bad schedule \"61 22 * * *\""),
            "{text}"
        );
    }

    #[test]
    fn zone_names_have_the_iana_shape() {
        for ok in ["UTC", "Europe/Berlin", "America/Argentina/Buenos_Aires", "Etc/GMT+5"] {
            assert!(check_zone(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Europe//Berlin", "../etc/passwd", "Europe/Berlin ", &"A".repeat(65)] {
            assert!(check_zone(bad).is_err(), "{bad:?}");
        }
    }
}
