//! The door: only the API server gets an answer (docs/security.md, "The
//! door").
//!
//! Most clusters cannot make kube-apiserver present a client certificate
//! to a webhook (every managed one), so TLS alone does not tell the API
//! server from any pod that can reach serve's port. What the API server has
//! and a pod does not is the webhook configuration: the path it calls. serve
//! puts a secret in that path, `/mutate/<token>`, and answers a request only
//! when its path carries the token, before it reads a byte of the body.
//! Anything else gets a bare 404: no body buffered, no read, no write, no
//! answer derived from the cluster.
//!
//! The token is derived from the signing keyring's current key and the
//! hour: HMAC-SHA256 of a fixed label and the hour's number, its first 30
//! bytes in lowercase hex (a Service path's segments must be DNS labels). So
//! it is made, shared by every replica, backed up, restored and guarded
//! exactly as the key is; it tells nothing of the key; and one that leaks
//! (the API server names the URL it called in its errors) stops opening the
//! door within two hours, and within seconds when the key is rotated (`keys
//! rotate`). The door opens the tokens of the hour before and after too, so
//! clocks a little apart and the move of the configuration at each hour
//! refuse no call.
//!
//! After a rotation the key that was current keeps its tokens only while
//! the API server may still call them: until this replica sees the webhook
//! configuration call the new key's path (serve/trust/registration.rs moves it
//! five seconds after the rotation, and every replica reads it every five
//! seconds), then for [`AFTER_MOVE`], the time the API servers' informers
//! take to read the move. Only where nothing is seen to move it (serve told
//! to leave the configuration alone) do they stay for [`OVERLAP`].

use std::sync::RwLock;
use std::time::{Duration, Instant};

use ring::hmac;
use subtle::ConstantTimeEq as _;
use zeroize::Zeroizing;

use crate::cluster::proof::Keyring;

/// What the token is the MAC of, with the hour: a label of its own, so that
/// it is never the MAC of anything else the key signs.
const LABEL: &[u8] = b"config-snapshot/webhook-path/v2";

/// The path's fixed part; the token follows.
pub(crate) const PREFIX: &str = "/mutate/";

/// Bytes of the MAC the token keeps: 240 bits, and 60 hex characters, under
/// the 63 of a DNS label.
const TOKEN_BYTES: usize = 30;

/// A token's length in hex.
pub const TOKEN_LEN: usize = 2 * TOKEN_BYTES;

/// How long one token is the current one.
pub const PERIOD_SECS: i64 = 3600;

/// How long the tokens of a key that stopped being current stay open when
/// this replica never sees the webhook configuration move to the new key's
/// path: serve does not keep it (`--webhook-configuration ""`), or the
/// leader that should move it does not (an older version, during an
/// upgrade). Whoever moves it then has this long.
pub(crate) const OVERLAP: Duration = Duration::from_secs(600);

/// How long the earlier keys' tokens stay open once the webhook
/// configuration is seen calling the current key's path: every API server
/// reads the configuration through an informer, milliseconds behind its
/// store, and a call made just before it did is on its way. An API server
/// further behind (cut off from etcd) is refused at the old path, and its
/// calls follow the webhook's `failurePolicy`: the price of closing a
/// leaked path within seconds rather than minutes.
pub(crate) const AFTER_MOVE: Duration = Duration::from_secs(2);

/// The hour `unix` falls in.
fn period(unix: i64) -> i64 {
    unix.div_euclid(PERIOD_SECS)
}

/// The token of `key` for hour `period`.
fn token_of(key: &hmac::Key, period: i64) -> Zeroizing<String> {
    let mut message = LABEL.to_vec();
    message.extend_from_slice(&period.to_be_bytes());
    let tag = hmac::sign(key, &message);
    Zeroizing::new(hex::encode(&tag.as_ref()[..TOKEN_BYTES]))
}

/// The path the webhook configuration must name for `ring` at `unix`.
pub fn path_of(ring: &Keyring, unix: i64) -> Zeroizing<String> {
    let key = hmac::Key::new(hmac::HMAC_SHA256, current(ring));
    Zeroizing::new(format!("{PREFIX}{}", token_of(&key, period(unix)).as_str()))
}

/// Whether `path` is shaped as a door's path (any key's, any hour's): what
/// serve alone writes into its webhook configuration.
pub fn shaped(path: &str) -> bool {
    path.strip_prefix(PREFIX)
        .is_some_and(|t| t.len() == TOKEN_LEN && t.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

/// The token `path` carries, if it is shaped as a door's path.
fn token_in(path: &str) -> Option<&[u8]> {
    shaped(path).then(|| &path.as_bytes()[PREFIX.len()..])
}

/// Whether `given` is `key`'s token for the hour of `unix`, or the one
/// before or after, compared in constant time.
fn matches(key: &hmac::Key, given: &[u8], unix: i64) -> subtle::Choice {
    let hour = period(unix);
    let mut matched = subtle::Choice::from(0);
    for h in [hour - 1, hour, hour + 1] {
        matched |= token_of(key, h).as_bytes().ct_eq(given);
    }
    matched
}

fn current(ring: &Keyring) -> &[u8] {
    ring.keys().first().map_or(&[][..], |k| k.as_slice())
}

/// The keys whose tokens open the door.
struct Keys {
    current: Zeroizing<Vec<u8>>,
    /// Keys that were current before, each until its tokens close: the
    /// rotation's [`OVERLAP`], cut to [`AFTER_MOVE`] once the configuration
    /// is seen on the current key's path.
    earlier: Vec<(hmac::Key, Instant)>,
    /// When the current key became current here (`None`: at start).
    since: Option<Instant>,
}

/// The door's state: which paths it opens for.
pub(crate) struct Door {
    keys: RwLock<Keys>,
    /// Told when the current key changes, for the registration to move
    /// the webhook configuration to the new path.
    pub changed: tokio::sync::Notify,
}

impl Door {
    pub fn new(ring: &Keyring) -> Door {
        Door {
            keys: RwLock::new(Keys {
                current: Zeroizing::new(current(ring).to_vec()),
                earlier: Vec::new(),
                since: None,
            }),
            changed: tokio::sync::Notify::new(),
        }
    }

    fn keys(&self) -> std::sync::RwLockReadGuard<'_, Keys> {
        self.keys.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The path the webhook configuration must name at `unix`.
    pub fn path(&self, unix: i64) -> Zeroizing<String> {
        let key = hmac::Key::new(hmac::HMAC_SHA256, &self.keys().current);
        Zeroizing::new(format!("{PREFIX}{}", token_of(&key, period(unix)).as_str()))
    }

    /// Whether the current key has been current here for `settled` (or
    /// since start): only then may the webhook configuration move to its
    /// path, once every replica has had time to open it.
    pub fn settled(&self, settled: Duration) -> bool {
        self.keys().since.is_none_or(|since| since.elapsed() >= settled)
    }

    /// Whether a request for `path` at `unix` is let in: `/mutate/<token>`
    /// with the token of the current key, or of an earlier key whose tokens
    /// have not closed yet, for the hour of `unix` or the one before or
    /// after. Tokens are compared in constant time, so that the time of a
    /// refusal tells nothing of how much of a guess was right.
    pub fn opens(&self, path: &str, unix: i64) -> bool {
        let Some(given) = token_in(path) else {
            return false;
        };
        let keys = self.keys();
        let now = Instant::now();
        let current = hmac::Key::new(hmac::HMAC_SHA256, &keys.current);
        let open = std::iter::once(&current).chain(
            keys.earlier
                .iter()
                .filter(|(_, until)| now < *until)
                .map(|(key, _)| key),
        );
        let mut matched = subtle::Choice::from(0);
        for key in open {
            matched |= matches(key, given, unix);
        }
        matched.into()
    }

    /// The webhook configuration was seen calling `path` at `unix`. When
    /// that is a path of the current key, the API server has been told to
    /// call it: the earlier keys' tokens close [`AFTER_MOVE`] from now (or
    /// sooner, if they were to close sooner). Any other path changes
    /// nothing: the move has not happened yet, or this replica has not
    /// seen the rotation yet.
    pub(crate) fn configured(&self, path: &str, unix: i64) {
        let Some(given) = token_in(path) else {
            return;
        };
        let mut keys = self.keys.write().unwrap_or_else(|e| e.into_inner());
        let current = hmac::Key::new(hmac::HMAC_SHA256, &keys.current);
        if !bool::from(matches(&current, given, unix)) {
            return;
        }
        let closing = Instant::now() + AFTER_MOVE;
        for (_, until) in &mut keys.earlier {
            *until = (*until).min(closing);
        }
    }

    /// The keyring changed (rotated, restored): its current key's paths
    /// open now, and the key before keeps its own until the configuration
    /// is seen on the new key's path ([`Door::configured`]), or for
    /// [`OVERLAP`] at most.
    pub(crate) fn rekey(&self, ring: &Keyring) {
        let new = current(ring);
        let mut keys = self.keys.write().unwrap_or_else(|e| e.into_inner());
        if new == keys.current.as_slice() {
            return;
        }
        let now = Instant::now();
        keys.earlier.retain(|(_, until)| now < *until);
        let before = hmac::Key::new(hmac::HMAC_SHA256, &keys.current);
        keys.earlier.push((before, now + OVERLAP));
        keys.current = Zeroizing::new(new.to_vec());
        keys.since = Some(now);
        drop(keys);
        self.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_795_000_000;

    fn ring(byte: u8) -> Keyring {
        Keyring::of(&[byte; 32]).unwrap()
    }

    /// A Service webhook's path segments must be DNS-1123 labels, or the
    /// API server refuses the configuration (`ValidateWebhookService`).
    #[test]
    fn the_path_is_one_a_service_webhook_may_name() {
        let path = path_of(&ring(1), NOW);
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        assert_eq!(segments.len(), 2);
        for s in segments {
            assert!(
                config_snapshot_policy::model::selection::is_dns_label(s),
                "{s:?} is not a DNS label"
            );
        }
        assert!(shaped(&path));
        assert_eq!(path.len(), PREFIX.len() + TOKEN_LEN);
    }

    #[test]
    fn only_the_current_path_opens() {
        let door = Door::new(&ring(1));
        let path = door.path(NOW);
        assert!(door.opens(&path, NOW));
        assert_eq!(*path, *path_of(&ring(1), NOW));
        let upper = path.to_uppercase().replace("/MUTATE/", "/mutate/");
        for wrong in [
            "/mutate",
            "/mutate/",
            "/",
            "",
            &path_of(&ring(2), NOW),
            &format!("{}0", path.as_str()),
            &path[..path.len() - 1],
            &path.replace("/mutate/", "/validate/"),
            &format!("{}?x", path.as_str()),
            &format!("/{}", path.as_str()),
            upper.as_str(),
        ] {
            assert!(!door.opens(wrong, NOW), "{wrong:?} opened the door");
        }
        // Every one-character change of the token is refused.
        let token = &path[PREFIX.len()..];
        for i in 0..token.len() {
            let mut changed: Vec<u8> = token.bytes().collect();
            changed[i] = if changed[i] == b'a' { b'b' } else { b'a' };
            let guess = format!("{PREFIX}{}", String::from_utf8(changed).unwrap());
            assert!(!door.opens(&guess, NOW), "{guess}");
        }
    }

    /// A token is a MAC of the key and the hour: it depends on both, is not
    /// the key, and opens for the hour before and after its own (clocks a
    /// little apart, a configuration moved at the hour), then no more.
    #[test]
    fn a_token_is_derived_and_stops_opening_two_hours_on() {
        let door = Door::new(&ring(7));
        let now = door.path(NOW);
        let next = door.path(NOW + PERIOD_SECS);
        assert_ne!(*now, *next, "a new token every hour");
        assert!(!now.contains(&hex::encode([7u8; 8])));
        assert!(door.opens(&now, NOW + PERIOD_SECS), "an hour on");
        assert!(door.opens(&next, NOW), "an hour early");
        assert!(!door.opens(&now, NOW + 2 * PERIOD_SECS), "two hours on");
        assert!(!door.opens(&door.path(NOW + 2 * PERIOD_SECS), NOW));
    }

    /// After a rotation the new path opens at once and the old key's stay
    /// open while the configuration still calls them; once it is seen on
    /// the new key's path (this hour's or the next), every earlier key's
    /// close within [`AFTER_MOVE`]. Finding 8: on eff3694 they stayed open
    /// for the whole [`OVERLAP`], ten minutes, whatever the configuration
    /// called.
    #[test]
    fn a_rotation_closes_the_old_paths_once_the_configuration_calls_the_new_one() {
        let door = Door::new(&ring(1));
        let old = door.path(NOW);
        door.rekey(&ring(1));
        assert_eq!(*door.path(NOW), *old, "the same ring changes nothing");
        assert!(door.settled(Duration::from_secs(5)), "never rotated");
        let rotated = ring(1).rotated(Zeroizing::new(vec![2u8; 32])).unwrap();
        door.rekey(&rotated);
        let new = door.path(NOW);
        assert_ne!(*new, *old);
        assert_eq!(*new, *path_of(&rotated, NOW));
        assert!(door.opens(&new, NOW) && door.opens(&old, NOW));
        assert!(!door.settled(Duration::from_secs(5)), "just rotated");
        assert!(door.settled(Duration::ZERO));
        let closes = |door: &Door| door.keys().earlier.iter().map(|(_, until)| *until).max().unwrap();
        // The configuration still calls the old path, or a path that is
        // no door's: the old key keeps its overlap.
        for called in [old.as_str(), "/mutate", &path_of(&ring(3), NOW)] {
            door.configured(called, NOW);
            assert!(
                closes(&door) > Instant::now() + OVERLAP - Duration::from_secs(60),
                "{called} closed the old path"
            );
        }
        // A second rotation before the move: both earlier keys open.
        let again = rotated.rotated(Zeroizing::new(vec![4u8; 32])).unwrap();
        door.rekey(&again);
        let newest = door.path(NOW);
        assert!(door.opens(&old, NOW) && door.opens(&new, NOW) && door.opens(&newest, NOW));
        // The configuration is seen on the current key's path (the next
        // hour's, as the leader writes it at the turn of the hour): every
        // earlier key closes within AFTER_MOVE.
        door.configured(&door.path(NOW + PERIOD_SECS), NOW);
        assert!(closes(&door) <= Instant::now() + AFTER_MOVE);
        assert!(door.opens(&old, NOW), "still open for the informers");
        for (_, until) in &mut door.keys.write().unwrap().earlier {
            *until = Instant::now();
        }
        assert!(!door.opens(&old, NOW) && !door.opens(&new, NOW));
        assert!(door.opens(&newest, NOW));
        // Seen again, nothing reopens.
        door.configured(&newest, NOW);
        assert!(!door.opens(&old, NOW));
    }
}
