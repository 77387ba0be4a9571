//! [`CodecError`]: why a payload could not be sealed or opened; and what to pass when a
//! reader has no key ([`NO_KEY_HINT`]), said by every error about a missing key.

/// What a reader without the key must pass, in the API and in the CLI: the one wording of
/// [`CodecError::NoCodec`] and [`Error::Encrypted`](crate::Error::Encrypted).
pub const NO_KEY_HINT: &str = "give the runtime the key with RuntimeBuilder::codec (the `loops` CLI: --key-file PATH or LOOPS_KEY_FILE)";

/// Why a payload could not be sealed or opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// The payload is sealed, and the reader has no codec.
    #[error("it is encrypted with key `{key}` and no key was given: {NO_KEY_HINT}")]
    NoCodec {
        /// The id of the key that sealed it.
        key: String,
    },
    /// The payload arrived sealed at a runtime without a codec, whose store keeps payloads
    /// in clear.
    #[error(
        "it is encrypted with key `{key}`, and this runtime keeps payloads in clear (it has no codec): send it in clear"
    )]
    SealedForClear {
        /// The id of the key that sealed it.
        key: String,
    },
    /// The payload was sealed with a key the codec does not have.
    #[error("it is encrypted with key `{key}`, which is not in the keyring (it has {known})")]
    UnknownKey {
        /// The id of the key that sealed it.
        key: String,
        /// The ids the keyring has, comma-separated.
        known: String,
    },
    /// The key is known but the payload does not authenticate under it.
    #[error(
        "it does not authenticate under key `{key}`: the payload was altered, moved from another record or run, or sealed with another key of the same id"
    )]
    Rejected {
        /// The id of the key tried.
        key: String,
    },
    /// The envelope itself is damaged (not the `{"$sealed":..}` shape, bad base64, too
    /// short), or what it opens to is not the JSON or text that was sealed.
    #[error("its envelope is damaged: {reason}")]
    Malformed {
        /// What is wrong.
        reason: String,
    },
    /// Sealing failed: no random nonce could be drawn from the operating system.
    #[error("no random nonce could be drawn: {reason}")]
    Random {
        /// The operating system's error.
        reason: String,
    },
}
