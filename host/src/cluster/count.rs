//! Counting a JSON document's values (objects, arrays, strings, numbers
//! and the rest) without keeping any of them: the one measure serve puts on
//! what a review, its cache, its reads ahead and the sources it keeps hold
//! (`Allowance`). A tree costs by its count of values (a
//! `serde_json::Value` node with preserve_order is some 75 bytes however
//! short its text) and by its text: so a string, or a key, counts one more
//! value for every [`TEXT_PER_VALUE`] bytes it holds. Counting values alone
//! let one env value of 1.4 MiB count as one.

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes of text that count as one more value: about what a value's node
/// costs in memory.
pub(crate) const TEXT_PER_VALUE: usize = 64;

/// How many values a document holds (it, and every one inside it), its
/// text counted by [`TEXT_PER_VALUE`].
pub(crate) struct Values(pub usize);

impl<'de> Deserialize<'de> for Values {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let counted = Cell::new(0);
        deserializer.deserialize_any(Counter(&counted))?;
        Ok(Values(counted.get()))
    }
}

struct Counter<'c>(&'c Cell<usize>);

impl Counter<'_> {
    fn one<E: serde::de::Error>(&self) -> Result<(), E> {
        self.add(1)
    }

    fn add<E: serde::de::Error>(&self, n: usize) -> Result<(), E> {
        self.0.set(self.0.get().saturating_add(n));
        Ok(())
    }
}

/// A map's key: its text counted, nothing kept.
struct KeyText<'c>(&'c Cell<usize>);

impl<'de> serde::de::DeserializeSeed<'de> for KeyText<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyText<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<(), E> {
        Counter(self.0).add(key.len() / TEXT_PER_VALUE)
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Counter<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Counter<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.one()?;
        while map.next_key_seed(KeyText(self.0))?.is_some() {
            map.next_value_seed(Counter(self.0))?;
        }
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.one()?;
        while seq.next_element_seed(Counter(self.0))?.is_some() {}
        Ok(())
    }
    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<(), E> {
        self.add(1 + text.len() / TEXT_PER_VALUE)
    }
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<(), E> {
        self.one()
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<(), E> {
        self.one()
    }
    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<(), E> {
        self.one()
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<(), E> {
        self.one()
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.one()
    }
}

/// How many values `value` holds (it, and every one inside it).
pub(crate) fn of(value: &serde_json::Value) -> usize {
    Values::deserialize(value).map_or(0, |v| v.0)
}

/// The JSON values one holder may still take (an admission's reads ahead,
/// the sources it read fresh): spent as it takes trees, never refunded, so
/// what it ever took is bounded and not only what it holds at one moment.
pub(crate) struct Allowance {
    limit: usize,
    left: AtomicUsize,
}

impl Allowance {
    pub(crate) fn new(limit: usize) -> Allowance {
        Allowance {
            limit,
            left: AtomicUsize::new(limit),
        }
    }

    /// The values it started with.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// Takes `value`'s count from what is left; `false`, and nothing taken,
    /// when it does not fit.
    pub(crate) fn take(&self, value: &serde_json::Value) -> bool {
        let values = of(value);
        self.left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| left.checked_sub(values))
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Review of issue 63 (second pass), finding 1: a Deployment whose one
    /// env value holds 1.4 MiB counted as a handful of values, so a tenant's
    /// few hundred of them (and their ReplicaSets) passed the cache's
    /// budget by hundreds of MiB. Its text counts now, in a value and in a
    /// key alike.
    #[test]
    fn text_counts_by_its_length() {
        let short = of(&json!({"env": [{"name": "A", "value": "b"}]}));
        assert_eq!(short, 5);
        let long = "x".repeat(1_400_000);
        let value = of(&json!({"env": [{"name": "A", "value": long}]}));
        assert_eq!(value, short + 1_400_000 / TEXT_PER_VALUE);
        let key = of(&json!({ long.clone(): "" }));
        assert_eq!(key, 2 + 1_400_000 / TEXT_PER_VALUE);
        // As the review's bytes count them too.
        let text = serde_json::to_vec(&json!({ long: "" })).unwrap();
        let counted: Values = serde_json::from_slice(&text).unwrap();
        assert_eq!(counted.0, key);
    }

    #[test]
    fn an_allowance_takes_whole_trees_while_they_fit() {
        let allowance = Allowance::new(5);
        let three = json!({"a": 1, "b": 2});
        assert!(allowance.take(&three));
        assert!(!allowance.take(&three), "3 more do not fit in 2");
        assert!(allowance.take(&json!([1])), "nothing was taken by the refusal");
        assert!(!allowance.take(&json!(null)));
    }
}
