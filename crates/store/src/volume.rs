//! [`Volume`]: one thin volume of a pool, served as a [`BlockTarget`].

use trireme_types::{BlockStatusExtent, BlockTarget, TargetError, ZeroFlags};

pub struct Volume {
    _private: (),
}

impl BlockTarget for Volume {
    fn size_bytes(&self) -> u64 {
        todo!()
    }
    fn read(&self, offset: u64, buffer: &mut [u8]) -> Result<(), TargetError> {
        let _ = (offset, buffer);
        todo!()
    }
    fn write(&self, offset: u64, data: Vec<u8>, fua: bool) -> Result<(), TargetError> {
        let _ = (offset, data, fua);
        todo!()
    }
    fn flush(&self) -> Result<(), TargetError> {
        todo!()
    }
    fn trim(&self, offset: u64, length: u64, fua: bool) -> Result<(), TargetError> {
        let _ = (offset, length, fua);
        todo!()
    }
    fn write_zeroes(&self, offset: u64, length: u64, flags: ZeroFlags) -> Result<(), TargetError> {
        let _ = (offset, length, flags);
        todo!()
    }
    fn block_status(&self, offset: u64, length: u64) -> Result<Vec<BlockStatusExtent>, TargetError> {
        let _ = (offset, length);
        todo!()
    }
}
