//! Values sealed at rest with AES-256-GCM (ring): the shared CA's key on etcd (`tls.rs`) and
//! the projects' secrets (`secrets.rs`). A key is derived from an operator's secret under a
//! label of its use, so one secret never gives the same key to two uses; each seal takes a
//! fresh random nonce, written before the ciphertext; what is sealed is bound to its
//! associated data (what it is the value of), so a sealed value moved under another name does
//! not open.

/// The nonce's length of AES-256-GCM, in bytes.
const NONCE_LEN: usize = 12;

/// An AES-256-GCM key.
pub struct SealingKey {
    key: ring::aead::LessSafeKey,
}

impl std::fmt::Debug for SealingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealingKey { .. }")
    }
}

/// Why a value could not be sealed.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("cannot read random bytes from the operating system: {0}")]
    Random(String),
    #[error("the value could not be sealed")]
    Seal,
}

impl SealingKey {
    /// The key of `secret` for the use `label`: SHA-256 of both.
    pub fn derive(label: &str, secret: &[u8]) -> SealingKey {
        let mut context = ring::digest::Context::new(&ring::digest::SHA256);
        context.update(label.as_bytes());
        context.update(secret);
        let digest = context.finish();
        // A SHA-256 digest is always AES-256's key length.
        let key = ring::aead::UnboundKey::new(&ring::aead::AES_256_GCM, digest.as_ref())
            .unwrap_or_else(|_| unreachable!("a SHA-256 digest is 32 bytes"));
        SealingKey {
            key: ring::aead::LessSafeKey::new(key),
        }
    }

    /// `plain` sealed and bound to `bound_to`: the nonce, then the ciphertext and its tag.
    pub fn seal(&self, plain: &[u8], bound_to: &[u8]) -> Result<Vec<u8>, SealError> {
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).map_err(|err| SealError::Random(err.to_string()))?;
        let mut sealed = plain.to_vec();
        self.key
            .seal_in_place_append_tag(
                ring::aead::Nonce::assume_unique_for_key(nonce),
                ring::aead::Aad::from(bound_to),
                &mut sealed,
            )
            .map_err(|_| SealError::Seal)?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    /// What [`SealingKey::seal`] sealed, or `None` when this is not the key it was sealed
    /// with, it was bound to something else, or it was altered.
    pub fn open(&self, sealed: &[u8], bound_to: &[u8]) -> Option<Vec<u8>> {
        if sealed.len() < NONCE_LEN {
            return None;
        }
        let (nonce, sealed) = sealed.split_at(NONCE_LEN);
        let nonce = ring::aead::Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut sealed = sealed.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, ring::aead::Aad::from(bound_to), &mut sealed)
            .ok()?;
        Some(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_value_opens_only_with_its_key_and_its_binding() {
        let key = SealingKey::derive("use a\0", b"secret");
        let sealed = key.seal(b"hunter2", b"a/b").unwrap();
        assert!(!sealed.windows(7).any(|w| w == b"hunter2"));
        assert_eq!(key.open(&sealed, b"a/b").as_deref(), Some(&b"hunter2"[..]));
        assert_eq!(key.open(&sealed, b"a/c"), None);
        assert_eq!(
            SealingKey::derive("use b\0", b"secret").open(&sealed, b"a/b"),
            None
        );
        let mut altered = sealed.clone();
        *altered.last_mut().unwrap() ^= 1;
        assert_eq!(key.open(&altered, b"a/b"), None);
        assert_ne!(
            key.seal(b"hunter2", b"a/b").unwrap(),
            sealed,
            "a fresh nonce each time"
        );
    }
}
