//! A workload's rollout window, judged against the cluster's clock
//! (docs/design.md, "Rollout windows"). The policy parsed the annotations
//! when the workload was written (`config_snapshot_policy::model::window`); here
//! the schedules are read in their time zone, whose rules the host holds
//! (jiff, with the zone database bundled), to say whether a watch rollout
//! may go now, and if not, when.

use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::object::ObjectExt;
use config_snapshot_policy::model::window::{self, Window};
use jiff::tz::TimeZone;
use jiff::Timestamp;
use serde_json::Value;

/// How long a rollout waits before its window is read again when the
/// window cannot be judged (an unknown zone, a schedule that never comes).
pub(crate) const RECHECK_SECS: i64 = 3600;

/// `None` when `workload` may roll out at `now` (no window, or one is
/// open); else when to look again (unix seconds) and why, for the user.
/// A window that cannot be judged holds the rollout, and says why: the
/// user asked not to roll outside it.
pub fn held(workload: &Value, now: i64) -> Option<(i64, String)> {
    let text = workload.annotation(keys::ROLLOUT_WINDOW)?;
    let zone_name = workload.annotation(keys::ROLLOUT_WINDOW_ZONE).unwrap_or("UTC");
    let unjudged = |why: String| Some((now + RECHECK_SECS, why));
    let windows = match window::parse(text) {
        Ok(windows) => windows,
        Err(e) => return unjudged(e.to_string()),
    };
    let zone = match window::check_zone(zone_name).map(|()| TimeZone::get(zone_name)) {
        Ok(Ok(zone)) => zone,
        _ => {
            return unjudged(format!(
                "{}: unknown time zone {zone_name:?}",
                keys::ROLLOUT_WINDOW_ZONE
            ))
        }
    };
    match next_opening(&windows, &zone, now) {
        Ok(None) => None,
        Ok(Some(opens)) => {
            let when = Timestamp::from_second(opens)
                .map(|t| t.to_zoned(zone.clone()).strftime("%Y-%m-%d %H:%M %Z").to_string())
                .unwrap_or_else(|_| opens.to_string());
            Some((opens, format!("closed; it opens at {when} ({text:?})")))
        }
        Err(why) => unjudged(why.to_string()),
    }
}

/// Why a window cannot be judged: said to the user, and the rollout held.
#[derive(Debug, thiserror::Error)]
enum Unjudged {
    #[error("the clock: {0}")]
    Clock(#[from] jiff::Error),
    #[error("{}: no window ever opens", keys::ROLLOUT_WINDOW)]
    NeverOpens,
}

/// `Ok(None)` if a window is open at `now`, else when the next one opens.
fn next_opening(windows: &[Window], zone: &TimeZone, now: i64) -> Result<Option<i64>, Unjudged> {
    let at = Timestamp::from_second(now)?.to_zoned(zone.clone());
    for w in windows {
        // The last opening at or before now: open if now falls before its
        // end.
        if let Ok(opened) = w.opens.find_previous_occurrence(&at, true) {
            if now < opened.timestamp().as_second() + w.open_secs as i64 {
                return Ok(None);
            }
        }
    }
    windows
        .iter()
        .filter_map(|w| w.opens.find_next_occurrence(&at, false).ok())
        .map(|z| z.timestamp().as_second())
        .min()
        .map(Some)
        .ok_or(Unjudged::NeverOpens)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn workload(window: &str, zone: Option<&str>) -> Value {
        let mut annotations = json!({ keys::ROLLOUT_WINDOW: window });
        if let Some(zone) = zone {
            annotations[keys::ROLLOUT_WINDOW_ZONE] = json!(zone);
        }
        json!({"metadata": {"annotations": annotations}})
    }

    fn at(text: &str) -> i64 {
        text.parse::<Timestamp>().unwrap().as_second()
    }

    #[test]
    fn a_rollout_goes_inside_a_window_and_waits_outside_it() {
        // Weeknights 22:00 to 06:00, Berlin time; 2026-11-27 is a Friday.
        let w = workload("0 22 * * 1-5 for 8h", Some("Europe/Berlin"));
        // 03:00 UTC on Friday is 04:00 in Berlin: Thursday night's window.
        assert_eq!(held(&w, at("2026-11-27T03:00:00Z")), None);
        // 12:00 UTC Friday: closed until 22:00 Berlin (21:00 UTC).
        let (opens, why) = held(&w, at("2026-11-27T12:00:00Z")).unwrap();
        assert_eq!(opens, at("2026-11-27T21:00:00Z"));
        assert!(why.contains("2026-11-27 22:00 CET"), "{why}");
        // Saturday noon: Friday night's window ended at 06:00 Saturday;
        // the next opens Monday 22:00.
        let (opens, _) = held(&w, at("2026-11-28T12:00:00Z")).unwrap();
        assert_eq!(opens, at("2026-11-30T21:00:00Z"));
        // The window's last minute, and the minute it closes.
        assert_eq!(held(&w, at("2026-11-27T04:59:59Z")), None);
        assert!(held(&w, at("2026-11-27T05:00:00Z")).is_some());
    }

    #[test]
    fn several_windows_and_the_zone_default_to_utc() {
        let w = workload("0 22 * * 1-5 for 8h; 0 0 * * 6,0 for 24h", None);
        // Saturday 12:00 UTC: the weekend window.
        assert_eq!(held(&w, at("2026-11-28T12:00:00Z")), None);
        // Friday 12:00 UTC: closed until 22:00 UTC.
        assert_eq!(
            held(&w, at("2026-11-27T12:00:00Z")).unwrap().0,
            at("2026-11-27T22:00:00Z")
        );
    }

    #[test]
    fn a_window_that_cannot_be_judged_holds_and_says_why() {
        let now = at("2026-11-27T12:00:00Z");
        let (again, why) = held(&workload("0 22 * * * for 8h", Some("Mars/Olympus_Mons")), now).unwrap();
        assert_eq!(again, now + RECHECK_SECS);
        assert!(why.contains("unknown time zone"), "{why}");
        let (_, why) = held(&workload("0 22 * * for 8h", None), now).unwrap();
        assert!(why.contains("bad schedule"), "{why}");
        let (_, why) = held(&workload("0 0 31 2 * for 1h", None), now).unwrap();
        assert!(why.contains("no window ever opens"), "{why}");
        assert_eq!(held(&json!({"metadata": {}}), now), None, "no window: no hold");
    }
}
