//! What each namespace's objects cost serve's cache, and whether the cache
//! holds the namespace (docs/serve.md, "The cache"). One tenant's objects
//! must not fill the memory every namespace's admissions share: past
//! `--cache-values-per-namespace` (counted in JSON values, the measure of a
//! tree's memory: [`super::count`]), across every kind, the cache drops what
//! it holds of that namespace and holds none of its objects, only their
//! costs (a name and a number each), until they shrink back within it and
//! every kind has been listed again.
//!
//! A namespace is held whole or not at all: while it is not, every read of
//! it from the cache fails, its listings across the cluster leave it out,
//! and [`super::cache::Cache::following`] says no of it. No decision is
//! made on part of a namespace: never a snapshot swept because the
//! workloads that name it were dropped.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use config_snapshot_policy::model::kinds::KINDS;

/// The costs of one listing of one kind, by namespace and name.
pub(crate) type Costs = HashMap<String, BTreeMap<String, usize>>;

/// One namespace's spending.
#[derive(Default)]
struct Spent {
    /// Every object's cost, held or not, by (kind, name).
    costs: HashMap<(&'static str, String), usize>,
    total: usize,
    /// Past the budget: none of its objects is held.
    over: bool,
    /// The kinds dropped when it went over and not listed since: until
    /// each is, the cache lacks what did not change meanwhile.
    short: BTreeSet<&'static str>,
}

impl Spent {
    fn holds(&self) -> bool {
        !self.over && self.short.is_empty()
    }

    /// Settles `over` from the total; whether it went over now.
    fn settle(&mut self, limit: usize) -> bool {
        let over = self.total > limit;
        let went = over && !self.over;
        if went {
            self.short = KINDS.iter().map(|k| k.kind).collect();
        }
        self.over = over;
        went
    }

    fn idle(&self) -> bool {
        self.costs.is_empty() && self.holds()
    }
}

/// What [`Ledger::charge`] says of an object just seen.
#[derive(Debug, PartialEq)]
pub(crate) enum Charged {
    /// Keep it.
    Hold,
    /// Do not: its namespace is over the budget.
    Drop,
    /// Do not, and drop what the cache holds of its namespace: it went
    /// over the budget with this object.
    WentOver,
}

/// Every namespace's spending against one budget.
pub(crate) struct Ledger {
    limit: usize,
    namespaces: HashMap<String, Spent>,
}

impl Default for Ledger {
    fn default() -> Ledger {
        Ledger::new(usize::MAX)
    }
}

impl Ledger {
    /// A ledger of at most `limit` values per namespace.
    pub(crate) fn new(limit: usize) -> Ledger {
        Ledger {
            limit,
            namespaces: HashMap::new(),
        }
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// Whether the cache holds `namespace` whole.
    pub(crate) fn holds(&self, namespace: &str) -> bool {
        self.namespaces.get(namespace).is_none_or(Spent::holds)
    }

    /// Whether the cache keeps `namespace`'s objects as they come: it is
    /// within its budget (held, or short of kinds not listed again yet).
    pub(crate) fn stores(&self, namespace: &str) -> bool {
        self.namespaces.get(namespace).is_none_or(|s| !s.over)
    }

    /// An object of `kind` seen (a watch's change, one of serve's writes),
    /// costing `cost`.
    pub(crate) fn charge(&mut self, kind: &'static str, namespace: &str, name: &str, cost: usize) -> Charged {
        let limit = self.limit;
        let spent = self.namespaces.entry(namespace.to_string()).or_default();
        let old = spent.costs.insert((kind, name.to_string()), cost).unwrap_or(0);
        spent.total = spent.total - old + cost;
        if spent.settle(limit) {
            Charged::WentOver
        } else if spent.over {
            Charged::Drop
        } else {
            Charged::Hold
        }
    }

    /// An object of `kind` gone.
    pub(crate) fn discharge(&mut self, kind: &'static str, namespace: &str, name: &str) {
        let limit = self.limit;
        if let Some(spent) = self.namespaces.get_mut(namespace) {
            if let Some(cost) = spent.costs.remove(&(kind, name.to_string())) {
                spent.total -= cost;
                spent.settle(limit);
            }
            if spent.idle() {
                self.namespaces.remove(namespace);
            }
        }
    }

    /// A listing of `kind` in `scope` (a namespace; `None`: every one)
    /// replaces what it cost there. Answers the namespaces that went over
    /// with it; of every other, the kind is no longer short.
    pub(crate) fn relisted(&mut self, kind: &'static str, scope: Option<&str>, mut listed: Costs) -> Vec<String> {
        let limit = self.limit;
        let mut namespaces: BTreeSet<String> = listed.keys().cloned().collect();
        match scope {
            Some(ns) => {
                namespaces.retain(|n| n == ns);
                namespaces.insert(ns.to_string());
            }
            None => namespaces.extend(self.namespaces.keys().cloned()),
        }
        let mut went_over = Vec::new();
        for ns in namespaces {
            let spent = self.namespaces.entry(ns.clone()).or_default();
            let mut dropped = 0;
            spent.costs.retain(|(k, _), cost| {
                if *k == kind {
                    dropped += *cost;
                }
                *k != kind
            });
            spent.total -= dropped;
            for (name, cost) in listed.remove(&ns).unwrap_or_default() {
                spent.total += cost;
                spent.costs.insert((kind, name), cost);
            }
            if spent.settle(limit) {
                went_over.push(ns.clone());
            } else if !spent.over {
                spent.short.remove(kind);
            }
            if spent.idle() {
                self.namespaces.remove(&ns);
            }
        }
        went_over
    }

    /// The kinds to list again: those some namespace back within the
    /// budget is still short of.
    pub(crate) fn short(&self) -> BTreeSet<&'static str> {
        self.namespaces
            .values()
            .filter(|s| !s.over)
            .flat_map(|s| s.short.iter().copied())
            .collect()
    }

    /// How many namespaces the cache does not hold for the budget.
    pub(crate) fn unheld(&self) -> usize {
        self.namespaces.values().filter(|s| !s.holds()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_past_its_budget_is_not_held_until_it_shrinks_and_every_kind_is_listed_again() {
        let mut ledger = Ledger::new(100);
        assert_eq!(ledger.charge("Deployment", "a", "one", 60), Charged::Hold);
        assert_eq!(ledger.charge("ConfigMap", "a", "cm", 30), Charged::Hold);
        assert_eq!(ledger.charge("Deployment", "b", "one", 90), Charged::Hold);
        assert_eq!(
            ledger.charge("Deployment", "a", "two", 20),
            Charged::WentOver,
            "across kinds"
        );
        assert_eq!(ledger.charge("Deployment", "a", "three", 1), Charged::Drop);
        assert!(!ledger.holds("a") && ledger.holds("b"));
        assert_eq!(ledger.unheld(), 1);
        ledger.discharge("Deployment", "a", "two");
        ledger.discharge("Deployment", "a", "three");
        assert!(!ledger.holds("a"), "within again, but what did not change was dropped");
        assert!(ledger.short().contains("Deployment") && ledger.short().contains("Pod"));
        for k in KINDS.iter().filter(|k| k.kind != "Deployment") {
            let listed: Costs = [("a".to_string(), BTreeMap::from([("x".to_string(), 1)]))].into();
            assert!(ledger.relisted(k.kind, None, listed).is_empty());
        }
        assert!(!ledger.holds("a"));
        let listed: Costs = [("a".to_string(), BTreeMap::from([("one".to_string(), 60)]))].into();
        assert!(ledger.relisted("Deployment", Some("a"), listed).is_empty());
        assert!(ledger.holds("a") && ledger.unheld() == 0 && ledger.short().is_empty());
        // A listing that brings it past the budget drops it again.
        let big: Costs = [("a".to_string(), BTreeMap::from([("big".to_string(), 500)]))].into();
        assert_eq!(ledger.relisted("Pod", None, big), ["a"]);
        assert!(!ledger.holds("a") && ledger.holds("b"));
    }
}
