//! The on-disk record format.

/// Version of loops' on-disk record format, folded into every stored schema hash.
pub const FORMAT_VERSION: u32 = 1;
