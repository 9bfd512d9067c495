//! The sources whose stored content changed, as serve's watch of them
//! saw it, waiting to be judged (docs/design.md, "Watch"). The API server
//! never waits on serve for a ConfigMap or Secret write: serve learns of
//! the change from the watch its cache already holds, and its leader
//! re-admits the source as stored, read fresh, so that its watchers roll.
//!
//! Each source waits at most once however often it changes (the judgement
//! reads it fresh, so the newest content is what rolls), and sources are
//! taken in turn by namespace ([`Turns`]): a tenant who edits a ConfigMap in
//! a loop keeps one item waiting, and another namespace's edit is judged
//! after at most one of theirs.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, Weak};

use tokio::sync::Notify;

use super::fair::Turns;
use crate::cluster::Key;

/// Who judges a changed source: serve's state, which re-admits it
/// ([`crate::lifecycle::Driver::source_changed`]).
pub(crate) trait Judge: Send + Sync {
    /// Judges the source `key` as stored now. Blocking.
    fn source_changed(&self, key: &Key);
}

#[derive(Default)]
struct Waiting {
    keys: HashSet<Key>,
    turns: Turns<Key>,
}

/// The changed sources waiting, and how many are being judged.
#[derive(Default)]
pub(crate) struct SourceChanges {
    waiting: Mutex<Waiting>,
    judging: AtomicUsize,
    ready: Notify,
    judge: OnceLock<Weak<dyn Judge>>,
}

impl SourceChanges {
    fn waiting(&self) -> MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets who judges (once; serve's state, built after the queue).
    pub fn judged_by(&self, judge: Weak<dyn Judge>) {
        let _ = self.judge.set(judge);
    }

    /// The source `key` changed: judge it, unless it waits already.
    pub fn changed(&self, key: Key) {
        {
            let mut waiting = self.waiting();
            if !waiting.keys.insert(key.clone()) {
                return;
            }
            let namespace = key.1.clone();
            waiting.turns.push(&namespace, key);
        }
        self.ready.notify_one();
    }

    /// Whether nothing waits and nothing is being judged.
    pub fn quiet(&self) -> bool {
        self.judging.load(Ordering::SeqCst) == 0 && self.waiting().keys.is_empty()
    }

    /// How many sources wait to be judged.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.waiting().keys.len()
    }

    /// The next source to judge, counted as being judged until its
    /// [`Judging`] goes.
    async fn next(&self) -> (Key, Judging<'_>) {
        loop {
            let notified = self.ready.notified();
            {
                let mut waiting = self.waiting();
                if let Some(key) = waiting.turns.pop() {
                    waiting.keys.remove(&key);
                    // Counted before the lock goes: `quiet` never sees it
                    // neither waiting nor judged.
                    self.judging.fetch_add(1, Ordering::SeqCst);
                    return (key, Judging(&self.judging));
                }
            }
            notified.await;
        }
    }

    /// Judges changed sources one at a time, until the runtime stops.
    /// One at a time: each is a fresh read and one policy evaluation, and
    /// the admissions users wait for come first.
    pub async fn run(&self) {
        loop {
            let (key, judging) = self.next().await;
            let Some(judge) = self.judge.get().and_then(Weak::upgrade) else {
                // serve is stopping (or no judge yet): nothing to roll.
                drop(judging);
                continue;
            };
            let span = tracing::info_span!("source change", kind = %key.0, namespace = %key.1);
            let judged = tokio::task::spawn_blocking(move || {
                let _in = span.enter();
                judge.source_changed(&key);
            })
            .await;
            if let Err(e) = judged {
                tracing::error!("judging a changed source panicked: {e}");
            }
            drop(judging);
        }
    }
}

/// One source being judged; counted until it is dropped.
struct Judging<'a>(&'a AtomicUsize);

impl Drop for Judging<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    struct Recorder(Mutex<Vec<Key>>);

    impl Judge for Recorder {
        fn source_changed(&self, key: &Key) {
            self.0.lock().unwrap().push(key.clone());
        }
    }

    fn key(ns: &str, name: &str) -> Key {
        ("ConfigMap".into(), ns.into(), name.into())
    }

    #[tokio::test]
    async fn a_source_edited_in_a_loop_waits_once_and_others_take_their_turn() {
        let changes = Arc::new(SourceChanges::default());
        for _ in 0..1000 {
            changes.changed(key("storm", "app"));
        }
        changes.changed(key("storm", "other"));
        changes.changed(key("quiet", "app"));
        assert_eq!(changes.len(), 3, "one entry per source, however often it changed");
        let recorder = Arc::new(Recorder(Mutex::default()));
        let judge: Arc<dyn Judge> = recorder.clone();
        changes.judged_by(Arc::downgrade(&judge));
        let running = tokio::spawn({
            let changes = changes.clone();
            async move { changes.run().await }
        });
        while !changes.quiet() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        running.abort();
        assert_eq!(
            *recorder.0.lock().unwrap(),
            [key("storm", "app"), key("quiet", "app"), key("storm", "other")],
            "in turn by namespace"
        );
    }
}
