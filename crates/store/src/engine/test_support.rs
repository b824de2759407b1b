//! What the engine's unit tests share: a small pool in a temporary
//! directory, buffers, waiting for the background threads, and the files a
//! crash would leave. (Integration tests have `tests/common`, which unit
//! tests cannot reach.)

use crate::{Pool, PoolConfig, Volume};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use trireme_types::{BlockBuf, DeviceClass, PoolId, PoolName};

pub(super) const MIB: u64 = 1 << 20;

/// A sparse 64 MiB pool file and its metadata, in `dir`.
pub(super) fn pool_config(dir: &Path) -> PoolConfig {
    PoolConfig {
        name: PoolName::new("test").unwrap(),
        id: PoolId(1),
        class: DeviceClass::Ssd,
        device_path: dir.join("pool.img"),
        metadata_path: dir.join("meta/metadata.redb"),
        size_bytes: Some(64 * MIB),
        preallocate: false,
        force: false,
    }
}

/// [`pool_config`]'s pool, created, with its background threads.
pub(super) fn test_pool(dir: &Path) -> Arc<Pool> {
    Pool::create(pool_config(dir)).unwrap()
}

/// `bytes` bytes of `seed`.
pub(super) fn filled(seed: u8, bytes: u64) -> Arc<BlockBuf> {
    Arc::new(vec![seed; bytes as usize].into())
}

/// Polls until `done` holds, failing after 10 s: the background threads
/// get there in their own time.
pub(super) fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The physical chunk behind `volume`'s chunk `chunk` (mapped).
pub(super) fn physical(volume: &Volume, chunk: u64) -> u32 {
    let state = volume.engine.lock();
    state.volumes[&volume.id]
        .map
        .get(chunk)
        .expect("mapped")
        .physical
}

/// What a crash would leave of the pool in `dir`: its files copied into a
/// new directory while no apply pass or checkpoint runs (the journal
/// writer goes on), with `damage` applied to the copy's directory before
/// it is opened again (replay).
pub(super) fn crash_copy(
    pool: &Pool,
    dir: &Path,
    damage: impl FnOnce(&Path),
) -> (tempfile::TempDir, Arc<Pool>) {
    let copy = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(copy.path().join("meta")).unwrap();
    pool.while_quiesced(|| {
        for file in ["pool.img", "meta/metadata.redb"] {
            std::fs::copy(dir.join(file), copy.path().join(file)).unwrap();
        }
    });
    damage(copy.path());
    let crashed = Pool::open(
        &copy.path().join("pool.img"),
        &copy.path().join("meta/metadata.redb"),
    )
    .unwrap();
    (copy, crashed)
}
