//! [`Volume`]: one thin volume of a pool, served as a [`BlockTarget`];
//! [`SnapshotView`]: one of its snapshots, read-only.

use crate::engine::{Engine, HeldWrite, View};
use crate::StoreError;
use std::sync::Arc;
use trireme_types::{
    Attempt, BlockBuf, BlockStatusExtent, BlockTarget, SnapshotId, TargetError, VolumeId,
    VolumeName, ZeroFlags,
};

pub struct Volume {
    pub(crate) engine: Arc<Engine>,
    pub(crate) id: VolumeId,
    pub(crate) name: VolumeName,
}

impl Volume {
    pub fn id(&self) -> VolumeId {
        self.id
    }

    pub fn name(&self) -> &VolumeName {
        &self.name
    }

    /// Snapshot `id` of this volume: holds every write admitted
    /// (acknowledged) before the call and none after; returns once it is
    /// durable. Taken without copying data, in O(1) of the volume's size.
    pub fn snapshot(&self, id: SnapshotId) -> Result<(), StoreError> {
        self.engine.take_snapshot(self.id, &self.name, id)
    }

    /// A plain write that this thread puts in the journal itself when the
    /// pool's journal writer is idle, saving a thread hand-off: for callers
    /// that go on to [`Volume::sync_ahead`] or wait for a flush. Like every
    /// write here, `data` is kept as it is, shared with the caller.
    pub fn write_now(&self, offset: u64, data: Arc<BlockBuf>) -> Result<(), TargetError> {
        self.engine.write_now(self.id, offset, data)
    }

    /// [`Volume::write_now`] in two steps, for a caller that answers the
    /// write once it is admitted and only then writes it (see
    /// [`HeldWrite`]).
    pub fn admit_now(
        &self,
        offset: u64,
        data: Arc<BlockBuf>,
    ) -> Result<Option<HeldWrite<'_>>, TargetError> {
        self.engine.admit_now(self.id, offset, data)
    }

    /// [`Volume::admit_now`] for a caller that may hold admitted writes of
    /// this volume already (`held`): the write joins them when it can
    /// ([`HeldWrite::admit_also`]); otherwise they are written first and
    /// the write is admitted on its own, `held` then holding it if this
    /// thread is to write it. Admitted when this returns `Ok`. An error
    /// writing the held ones (the pool has failed) is this write's error.
    pub fn admit_joining<'a>(
        &'a self,
        held: &mut Option<HeldWrite<'a>>,
        offset: u64,
        data: Arc<BlockBuf>,
    ) -> Result<(), TargetError> {
        let data = match held.as_mut() {
            Some(gathering) => match gathering.admit_also(offset, data)? {
                None => return Ok(()),
                Some(data) => data,
            },
            None => data,
        };
        if let Some(gathering) = held.take() {
            gathering.finish()?;
        }
        *held = self.admit_now(offset, data)?;
        Ok(())
    }

    /// [`BlockTarget::write`] of data the caller shares: a replicated
    /// write's primary keeps its payload to send it again, and the store
    /// keeps the same buffer instead of a copy.
    pub fn write_shared(
        &self,
        offset: u64,
        data: Arc<BlockBuf>,
        fua: bool,
    ) -> Result<(), TargetError> {
        self.engine.write(self.id, offset, data, fua)
    }

    /// [`BlockTarget::try_write`] of data the caller shares (see
    /// [`Volume::write_shared`]).
    pub fn try_write_shared(&self, offset: u64, data: Arc<BlockBuf>) -> Attempt<(), Arc<BlockBuf>> {
        self.engine.try_write(self.id, offset, data)
    }

    /// A flush that needs no waiting: `Done` when every write completed
    /// before it is durable already (an eager device flush got there
    /// first), `WouldBlock` when [`BlockTarget::flush`] would have to wait.
    pub fn try_flush(&self) -> Attempt<(), ()> {
        self.engine.try_flush(self.id)
    }

    /// While clients flush often, makes what is written durable now, on
    /// this thread, so that the flush that follows finds it done. Does
    /// nothing otherwise.
    pub fn sync_ahead(&self) {
        self.engine.sync_ahead()
    }
}

/// A snapshot, read-only. Reads cost one in-memory lookup per newer
/// snapshot per 64 KiB chunk on top of a volume read.
pub struct SnapshotView {
    pub(crate) engine: Arc<Engine>,
    pub(crate) volume: VolumeId,
    pub(crate) volume_name: VolumeName,
    pub(crate) id: SnapshotId,
    pub(crate) size_bytes: u64,
}

impl SnapshotView {
    pub fn id(&self) -> SnapshotId {
        self.id
    }

    pub fn volume_name(&self) -> &VolumeName {
        &self.volume_name
    }
}

impl BlockTarget for SnapshotView {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_only(&self) -> bool {
        true
    }

    fn read(&self, offset: u64, buffer: &mut [u8]) -> Result<(), TargetError> {
        self.engine
            .read_view(self.volume, View::Snapshot(self.id), offset, buffer)
    }

    fn try_read(&self, offset: u64, buffer: &mut [u8]) -> Option<Result<(), TargetError>> {
        self.engine
            .try_read_view(self.volume, View::Snapshot(self.id), offset, buffer)
    }

    fn write(&self, _offset: u64, _data: BlockBuf, _fua: bool) -> Result<(), TargetError> {
        Err(TargetError::ReadOnly)
    }

    fn flush(&self) -> Result<(), TargetError> {
        // Nothing to make durable: a snapshot is durable once taken.
        self.engine.lock().check_usable()
    }

    fn trim(&self, _offset: u64, _length: u64, _fua: bool) -> Result<(), TargetError> {
        Err(TargetError::ReadOnly)
    }

    fn write_zeroes(
        &self,
        _offset: u64,
        _length: u64,
        _flags: ZeroFlags,
    ) -> Result<(), TargetError> {
        Err(TargetError::ReadOnly)
    }

    fn block_status(
        &self,
        offset: u64,
        length: u64,
    ) -> Result<Vec<BlockStatusExtent>, TargetError> {
        self.engine
            .block_status_view(self.volume, View::Snapshot(self.id), offset, length)
    }
}

impl BlockTarget for Volume {
    fn size_bytes(&self) -> u64 {
        let state = self.engine.lock();
        state
            .live_volume(self.id)
            .map_or(0, |volume| volume.record.size_bytes)
    }

    fn read(&self, offset: u64, buffer: &mut [u8]) -> Result<(), TargetError> {
        self.engine.read(self.id, offset, buffer)
    }

    fn write(&self, offset: u64, data: BlockBuf, fua: bool) -> Result<(), TargetError> {
        self.write_shared(offset, Arc::new(data), fua)
    }

    fn try_write(&self, offset: u64, data: BlockBuf) -> Attempt<(), BlockBuf> {
        match self.try_write_shared(offset, Arc::new(data)) {
            Attempt::Done(result) => Attempt::Done(result),
            // Handed back untouched: this is the only reference.
            Attempt::WouldBlock(data) => Attempt::WouldBlock(
                Arc::try_unwrap(data).unwrap_or_else(|shared| BlockBuf::clone(&shared)),
            ),
        }
    }

    fn try_read(&self, offset: u64, buffer: &mut [u8]) -> Option<Result<(), TargetError>> {
        self.engine.try_read(self.id, offset, buffer)
    }

    fn flush(&self) -> Result<(), TargetError> {
        self.engine.lock().live_volume(self.id)?;
        self.engine.flush(self.id)
    }

    fn trim(&self, offset: u64, length: u64, fua: bool) -> Result<(), TargetError> {
        self.engine.zero(self.id, offset, length, fua, true)
    }

    fn write_zeroes(&self, offset: u64, length: u64, flags: ZeroFlags) -> Result<(), TargetError> {
        if !flags.no_hole {
            return self.engine.zero(self.id, offset, length, flags.fua, false);
        }
        if flags.fast_zero {
            return Err(TargetError::NotSupported(
                "zeroes that stay allocated (NO_HOLE) are written block by block, which is not fast".into(),
            ));
        }
        self.engine
            .zero_allocated(self.id, offset, length, flags.fua)
    }

    fn block_status(
        &self,
        offset: u64,
        length: u64,
    ) -> Result<Vec<BlockStatusExtent>, TargetError> {
        self.engine.block_status(self.id, offset, length)
    }
}
