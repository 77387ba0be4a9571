//! Schema hashes: the compile-time fingerprint of a workflow's stored shape.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A 64-bit fingerprint of everything that decides how a workflow's records decode.
///
/// `#[derive(Workflow)]` computes it at compile time from the enum's shape (variants,
/// fields and their types, transitions, `version`), and the runtime folds in
/// [`FORMAT_VERSION`](crate::record::FORMAT_VERSION) before storing it with every record
/// (see [`SchemaHash::pinned`]). A run whose stored hash differs from the compiled one is
/// refused with [`Error::SchemaMismatch`](crate::Error::SchemaMismatch).
///
/// The hash function is XXH3-64 (the `xxhash-rust` crate), which is stable across builds,
/// platforms and compiler versions. Displayed and parsed as 16 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct SchemaHash(u64);

impl SchemaHash {
    /// Wraps a raw 64-bit value.
    pub const fn from_u64(value: u64) -> Self {
        SchemaHash(value)
    }

    /// The raw 64-bit value.
    pub const fn to_u64(self) -> u64 {
        self.0
    }

    /// Hashes `bytes` with XXH3-64; usable in `const` context.
    pub const fn of(bytes: &[u8]) -> Self {
        SchemaHash(xxhash_rust::const_xxh3::xxh3_64(bytes))
    }

    /// Combines this hash with `other`, order-sensitively; usable in `const` context.
    ///
    /// `a.combine(b)` is the XXH3-64 of the 16 little-endian bytes of `a` then `b`.
    pub const fn combine(self, other: SchemaHash) -> Self {
        let a = self.0.to_le_bytes();
        let b = other.0.to_le_bytes();
        let mut buf = [0u8; 16];
        let mut i = 0;
        while i < 8 {
            buf[i] = a[i];
            buf[i + 8] = b[i];
            i += 1;
        }
        SchemaHash::of(&buf)
    }

    /// The hash stored with every record: this workflow hash with loops' own
    /// [`FORMAT_VERSION`](crate::record::FORMAT_VERSION) folded in, so that a change of the
    /// on-disk format is refused exactly like a change of the workflow.
    pub const fn pinned(self) -> Self {
        SchemaHash::from_u64(crate::record::FORMAT_VERSION as u64).combine(self)
    }
}

impl fmt::Display for SchemaHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Debug for SchemaHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SchemaHash({:016x})", self.0)
    }
}

/// The text was not 16 hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid schema hash {0:?}: expected 16 hex digits")]
pub struct ParseSchemaHashError(pub String);

impl FromStr for SchemaHash {
    type Err = ParseSchemaHashError;

    /// Parses 16 hex digits (either case), as printed by `Display`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() != 16 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ParseSchemaHashError(s.to_owned()));
        }
        u64::from_str_radix(s, 16)
            .map(SchemaHash)
            .map_err(|_| ParseSchemaHashError(s.to_owned()))
    }
}

impl From<SchemaHash> for String {
    fn from(h: SchemaHash) -> String {
        h.to_string()
    }
}

impl TryFrom<String> for SchemaHash {
    type Error = ParseSchemaHashError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_parse_round_trip() {
        let h = SchemaHash::from_u64(0x00ab_cdef_0123_4567);
        assert_eq!(h.to_string(), "00abcdef01234567");
        assert_eq!("00ABCDEF01234567".parse::<SchemaHash>(), Ok(h));
        assert!("xyz".parse::<SchemaHash>().is_err());
        assert!("00abcdef0123456".parse::<SchemaHash>().is_err());
    }

    #[test]
    fn hash_is_stable_and_const() {
        const H: SchemaHash = SchemaHash::of(b"loops");
        // XXH3-64 of "loops" with seed 0; a change here would strand every stored run.
        assert_eq!(H, SchemaHash::of(b"loops"));
        assert_eq!(
            H.to_u64(),
            xxhash_rust::xxh3::xxh3_64(b"loops"),
            "const and runtime XXH3 agree"
        );
        assert_ne!(
            H.combine(SchemaHash::of(b"a")),
            SchemaHash::of(b"a").combine(H)
        );
        assert_ne!(H.pinned(), H);
    }
}
