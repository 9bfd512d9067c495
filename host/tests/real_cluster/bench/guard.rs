//! The regression guard the short cluster benchmark applies in `make test`.
//!
//! CI runs an unoptimised build on a shared machine, where absolute figures
//! say little and move by up to 1.5 times between runs an hour apart
//! (docs/BENCHMARKS.md); so every bound is a ratio between two rows of one
//! run, which the same noise slows alike. The 8 : 1 bound sits between what
//! the shipped build measures and what a deliberately slowed one does, so
//! that it holds on the one and fails on the other (docs/BENCHMARKS.md,
//! "The regression guard, shown failing").

use super::{ms, Engine, Group, Row};

/// A Deployment with 8 new snapshots may cost at most this many times one
/// whose 8 snapshots exist (client p50). Measured 0.5 to 0.8 in the
/// unoptimised build on 2026-11-27, and 2.7 in release with 1,000 samples, where the bench's paused Deployments leave every new snapshot
/// unowned and each sweep lists more of them. That the creates run
/// together is proven apart, without timing: host/tests/serve.rs counts
/// them in flight against a slow stand-in.
pub const NEW_TO_EXISTING: f64 = 5.0;

/// serve's own time for a create whose 8 snapshots exist, at most this many
/// times one with 1 (serve's mean). Read ahead together, 8 fresh reads cost
/// about one round trip more than 1 does; one after another, as the policy
/// asks for them (`--source-reads none`), they cost 8.
pub const EIGHT_TO_ONE: f64 = 5.5;

/// With `POLICY_SERVER` set: serve at most this many times policy-server
/// on the opted-in creates whose snapshots exist (kube-apiserver's mean in
/// the webhook, 1 client). The goal is 1 (issue 43); the bound keeps what
/// is reached from slipping. An unoptimised serve against a release
/// policy-server measures the compiler as much as the design: measured
/// 5.77 and 4.73 (2026-11-27 09:05 UTC).
pub const SERVE_TO_POLICY_SERVER: f64 = 8.0;

/// serve's writes per opted-in create whose snapshots exist, at most: a
/// shared snapshot is anchored once in its life, then reused with no write
/// but a mark about once a grace period (docs/design.md, "Garbage
/// collection", Anchors). A count, not a time: it holds in every build,
/// however loaded the machine. Bridging as before anchors wrote a PATCH
/// per snapshot per create (8 with 8 references).
pub const WRITES_PER_EXISTING_CREATE: f64 = 0.5;

/// Whether this build enforces the bounds on times. They are set for the
/// unoptimised build `make test` runs. The optimised one (`make
/// bench-cluster`) prints its ratios: there the policy costs little, so
/// each ratio's small side moves with the machine, and one day's runs gave
/// 5.1 to 7.0 for 8 : 1 and 1.7 to 2.5 against policy-server
/// (docs/BENCHMARKS.md, "The regression guard, shown failing").
pub const ENFORCED: bool = cfg!(debug_assertions);

/// One ratio of the guard: what it compares, its value in this run, its bound.
#[derive(Debug)]
pub struct Ratio {
    pub what: String,
    pub value: f64,
    pub bound: f64,
    /// A count rather than a time: enforced in every build.
    pub counted: bool,
}

impl Ratio {
    pub fn holds(&self) -> bool {
        self.value <= self.bound
    }

    fn enforced(&self) -> bool {
        ENFORCED || self.counted
    }
}

impl std::fmt::Display for Ratio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.enforced() {
            return write!(f, "{}: {:.2} (not enforced in this build)", self.what, self.value);
        }
        let verdict = if self.holds() { "holds" } else { "FAILS" };
        write!(
            f,
            "{}: {:.2} (bound {:.1}, {verdict})",
            self.what, self.value, self.bound
        )
    }
}

/// serve's 8 : 1 ratio from the two means (µs) of one run.
pub fn eight_to_one(one: f64, eight: f64) -> Ratio {
    Ratio {
        what: format!(
            "serve's mean, 8 references : 1, snapshots exist ({} / {} ms)",
            ms(eight),
            ms(one)
        ),
        value: eight / one.max(1.0),
        bound: EIGHT_TO_ONE,
        counted: false,
    }
}

/// Every ratio the rows of one run allow, at 1 client.
pub fn ratios(rows: &[Row]) -> Vec<Ratio> {
    let at_one = |group: Group, hook: Engine| {
        rows.iter()
            .find(|r| r.group == group && r.clients == 1 && r.hook == hook)
    };
    let row = |group: Group| at_one(group, Engine::Serve);
    let mut out = Vec::new();
    if let (Some(new), Some(existing)) = (row(Group::EightNew), row(Group::EightExisting)) {
        let (new, existing) = (new.client_quantile(0.5) as f64, existing.client_quantile(0.5) as f64);
        out.push(Ratio {
            what: format!(
                "client p50, 8 new snapshots : 8 existing ({} / {} ms)",
                ms(new),
                ms(existing)
            ),
            value: new / existing.max(1.0),
            bound: NEW_TO_EXISTING,
            counted: false,
        });
    }
    if let (Some(one), Some(eight)) = (row(Group::OneExisting), row(Group::EightExisting)) {
        out.push(eight_to_one(one.serve_mean(), eight.serve_mean()));
    }
    for group in [Group::OneExisting, Group::EightExisting] {
        if let (Some(serve), Some(ps)) = (at_one(group, Engine::Serve), at_one(group, Engine::PolicyServer)) {
            out.push(Ratio {
                what: format!(
                    "kube-apiserver's mean, serve : policy-server, {} ({} / {} ms)",
                    group.describe(),
                    ms(serve.apiserver_mean()),
                    ms(ps.apiserver_mean())
                ),
                value: serve.apiserver_mean() / ps.apiserver_mean().max(1.0),
                bound: SERVE_TO_POLICY_SERVER,
                counted: false,
            });
        }
    }
    for group in [Group::OneExisting, Group::EightExisting] {
        if let Some(r) = row(group) {
            out.push(writes_per_existing_create(group, r.requests.serve_writes, r.samples));
        }
    }
    out
}

/// serve's writes per create in a window of `samples` creates whose
/// snapshots exist.
pub fn writes_per_existing_create(group: Group, writes: f64, samples: usize) -> Ratio {
    Ratio {
        what: format!(
            "serve's writes per create, {} ({writes:.0} in {samples})",
            group.describe()
        ),
        value: writes / samples.max(1) as f64,
        bound: WRITES_PER_EXISTING_CREATE,
        counted: true,
    }
}

/// Fails the run, naming every ratio out of bounds.
pub fn check(rows: &[Row]) {
    let ratios = ratios(rows);
    for r in &ratios {
        eprintln!("bench guard: {r}");
    }
    let failed: Vec<String> = ratios
        .iter()
        .filter(|r| !r.holds() && r.enforced())
        .map(|r| r.to_string())
        .collect();
    assert!(
        failed.is_empty(),
        "the regression guard fails: {}. Are the creates or the fresh reads sequential again, or shared snapshots written at every create?",
        failed.join("; ")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// serve's means (µs) for 1 and 8 references, each pair from one run of
    /// the unoptimised build on the real control plane (docs/BENCHMARKS.md,
    /// "The regression guard, shown failing"): the bound must sit between
    /// the shipped reads and reads in turn, or it guards nothing.
    #[test]
    fn the_eight_to_one_bound_passes_the_shipped_reads_and_fails_reads_in_turn() {
        // 2026-11-27 08:38 UTC (1,000 creates a row, two restarts), 09:05 UTC.
        for (one, eight) in [(15_800.0, 61_600.0), (19_600.0, 55_100.0), (17_300.0, 69_400.0)] {
            let r = eight_to_one(one, eight);
            assert!(r.holds(), "{r:?}");
        }
        // `--source-reads none`: 08:38 UTC, and the short benchmark at 08:51 UTC.
        for (one, eight) in [(17_600.0, 145_600.0), (19_300.0, 132_500.0)] {
            let r = eight_to_one(one, eight);
            assert!(!r.holds(), "{r:?}");
        }
    }

    /// serve's writes in 200 creates whose snapshots exist, counted by the
    /// short benchmark on the real control plane (docs/BENCHMARKS.md, "The
    /// regression guard, shown failing"): with anchors, and on a build that
    /// bridges (main before anchors, 0417dd7, with serve's request counter
    /// added). The bound must pass the one and fail the other.
    #[test]
    fn the_writes_bound_passes_anchors_and_fails_the_bridge() {
        // Anchors, 2026-11-28: 1 write in 200 creates (1 reference), 8 (8).
        for (group, writes) in [(Group::OneExisting, 1.0), (Group::EightExisting, 8.0)] {
            let r = writes_per_existing_create(group, writes, 200);
            assert!(r.holds(), "{r:?}");
        }
        // Bridging, 2026-11-28 23:45 UTC: 1.75 and 7.92 writes per create.
        for (group, writes) in [(Group::OneExisting, 350.0), (Group::EightExisting, 1584.0)] {
            let r = writes_per_existing_create(group, writes, 200);
            assert!(!r.holds(), "{r:?}");
        }
    }
}
