//! Deserialising request bodies the way the API's schema reads them.
//!
//! A type that serde derives `Deserialize` for takes a struct from a JSON
//! array as well as from an object: `[{"n": 1}]` fills the first field by
//! position, and `[]` fills none, leaving every optional field at its
//! default. The API's schema declares every body and every nested record an
//! object, so an array there must be refused. [`Strict`] wraps any
//! deserializer and, wherever a struct (or a struct variant) is asked for,
//! refuses a sequence; everything else passes through unchanged, so the
//! underlying deserializer's errors (with their line and column) are kept.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor};

/// A deserializer that reads structs from maps only.
pub(crate) struct Strict<D>(pub D);

/// Deserialize `T` from `deserializer`, refusing a sequence wherever `T`
/// (or any type inside it) reads a struct.
pub(crate) fn deserialize<'de, T: de::Deserialize<'de>, D: Deserializer<'de>>(deserializer: D) -> Result<T, D::Error> {
    T::deserialize(Strict(deserializer))
}

/// The visitor of a strict read: passes every value on, wrapping what is
/// nested; when `map_only`, a sequence is refused.
struct Wrap<V> {
    inner: V,
    map_only: bool,
}

impl<V> Wrap<V> {
    fn any(inner: V) -> Self {
        Self { inner, map_only: false }
    }
}

macro_rules! forward_deserialize {
    ($($method:ident),* $(,)?) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
            self.0.$method(Wrap::any(visitor))
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Strict<D> {
    type Error = D::Error;

    forward_deserialize!(
        deserialize_any,
        deserialize_bool,
        deserialize_i8,
        deserialize_i16,
        deserialize_i32,
        deserialize_i64,
        deserialize_i128,
        deserialize_u8,
        deserialize_u16,
        deserialize_u32,
        deserialize_u64,
        deserialize_u128,
        deserialize_f32,
        deserialize_f64,
        deserialize_char,
        deserialize_str,
        deserialize_string,
        deserialize_bytes,
        deserialize_byte_buf,
        deserialize_option,
        deserialize_unit,
        deserialize_seq,
        deserialize_map,
        deserialize_identifier,
        deserialize_ignored_any,
    );

    fn deserialize_unit_struct<V: Visitor<'de>>(self, name: &'static str, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_unit_struct(name, Wrap::any(visitor))
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, name: &'static str, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_newtype_struct(name, Wrap::any(visitor))
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_tuple(len, Wrap::any(visitor))
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_tuple_struct(name, len, Wrap::any(visitor))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_struct(name, fields, Wrap { inner: visitor, map_only: true })
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_enum(name, variants, Wrap::any(visitor))
    }

    fn is_human_readable(&self) -> bool {
        self.0.is_human_readable()
    }
}

macro_rules! forward_visit {
    ($($method:ident($ty:ty)),* $(,)?) => {$(
        fn $method<E: de::Error>(self, v: $ty) -> Result<Self::Value, E> {
            self.inner.$method(v)
        }
    )*};
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Wrap<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.inner.expecting(f)
    }

    forward_visit!(
        visit_bool(bool),
        visit_i8(i8),
        visit_i16(i16),
        visit_i32(i32),
        visit_i64(i64),
        visit_i128(i128),
        visit_u8(u8),
        visit_u16(u16),
        visit_u32(u32),
        visit_u64(u64),
        visit_u128(u128),
        visit_f32(f32),
        visit_f64(f64),
        visit_char(char),
        visit_str(&str),
        visit_borrowed_str(&'de str),
        visit_string(String),
        visit_bytes(&[u8]),
        visit_borrowed_bytes(&'de [u8]),
        visit_byte_buf(Vec<u8>),
    );

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        self.inner.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        self.inner.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        self.inner.visit_some(Strict(deserializer))
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        self.inner.visit_newtype_struct(Strict(deserializer))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        if self.map_only {
            return Err(de::Error::invalid_type(de::Unexpected::Seq, &self));
        }
        self.inner.visit_seq(Seq(seq))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        self.inner.visit_map(Map(map))
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Self::Value, A::Error> {
        self.inner.visit_enum(Enum(data))
    }
}

/// A seed whose deserializer is made strict.
struct Seed<S>(S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Seed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(Strict(deserializer))
    }
}

struct Seq<A>(A);

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for Seq<A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, A::Error> {
        self.0.next_element_seed(Seed(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

struct Map<A>(A);

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Map<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        self.0.next_key_seed(Seed(seed))
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, A::Error> {
        self.0.next_value_seed(Seed(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

struct Enum<A>(A);

impl<'de, A: EnumAccess<'de>> EnumAccess<'de> for Enum<A> {
    type Error = A::Error;
    type Variant = Variant<A::Variant>;

    fn variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<(T::Value, Self::Variant), A::Error> {
        let (value, variant) = self.0.variant_seed(Seed(seed))?;
        Ok((value, Variant(variant)))
    }
}

struct Variant<A>(A);

impl<'de, A: VariantAccess<'de>> VariantAccess<'de> for Variant<A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.0.unit_variant()
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        self.0.newtype_variant_seed(Seed(seed))
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        self.0.tuple_variant(len, Wrap::any(visitor))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.0.struct_variant(fields, Wrap { inner: visitor, map_only: true })
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        #[serde(default)]
        n: Option<i64>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct Outer {
        #[serde(default)]
        items: Vec<Inner>,
        #[serde(default)]
        one: Option<Inner>,
        #[serde(default)]
        data: Option<serde_json::Value>,
        #[serde(default)]
        kind: Option<Kind>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "lowercase")]
    enum Kind {
        Plain,
        Shaped { n: i64 },
    }

    fn read<T: for<'de> Deserialize<'de>>(json: &str) -> Result<T, serde_json::Error> {
        let mut de = serde_json::Deserializer::from_str(json);
        let value = deserialize(&mut de)?;
        de.end()?;
        Ok(value)
    }

    #[test]
    fn objects_are_read_as_before() {
        let outer: Outer = read(r#"{"items": [{"n": 1}, {}], "one": {"n": 2}, "data": [[1], {"a": []}]}"#).unwrap();
        assert_eq!(outer.items, [Inner { n: Some(1) }, Inner { n: None }]);
        assert_eq!(outer.one, Some(Inner { n: Some(2) }));
        assert_eq!(outer.data, Some(serde_json::json!([[1], {"a": []}])));
        let outer: Outer = read(r#"{"kind": "plain"}"#).unwrap();
        assert_eq!(outer.kind, Some(Kind::Plain));
        let outer: Outer = read(r#"{"kind": {"shaped": {"n": 3}}}"#).unwrap();
        assert_eq!(outer.kind, Some(Kind::Shaped { n: 3 }));
        // Plain serde takes each of these; the strict read refuses them all.
        assert!(serde_json::from_str::<Outer>("[]").is_ok());
        for json in ["[]", "[[]]", r#"{"items": [[1]]}"#, r#"{"one": []}"#, r#"{"kind": {"shaped": [3]}}"#] {
            let err = read::<Outer>(json).unwrap_err();
            assert!(err.to_string().starts_with("invalid type: sequence, expected struct"), "{json}: {err}");
            assert!(err.is_data(), "{json}");
        }
    }

    #[test]
    fn values_read_from_a_value_are_strict_too() {
        let err = deserialize::<Outer, _>(serde_json::json!({"one": [1]})).unwrap_err();
        assert!(err.to_string().contains("invalid type: sequence"), "{err}");
        let outer: Outer = deserialize(serde_json::json!({"one": {"n": 1}})).unwrap();
        assert_eq!(outer.one, Some(Inner { n: Some(1) }));
    }
}
