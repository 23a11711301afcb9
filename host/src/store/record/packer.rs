//! The packed form written straight from a record's fields by serde, with no JSON tree in
//! between: building a tree of maps and strings for each write was most of what packing
//! cost the writer. It writes what [`super::unpack`] reads: the same tags, field codes and
//! words, a value for each value `serde_json::to_value` would have made (a float that is
//! not finite as null, bytes as an array of numbers, an enum's variant as a string or a
//! one-field object). An object's fields come in the order its type gives them; a reader
//! takes them by name.

use super::{
    write_name, write_str, write_varint, ARRAY, FALSE, FLOAT, NEG, NULL, OBJECT, TRUE, UINT,
};
use serde::ser::{self, Error as _, Serialize};
use serde_json::Error;

/// Writes one value into `out`.
pub(super) struct Packer<'a> {
    pub(super) out: &'a mut Vec<u8>,
}

impl Packer<'_> {
    fn int(self, n: i64) {
        if n >= 0 {
            self.out.push(UINT);
            write_varint(self.out, n as u64);
        } else {
            self.out.push(NEG);
            write_varint(self.out, !(n as u64));
        }
    }

    fn uint(self, n: u64) {
        self.out.push(UINT);
        write_varint(self.out, n);
    }

    /// An enum variant with content: an object of one field named after it.
    fn variant(&mut self, variant: &str) {
        self.out.push(OBJECT);
        write_varint(self.out, 1);
        write_name(self.out, variant);
    }
}

/// An array or object being written: its entries follow its tag, and its count goes in
/// before them once they are all written (a type need not say how many it has).
pub(super) struct Compound<'a> {
    out: &'a mut Vec<u8>,
    at: usize,
    count: u64,
}

impl<'a> Compound<'a> {
    fn start(out: &'a mut Vec<u8>, tag: u8) -> Self {
        out.push(tag);
        let at = out.len();
        Compound { out, at, count: 0 }
    }

    fn item<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), Error> {
        self.count += 1;
        value.serialize(Packer { out: self.out })
    }

    fn field<T: ?Sized + Serialize>(&mut self, name: &str, value: &T) -> Result<(), Error> {
        write_name(self.out, name);
        self.item(value)
    }

    fn finish(self) -> Result<(), Error> {
        let mut count = Vec::with_capacity(2);
        write_varint(&mut count, self.count);
        self.out.splice(self.at..self.at, count);
        Ok(())
    }
}

impl<'a> ser::Serializer for Packer<'a> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Compound<'a>;
    type SerializeTuple = Compound<'a>;
    type SerializeTupleStruct = Compound<'a>;
    type SerializeTupleVariant = Compound<'a>;
    type SerializeMap = Compound<'a>;
    type SerializeStruct = Compound<'a>;
    type SerializeStructVariant = Compound<'a>;

    fn serialize_bool(self, v: bool) -> Result<(), Error> {
        self.out.push(if v { TRUE } else { FALSE });
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Result<(), Error> {
        self.serialize_i64(v.into())
    }
    fn serialize_i16(self, v: i16) -> Result<(), Error> {
        self.serialize_i64(v.into())
    }
    fn serialize_i32(self, v: i32) -> Result<(), Error> {
        self.serialize_i64(v.into())
    }
    fn serialize_i64(self, v: i64) -> Result<(), Error> {
        self.int(v);
        Ok(())
    }
    fn serialize_u8(self, v: u8) -> Result<(), Error> {
        self.serialize_u64(v.into())
    }
    fn serialize_u16(self, v: u16) -> Result<(), Error> {
        self.serialize_u64(v.into())
    }
    fn serialize_u32(self, v: u32) -> Result<(), Error> {
        self.serialize_u64(v.into())
    }
    fn serialize_u64(self, v: u64) -> Result<(), Error> {
        self.uint(v);
        Ok(())
    }
    fn serialize_f32(self, v: f32) -> Result<(), Error> {
        self.serialize_f64(v.into())
    }
    fn serialize_f64(self, v: f64) -> Result<(), Error> {
        if v.is_finite() {
            self.out.push(FLOAT);
            self.out.extend_from_slice(&v.to_le_bytes());
        } else {
            self.out.push(NULL);
        }
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<(), Error> {
        write_str(self.out, v.encode_utf8(&mut [0; 4]));
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<(), Error> {
        write_str(self.out, v);
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), Error> {
        self.out.push(ARRAY);
        write_varint(self.out, v.len() as u64);
        for &b in v {
            self.out.push(UINT);
            write_varint(self.out, b.into());
        }
        Ok(())
    }
    fn serialize_none(self) -> Result<(), Error> {
        self.serialize_unit()
    }
    fn serialize_some<T: ?Sized + Serialize>(self, value: &T) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Error> {
        self.out.push(NULL);
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Error> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), Error> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        mut self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.variant(variant);
        value.serialize(self)
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Compound<'a>, Error> {
        Ok(Compound::start(self.out, ARRAY))
    }
    fn serialize_tuple(self, len: usize) -> Result<Compound<'a>, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        len: usize,
    ) -> Result<Compound<'a>, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        mut self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Compound<'a>, Error> {
        self.variant(variant);
        Ok(Compound::start(self.out, ARRAY))
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Compound<'a>, Error> {
        Ok(Compound::start(self.out, OBJECT))
    }
    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Compound<'a>, Error> {
        Ok(Compound::start(self.out, OBJECT))
    }
    fn serialize_struct_variant(
        mut self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Compound<'a>, Error> {
        self.variant(variant);
        Ok(Compound::start(self.out, OBJECT))
    }
}

/// The traits whose entries are values alone, each the same over [`Compound`].
macro_rules! items {
    ($($trait:ident :: $method:ident),*) => {$(
        impl ser::$trait for Compound<'_> {
            type Ok = ();
            type Error = Error;
            fn $method<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), Error> {
                self.item(value)
            }
            fn end(self) -> Result<(), Error> {
                self.finish()
            }
        }
    )*};
}

items!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

/// The traits whose entries are named fields, each the same over [`Compound`].
macro_rules! fields {
    ($($trait:ident),*) => {$(
        impl ser::$trait for Compound<'_> {
            type Ok = ();
            type Error = Error;
            fn serialize_field<T: ?Sized + Serialize>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> Result<(), Error> {
                self.field(key, value)
            }
            fn end(self) -> Result<(), Error> {
                self.finish()
            }
        }
    )*};
}

fields!(SerializeStruct, SerializeStructVariant);

impl ser::SerializeMap for Compound<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_key<T: ?Sized + Serialize>(&mut self, key: &T) -> Result<(), Error> {
        let name = key.serialize(KeyName)?;
        write_name(self.out, &name);
        Ok(())
    }
    fn serialize_value<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), Error> {
        self.item(value)
    }
    fn end(self) -> Result<(), Error> {
        self.finish()
    }
}

/// A map key as a field name: a string, or what JSON writes as one (a number, a
/// character, a variant's name).
struct KeyName;

/// [`KeyName`]'s methods for what is written as a name the way it prints.
macro_rules! to_name {
    ($($method:ident: $t:ty),*) => {$(
        fn $method(self, v: $t) -> Result<String, Error> {
            Ok(v.to_string())
        }
    )*};
}

/// What cannot be a field name.
fn not_a_name() -> Error {
    Error::custom("a map key must be a string")
}

impl ser::Serializer for KeyName {
    type Ok = String;
    type Error = Error;
    type SerializeSeq = ser::Impossible<String, Error>;
    type SerializeTuple = ser::Impossible<String, Error>;
    type SerializeTupleStruct = ser::Impossible<String, Error>;
    type SerializeTupleVariant = ser::Impossible<String, Error>;
    type SerializeMap = ser::Impossible<String, Error>;
    type SerializeStruct = ser::Impossible<String, Error>;
    type SerializeStructVariant = ser::Impossible<String, Error>;

    fn serialize_str(self, v: &str) -> Result<String, Error> {
        Ok(v.to_string())
    }
    to_name!(
        serialize_char: char,
        serialize_i8: i8,
        serialize_i16: i16,
        serialize_i32: i32,
        serialize_i64: i64,
        serialize_u8: u8,
        serialize_u16: u16,
        serialize_u32: u32,
        serialize_u64: u64
    );
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<String, Error> {
        Ok(variant.to_string())
    }
    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<String, Error> {
        value.serialize(self)
    }
    fn serialize_bool(self, _v: bool) -> Result<String, Error> {
        Err(not_a_name())
    }
    fn serialize_f32(self, _v: f32) -> Result<String, Error> {
        Err(not_a_name())
    }
    fn serialize_f64(self, _v: f64) -> Result<String, Error> {
        Err(not_a_name())
    }
    fn serialize_bytes(self, _v: &[u8]) -> Result<String, Error> {
        Err(not_a_name())
    }
    fn serialize_none(self) -> Result<String, Error> {
        Err(not_a_name())
    }
    fn serialize_some<T: ?Sized + Serialize>(self, _value: &T) -> Result<String, Error> {
        Err(not_a_name())
    }
    fn serialize_unit(self) -> Result<String, Error> {
        Err(not_a_name())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<String, Error> {
        Err(not_a_name())
    }
    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<String, Error> {
        Err(not_a_name())
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, Error> {
        Err(not_a_name())
    }
    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, Error> {
        Err(not_a_name())
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleStruct, Error> {
        Err(not_a_name())
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, Error> {
        Err(not_a_name())
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, Error> {
        Err(not_a_name())
    }
    fn serialize_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStruct, Error> {
        Err(not_a_name())
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, Error> {
        Err(not_a_name())
    }
}
