//! The bodies of the session token routes. The secret is in one body
//! only, the answer that makes it; lists name tokens by id.

use serde::Serialize;
use utoipa::ToSchema;

use crate::session_tokens::{Issued, TokenInfo};

/// `POST /v1/sessions/{sessionKey}/tokens`: the token, shown this once.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(in crate::api) struct TokenIssued {
    /// Names the token (to list or revoke it); not secret.
    id: String,
    /// `sbx_st_` and 64 hex digits; sandboxd keeps only its SHA-256.
    token: String,
    session_key: String,
    created_at: u64,
    expires_at: u64,
}

impl From<Issued> for TokenIssued {
    fn from(i: Issued) -> Self {
        TokenIssued {
            id: i.id,
            token: i.token,
            session_key: i.session_key,
            created_at: i.created_at,
            expires_at: i.expires_at,
        }
    }
}

/// A live session token, without its secret.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(in crate::api) struct SessionToken {
    id: String,
    created_at: u64,
    expires_at: u64,
}

/// `GET /v1/sessions/{sessionKey}/tokens`: oldest first.
#[derive(Debug, Serialize, ToSchema)]
pub(in crate::api) struct SessionTokenList {
    tokens: Vec<SessionToken>,
}

impl From<Vec<TokenInfo>> for SessionTokenList {
    fn from(list: Vec<TokenInfo>) -> Self {
        SessionTokenList {
            tokens: list
                .into_iter()
                .map(|t| SessionToken {
                    id: t.id,
                    created_at: t.created_at,
                    expires_at: t.expires_at,
                })
                .collect(),
        }
    }
}

/// `DELETE /v1/sessions/{sessionKey}/tokens`.
#[derive(Debug, Serialize, ToSchema)]
pub(in crate::api) struct TokensRevoked {
    /// Always `true`.
    ok: bool,
    /// How many live tokens the session had.
    revoked: usize,
}

impl From<usize> for TokensRevoked {
    fn from(revoked: usize) -> Self {
        TokensRevoked { ok: true, revoked }
    }
}
