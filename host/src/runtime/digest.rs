//! Policy identity: the SHA-256 of a component's bytes.

use sha2::{Digest, Sha256};
use std::fmt;

/// The SHA-256 of a policy component, recorded with every decision it makes.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyDigest(pub [u8; 32]);

impl PolicyDigest {
    /// The digest of a component's bytes.
    pub fn of(bytes: &[u8]) -> Self {
        PolicyDigest(Sha256::digest(bytes).into())
    }
}

impl fmt::Display for PolicyDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(&self.0))
    }
}

/// Lower-case hex of `bytes`, a table look-up per digit: digests are written out with
/// every decision, and a formatter call per byte showed in its cost.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 * bytes.len());
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 15)] as char);
    }
    out
}

/// The 32 bytes that 64 lower-case hex digits spell, as [`hex`] writes them (upper case
/// would not be written back the same).
pub fn unhex32(text: &str) -> Option<[u8; 32]> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let b = text.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = digit(b[2 * i])? << 4 | digit(b[2 * i + 1])?;
    }
    Some(out)
}

impl fmt::Debug for PolicyDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PolicyDigest({self})")
    }
}
