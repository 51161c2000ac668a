//! File operations confined to the workspace.
