//! The pool catalog: which pools this node has and where they live.
//!
//! One small JSON file, `DATA/catalog.json`, rewritten whole on every change.
//! A crash must leave either the old or the new catalog, never a torn one, so
//! a change is: write `catalog.json.tmp`, fsync it, rename it over
//! `catalog.json`, fsync the directory (which makes the rename durable).

use serde::{Deserialize, Serialize};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use trireme_types::{DeviceClass, PoolId, PoolName};

use crate::NodeError;

pub const CATALOG_FILE: &str = "catalog.json";
const CATALOG_TEMP_FILE: &str = "catalog.json.tmp";
/// Bumped when the catalog's fields change in a way old readers cannot follow.
pub const CATALOG_FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolRecord {
    pub name: PoolName,
    pub id: PoolId,
    pub class: DeviceClass,
    pub device_path: PathBuf,
    pub metadata_path: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalog {
    pub format_version: u32,
    /// The id the next pool gets; ids are never reused after a deletion.
    pub next_pool_id: u64,
    pub pools: Vec<PoolRecord>,
}

impl Default for Catalog {
    fn default() -> Self {
        Catalog {
            format_version: CATALOG_FORMAT_VERSION,
            next_pool_id: 1,
            pools: Vec::new(),
        }
    }
}

impl Catalog {
    /// Reads `DATA/catalog.json`; a missing file is an empty catalog (first start).
    pub fn load(data_dir: &Path) -> Result<Catalog, NodeError> {
        let path = data_dir.join(CATALOG_FILE);
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Catalog::default())
            }
            Err(error) => return Err(NodeError::io(format!("read {}", path.display()), error)),
        };
        let catalog: Catalog = serde_json::from_str(&text).map_err(|error| {
            NodeError::Internal(format!("catalog {} is damaged: {error}", path.display()))
        })?;
        if catalog.format_version != CATALOG_FORMAT_VERSION {
            return Err(NodeError::Internal(format!(
                "catalog {} has format version {}; this trireme reads version {CATALOG_FORMAT_VERSION}",
                path.display(),
                catalog.format_version
            )));
        }
        Ok(catalog)
    }

    /// Replaces `DATA/catalog.json` atomically and durably.
    pub fn save(&self, data_dir: &Path) -> Result<(), NodeError> {
        let temp_path = data_dir.join(CATALOG_TEMP_FILE);
        let final_path = data_dir.join(CATALOG_FILE);
        let text = serde_json::to_vec_pretty(self)
            .map_err(|error| NodeError::Internal(format!("cannot encode the catalog: {error}")))?;
        let write = |path: &Path| -> std::io::Result<()> {
            let mut file = File::create(path)?;
            file.write_all(&text)?;
            file.sync_all()
        };
        write(&temp_path)
            .map_err(|error| NodeError::io(format!("write {}", temp_path.display()), error))?;
        fs::rename(&temp_path, &final_path)
            .map_err(|error| NodeError::io(format!("rename {}", temp_path.display()), error))?;
        File::open(data_dir)
            .and_then(|directory| directory.sync_all())
            .map_err(|error| NodeError::io(format!("fsync {}", data_dir.display()), error))
    }

    pub fn find(&self, name: &PoolName) -> Option<&PoolRecord> {
        self.pools.iter().find(|record| &record.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_catalog_is_empty_and_saves_round_trip() {
        let directory = tempfile::tempdir().unwrap();
        let mut catalog = Catalog::load(directory.path()).unwrap();
        assert_eq!(catalog, Catalog::default());
        catalog.pools.push(PoolRecord {
            name: PoolName::new("fast").unwrap(),
            id: PoolId(1),
            class: DeviceClass::Nvme,
            device_path: "/dev/nvme0n1".into(),
            metadata_path: directory.path().join("pools/fast/metadata.redb"),
        });
        catalog.next_pool_id = 2;
        catalog.save(directory.path()).unwrap();
        assert_eq!(Catalog::load(directory.path()).unwrap(), catalog);
        assert!(!directory.path().join(CATALOG_TEMP_FILE).exists());
    }

    #[test]
    fn damaged_catalog_is_an_error_not_an_empty_one() {
        let directory = tempfile::tempdir().unwrap();
        fs::write(directory.path().join(CATALOG_FILE), b"{ not json").unwrap();
        assert!(Catalog::load(directory.path()).is_err());
    }
}
