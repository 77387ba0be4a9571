//! The one way loops turns what it knows into a number: idempotency keys, a `ManualClock`'s
//! key nonces and retry jitter each hash a [`Material`] built field by field, so that how a
//! field is laid out (a text with its length before it, an integer in little-endian bytes)
//! is written once.

/// Bytes to hash, built field by field. A text field added with [`text`](Self::text) has its
/// length (u64, little-endian) before it, so that `("ab", "c")` and `("a", "bc")` differ; one
/// added with [`raw`](Self::raw) is its bytes alone (retry jitter's material, laid out so
/// before this type: kept, so that a build with it spreads a run's retries as before).
pub(crate) struct Material(Vec<u8>);

impl Material {
    /// Empty material with room for `bytes` bytes.
    pub(crate) fn with_capacity(bytes: usize) -> Self {
        Self(Vec::with_capacity(bytes))
    }

    /// Appends `text`'s length in bytes (u64, little-endian), then its bytes.
    pub(crate) fn text(mut self, text: &str) -> Self {
        self.0.extend_from_slice(&(text.len() as u64).to_le_bytes());
        self.0.extend_from_slice(text.as_bytes());
        self
    }

    /// Appends `bytes` as they are, with no length before them.
    pub(crate) fn raw(mut self, bytes: &[u8]) -> Self {
        self.0.extend_from_slice(bytes);
        self
    }

    /// Appends `n` as 8 little-endian bytes.
    pub(crate) fn u64(self, n: u64) -> Self {
        self.raw(&n.to_le_bytes())
    }

    /// Appends `n` as 4 little-endian bytes.
    pub(crate) fn u32(self, n: u32) -> Self {
        self.raw(&n.to_le_bytes())
    }

    /// The material's 64-bit XXH3 hash.
    pub(crate) fn hash64(&self) -> u64 {
        xxhash_rust::xxh3::xxh3_64(&self.0)
    }

    /// The material's 128-bit XXH3 hash.
    pub(crate) fn hash128(&self) -> u128 {
        xxhash_rust::xxh3::xxh3_128(&self.0)
    }

    /// A number in `0.0..1.0` from [`hash64`](Self::hash64)'s top 53 bits (an `f64`'s
    /// mantissa: every value equally likely).
    pub(crate) fn unit(&self) -> f64 {
        (self.hash64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::Material;

    #[test]
    fn a_text_field_carries_its_length_so_fields_do_not_run_together() {
        let ab_c = Material::with_capacity(0).text("ab").text("c");
        let a_bc = Material::with_capacity(0).text("a").text("bc");
        assert_ne!(ab_c.hash64(), a_bc.hash64());
        assert_eq!(ab_c.0, b"\x02\0\0\0\0\0\0\0ab\x01\0\0\0\0\0\0\0c");
        // Raw fields do run together: what `raw` is for is a layout fixed before.
        let raw = |parts: [&str; 2]| {
            let m = Material::with_capacity(0).raw(parts[0].as_bytes());
            m.raw(parts[1].as_bytes()).hash64()
        };
        assert_eq!(raw(["ab", "c"]), raw(["a", "bc"]));
    }

    #[test]
    fn integers_are_little_endian_and_units_lie_in_zero_to_one() {
        let m = Material::with_capacity(12).u64(1).u32(2);
        assert_eq!(m.0, [1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(m.hash64(), xxhash_rust::xxh3::xxh3_64(&m.0));
        assert_eq!(m.hash128(), xxhash_rust::xxh3::xxh3_128(&m.0));
        for n in 0..1000u64 {
            let unit = Material::with_capacity(8).u64(n).unit();
            assert!((0.0..1.0).contains(&unit), "{unit}");
        }
    }
}
