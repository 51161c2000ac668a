//! `FieldError`: why a request was refused, naming the field at fault
//! (`resources.vcpus`, `files[2].path`). Every request parser returns it,
//! so every 400 reads the same way.

/// A refused field: `{field}: {message}`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            message: message.into(),
        }
    }
}
