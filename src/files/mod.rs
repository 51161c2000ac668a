//! Files in the workspace. For now the path rules ([`path`]); reading and
//! writing arrive with the files API.

pub mod path;
