//! Packs: the store's small objects, many to a file. A checkpoint of a
//! `node_modules`-shaped tree stores thousands of files of a few KiB; as
//! a file each, creating and renaming them cost ten times what reading
//! and hashing them did (profiled: 20,000 objects, 3.8 s of a 4.6 s
//! checkpoint; 0.4 s as packs). A pack is written once, whole, and never
//! changed: `packs/NAME.pack` holds the contents back to back and
//! `packs/NAME.idx` a line per object, `SHA256 OFFSET SIZE`.
//!
//! The store is sandboxd's own, out of every sandbox's reach, but a crash
//! can cut a pack short, so an index is read defensively: a line that
//! does not parse ends it, and one that points past its pack's end is
//! dropped. A pack without its index, or an index without its pack, is
//! swept by [`Packs::collect`]. An object that two packs hold (a repack
//! cut short) is read from the first by name; the other counts it dead.
//!
//! Deleting checkpoints leaves dead objects in packs: [`Packs::collect`]
//! removes a pack with none alive, and rewrites the live objects of one
//! less than half alive into a new pack, made durable before the old one
//! goes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::store_files::{StoreError, StoreResult, failed, plain, start_writeback, sync_dir};

const PACK: &str = "pack";
const INDEX: &str = "idx";

/// Where an object is: its pack and its bytes there.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Location {
    pack: Arc<str>,
    offset: u64,
    size: u64,
}

/// One pack: its file's bytes and what its index lists.
#[derive(Debug)]
struct Pack {
    bytes: u64,
    listed: Vec<(String, u64)>,
}

/// A store's packs' indexes, loaded on first use (`None` before), kept
/// from one operation to the next (see [`super::recent`]): every change
/// of its packs is made through them.
pub(super) type LoadedPacks = std::sync::Arc<std::sync::Mutex<Option<Packs>>>;

/// The packs of one store, their indexes loaded.
#[derive(Debug)]
pub(super) struct Packs {
    dir: PathBuf,
    packs: BTreeMap<Arc<str>, Pack>,
    /// Each object's first holder.
    objects: HashMap<String, Location>,
    /// Files of `dir` that are not half of a pack and its index.
    stray: Vec<PathBuf>,
}

/// An index's lines as (hash, offset, size), up to the first that does
/// not parse; a last line without its newline is a write cut short.
fn parse_index(bytes: &[u8]) -> Vec<(String, u64, u64)> {
    let mut out = Vec::new();
    let mut lines = bytes.split_inclusive(|b| *b == b'\n');
    while let Some(line) = lines.next().and_then(|l| l.strip_suffix(b"\n")) {
        let Ok(line) = std::str::from_utf8(line) else {
            break;
        };
        let mut parts = line.split(' ');
        let parsed = match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(sha), Some(offset), Some(size), None) if sha.len() == 64 && plain(sha) => offset
                .parse()
                .ok()
                .zip(size.parse().ok())
                .map(|(o, s)| (sha.to_string(), o, s)),
            _ => None,
        };
        match parsed {
            Some(record) => out.push(record),
            None => break,
        }
    }
    out
}

/// A pack's bytes and its index's, `None` when either is gone (removed
/// by a delete meanwhile).
fn read_pair(pack: &Path, index: &Path) -> StoreResult<Option<(u64, Vec<u8>)>> {
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    let bytes = match std::fs::metadata(pack) {
        Ok(m) => m.len(),
        Err(e) if gone(&e) => return Ok(None),
        Err(e) => return Err(failed("stat", pack, e)),
    };
    match std::fs::read(index) {
        Ok(text) => Ok(Some((bytes, text))),
        Err(e) if gone(&e) => Ok(None),
        Err(e) => Err(failed("read", index, e)),
    }
}

impl Packs {
    /// The packs in `dir` (none when it is missing).
    pub(super) fn load(dir: PathBuf) -> StoreResult<Packs> {
        let mut packs = Packs {
            dir,
            packs: BTreeMap::new(),
            objects: HashMap::new(),
            stray: Vec::new(),
        };
        let listing = match std::fs::read_dir(&packs.dir) {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(packs),
            Err(e) => return Err(failed("list", &packs.dir, e)),
        };
        let mut names: BTreeMap<String, (bool, bool)> = BTreeMap::new();
        for item in listing {
            let item = item.map_err(|e| failed("list", &packs.dir, e))?;
            let name = item.file_name();
            let pair = name
                .to_str()
                .and_then(|n| n.split_once('.'))
                .filter(|(stem, ext)| plain(stem) && (*ext == PACK || *ext == INDEX));
            match pair {
                Some((stem, ext)) => {
                    let seen = names.entry(stem.to_string()).or_default();
                    if ext == PACK {
                        seen.0 = true
                    } else {
                        seen.1 = true
                    }
                }
                None => packs.stray.push(item.path()),
            }
        }
        for (stem, seen) in names {
            if seen != (true, true) {
                packs
                    .stray
                    .push(packs.path(&stem, if seen.0 { PACK } else { INDEX }));
                continue;
            }
            let (pack_path, index_path) = (packs.path(&stem, PACK), packs.path(&stem, INDEX));
            let Some((bytes, text)) = read_pair(&pack_path, &index_path)? else {
                continue;
            };
            let name: Arc<str> = stem.into();
            let mut listed = Vec::new();
            for (sha256, offset, size) in parse_index(&text) {
                if offset.checked_add(size).is_none_or(|end| end > bytes) {
                    continue;
                }
                packs.objects.entry(sha256.clone()).or_insert(Location {
                    pack: Arc::clone(&name),
                    offset,
                    size,
                });
                listed.push((sha256, size));
            }
            packs.packs.insert(name, Pack { bytes, listed });
        }
        Ok(packs)
    }

    fn path(&self, name: &str, ext: &str) -> PathBuf {
        self.dir.join(format!("{name}.{ext}"))
    }

    /// Objects the packs hold.
    pub(super) fn len(&self) -> usize {
        self.objects.len()
    }

    /// Whether a pack holds object `sha256` of `size` bytes.
    pub(super) fn holds(&self, sha256: &str, size: u64) -> bool {
        self.objects.get(sha256).is_some_and(|at| at.size == size)
    }

    /// Object `sha256`, `None` when no pack holds it; an error when it is
    /// not `size` bytes, or its pack is gone (`NotFound`: a delete
    /// rewrote it since these indexes were loaded).
    pub(super) fn read(&self, sha256: &str, size: u64) -> Option<std::io::Result<Vec<u8>>> {
        let at = self.objects.get(sha256)?;
        Some(self.read_at(sha256, at, size))
    }

    fn read_at(&self, sha256: &str, at: &Location, size: u64) -> std::io::Result<Vec<u8>> {
        if at.size != size {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "object {sha256} holds {} bytes, its checkpoint says {size}",
                    at.size
                ),
            ));
        }
        // Within the pack's bytes: lines past its end were dropped.
        let len = usize::try_from(size).map_err(std::io::Error::other)?;
        let mut content = vec![0; len];
        File::open(self.path(&at.pack, PACK))?.read_exact_at(&mut content, at.offset)?;
        Ok(content)
    }

    /// Writes `objects` (hash, content; none a pack holds) as a new pack,
    /// synced to disk when `sync`: its two files. A failure leaves no
    /// file of it.
    pub(super) fn write(
        &mut self,
        objects: &[(String, &[u8])],
        sync: bool,
    ) -> StoreResult<[PathBuf; 2]> {
        let name: Arc<str> = crate::id::random_hex(12)
            .map_err(|e| StoreError(e.to_string()))?
            .into();
        let (pack_path, index_path) = (self.path(&name, PACK), self.path(&name, INDEX));
        let create = |path: &Path| {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map(|f| BufWriter::with_capacity(1 << 20, f))
                .map_err(|e| failed("create", path, e))
        };
        let written = (|| {
            let mut pack = create(&pack_path)?;
            let mut index = create(&index_path)?;
            let mut offset = 0u64;
            let mut listed = Vec::with_capacity(objects.len());
            for (sha256, content) in objects {
                pack.write_all(content)
                    .map_err(|e| failed("write", &pack_path, e))?;
                let size = content.len() as u64;
                writeln!(index, "{sha256} {offset} {size}")
                    .map_err(|e| failed("write", &index_path, e))?;
                listed.push((sha256.clone(), offset, size));
                offset += size;
            }
            for (file, path) in [(pack, &pack_path), (index, &index_path)] {
                let file = file
                    .into_inner()
                    .map_err(|e| failed("write", path, e.into_error()))?;
                if sync {
                    file.sync_all().map_err(|e| failed("sync", path, e))?;
                } else {
                    start_writeback(&file);
                }
            }
            if sync {
                sync_dir(&self.dir)?;
            }
            Ok((offset, listed))
        })();
        let (bytes, listed) = match written {
            Ok(w) => w,
            Err(e) => {
                let _ = std::fs::remove_file(&index_path);
                let _ = std::fs::remove_file(&pack_path);
                return Err(e);
            }
        };
        let mut names = Vec::with_capacity(listed.len());
        for (sha256, offset, size) in listed {
            self.objects.insert(
                sha256.clone(),
                Location {
                    pack: Arc::clone(&name),
                    offset,
                    size,
                },
            );
            names.push((sha256, size));
        }
        self.packs.insert(
            name,
            Pack {
                bytes,
                listed: names,
            },
        );
        Ok([pack_path, index_path])
    }

    /// Removes pack `name`, index first: what is left of a pack whose
    /// removal is cut short is a stray.
    fn remove(&mut self, name: &Arc<str>) -> StoreResult<()> {
        for ext in [INDEX, PACK] {
            let path = self.path(name, ext);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(failed("remove", &path, e)),
            }
        }
        if let Some(pack) = self.packs.remove(name) {
            for (sha256, _) in pack.listed {
                if self.objects.get(&sha256).is_some_and(|at| at.pack == *name) {
                    self.objects.remove(&sha256);
                }
            }
        }
        Ok(())
    }

    /// Removes the packs whose every object is one of `names` (the
    /// objects a refused checkpoint stored, which wrote those packs).
    pub(super) fn remove_all_of(&mut self, names: &HashSet<&str>) -> StoreResult<()> {
        let doomed: Vec<Arc<str>> = (self.packs.iter())
            .filter(|(_, p)| p.listed.iter().all(|(sha, _)| names.contains(sha.as_str())))
            .map(|(name, _)| Arc::clone(name))
            .collect();
        for name in &doomed {
            self.remove(name)?;
        }
        Ok(())
    }

    /// Keeps only the objects `named`: removes strays and packs with none
    /// of them, rewrites packs less than half alive. The packs' bytes
    /// left.
    pub(super) fn collect(&mut self, named: &HashSet<&str>) -> StoreResult<u64> {
        for path in std::mem::take(&mut self.stray) {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(failed("remove", &path, e)),
            }
        }
        let names: Vec<Arc<str>> = self.packs.keys().cloned().collect();
        for name in names {
            let Some(pack) = self.packs.get(&name) else {
                continue;
            };
            let live: Vec<(String, Location)> = (pack.listed.iter())
                .filter(|(sha, _)| named.contains(sha.as_str()))
                .filter_map(|(sha, _)| {
                    let at = self.objects.get(sha).filter(|at| at.pack == name)?;
                    Some((sha.clone(), at.clone()))
                })
                .collect();
            let live_bytes: u64 = live.iter().map(|(_, at)| at.size).sum();
            if !live.is_empty() && live_bytes.saturating_mul(2) >= pack.bytes {
                continue;
            }
            if !live.is_empty() {
                let mut contents = Vec::with_capacity(live.len());
                for (sha, at) in &live {
                    let content = self
                        .read_at(sha, at, at.size)
                        .map_err(|e| failed("read", &self.path(&name, PACK), e))?;
                    contents.push((sha.clone(), content));
                }
                for (sha, _) in &live {
                    self.objects.remove(sha);
                }
                let objects: Vec<(String, &[u8])> = contents
                    .iter()
                    .map(|(s, c)| (s.clone(), c.as_slice()))
                    .collect();
                // Durable before the old pack goes.
                self.write(&objects, true)?;
            }
            self.remove(&name)?;
        }
        Ok(self.packs.values().map(|p| p.bytes).sum())
    }
}

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};

    use super::*;
    use crate::checkpoints::store_files::{Scratch, hex};

    fn scratch() -> Scratch {
        Scratch::new("sandboxd-packs")
    }

    fn object(content: &[u8]) -> (String, &[u8]) {
        (hex(&Sha256::digest(content)), content)
    }

    fn files(dir: &Path) -> usize {
        std::fs::read_dir(dir).expect("list").count()
    }

    #[test]
    fn objects_written_as_a_pack_are_read_back_after_a_reload() {
        let tmp = scratch();
        let mut packs = Packs::load(tmp.0.clone()).expect("load");
        let (a, b) = (object(b"alpha"), object(b"beta!"));
        packs.write(&[a.clone(), b.clone()], false).expect("write");
        let packs = Packs::load(tmp.0.clone()).expect("reload");
        assert!(packs.holds(&a.0, 5) && packs.holds(&b.0, 5));
        assert!(!packs.holds(&a.0, 4), "held at another size");
        assert_eq!(packs.read(&b.0, 5).expect("held").expect("read"), b"beta!");
        assert!(
            packs.read(&b.0, 4).expect("held").is_err(),
            "a size that differs"
        );
        assert!(packs.read(&"0".repeat(64), 5).is_none());
        assert_eq!(files(&tmp.0), 2, "one pack, one index");
    }

    #[test]
    fn an_index_cut_short_or_pointing_past_its_pack_loses_only_those_objects() {
        let tmp = scratch();
        let mut packs = Packs::load(tmp.0.clone()).expect("load");
        let (a, b, c) = (object(b"one"), object(b"two"), object(b"three"));
        packs
            .write(&[a.clone(), b.clone(), c.clone()], false)
            .expect("write");
        let index = std::fs::read_dir(&tmp.0)
            .expect("list")
            .map(|e| e.expect("entry").path())
            .find(|p| p.extension().is_some_and(|e| e == INDEX))
            .expect("index");
        let text = std::fs::read_to_string(&index).expect("read");
        let lines: Vec<&str> = text.lines().collect();
        let whole = |line: &str| format!("{line}\n").into_bytes();
        let past = lines[1].replace(" 3 3", " 9 3");
        let cases = [
            (
                "c's line is whole but for its newline; b's points past the end",
                [whole(lines[0]), whole(&past), lines[2].as_bytes().to_vec()].concat(),
            ),
            (
                "c's line follows one that is not text",
                [whole(lines[0]), b"\xff\n".to_vec(), whole(lines[2])].concat(),
            ),
        ];
        for (what, text) in cases {
            std::fs::write(&index, text).expect("write");
            let packs = Packs::load(tmp.0.clone()).expect("reload");
            assert_eq!(packs.read(&a.0, 3).expect("held").expect("read"), b"one");
            assert!(!packs.holds(&b.0, 3) && !packs.holds(&c.0, 5), "{what}");
        }
    }

    #[test]
    fn collection_removes_dead_packs_and_strays_and_rewrites_sparse_ones() {
        let tmp = scratch();
        let mut packs = Packs::load(tmp.0.clone()).expect("load");
        let big = vec![7u8; 100];
        let (a, b, c, d) = (
            object(b"keep"),
            object(&big),
            object(b"gone"),
            object(b"also"),
        );
        packs.write(&[a.clone(), b.clone()], false).expect("write");
        packs.write(std::slice::from_ref(&c), false).expect("write");
        packs.write(std::slice::from_ref(&d), false).expect("write");
        std::fs::write(tmp.0.join("0123.pack"), b"half a pack").expect("stray");
        std::fs::write(tmp.0.join("junk"), b"?").expect("stray");
        let mut packs = Packs::load(tmp.0.clone()).expect("reload");
        let named: HashSet<&str> = [a.0.as_str(), d.0.as_str()].into();
        let bytes = packs.collect(&named).expect("collect");
        assert_eq!(bytes, 4 + 4, "a rewritten alone, d's pack kept whole");
        assert_eq!(files(&tmp.0), 4, "two packs and their indexes");
        let packs = Packs::load(tmp.0.clone()).expect("reload");
        assert_eq!(packs.read(&a.0, 4).expect("held").expect("read"), b"keep");
        assert_eq!(packs.read(&d.0, 4).expect("held").expect("read"), b"also");
        assert!(!packs.holds(&b.0, 100) && !packs.holds(&c.0, 4));
    }

    #[test]
    fn an_object_in_two_packs_is_read_from_one_and_collected_from_the_other() {
        let tmp = scratch();
        let mut packs = Packs::load(tmp.0.clone()).expect("load");
        let a = object(b"twice");
        packs.write(std::slice::from_ref(&a), false).expect("write");
        packs.objects.clear();
        packs
            .write(std::slice::from_ref(&a), false)
            .expect("write again");
        let mut packs = Packs::load(tmp.0.clone()).expect("reload");
        assert_eq!(packs.read(&a.0, 5).expect("held").expect("read"), b"twice");
        let named: HashSet<&str> = [a.0.as_str()].into();
        assert_eq!(packs.collect(&named).expect("collect"), 5, "one copy left");
        assert_eq!(files(&tmp.0), 2);
    }

    #[test]
    fn a_refused_checkpoints_packs_are_removed_whole() {
        let tmp = scratch();
        let mut packs = Packs::load(tmp.0.clone()).expect("load");
        let (a, b, c) = (object(b"old"), object(b"new1"), object(b"new2"));
        packs.write(std::slice::from_ref(&a), false).expect("write");
        packs.write(&[b.clone(), c.clone()], false).expect("write");
        let added: HashSet<&str> = [b.0.as_str(), c.0.as_str()].into();
        packs.remove_all_of(&added).expect("remove");
        assert!(packs.holds(&a.0, 3) && !packs.holds(&b.0, 4));
        assert_eq!(files(&tmp.0), 2);
    }
}
