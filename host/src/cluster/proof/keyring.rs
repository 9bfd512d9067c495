//! An installation's keys: the current one signs and names, every one
//! verifies. Kept apart from what they prove so that the one place that
//! holds key bytes is small enough to read at once.

use std::fmt;

use config_snapshot_policy::model::content::hex;
use ring::hmac;
use sha2::Digest as _;
use zeroize::Zeroizing;

/// A key's length: HMAC-SHA256's block-sized key.
const KEY_BYTES: usize = 32;

/// The least key length accepted: below, a key could be guessed.
pub(crate) const MIN_KEY_BYTES: usize = 16;

/// The keys of an installation: the first signs and names, every one
/// verifies. Never printed.
#[derive(Clone)]
pub struct Keyring {
    keys: Vec<Zeroizing<Vec<u8>>>,
}

/// Why a keyring cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyringError {
    #[error("a keyring has at least one key")]
    Empty,
    #[error("a key has at least {MIN_KEY_BYTES} bytes, not {0}")]
    Short(usize),
    #[error("a keyring holds at most {MAX_KEYS} keys, not {0}")]
    TooMany(usize),
}

/// The most keys a ring holds: each costs a MAC per verification.
pub(crate) const MAX_KEYS: usize = 16;

impl Keyring {
    /// A ring of `keys`, the current one first.
    pub fn new(keys: Vec<Zeroizing<Vec<u8>>>) -> Result<Keyring, KeyringError> {
        if keys.is_empty() {
            return Err(KeyringError::Empty);
        }
        if keys.len() > MAX_KEYS {
            return Err(KeyringError::TooMany(keys.len()));
        }
        if let Some(short) = keys.iter().find(|k| k.len() < MIN_KEY_BYTES) {
            return Err(KeyringError::Short(short.len()));
        }
        let mut unique: Vec<Zeroizing<Vec<u8>>> = Vec::with_capacity(keys.len());
        for key in keys {
            if !unique.iter().any(|k| **k == *key) {
                unique.push(key);
            }
        }
        Ok(Keyring { keys: unique })
    }

    /// A ring of one key.
    pub fn of(key: &[u8]) -> Result<Keyring, KeyringError> {
        Keyring::new(vec![Zeroizing::new(key.to_vec())])
    }

    /// A fresh random key.
    pub fn generate_key() -> Zeroizing<Vec<u8>> {
        use ring::rand::SecureRandom;
        let mut key = Zeroizing::new(vec![0u8; KEY_BYTES]);
        ring::rand::SystemRandom::new()
            .fill(&mut key)
            .expect("the system's random source works");
        key
    }

    /// The keys, the current one first.
    pub fn keys(&self) -> &[Zeroizing<Vec<u8>>] {
        &self.keys
    }

    /// The same ring with `key` current, and the current one kept to
    /// verify.
    pub fn rotated(&self, key: Zeroizing<Vec<u8>>) -> Result<Keyring, KeyringError> {
        let mut keys = vec![key];
        keys.extend(self.keys.iter().cloned());
        Keyring::new(keys)
    }

    /// The same ring with `other`'s keys added to verify (a restore: what
    /// the backup's keys signed is proven again, and the current key
    /// stays current).
    pub fn merged(&self, other: &Keyring) -> Result<Keyring, KeyringError> {
        let mut keys = self.keys.clone();
        keys.extend(other.keys.iter().cloned());
        Keyring::new(keys)
    }

    /// A key's public name: the start of a hash of it, for logs and for
    /// `config-snapshot keys list`. Tells nothing of the key.
    pub fn id(key: &[u8]) -> String {
        let mut hash = sha2::Sha256::new();
        hash.update(b"config-snapshot/key-id/v1\0");
        hash.update(key);
        hex(&hash.finalize())[..12].to_string()
    }

    /// The ids of the keys, the current one first.
    pub fn ids(&self) -> Vec<String> {
        self.keys.iter().map(|k| Keyring::id(k)).collect()
    }
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never a key: their ids.
        f.debug_struct("Keyring").field("ids", &self.ids()).finish()
    }
}

/// The keyring as the MACs use it.
pub(super) struct Ring {
    pub(super) macs: Vec<hmac::Key>,
    pub(super) ids: Vec<String>,
}

impl Ring {
    pub(super) fn of(keyring: &Keyring) -> Ring {
        Ring {
            macs: keyring
                .keys
                .iter()
                .map(|k| hmac::Key::new(hmac::HMAC_SHA256, k))
                .collect(),
            ids: keyring.ids(),
        }
    }

    pub(super) fn current(&self) -> &hmac::Key {
        &self.macs[0]
    }
}
