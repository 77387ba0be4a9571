//! `Schema` for the standard library, `serde_json` and, behind features, `uuid` and `chrono`:
//! each describes what serde writes to JSON for the type.

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, HashSet, LinkedList, VecDeque};
use std::marker::PhantomData;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::num::{NonZero, Wrapping};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use super::{Enum, Field, Fields, Repr, Schema, Shape, Struct, Variant};

macro_rules! scalar {
    ($($ty:ty => $name:literal),* $(,)?) => {
        $(
            impl Schema for $ty {
                const SHAPE: &'static Shape = &Shape::Scalar($name);
            }
        )*
    };
}

scalar! {
    bool => "bool",
    char => "char",
    u8 => "u8", u16 => "u16", u32 => "u32", u64 => "u64", u128 => "u128", usize => "usize",
    i8 => "i8", i16 => "i16", i32 => "i32", i64 => "i64", i128 => "i128", isize => "isize",
    f32 => "f32",
    f64 => "f64",
    // Strings, and what serde writes as strings.
    str => "String",
    String => "String",
    Path => "String",
    PathBuf => "String",
    () => "()",
    IpAddr => "IpAddr",
    Ipv4Addr => "Ipv4Addr",
    Ipv6Addr => "Ipv6Addr",
    SocketAddr => "SocketAddr",
    SocketAddrV4 => "SocketAddrV4",
    SocketAddrV6 => "SocketAddrV6",
    // Any JSON value.
    serde_json::Value => "Value",
    serde_json::Number => "Number",
}

// Non-zero integers are stored as the integer (reading rejects zero, hence their own names).
scalar! {
    NonZero<u8> => "NonZero<u8>", NonZero<u16> => "NonZero<u16>",
    NonZero<u32> => "NonZero<u32>", NonZero<u64> => "NonZero<u64>",
    NonZero<u128> => "NonZero<u128>", NonZero<usize> => "NonZero<usize>",
    NonZero<i8> => "NonZero<i8>", NonZero<i16> => "NonZero<i16>",
    NonZero<i32> => "NonZero<i32>", NonZero<i64> => "NonZero<i64>",
    NonZero<i128> => "NonZero<i128>", NonZero<isize> => "NonZero<isize>",
}

impl<T> Schema for PhantomData<T> {
    const SHAPE: &'static Shape = <() as Schema>::SHAPE;
}

/// Types serde writes as the value they hold.
macro_rules! transparent {
    ($($ty:ident),* $(,)?) => {
        $(
            impl<T: Schema + ?Sized> Schema for $ty<T> {
                const SHAPE: &'static Shape = T::SHAPE;
            }
        )*
    };
}

transparent!(Box, Rc, Arc, Cell, RefCell, Mutex, RwLock);

impl<T: Schema + ?Sized> Schema for &T {
    const SHAPE: &'static Shape = T::SHAPE;
}

impl<T: Schema + ?Sized> Schema for &mut T {
    const SHAPE: &'static Shape = T::SHAPE;
}

impl<T: Schema + ToOwned + ?Sized> Schema for Cow<'_, T> {
    const SHAPE: &'static Shape = T::SHAPE;
}

impl<T: Schema> Schema for Wrapping<T> {
    const SHAPE: &'static Shape = T::SHAPE;
}

impl<T: Schema> Schema for Reverse<T> {
    const SHAPE: &'static Shape = T::SHAPE;
}

impl<T: Schema> Schema for Option<T> {
    const SHAPE: &'static Shape = &Shape::Option(T::SHAPE);
}

macro_rules! seq {
    ($variant:ident: $($ty:ident),*) => {
        $(
            impl<T: Schema> Schema for $ty<T> {
                const SHAPE: &'static Shape = &Shape::$variant(T::SHAPE);
            }
        )*
    };
}

seq!(Seq: Vec, VecDeque, LinkedList, BinaryHeap);
seq!(Set: BTreeSet);

impl<T: Schema> Schema for [T] {
    const SHAPE: &'static Shape = &Shape::Seq(T::SHAPE);
}

impl<T: Schema, S> Schema for HashSet<T, S> {
    const SHAPE: &'static Shape = &Shape::Set(T::SHAPE);
}

impl<K: Schema, V: Schema> Schema for BTreeMap<K, V> {
    const SHAPE: &'static Shape = &Shape::Map(K::SHAPE, V::SHAPE);
}

impl<K: Schema, V: Schema, S> Schema for HashMap<K, V, S> {
    const SHAPE: &'static Shape = &Shape::Map(K::SHAPE, V::SHAPE);
}

impl Schema for serde_json::Map<String, serde_json::Value> {
    const SHAPE: &'static Shape = &Shape::Map(String::SHAPE, serde_json::Value::SHAPE);
}

impl<T: Schema, const N: usize> Schema for [T; N] {
    const SHAPE: &'static Shape = &Shape::Array(T::SHAPE, N);
}

macro_rules! tuple {
    ($($name:ident)+) => {
        impl<$($name: Schema),+> Schema for ($($name,)+) {
            const SHAPE: &'static Shape = &Shape::Tuple(&[$($name::SHAPE),+]);
        }
    };
}

tuple!(A);
tuple!(A B);
tuple!(A B C);
tuple!(A B C D);
tuple!(A B C D E);
tuple!(A B C D E F);
tuple!(A B C D E F G);
tuple!(A B C D E F G H);
tuple!(A B C D E F G H I);
tuple!(A B C D E F G H I J);
tuple!(A B C D E F G H I J K);
tuple!(A B C D E F G H I J K L);

/// `Ok` or `Err`, externally tagged, as serde writes it.
impl<T: Schema, E: Schema> Schema for Result<T, E> {
    const SHAPE: &'static Shape = &Shape::Enum(&Enum {
        name: "Result",
        params: &[T::SHAPE, E::SHAPE],
        repr: Repr::External,
        variants: &[
            Variant {
                name: "Ok",
                fields: Fields::Newtype(&Field::new("0", T::SHAPE)),
                note: "",
            },
            Variant {
                name: "Err",
                fields: Fields::Newtype(&Field::new("0", E::SHAPE)),
                note: "",
            },
        ],
        note: "",
    });
}

/// `{"secs": u64, "nanos": u32}`, as serde writes it.
impl Schema for Duration {
    const SHAPE: &'static Shape = &Shape::Struct(&Struct {
        name: "Duration",
        params: &[],
        tag: None,
        fields: Fields::Named(&[
            Field::new("secs", u64::SHAPE),
            Field::new("nanos", u32::SHAPE),
        ]),
        note: "",
    });
}

/// `{"secs_since_epoch": u64, "nanos_since_epoch": u32}`, as serde writes it.
impl Schema for SystemTime {
    const SHAPE: &'static Shape = &Shape::Struct(&Struct {
        name: "SystemTime",
        params: &[],
        tag: None,
        fields: Fields::Named(&[
            Field::new("secs_since_epoch", u64::SHAPE),
            Field::new("nanos_since_epoch", u32::SHAPE),
        ]),
        note: "",
    });
}

/// A hyphenated UUID string.
#[cfg(feature = "uuid")]
impl Schema for uuid::Uuid {
    const SHAPE: &'static Shape = &Shape::Scalar("Uuid");
}

/// chrono writes its dates and times as ISO 8601 / RFC 3339 strings, the same for every time
/// zone.
#[cfg(feature = "chrono")]
mod chrono_impls {
    use super::{Schema, Shape};

    impl<Tz: chrono::TimeZone> Schema for chrono::DateTime<Tz> {
        const SHAPE: &'static Shape = &Shape::Scalar("DateTime");
    }

    impl Schema for chrono::NaiveDateTime {
        const SHAPE: &'static Shape = &Shape::Scalar("NaiveDateTime");
    }

    impl Schema for chrono::NaiveDate {
        const SHAPE: &'static Shape = &Shape::Scalar("NaiveDate");
    }

    impl Schema for chrono::NaiveTime {
        const SHAPE: &'static Shape = &Shape::Scalar("NaiveTime");
    }
}
