//! `WorkspacePath`: the lexical rules a path must pass before anything
//! touches the sandbox. Absolute paths must lie under the workspace
//! directory, or under one of its aliases (the same volume mounted at
//! another path, see `workspace_aliases`); relative ones are taken from
//! it. `..` is refused outright rather than resolved, and `.`/repeated
//! slashes are normalised. This is only the first line: symlinks are
//! handled inside the sandbox, where the kernel resolves them (see `files`).

/// Longest path accepted, in bytes (PATH_MAX).
pub const MAX_PATH_BYTES: usize = 4096;
/// Longest path component accepted, in bytes (NAME_MAX).
pub const MAX_COMPONENT_BYTES: usize = 255;

/// A normalised path inside the workspace, as components relative to it.
/// No component is empty, `.` or `..`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspacePath {
    components: Vec<String>,
}

/// Why a path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("the path is empty")]
    Empty,
    #[error("the path contains a NUL byte")]
    Nul,
    #[error("the path is longer than {MAX_PATH_BYTES} bytes")]
    TooLong,
    #[error("a path component is longer than {MAX_COMPONENT_BYTES} bytes")]
    ComponentTooLong,
    #[error("'..' is not allowed in paths")]
    ParentComponent,
    #[error("{0:?} is outside the workspace ({1})")]
    Outside(String, String),
}

impl WorkspacePath {
    /// Parses `input`, absolute under one of `dirs` (the workspace's
    /// spellings, canonical first) or relative to the workspace.
    pub fn parse(input: &str, dirs: &[&str]) -> Result<WorkspacePath, PathError> {
        if input.is_empty() {
            return Err(PathError::Empty);
        }
        if input.contains('\0') {
            return Err(PathError::Nul);
        }
        if input.len() > MAX_PATH_BYTES {
            return Err(PathError::TooLong);
        }
        let mut parts = Vec::new();
        for c in input.split('/') {
            match c {
                "" | "." => {}
                ".." => return Err(PathError::ParentComponent),
                c if c.len() > MAX_COMPONENT_BYTES => return Err(PathError::ComponentTooLong),
                c => parts.push(c),
            }
        }
        // Absolute paths must start with the components of one of the
        // workspace's spellings, whole: /workspacex is not under /workspace.
        let skip = if input.starts_with('/') {
            let under = dirs.iter().find_map(|dir| {
                let ws: Vec<&str> = dir.split('/').filter(|c| !c.is_empty()).collect();
                (parts.len() >= ws.len() && parts[..ws.len()] == ws[..]).then_some(ws.len())
            });
            match under {
                Some(n) => n,
                None => {
                    return Err(PathError::Outside(
                        input.to_string(),
                        dirs.iter()
                            .map(|d| d.trim_end_matches('/'))
                            .collect::<Vec<_>>()
                            .join(" or "),
                    ));
                }
            }
        } else {
            0
        };
        let components = parts[skip..].iter().map(|c| c.to_string()).collect();
        Ok(WorkspacePath { components })
    }

    /// The workspace directory itself.
    pub fn is_root(&self) -> bool {
        self.components.is_empty()
    }

    pub fn components(&self) -> &[String] {
        &self.components
    }

    /// Relative to the workspace, `""` for the root.
    pub fn relative(&self) -> String {
        self.components.join("/")
    }

    /// Absolute inside the sandbox.
    pub fn absolute(&self, workspace: &str) -> String {
        let ws = workspace.trim_end_matches('/');
        if self.is_root() {
            ws.to_string()
        } else {
            format!("{ws}/{}", self.relative())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const WS: &str = "/workspace";
    const DIRS: &[&str] = &["/workspace", "/vercel/sandbox/workspace"];

    fn rel(p: &str) -> Result<String, PathError> {
        WorkspacePath::parse(p, DIRS).map(|w| w.relative())
    }

    #[test]
    fn accepted_forms_normalise() {
        assert_eq!(rel("a.txt"), Ok("a.txt".into()));
        assert_eq!(rel("/workspace/a.txt"), Ok("a.txt".into()));
        assert_eq!(rel("/workspace"), Ok("".into()));
        assert_eq!(rel("/workspace/"), Ok("".into()));
        assert_eq!(rel("."), Ok("".into()));
        assert_eq!(rel("a//b/./c/"), Ok("a/b/c".into()));
        assert_eq!(rel("//workspace//x"), Ok("x".into()));
        assert_eq!(rel("/workspace/./x"), Ok("x".into()));
        for ok in ["a..b.txt", ".env", "...", "..a", "a..", "dir/.hidden"] {
            assert_eq!(rel(ok), Ok(ok.to_string()), "{ok}");
        }
        assert_eq!(
            WorkspacePath::parse("x/y", &["/vercel/sandbox/workspace"])
                .map(|p| p.absolute("/vercel/sandbox/workspace")),
            Ok("/vercel/sandbox/workspace/x/y".into())
        );
    }

    #[test]
    fn both_spellings_name_the_same_path_reported_canonically() {
        assert_eq!(rel("/vercel/sandbox/workspace/a/b"), Ok("a/b".into()));
        assert_eq!(rel("/vercel/sandbox/workspace"), Ok("".into()));
        assert_eq!(
            WorkspacePath::parse("/vercel/sandbox/workspace/x", DIRS).map(|p| p.absolute(WS)),
            Ok("/workspace/x".into())
        );
        assert!(matches!(
            rel("/vercel/sandbox"),
            Err(PathError::Outside(..))
        ));
        assert!(matches!(
            rel("/vercel/sandbox/workspacex"),
            Err(PathError::Outside(..))
        ));
        assert_eq!(
            rel("/vercel/sandbox/workspace/../x"),
            Err(PathError::ParentComponent)
        );
        assert!(
            matches!(
                WorkspacePath::parse("/vercel/sandbox/workspace/a", &[WS]),
                Err(PathError::Outside(..))
            ),
            "without the alias it is outside"
        );
    }

    #[test]
    fn refused_forms() {
        assert_eq!(rel(""), Err(PathError::Empty));
        assert_eq!(rel("a\0b"), Err(PathError::Nul));
        assert_eq!(rel(".."), Err(PathError::ParentComponent));
        assert_eq!(rel("a/../b"), Err(PathError::ParentComponent));
        assert_eq!(rel("/workspace/../etc"), Err(PathError::ParentComponent));
        assert!(matches!(rel("/etc/passwd"), Err(PathError::Outside(..))));
        assert!(matches!(rel("/workspacex/a"), Err(PathError::Outside(..))));
        assert!(matches!(rel("/"), Err(PathError::Outside(..))));
        assert_eq!(rel(&"a/".repeat(2049)), Err(PathError::TooLong));
        assert_eq!(rel(&"n".repeat(256)), Err(PathError::ComponentTooLong));
        assert_eq!(rel(&"n".repeat(255)), Ok("n".repeat(255)));
    }

    proptest! {
        #[test]
        fn never_escapes(input in "[a-z./\\\\]{0,40}") {
            if let Ok(p) = WorkspacePath::parse(&input, DIRS) {
                for c in p.components() {
                    prop_assert!(!c.is_empty() && c != "." && c != "..");
                    prop_assert!(!c.contains('/'));
                }
                let abs = p.absolute(WS);
                prop_assert!(abs == WS || abs.starts_with("/workspace/"));
                // Normalisation is idempotent.
                prop_assert_eq!(WorkspacePath::parse(&abs, DIRS), Ok(p));
            }
        }
    }
}
