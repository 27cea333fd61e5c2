//! Standard Webhooks signatures: `webhook-signature: v1,<base64 of
//! HMAC-SHA256(key, "<webhook-id>.<webhook-timestamp>.<body>")>`, with the
//! key given as `whsec_<base64>`.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// A signing key. Its `Debug` shows no key material.
#[derive(Clone)]
pub struct Signer {
    key: Vec<u8>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer(..)")
    }
}

impl Signer {
    /// From `whsec_<base64>` (the prefix may be left out).
    pub fn from_secret(secret: &str) -> Result<Self, String> {
        let encoded = secret.trim().strip_prefix("whsec_").unwrap_or(secret.trim());
        let key =
            STANDARD.decode(encoded).map_err(|_| "TXGATE_HOOK_SECRET must be whsec_ followed by base64".to_owned())?;
        if key.len() < 16 {
            return Err("TXGATE_HOOK_SECRET must hold at least 16 bytes of key".into());
        }
        Ok(Self { key })
    }

    /// The `webhook-signature` header value.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes any key length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_standard_webhooks_example() {
        // The example of the Standard Webhooks specification.
        let signer = Signer::from_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            signer.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn refuses_bad_secrets() {
        assert!(Signer::from_secret("whsec_not base64!").is_err());
        assert!(Signer::from_secret("whsec_c2hvcnQ=").is_err(), "too short");
        assert!(Signer::from_secret("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_ok(), "prefix optional");
        assert!(!format!("{:?}", Signer::from_secret("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap()).contains("MfKQ"));
    }
}
