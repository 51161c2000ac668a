//! Session tokens: credentials scoped to one session key, for a client (a
//! chat app's MCP connection) that must reach that session and nothing
//! else. A token is `sbx_st_` and 256 random bits from the OS (or none is
//! made); sandboxd keeps only its SHA-256, compares in constant time, and
//! writes every change to the state file ([`state_file`]) before it
//! answers, so tokens and revocations survive a restart. Expired tokens
//! are refused at once and pruned from the file by [`run_pruner`].

mod state_file;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;
use utoipa::ToSchema;

use crate::clock::now_ms;
use crate::config::Config;
use crate::field_error::FieldError;
use crate::id::{RandomUnavailable, random_hex};
use crate::sandbox::spec::check_session_key;
use state_file::StateFile;

/// What every token starts with: a reader (or a secret scanner) knows one.
pub const TOKEN_PREFIX: &str = "sbx_st_";
/// Random bytes of a token: 256 bits.
const TOKEN_BYTES: usize = 32;
/// Random bytes of a token's id (not secret: it names the token).
const ID_BYTES: usize = 8;
/// Most live tokens one session may have.
pub const MAX_PER_SESSION: usize = 32;
/// Most live tokens of all sessions together.
pub const MAX_TOTAL: usize = 10_000;
/// The shortest lifetime a token may be given.
const MIN_TTL_MS: u64 = 1_000;
/// How often expired tokens are pruned from the file.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// Why a token operation failed.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error(transparent)]
    Invalid(#[from] FieldError),
    #[error("no live token {0} for this session")]
    NotFound(String),
    #[error("the session already has {MAX_PER_SESSION} live tokens, the most it may; revoke one")]
    TooManyForSession,
    #[error("{MAX_TOTAL} session tokens are live, the most sandboxd keeps; revoke some")]
    TooMany,
    #[error(transparent)]
    Random(#[from] RandomUnavailable),
    /// The state file could not be written; nothing changed.
    #[error("the session tokens could not be saved ({0}); nothing changed")]
    Save(String),
    /// At start: the state file could not be read or its directory made.
    #[error("session tokens: {0}")]
    Load(String),
}

/// `POST /v1/sessions/{sessionKey}/tokens` as the client sends it.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenRequest {
    /// Lifetime in milliseconds: 1000 to `session_token_max_ttl_ms`
    /// (default 86400000); default `session_token_ttl_ms` (3600000).
    #[serde(default)]
    pub ttl_ms: Option<i64>,
}

/// A token just made: the only time its secret is seen.
#[derive(Debug, Clone)]
pub struct Issued {
    pub id: String,
    pub token: String,
    pub session_key: String,
    pub created_at: u64,
    pub expires_at: u64,
}

/// A live token as listed: never its secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    pub id: String,
    pub created_at: u64,
    pub expires_at: u64,
}

/// A token as kept: its hash, never the token.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    id: String,
    session_key: String,
    hash: [u8; 32],
    created_at: u64,
    expires_at: u64,
}

/// The store: the live tokens in memory, the state file on disk.
#[derive(Debug)]
pub struct SessionTokens {
    /// `None` when the configuration has no state directory: [`load`]
    /// refuses to start then.
    ///
    /// [`load`]: SessionTokens::load
    file: Option<StateFile>,
    records: Mutex<Vec<Record>>,
    /// Held across a change and its write, so changes are saved in the
    /// order they are made.
    writer: Mutex<()>,
    default_ttl_ms: u64,
    max_ttl_ms: u64,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding it leaves a whole vector behind: still usable.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn sha256(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl SessionTokens {
    /// An empty store over the configured state directory; reads nothing
    /// until [`load`](SessionTokens::load).
    pub fn new(config: &Config) -> SessionTokens {
        SessionTokens {
            file: config.state_dir().map(StateFile::in_dir),
            records: Mutex::new(Vec::new()),
            writer: Mutex::new(()),
            default_ttl_ms: millis(config.session_token_ttl),
            max_ttl_ms: millis(config.session_token_max_ttl),
        }
    }

    /// The state file's path, when there is a state directory.
    pub fn path(&self) -> Option<PathBuf> {
        self.file.as_ref().map(|f| f.path().to_path_buf())
    }

    /// At start, before any request: makes the state directory, reads the
    /// tokens, drops the expired ones and writes the file back (so a
    /// directory sandboxd cannot write stops it now, not at the first
    /// token). Returns how many live tokens there are.
    pub fn load(&self) -> Result<usize, TokenError> {
        let file = self.file.as_ref().ok_or_else(|| {
            TokenError::Load(
                "no state directory: not root, and neither STATE_DIRECTORY, XDG_STATE_HOME nor \
                 HOME is an absolute path; set SANDBOXD_STATE_DIR"
                    .into(),
            )
        })?;
        let _writer = locked(&self.writer);
        let mut records = file.read().map_err(TokenError::Load)?;
        let now = now_ms();
        records.retain(|r| r.expires_at > now);
        file.write(&records).map_err(TokenError::Load)?;
        let live = records.len();
        *locked(&self.records) = records;
        Ok(live)
    }

    /// Makes a token for `session_key`, saved before it is returned.
    pub async fn issue(
        self: &Arc<Self>,
        session_key: &str,
        req: TokenRequest,
    ) -> Result<Issued, TokenError> {
        check_session_key(session_key)?;
        let ttl_ms = match req.ttl_ms {
            None => self.default_ttl_ms,
            Some(v) => u64::try_from(v)
                .ok()
                .filter(|v| (MIN_TTL_MS..=self.max_ttl_ms).contains(v))
                .ok_or_else(|| {
                    FieldError::new(
                        "ttlMs",
                        format!(
                            "must be between {MIN_TTL_MS} and {} (session_token_max_ttl_ms) (got {v})",
                            self.max_ttl_ms
                        ),
                    )
                })?,
        };
        let token = format!("{TOKEN_PREFIX}{}", random_hex(TOKEN_BYTES)?);
        let id = random_hex(ID_BYTES)?;
        let key = session_key.to_string();
        let hash = sha256(&token);
        let issued = self
            .change(move |records, now| {
                if records.len() >= MAX_TOTAL {
                    return Err(TokenError::TooMany);
                }
                if records.iter().filter(|r| r.session_key == key).count() >= MAX_PER_SESSION {
                    return Err(TokenError::TooManyForSession);
                }
                let record = Record {
                    id,
                    session_key: key,
                    hash,
                    created_at: now,
                    expires_at: now.saturating_add(ttl_ms),
                };
                let issued = (record.id.clone(), record.created_at, record.expires_at);
                records.push(record);
                Ok(issued)
            })
            .await?;
        let (id, created_at, expires_at) = issued;
        Ok(Issued {
            id,
            token,
            session_key: session_key.to_string(),
            created_at,
            expires_at,
        })
    }

    /// The session's live tokens, oldest first.
    pub fn list(&self, session_key: &str) -> Result<Vec<TokenInfo>, TokenError> {
        check_session_key(session_key)?;
        let now = now_ms();
        Ok(locked(&self.records)
            .iter()
            .filter(|r| r.session_key == session_key && r.expires_at > now)
            .map(|r| TokenInfo {
                id: r.id.clone(),
                created_at: r.created_at,
                expires_at: r.expires_at,
            })
            .collect())
    }

    /// Revokes one of the session's tokens, saved before it returns.
    pub async fn revoke(self: &Arc<Self>, session_key: &str, id: &str) -> Result<(), TokenError> {
        check_session_key(session_key)?;
        let (key, id) = (session_key.to_string(), id.to_string());
        self.change(move |records, _| {
            let before = records.len();
            records.retain(|r| !(r.session_key == key && r.id == id));
            if records.len() == before {
                return Err(TokenError::NotFound(id));
            }
            Ok(())
        })
        .await
    }

    /// Revokes every token of the session, saved before it returns; how
    /// many there were.
    pub async fn revoke_all(self: &Arc<Self>, session_key: &str) -> Result<usize, TokenError> {
        check_session_key(session_key)?;
        let key = session_key.to_string();
        self.change(move |records, _| {
            let before = records.len();
            records.retain(|r| r.session_key != key);
            Ok(before - records.len())
        })
        .await
    }

    /// Whether `presented` is a live token of `session_key`. Every token
    /// of the session is compared, in constant time, whatever matched.
    pub fn verify(&self, session_key: &str, presented: &str) -> bool {
        let hash = sha256(presented);
        let now = now_ms();
        locked(&self.records)
            .iter()
            .filter(|r| r.session_key == session_key)
            .fold(false, |ok, r| {
                let matched = bool::from(r.hash.ct_eq(&hash)) && r.expires_at > now;
                ok | matched
            })
    }

    /// Drops expired tokens from memory and the file.
    pub async fn prune(self: &Arc<Self>) -> Result<(), TokenError> {
        let now = now_ms();
        if locked(&self.records).iter().all(|r| r.expires_at > now) {
            return Ok(());
        }
        self.change(|_, _| Ok(())).await
    }

    /// Applies `f` to a copy of the live tokens (expired ones dropped),
    /// writes the result and only then makes it the store's. It runs on
    /// a blocking thread of its own, to its end even when the request
    /// that asked is gone, so the file and memory never disagree.
    async fn change<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Vec<Record>, u64) -> Result<T, TokenError> + Send + 'static,
    ) -> Result<T, TokenError> {
        let store = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let file = store.file.as_ref().ok_or_else(|| {
                TokenError::Save("no state directory is configured (state_dir)".into())
            })?;
            let _writer = locked(&store.writer);
            let now = now_ms();
            let mut next = locked(&store.records).clone();
            next.retain(|r| r.expires_at > now);
            let out = f(&mut next, now)?;
            file.write(&next).map_err(TokenError::Save)?;
            *locked(&store.records) = next;
            Ok(out)
        })
        .await
        .map_err(|e| TokenError::Save(format!("the task saving them failed: {e}")))?
    }
}

/// Prunes expired tokens from the file every minute until shutdown.
pub async fn run_pruner(tokens: Arc<SessionTokens>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(PRUNE_EVERY);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {
                if let Err(e) = tokens.prune().await {
                    tracing::warn!(error = %e, "pruning expired session tokens failed");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
