#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use trireme_store::{Pool, PoolConfig};
use trireme_types::{DeviceClass, PoolId, PoolName, VolumeName};

pub struct TestPool {
    pub dir: tempfile::TempDir,
    pub pool: Arc<Pool>,
}

impl TestPool {
    pub fn create(size_bytes: u64) -> TestPool {
        let dir = tempfile::tempdir().expect("temp dir");
        let pool = Pool::create(config(dir.path(), size_bytes)).expect("create pool");
        TestPool { dir, pool }
    }

    pub fn device(&self) -> PathBuf {
        self.dir.path().join("pool.img")
    }

    pub fn metadata(&self) -> PathBuf {
        self.dir.path().join("meta/metadata.redb")
    }

    /// Clean restart: shut down, open again.
    pub fn reopen(self) -> TestPool {
        let TestPool { dir, pool } = self;
        pool.shutdown().expect("shutdown");
        drop(pool);
        let pool = Pool::open(
            &dir.path().join("pool.img"),
            &dir.path().join("meta/metadata.redb"),
        )
        .expect("reopen");
        TestPool { dir, pool }
    }

    /// What a crash of the process leaves: the files as they are now
    /// (unflushed data included, as the page cache outlives the process),
    /// copied aside and opened while the original keeps running.
    pub fn crash_copy(&self) -> (tempfile::TempDir, Arc<Pool>) {
        let copy = self.crash_files();
        let pool = Pool::open(
            &copy.path().join("pool.img"),
            &copy.path().join("meta/metadata.redb"),
        )
        .expect("open crash copy");
        (copy, pool)
    }

    /// The files of [`TestPool::crash_copy`], not yet opened.
    pub fn crash_files(&self) -> tempfile::TempDir {
        let copy = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(copy.path().join("meta")).unwrap();
        self.pool.while_quiesced(|| {
            std::fs::copy(self.metadata(), copy.path().join("meta/metadata.redb")).unwrap();
            std::fs::copy(self.device(), copy.path().join("pool.img")).unwrap();
        });
        copy
    }
}

pub fn config(dir: &Path, size_bytes: u64) -> PoolConfig {
    PoolConfig {
        name: PoolName::new("test").unwrap(),
        id: PoolId(1),
        class: DeviceClass::Ssd,
        device_path: dir.join("pool.img"),
        metadata_path: dir.join("meta/metadata.redb"),
        size_bytes: Some(size_bytes),
        preallocate: false,
        force: false,
    }
}

pub fn name(text: &str) -> VolumeName {
    VolumeName::new(text).unwrap()
}

pub fn pattern(seed: u64, length: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}
