//! Counting a JSON document's values (objects, arrays, strings, numbers
//! and the rest) without keeping any of them: the one measure serve puts on
//! what a review, its cache and its reads ahead hold, since a tree costs by
//! its count of values, not by its bytes (a `serde_json::Value` node with
//! preserve_order is some 75 bytes however short its text).

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::cell::Cell;

/// How many values a document holds (it, and every one inside it).
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
        self.0.set(self.0.get().saturating_add(1));
        Ok(())
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
        while map.next_key::<IgnoredAny>()?.is_some() {
            map.next_value_seed(Counter(self.0))?;
        }
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.one()?;
        while seq.next_element_seed(Counter(self.0))?.is_some() {}
        Ok(())
    }
    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<(), E> {
        self.one()
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
