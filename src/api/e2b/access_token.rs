//! envd access tokens: what `envdAccessToken` hands an E2B client for one
//! sandbox and every envd call must carry back (`X-Access-Token`). A token
//! is HMAC-SHA256 of the sandbox id under a 32-byte secret that sandboxd
//! makes once in `state_dir` (mode 0600): nothing is stored per sandbox,
//! a restart keeps every token valid, a token opens its own sandbox only,
//! and none can be derived from the API key. A secret file that cannot be
//! read, has the wrong size or is readable by others is refused (the E2B
//! routes then answer 503), never replaced.

use std::fs::{DirBuilder, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// The secret's file in the state directory.
const FILE_NAME: &str = "e2b-envd-secret";
/// Bytes of the secret.
const SECRET_BYTES: usize = 32;
/// Bound into every token, so the secret signs nothing else by accident.
const CONTEXT: &[u8] = b"sandboxd e2b envd access token v1\0";

/// The tokens of every sandbox, or why there are none.
#[derive(Debug)]
pub(super) struct AccessTokens {
    secret: Result<[u8; SECRET_BYTES], String>,
}

impl AccessTokens {
    /// Reads the secret from `state_dir`, making it when there is none.
    pub(super) fn load(state_dir: Option<&Path>) -> AccessTokens {
        let secret = match state_dir {
            Some(dir) => load_or_make(dir),
            None => Err("no state directory is configured (state_dir)".into()),
        };
        if let Err(why) = &secret {
            tracing::error!(error = %why, "the E2B routes are off: their access-token secret is unusable");
        }
        AccessTokens { secret }
    }

    /// Why there are no tokens, if there are none.
    pub(super) fn unusable(&self) -> Option<&str> {
        self.secret.as_ref().err().map(String::as_str)
    }

    /// The token of `sandbox_id` (64 lowercase hex digits).
    pub(super) fn token(&self, sandbox_id: &str) -> Option<String> {
        let mac = self.mac(sandbox_id)?;
        Some(mac.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// Whether `presented` is the token of `sandbox_id`, compared in
    /// constant time.
    pub(super) fn verify(&self, sandbox_id: &str, presented: &[u8]) -> bool {
        self.token(sandbox_id)
            .is_some_and(|t| bool::from(t.as_bytes().ct_eq(presented)))
    }

    fn mac(&self, sandbox_id: &str) -> Option<[u8; 32]> {
        let secret = self.secret.as_ref().ok()?;
        let mut mac = Hmac::<Sha256>::new_from_slice(secret).ok()?;
        mac.update(CONTEXT);
        mac.update(sandbox_id.as_bytes());
        Some(mac.finalize().into_bytes().into())
    }
}

/// The secret in `dir`, made (0600, in a 0700 directory) when missing.
fn load_or_make(dir: &Path) -> Result<[u8; SECRET_BYTES], String> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot create the directory {}: {e}", dir.display()))?;
    let path = dir.join(FILE_NAME);
    match read_secret(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        other => return other.map_err(|e| unusable(&path, &e.to_string())),
    }
    let mut secret = [0u8; SECRET_BYTES];
    getrandom::fill(&mut secret).map_err(|e| format!("the OS random source failed: {e}"))?;
    let made = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut f| f.write_all(&secret).and_then(|()| f.sync_all()));
    match made {
        Ok(()) => Ok(secret),
        // Another sandboxd of this state directory made it first.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            read_secret(&path).map_err(|e| unusable(&path, &e.to_string()))
        }
        Err(e) => Err(format!("cannot write {}: {e}", path.display())),
    }
}

fn unusable(path: &Path, why: &str) -> String {
    format!(
        "{} is unusable ({why}); E2B clients' access tokens come from it, so it is not replaced: \
         fix it, or remove it to make every earlier token invalid",
        path.display()
    )
}

/// Reads the secret: exactly [`SECRET_BYTES`] bytes of a regular file
/// nobody else may read.
fn read_secret(path: &Path) -> std::io::Result<[u8; SECRET_BYTES]> {
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(std::io::Error::other(format!(
            "mode {:o}: others may read it; chmod 600 it",
            meta.mode() & 0o777
        )));
    }
    let mut buf = Vec::with_capacity(SECRET_BYTES + 1);
    Read::by_ref(&mut f)
        .take(SECRET_BYTES as u64 + 1)
        .read_to_end(&mut buf)?;
    <[u8; SECRET_BYTES]>::try_from(buf.as_slice()).map_err(|_| {
        std::io::Error::other(format!(
            "{} bytes where {SECRET_BYTES} are expected",
            buf.len()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    struct TempDir(std::path::PathBuf);

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn temp_dir() -> TempDir {
        TempDir(std::env::temp_dir().join(format!(
            "sandboxd-e2b-{}-{}",
            std::process::id(),
            crate::id::random_hex(4).expect("random")
        )))
    }

    #[test]
    fn tokens_survive_a_reload_and_open_their_own_sandbox_only() {
        let dir = temp_dir();
        let first = AccessTokens::load(Some(&dir.0));
        assert!(first.unusable().is_none());
        let a = first.token("sbx-a").expect("token");
        assert_eq!(a.len(), 64);
        assert_ne!(Some(a.clone()), first.token("sbx-b"));
        let mode = std::fs::metadata(dir.0.join(FILE_NAME))
            .expect("secret")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = AccessTokens::load(Some(&dir.0));
        assert!(
            again.verify("sbx-a", a.as_bytes()),
            "a restart keeps tokens"
        );
        assert!(!again.verify("sbx-b", a.as_bytes()));
        assert!(!again.verify("sbx-a", &a.as_bytes()[..63]));
        assert!(!again.verify("sbx-a", b""));
        let elsewhere = temp_dir();
        let other = AccessTokens::load(Some(&elsewhere.0));
        assert!(
            !other.verify("sbx-a", a.as_bytes()),
            "another secret, other tokens"
        );
    }

    #[test]
    fn an_unusable_secret_turns_tokens_off_and_is_kept() {
        let cases = [(vec![1u8; 31], 0o600), (vec![1u8; 32], 0o644)];
        cases.into_iter().for_each(|(bytes, mode)| {
            let dir = temp_dir();
            std::fs::create_dir_all(&dir.0).expect("dir");
            let path = dir.0.join(FILE_NAME);
            std::fs::write(&path, &bytes).expect("write");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
            let tokens = AccessTokens::load(Some(&dir.0));
            assert!(
                tokens.unusable().is_some(),
                "{} bytes, mode {mode:o}",
                bytes.len()
            );
            assert_eq!(tokens.token("sbx-a"), None);
            assert!(!tokens.verify("sbx-a", b"anything"));
            assert_eq!(std::fs::read(&path).expect("kept"), bytes);
        });
        let none = AccessTokens::load(None);
        assert!(none.unusable().is_some());
    }
}
