//! The OpenAPI 3.1 document, derived from the handlers' `#[utoipa::path]`
//! annotations and the request and response types they use, so it cannot
//! describe a shape the code does not send. Served at `GET /v1/openapi.json`
//! (with the token, like every route but health: it is no secret, but
//! nothing outside the token needs it) and printed by `sandboxd openapi`;
//! docs/openapi.json is a copy that a test holds equal to it.

use axum::Json;
use std::borrow::Cow;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};

use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::{RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi, PartialSchema, ToSchema};

use super::dto;
use super::error::{ErrorBody, ErrorCode};

/// The codes and their statuses come from [`ErrorCode::ALL`] itself (a
/// derive cannot see through the macro that declares the enum).
impl PartialSchema for ErrorCode {
    fn schema() -> RefOr<Schema> {
        let table: String = ErrorCode::ALL
            .iter()
            .map(|c| format!("\n- `{}`: {}", c.as_str(), c.status().as_u16()))
            .collect();
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(ErrorCode::ALL.iter().map(|c| c.as_str())))
            .description(Some(format!(
                "The stable error code, and the HTTP status it comes with:{table}"
            )))
            .into()
    }
}

impl ToSchema for ErrorCode {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("ErrorCode")
    }
}

#[derive(Debug, OpenApi)]
#[openapi(
    info(
        title = "sandboxd",
        description = "One hardened container per chat session. The prose guide is docs/API.md; \
            operations tagged `compat` (and marked `x-compat: true`) are RemcoChat's frozen wire protocol."
    ),
    paths(
        super::health::health,
        super::sandboxes::create_sandbox,
        super::sandboxes::list_sandboxes,
        super::sandboxes::get_sandbox,
        super::sandboxes::stop,
        super::sandboxes::restart,
        super::sandboxes::pause,
        super::sandboxes::resume,
        super::commands::start_command,
        super::commands::list_commands,
        super::commands::run_command,
        super::commands::wait_command,
        super::commands::stream_logs,
        super::commands::kill,
        super::commands::close_stdin,
        super::commands::send_stdin,
        super::files::read_file,
        super::files::write_files,
        super::files::list_files,
        super::files::delete_files,
        super::files::move_file,
        super::files::make_dir,
        super::files::stat_files,
        super::files::search_files,
        super::files::edit_file,
        super::files::watch_files,
        super::ports::port_url,
        super::checkpoints::create_checkpoint,
        super::checkpoints::list_checkpoints,
        super::checkpoints::delete_checkpoint,
        super::checkpoints::diff_checkpoint,
        super::checkpoints::restore,
        super::ptys::open_pty,
        super::ptys::list_ptys,
        super::ptys::attach_pty,
        super::ptys::kill_pty,
        super::ptys::pty_ticket,
        super::tokens::issue_token,
        super::tokens::list_tokens,
        super::tokens::revoke_tokens,
        super::tokens::revoke_token,
        super::metrics,
        serve,
    ),
    components(schemas(ErrorBody, ErrorCode, dto::LogRecord, dto::WatchLine)),
    modifiers(&Security, &Errors),
    security(("adminToken" = []), ("remcochatToken" = []), ("bearer" = [])),
    tags(
        (name = "compat", description = "Frozen: RemcoChat's client speaks these exactly as documented"),
    )
)]
struct ApiDoc;

/// The three ways to present the token.
#[derive(Debug)]
struct Security;

impl Modify for Security {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "adminToken",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("x-sandboxd-admin-token"))),
        );
        components.add_security_scheme(
            "remcochatToken",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "x-remcochat-admin-token",
                "compat: the header RemcoChat's client sends",
            ))),
        );
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Every operation can answer the error shape; which `code` goes with which
/// status is the `ErrorCode` table (docs/API.md, Error codes).
#[derive(Debug)]
struct Errors;

impl Modify for Errors {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let error = ResponseBuilder::new()
            .description(
                "An error: `{\"error\": sentence, \"code\": ErrorCode}`; 4xx for bad input, never 500",
            )
            .content(
                "application/json",
                utoipa::openapi::ContentBuilder::new()
                    .schema(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
                        "ErrorBody",
                    ))))
                    .build(),
            )
            .build();
        doc.paths
            .paths
            .values_mut()
            .flat_map(|item| {
                [&mut item.get, &mut item.post, &mut item.delete]
                    .into_iter()
                    .filter_map(Option::as_mut)
            })
            .for_each(|op| {
                op.responses
                    .responses
                    .entry("default".to_string())
                    .or_insert_with(|| RefOr::T(error.clone()));
            });
    }
}

/// The document.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// The document as pretty JSON with a final newline: what `sandboxd
/// openapi` prints and docs/openapi.json holds.
pub fn json() -> String {
    // Serialising the document's own types cannot fail.
    let mut text = document().to_pretty_json().unwrap_or_default();
    text.push('\n');
    text
}

/// `GET /v1/openapi.json`
#[utoipa::path(get, path = "/v1/openapi.json", tags = ["meta"], operation_id = "openapi",
    summary = "This OpenAPI 3.1 document",
    responses((status = 200, description = "The document", body = Object)))]
pub(super) async fn serve() -> Json<utoipa::openapi::OpenApi> {
    Json(document())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/openapi.json is what the code generates; regenerate it with
    /// `cargo run -q --bin sandboxd -- openapi > docs/openapi.json`.
    #[test]
    fn the_docs_copy_is_current() {
        let copy = include_str!("../../docs/openapi.json");
        assert!(
            copy == json(),
            "docs/openapi.json differs from the generated document; run `cargo run -q --bin sandboxd -- openapi > docs/openapi.json`"
        );
    }
}
