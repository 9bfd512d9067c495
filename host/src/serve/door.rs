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
//! door within two hours, and at once when the key is rotated (`keys
//! rotate`). The door opens the tokens of the hour before and after too, so
//! clocks a little apart and the move of the configuration at each hour
//! refuse no call; after a rotation, the key that was current keeps its
//! tokens for [`OVERLAP`].

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

/// How long the tokens of a key that stopped being current stay open: long
/// enough for every replica to have moved the webhook configuration and for
/// every API server to have read it again (their informers take
/// milliseconds; this covers an API server that was cut off for minutes).
pub(crate) const OVERLAP: Duration = Duration::from_secs(600);

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

fn current(ring: &Keyring) -> &[u8] {
    ring.keys().first().map_or(&[][..], |k| k.as_slice())
}

/// The keys whose tokens open the door.
struct Keys {
    current: Zeroizing<Vec<u8>>,
    /// Keys that were current before, each until its overlap ends.
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
    /// with the token of the current key, or of a key current less than
    /// [`OVERLAP`] ago, for the hour of `unix` or the one before or after.
    /// Tokens are compared in constant time, so that the time of a refusal
    /// tells nothing of how much of a guess was right.
    pub fn opens(&self, path: &str, unix: i64) -> bool {
        if !shaped(path) {
            return false;
        }
        let given = &path.as_bytes()[PREFIX.len()..];
        let keys = self.keys();
        let now = Instant::now();
        let current = hmac::Key::new(hmac::HMAC_SHA256, &keys.current);
        let open = std::iter::once(&current).chain(
            keys.earlier
                .iter()
                .filter(|(_, until)| now < *until)
                .map(|(key, _)| key),
        );
        let hour = period(unix);
        let mut matched = subtle::Choice::from(0);
        for key in open {
            for h in [hour - 1, hour, hour + 1] {
                matched |= token_of(key, h).as_bytes().ct_eq(given);
            }
        }
        matched.into()
    }

    /// The keyring changed (rotated, restored): its current key's paths
    /// open now, and the key before keeps its own for [`OVERLAP`].
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
    /// open for the overlap; a second rotation keeps both earlier ones open
    /// until theirs end.
    #[test]
    fn a_rotation_keeps_the_old_path_open_for_the_overlap() {
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
        // Past the overlap the old one is shut.
        door.keys.write().unwrap().earlier[0].1 = Instant::now();
        assert!(!door.opens(&old, NOW));
        assert!(door.opens(&new, NOW));
    }
}
