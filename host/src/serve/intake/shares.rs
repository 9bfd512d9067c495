//! What one namespace may hold of what the webhook bounds once a review has
//! passed the door (docs/security.md, "serve's port"): its requests in
//! flight and its bodies' bytes. The API server is one address carrying
//! every namespace's reviews, so these are counted by the namespace a
//! review names, never by address: one tenant's load then fills its own
//! share and no one else's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Whom a review's holdings are charged to: the namespace it names, read
/// from its first bytes (serve/intake/review_namespace.rs), or, when they name
/// none, one share that all such reviews have together. The API server's
/// reviews always name theirs (every kind the webhook reviews is
/// namespaced), so only other callers' land in the one left over.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum ChargedTo {
    Namespace(String),
    Unsorted,
}

impl ChargedTo {
    /// The namespace a review's first bytes named, if any.
    pub(crate) fn of(namespace: Option<String>) -> ChargedTo {
        namespace.map_or(ChargedTo::Unsorted, ChargedTo::Namespace)
    }
}

/// Of one bounded thing, what each [`ChargedTo`] holds, at most `each`.
/// A share past its bound is refused at once, never waited for: the
/// request that would wait holds what it read, and its namespace's own
/// requests are the only ones it could be waiting behind.
pub(crate) struct Shares {
    held: Mutex<HashMap<ChargedTo, u32>>,
    each: u32,
}

/// A part of one [`ChargedTo`]'s share, given back when dropped.
pub(crate) struct Share {
    shares: Arc<Shares>,
    to: ChargedTo,
    amount: u32,
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut held = self.shares.held();
        if let Some(n) = held.get_mut(&self.to) {
            *n = n.saturating_sub(self.amount);
            if *n == 0 {
                held.remove(&self.to);
            }
        }
    }
}

impl Shares {
    /// Shares of at most `each`.
    pub(crate) fn new(each: u32) -> Arc<Shares> {
        Arc::new(Shares {
            held: Mutex::default(),
            each,
        })
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<ChargedTo, u32>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `amount` more for `to`, if its share has that much left.
    pub(crate) fn take(self: &Arc<Self>, to: &ChargedTo, amount: u32) -> Option<Share> {
        let mut held = self.held();
        let mine = held.get(to).copied().unwrap_or(0);
        if mine.saturating_add(amount) > self.each {
            return None;
        }
        held.insert(to.clone(), mine + amount);
        Some(Share {
            shares: self.clone(),
            to: to.clone(),
            amount,
        })
    }

    /// What `to` holds now.
    #[cfg(test)]
    pub(crate) fn of(&self, to: &ChargedTo) -> u32 {
        self.held().get(to).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(name: &str) -> ChargedTo {
        ChargedTo::Namespace(name.to_string())
    }

    /// Finding 3: one namespace's load fills its own share; another's, and
    /// the reviews that named none, still find theirs whole.
    #[test]
    fn a_namespace_holds_its_own_share_and_no_one_elses() {
        let shares = Shares::new(10);
        let tenant: Vec<Share> = (0..5).map(|_| shares.take(&ns("tenant"), 2).unwrap()).collect();
        assert!(shares.take(&ns("tenant"), 1).is_none(), "past its share");
        let other = shares
            .take(&ns("shop"), 10)
            .expect("another namespace's share is whole");
        let unsorted = shares.take(&ChargedTo::Unsorted, 10).expect("so is the unsorted one");
        assert!(shares.take(&ChargedTo::Unsorted, 1).is_none());
        drop(tenant);
        assert_eq!(shares.of(&ns("tenant")), 0);
        assert!(
            shares.held().get(&ns("tenant")).is_none(),
            "an empty share is forgotten"
        );
        drop((other, unsorted));
        assert!(shares.held().is_empty());
    }
}
