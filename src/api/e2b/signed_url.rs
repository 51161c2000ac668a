//! Signed file URLs: what E2B's `download_url(path)` and
//! `upload_url(path)` build for a client with no headers to send (a
//! browser). The query carries `path`, `username`, `signature` and
//! optionally `signature_expiration` (Unix seconds); the signature is
//! `v1_` and unpadded base64 of SHA-256 over
//! `PATH:OPERATION:USER:TOKEN[:EXPIRATION]`, where OPERATION is `read`
//! (GET) or `write` (POST) and TOKEN the sandbox's `envdAccessToken`.
//! Such a URL names no sandbox (the SDKs point it at `E2B_SANDBOX_URL`,
//! without `E2b-Sandbox-Id`), so its sandbox is the one whose token made
//! the signature: only the holder of that token can make one, and it
//! opens that sandbox's file at that path, for that operation, until it
//! expires.

use base64::Engine as _;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::access_token::AccessTokens;

/// A signed URL's query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SignedUrl {
    path: String,
    user: String,
    signature: String,
    /// Unix seconds.
    expiration: Option<u64>,
}

/// What a signed URL may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Operation {
    Read,
    Write,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Read => "read",
            Operation::Write => "write",
        }
    }
}

/// Why a signed URL opens nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum Refused {
    #[error("signature_expiration is not a number of seconds: {0:?}")]
    BadExpiration(String),
    #[error("{0} is given more than once")]
    Repeated(&'static str),
    #[error("the signed URL expired")]
    Expired,
    #[error("the signature is not one of a running sandbox's for this path and operation")]
    NoSigner,
}

impl SignedUrl {
    /// The signed URL in `query`; `None` when it carries no `signature`.
    pub(super) fn from_query(query: Option<&str>) -> Option<Result<SignedUrl, Refused>> {
        let mut url = SignedUrl {
            path: String::new(),
            user: String::new(),
            signature: String::new(),
            expiration: None,
        };
        let mut expiration = None;
        // Each signed parameter once: the file route must read the very
        // path that was signed.
        let mut repeated = None;
        let mut seen = [false; 4];
        let keys = ["path", "username", "signature", "signature_expiration"];
        form_urlencoded::parse(query?.as_bytes()).for_each(|(k, v)| {
            let Some(i) = keys.iter().position(|key| *key == k) else {
                return;
            };
            if std::mem::replace(&mut seen[i], true) {
                repeated = Some(keys[i]);
            }
            let v = v.into_owned();
            match i {
                0 => url.path = v,
                1 => url.user = v,
                2 => url.signature = v,
                _ => expiration = Some(v),
            }
        });
        if url.signature.is_empty() {
            return None;
        }
        if let Some(key) = repeated {
            return Some(Err(Refused::Repeated(key)));
        }
        if let Some(e) = expiration {
            match e.parse::<u64>() {
                Ok(secs) => url.expiration = Some(secs),
                Err(_) => return Some(Err(Refused::BadExpiration(e))),
            }
        }
        Some(Ok(url))
    }

    /// The sandbox among `candidates` whose token signed this URL for
    /// `operation`, at `now` (Unix seconds).
    pub(super) fn signer<'a>(
        &self,
        tokens: &AccessTokens,
        operation: Operation,
        now: u64,
        mut candidates: impl Iterator<Item = &'a str>,
    ) -> Result<&'a str, Refused> {
        if self.expiration.is_some_and(|e| e < now) {
            return Err(Refused::Expired);
        }
        candidates
            .find(|id| {
                tokens.token(id).is_some_and(|token| {
                    let expected = self.signature_with(operation, &token);
                    bool::from(expected.as_bytes().ct_eq(self.signature.as_bytes()))
                })
            })
            .ok_or(Refused::NoSigner)
    }

    fn signature_with(&self, operation: Operation, token: &str) -> String {
        let mut raw = format!("{}:{}:{}:{token}", self.path, operation.as_str(), self.user);
        if let Some(e) = self.expiration {
            raw.push_str(&format!(":{e}"));
        }
        let digest = Sha256::digest(raw.as_bytes());
        format!(
            "v1_{}",
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(query: &str) -> SignedUrl {
        SignedUrl::from_query(Some(query))
            .expect("signed")
            .expect("well-formed")
    }

    #[test]
    fn the_signature_is_the_sdks() {
        // What the Python SDK's get_signature gives for these inputs:
        // hashlib.sha256(b"/home/user/a b.txt:read:user:tok:1700000000")
        // in base64 without padding, after "v1_".
        let u = SignedUrl {
            path: "/home/user/a b.txt".into(),
            user: "user".into(),
            signature: String::new(),
            expiration: Some(1_700_000_000),
        };
        assert_eq!(
            u.signature_with(Operation::Read, "tok"),
            "v1_093FhtpxEsgb4bxwBlKaSzW/6svl6T49OrOTDHSjDvA"
        );
        let no_expiry = SignedUrl {
            expiration: None,
            user: String::new(),
            ..u
        };
        assert_eq!(
            no_expiry.signature_with(Operation::Write, "tok"),
            "v1_PXMXj0IT2WBZ72T/ZJhmSb9FurbiXcF9EOpGyKnw7qU"
        );
    }

    #[test]
    fn a_query_without_a_signature_is_not_a_signed_url() {
        assert_eq!(SignedUrl::from_query(None), None);
        assert_eq!(SignedUrl::from_query(Some("path=%2Fx&username=user")), None);
        assert_eq!(SignedUrl::from_query(Some("signature=")), None);
        assert_eq!(
            SignedUrl::from_query(Some("signature=v1_x&signature_expiration=soon")),
            Some(Err(Refused::BadExpiration("soon".into())))
        );
        let u = url(
            "path=%2Fhome%2Fuser%2Fa%20b.txt&username=user&signature=v1_x%2By&signature_expiration=7",
        );
        assert_eq!(
            u,
            SignedUrl {
                path: "/home/user/a b.txt".into(),
                user: "user".into(),
                signature: "v1_x+y".into(),
                expiration: Some(7),
            }
        );
    }
}
