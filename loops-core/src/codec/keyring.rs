//! [`Keyring`]: the ready [`PayloadCodec`], XChaCha20-Poly1305 with a random nonce per
//! payload, keys by id, one key writing and older keys still reading.

use base64::Engine as _;
use std::fmt;
use std::path::{Path, PathBuf};

use chacha20poly1305::aead::{Aead, Generate, KeyInit, Payload};
use chacha20poly1305::{Key, XChaCha20Poly1305, XNonce};
use zeroize::Zeroizing;

use super::{CodecError, PayloadCodec, Place, Sealed};

/// Bytes of a key.
const KEY_BYTES: usize = 32;
/// Bytes of an XChaCha20 nonce: 192 bits, so random nonces never collide in practice
/// (unlike the 96 bits of AES-GCM or ChaCha20-Poly1305, which bound the payloads per key).
const NONCE_BYTES: usize = 24;

/// Payload keys by id: the first key seals new payloads, every key opens the payloads sealed
/// with it. Rotate by putting a new key first and keeping the old ones until no stored
/// payload needs them (a run sealed under `k1` still reads after `k2` became the writing key).
///
/// Each payload gets a random 192-bit nonce (XChaCha20-Poly1305, RustCrypto's
/// `chacha20poly1305`), and its [`Place`] as associated data. Keys are wiped from memory when
/// the keyring is dropped; `Debug` shows the ids only. Cloning copies the keys.
#[derive(Clone)]
pub struct Keyring {
    /// `(id, cipher)`, the writing key first.
    keys: Vec<(String, XChaCha20Poly1305)>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring")
            .field("writing", &self.writing_key_id())
            .field("keys", &self.key_ids())
            .finish()
    }
}

/// Why a [`Keyring`] could not be made.
///
/// `Debug` is written by hand only to show [`Exposed`](Self::Exposed)'s `mode` in octal
/// (`mode: 0o644`), as its message does; every other variant shows as derived.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum KeyringError {
    /// The key file could not be read. The I/O error is said in the message, and is not
    /// the error's `source()` too (a chain printed whole, as anyhow's `{:#}`, says it once).
    #[error("cannot read key file {}: {cause}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        cause: std::io::Error,
    },
    /// The key file may be read by its group or by others: refused, as ssh refuses such a
    /// private key, since a key anyone on the machine can read protects nothing.
    #[error(
        "key file {} has mode {mode:o}: it must be readable by its owner only (chmod 600 {})",
        path.display(),
        path.display()
    )]
    Exposed {
        /// The file.
        path: PathBuf,
        /// Its permission bits (`0o644`: said in octal by the message and by `Debug`).
        mode: u32,
    },
    /// A line of the key text is not `KEY_ID HEX`.
    #[error("key line {line}: {reason}")]
    Format {
        /// The line, from 1.
        line: usize,
        /// What is wrong (the key itself is never shown).
        reason: String,
    },
    /// A key id is not 1 to 64 of `A-Z a-z 0-9 _ . -`, or appears twice.
    #[error("key id `{id}`: {reason}")]
    BadId {
        /// The id.
        id: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The key text holds no key.
    #[error("no key given: a key file holds one `KEY_ID HEX` line per key, the writing key first")]
    Empty,
    /// The key file `path` does not hold a keyring: `cause` is [`Format`](Self::Format)
    /// (naming the line) or [`Empty`](Self::Empty). Said in the message, not as the
    /// `source()` too.
    #[error("key file {}: {cause}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong in it.
        cause: Box<KeyringError>,
    },
}

impl fmt::Debug for KeyringError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyringError::Read { path, cause } => f
                .debug_struct("Read")
                .field("path", path)
                .field("cause", cause)
                .finish(),
            KeyringError::Exposed { path, mode } => f
                .debug_struct("Exposed")
                .field("path", path)
                .field("mode", &format_args!("{mode:#o}"))
                .finish(),
            KeyringError::Format { line, reason } => f
                .debug_struct("Format")
                .field("line", line)
                .field("reason", reason)
                .finish(),
            KeyringError::BadId { id, reason } => f
                .debug_struct("BadId")
                .field("id", id)
                .field("reason", reason)
                .finish(),
            KeyringError::Empty => f.write_str("Empty"),
            KeyringError::File { path, cause } => f
                .debug_struct("File")
                .field("path", path)
                .field("cause", cause)
                .finish(),
        }
    }
}

impl Keyring {
    /// A keyring whose writing key is `key` (32 bytes) under `id`.
    ///
    /// # Errors
    /// [`KeyringError::BadId`] if `id` is not 1 to 64 of `A-Z a-z 0-9 _ . -`.
    pub fn new(id: impl Into<String>, key: [u8; KEY_BYTES]) -> Result<Keyring, KeyringError> {
        Keyring { keys: Vec::new() }.with_reading_key(id, key)
    }

    /// Adds an older key that opens the payloads sealed with it but seals nothing new.
    ///
    /// # Errors
    /// [`KeyringError::BadId`] if `id` is malformed or already in the keyring.
    pub fn with_reading_key(
        mut self,
        id: impl Into<String>,
        key: [u8; KEY_BYTES],
    ) -> Result<Keyring, KeyringError> {
        let id = id.into();
        check_id(&id)?;
        if self.keys.iter().any(|(known, _)| *known == id) {
            return Err(KeyringError::BadId {
                id,
                reason: "appears twice",
            });
        }
        let key = Zeroizing::new(key);
        let cipher = XChaCha20Poly1305::new(&Key::from(*key));
        self.keys.push((id, cipher));
        Ok(self)
    }

    /// Parses key text: one key a line, `KEY_ID HEX` (the id, white space, the key as 64
    /// hex digits), the writing key first; blank lines and lines starting with `#` are
    /// skipped.
    ///
    /// ```text
    /// # loops payload keys; the first one seals new payloads
    /// k2 8f6c0e1d2b3a4958677685a4b3c2d1e0f00112233445566778899aabbccddeef
    /// k1 00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff
    /// ```
    ///
    /// # Errors
    /// [`KeyringError::Format`] naming the line (never the key) if it is not `KEY_ID HEX`
    /// with 64 hex digits, or its key id is malformed or appears twice;
    /// [`KeyringError::Empty`] without a key.
    pub fn parse(text: &str) -> Result<Keyring, KeyringError> {
        let mut ring = Keyring { keys: Vec::new() };
        // A byte-order mark (an editor's) is not part of the first key's id.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let format = |reason: &str| KeyringError::Format {
                line: index + 1,
                reason: reason.to_owned(),
            };
            let mut parts = line.split_whitespace();
            let (Some(id), Some(hex), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(format("expected `KEY_ID HEX` (two words)"));
            };
            let key = decode_hex(hex).ok_or_else(|| {
                format("the key must be 64 hex digits (32 bytes; `openssl rand -hex 32`)")
            })?;
            ring = ring
                .with_reading_key(id, *key)
                .map_err(|e| format(&e.to_string()))?;
        }
        if ring.keys.is_empty() {
            return Err(KeyringError::Empty);
        }
        Ok(ring)
    }

    /// Reads a key file (the format of [`parse`](Self::parse)). On Unix the file must be
    /// readable by its owner only (mode 0600 or 0400).
    ///
    /// # Errors
    /// [`KeyringError::Read`] if it cannot be read; [`KeyringError::Exposed`] if its group
    /// or others may read or write it; [`KeyringError::File`] naming it, with the error of
    /// [`parse`](Self::parse).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Keyring, KeyringError> {
        let path = path.as_ref();
        let read = |cause| KeyringError::Read {
            path: path.to_owned(),
            cause,
        };
        let metadata = std::fs::metadata(path).map_err(read)?;
        // A FIFO would block the read below forever, and a directory's mode says nothing of
        // a key: refused before anything else is said of them.
        if !metadata.is_file() {
            return Err(read(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a regular file",
            )));
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = metadata.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                return Err(KeyringError::Exposed {
                    path: path.to_owned(),
                    mode,
                });
            }
        }
        let text = Zeroizing::new(std::fs::read_to_string(path).map_err(read)?);
        Keyring::parse(&text).map_err(|cause| KeyringError::File {
            path: path.to_owned(),
            cause: Box::new(cause),
        })
    }

    /// The id of the key that seals new payloads.
    pub fn writing_key_id(&self) -> &str {
        self.keys.first().map_or("", |(id, _)| id.as_str())
    }

    /// Every key id, the writing key first.
    pub fn key_ids(&self) -> Vec<&str> {
        self.keys.iter().map(|(id, _)| id.as_str()).collect()
    }

    /// This keyring with `id` as its writing key (the others kept for reading, in their
    /// order), or `None` if it holds no key `id`. What a tool that seals as the store does
    /// seals with when the store lists an older key of the ring but not its writing key
    /// (after a rotation no worker has sealed under yet).
    pub fn writing_with(&self, id: &str) -> Option<Keyring> {
        let at = self.keys.iter().position(|(key, _)| key == id)?;
        let mut keys = self.keys.clone();
        let writing = keys.remove(at);
        keys.insert(0, writing);
        Some(Keyring { keys })
    }
}

impl PayloadCodec for Keyring {
    fn key_id(&self) -> String {
        self.writing_key_id().to_owned()
    }

    fn key_ids(&self) -> Vec<String> {
        self.keys.iter().map(|(id, _)| id.clone()).collect()
    }

    /// The base64 of the tag of an empty message under a nonce of zeros, with the id as
    /// associated data (a key check value, as cards and HSMs show one): the nonce is never
    /// drawn for a payload (those are random, 24 bytes), and a tag says nothing of the key.
    fn key_check(&self, key: &str) -> Option<String> {
        let (id, cipher) = self.keys.iter().find(|(id, _)| id == key)?;
        let aad = format!("loops-key-check-1\0{id}");
        let tag = cipher
            .encrypt(
                &XNonce::default(),
                Payload {
                    msg: &[],
                    aad: aad.as_bytes(),
                },
            )
            .ok()?;
        Some(base64::engine::general_purpose::STANDARD.encode(tag))
    }

    fn seal(&self, place: &Place<'_>, plain: &[u8]) -> Result<Sealed, CodecError> {
        let (id, cipher) = self.keys.first().ok_or_else(|| CodecError::UnknownKey {
            key: String::new(),
            known: String::new(),
        })?;
        let nonce = XNonce::try_generate().map_err(|e| CodecError::Random {
            reason: e.to_string(),
        })?;
        let aad = place.associated_data();
        let ciphertext = cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: plain,
                    aad: &aad,
                },
            )
            .map_err(|_| CodecError::Malformed {
                reason: "the payload is too long to seal".to_owned(),
            })?;
        let mut data = Vec::with_capacity(NONCE_BYTES + ciphertext.len());
        data.extend_from_slice(&nonce);
        data.extend_from_slice(&ciphertext);
        Ok(Sealed {
            key: id.clone(),
            data,
        })
    }

    fn open(&self, place: &Place<'_>, sealed: &Sealed) -> Result<Vec<u8>, CodecError> {
        let Some((_, cipher)) = self.keys.iter().find(|(id, _)| *id == sealed.key) else {
            return Err(CodecError::UnknownKey {
                key: sealed.key.clone(),
                known: self.key_ids().join(", "),
            });
        };
        if sealed.data.len() < NONCE_BYTES {
            return Err(CodecError::Malformed {
                reason: format!(
                    "{} bytes, shorter than a nonce ({NONCE_BYTES})",
                    sealed.data.len()
                ),
            });
        }
        let (nonce, ciphertext) = sealed.data.split_at(NONCE_BYTES);
        let nonce = XNonce::try_from(nonce).map_err(|_| CodecError::Malformed {
            reason: "bad nonce".to_owned(),
        })?;
        let aad = place.associated_data();
        cipher
            .decrypt(
                &nonce,
                Payload {
                    msg: ciphertext,
                    aad: &aad,
                },
            )
            .map_err(|_| CodecError::Rejected {
                key: sealed.key.clone(),
            })
    }
}

fn check_id(id: &str) -> Result<(), KeyringError> {
    let ok = (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(KeyringError::BadId {
            id: id.chars().take(80).collect(),
            reason: "must be 1 to 64 of A-Z a-z 0-9 _ . -",
        })
    }
}

fn decode_hex(hex: &str) -> Option<Zeroizing<[u8; KEY_BYTES]>> {
    if hex.len() != KEY_BYTES * 2 {
        return None;
    }
    let mut key = Zeroizing::new([0u8; KEY_BYTES]);
    for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
        let digit = |c: u8| (c as char).to_digit(16);
        let (hi, lo) = (digit(pair[0])?, digit(pair[1])?);
        key[i] = u8::try_from(hi * 16 + lo).ok()?;
    }
    Some(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::RecordKind;

    fn place(seq: u64) -> Place<'static> {
        Place {
            run_id: "r",
            record: RecordKind::Transition,
            seq,
            field: "payload",
        }
    }

    #[test]
    fn rotation_reads_old_keys_and_writes_with_the_first() {
        let old = Keyring::new("k1", [1; 32]).unwrap();
        let sealed = old.seal(&place(3), b"secret-token=hunter2").unwrap();
        assert_eq!(sealed.key, "k1");
        assert_eq!(sealed.data.len(), NONCE_BYTES + 20 + 16);
        let rotated = Keyring::new("k2", [2; 32])
            .unwrap()
            .with_reading_key("k1", [1; 32])
            .unwrap();
        assert_eq!(
            rotated.open(&place(3), &sealed).unwrap(),
            b"secret-token=hunter2"
        );
        assert_eq!(rotated.seal(&place(3), b"x").unwrap().key, "k2");
        // Same plain text, two nonces.
        assert_ne!(
            old.seal(&place(3), b"x").unwrap(),
            old.seal(&place(3), b"x").unwrap()
        );
    }

    #[test]
    fn wrong_keys_places_and_tampering_are_refused() {
        let ring = Keyring::new("k1", [1; 32]).unwrap();
        let sealed = ring.seal(&place(3), b"secret").unwrap();
        assert_eq!(
            ring.open(&place(4), &sealed),
            Err(CodecError::Rejected { key: "k1".into() })
        );
        let impostor = Keyring::new("k1", [9; 32]).unwrap();
        assert_eq!(
            impostor.open(&place(3), &sealed),
            Err(CodecError::Rejected { key: "k1".into() })
        );
        let other = Keyring::new("k2", [1; 32]).unwrap();
        assert_eq!(
            other.open(&place(3), &sealed),
            Err(CodecError::UnknownKey {
                key: "k1".into(),
                known: "k2".into()
            })
        );
        let mut flipped = sealed.clone();
        let last = flipped.data.len() - 1;
        flipped.data[last] ^= 1;
        assert_eq!(
            ring.open(&place(3), &flipped),
            Err(CodecError::Rejected { key: "k1".into() })
        );
    }

    #[test]
    fn key_text_is_parsed_strictly() {
        let text = format!("# keys\n\nk2 {}\nk1 {}\n", "ab".repeat(32), "01".repeat(32));
        let ring = Keyring::parse(&text).unwrap();
        assert_eq!(ring.key_ids(), ["k2", "k1"]);
        // An editor's byte-order mark is not part of the first id.
        let marked = Keyring::parse(&format!("\u{feff}{text}")).unwrap();
        assert_eq!(marked.key_ids(), ["k2", "k1"]);
        // Another writing key of the ring; none for an id it does not hold.
        assert_eq!(ring.writing_with("k1").unwrap().key_ids(), ["k1", "k2"]);
        assert!(ring.writing_with("k3").is_none());
        assert_eq!(
            format!("{ring:?}"),
            r#"Keyring { writing: "k2", keys: ["k2", "k1"] }"#
        );
        assert!(matches!(
            Keyring::parse("k1 abcd"),
            Err(KeyringError::Format { line: 1, .. })
        ));
        assert!(matches!(
            Keyring::parse("# none\n"),
            Err(KeyringError::Empty)
        ));
        assert!(matches!(
            Keyring::parse(&format!("k/1 {}", "ab".repeat(32))),
            Err(KeyringError::Format { line: 1, .. })
        ));
        let twice = format!("# keys\nk1 {}\n\nk1 {}", "ab".repeat(32), "cd".repeat(32));
        assert_eq!(
            Keyring::parse(&twice).unwrap_err().to_string(),
            "key line 4: key id `k1`: appears twice"
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_key_file_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(&path, format!("k1 {}\n", "ab".repeat(32))).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let exposed = Keyring::from_file(&path).unwrap_err();
        assert!(matches!(exposed, KeyringError::Exposed { mode: 0o644, .. }));
        // The mode is octal in `Debug` as in the message, never the decimal 420.
        assert_eq!(
            format!("{exposed:?}"),
            format!("Exposed {{ path: {path:?}, mode: 0o644 }}")
        );
        assert_eq!(
            exposed.to_string(),
            format!(
                "key file {} has mode 644: it must be readable by its owner only (chmod 600 {})",
                path.display(),
                path.display()
            )
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(Keyring::from_file(&path).unwrap().key_ids(), ["k1"]);
        std::fs::write(&path, "k1 abcd\n").unwrap();
        assert_eq!(
            Keyring::from_file(&path).unwrap_err().to_string(),
            format!(
                "key file {}: key line 1: the key must be 64 hex digits (32 bytes; `openssl rand -hex 32`)",
                path.display()
            )
        );
    }
}
