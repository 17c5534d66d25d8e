//! SHA-256 fingerprints as lower-case hex: a token's stored key, a batch's request; and
//! HMAC-SHA256, for fingerprints that only the holder of a key can compute.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// The SHA-256 of `bytes`, as 64 lower-case hex digits.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// The HMAC-SHA256 of `bytes` under `key`, as 64 lower-case hex digits.
pub fn hmac_sha256_hex(key: &[u8], bytes: &[u8]) -> String {
    hex(&hmac_sha256(key, bytes))
}

/// The HMAC-SHA256 of `bytes` under `key`.
pub fn hmac_sha256(key: &[u8], bytes: &[u8]) -> [u8; 32] {
    // HMAC takes keys of any length: `new_from_slice` cannot fail for it.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
        unreachable!("HMAC accepts a key of any length")
    };
    mac.update(bytes);
    mac.finalize().into_bytes().into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_known_digest_of_abc() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    /// RFC 4231, test case 2.
    #[test]
    fn matches_the_rfc_4231_hmac() {
        assert_eq!(
            hmac_sha256_hex(b"Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
