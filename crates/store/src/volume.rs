//! [`Volume`]: one thin volume of a pool, served as a [`BlockTarget`].

use crate::engine::Engine;
use std::sync::Arc;
use trireme_types::{
    Attempt, BlockStatusExtent, BlockTarget, TargetError, VolumeId, VolumeName, ZeroFlags,
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

    fn write(&self, offset: u64, data: Vec<u8>, fua: bool) -> Result<(), TargetError> {
        self.engine.write(self.id, offset, data, fua)
    }

    fn try_write(&self, offset: u64, data: Vec<u8>) -> Attempt<(), Vec<u8>> {
        self.engine.try_write(self.id, offset, data)
    }

    fn try_read(&self, offset: u64, buffer: &mut [u8]) -> Option<Result<(), TargetError>> {
        self.engine.try_read(self.id, offset, buffer)
    }

    fn flush(&self) -> Result<(), TargetError> {
        self.engine.lock().live_volume(self.id)?;
        self.engine.flush()
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
