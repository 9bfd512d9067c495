//! Work taken in turn by namespace (docs/security.md, "A tenant's work
//! stays theirs"): a namespace that queues a thousand items gets its next
//! one only after every other namespace with work waiting got one, so one
//! tenant's storm delays another's rollout by at most one item per
//! namespace, never by the storm.

use std::collections::{HashMap, VecDeque};

/// A FIFO per namespace, and the namespaces in turn.
#[derive(Debug)]
pub(crate) struct Turns<T> {
    queues: HashMap<String, VecDeque<T>>,
    /// The namespaces with items, in the order their next is taken.
    turn: VecDeque<String>,
    len: usize,
}

impl<T> Default for Turns<T> {
    fn default() -> Self {
        Turns {
            queues: HashMap::new(),
            turn: VecDeque::new(),
            len: 0,
        }
    }
}

impl<T> Turns<T> {
    /// Queues `item` behind `namespace`'s others.
    pub fn push(&mut self, namespace: &str, item: T) {
        let queue = match self.queues.get_mut(namespace) {
            Some(queue) => queue,
            None => {
                self.turn.push_back(namespace.to_string());
                self.queues.entry(namespace.to_string()).or_default()
            }
        };
        queue.push_back(item);
        self.len += 1;
    }

    /// The next item of the namespace whose turn it is.
    pub fn pop(&mut self) -> Option<T> {
        let namespace = self.turn.pop_front()?;
        let queue = self.queues.get_mut(&namespace)?;
        let item = queue.pop_front();
        if queue.is_empty() {
            self.queues.remove(&namespace);
        } else {
            self.turn.push_back(namespace);
        }
        self.len -= usize::from(item.is_some());
        item
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.len
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_with_a_storm_waits_its_turn() {
        let mut turns = Turns::default();
        for i in 0..1000 {
            turns.push("storm", format!("storm-{i}"));
        }
        turns.push("quiet", "quiet-0".to_string());
        turns.push("other", "other-0".to_string());
        let first: Vec<String> = (0..3).filter_map(|_| turns.pop()).collect();
        assert_eq!(first, ["storm-0", "quiet-0", "other-0"]);
        assert_eq!(turns.len(), 999);
        turns.push("quiet", "quiet-1".to_string());
        assert_eq!(turns.pop().as_deref(), Some("storm-1"));
        assert_eq!(
            turns.pop().as_deref(),
            Some("quiet-1"),
            "a second item waits one turn, not the storm"
        );
        while turns.pop().is_some() {}
        assert!(turns.is_empty() && turns.queues.is_empty() && turns.turn.is_empty());
    }
}
