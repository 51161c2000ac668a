//! File operations confined to the workspace (being ported from helper.py).

use sandboxd_proto::{DirEntry, Failure, FailureKind, NewFile};

/// The workspace and its spellings.
#[derive(Debug)]
pub(crate) struct Workspace {
    dirs: Vec<String>,
}

impl Workspace {
    pub(crate) fn new(dirs: Vec<String>) -> Workspace {
        Workspace { dirs }
    }

    pub(crate) fn read_file(&self, _path: &str, _max_bytes: u64) -> Result<Vec<u8>, Failure> {
        Err(self.todo())
    }

    pub(crate) fn write_files(&self, _files: Vec<NewFile>) -> Result<(), Failure> {
        Err(self.todo())
    }

    pub(crate) fn list_dir(&self, _path: &str) -> Result<Vec<DirEntry>, Failure> {
        Err(self.todo())
    }

    pub(crate) fn delete(&self, _paths: &[String], _recursive: bool) -> Result<(), Failure> {
        Err(self.todo())
    }

    fn todo(&self) -> Failure {
        Failure::new(FailureKind::Other, format!("not yet: {:?}", self.dirs))
    }
}
