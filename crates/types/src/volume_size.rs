//! The sizes a volume may have, checked in one place: by the REST API
//! before a request goes anywhere, and by the control plane's state machine
//! before a create or a grow is committed. A size the store would refuse
//! must never reach the replicas: a grow they all refuse leaves the volume
//! failed on every node.

use serde::{Deserialize, Serialize};

use crate::BLOCK_SIZE;

/// The largest volume: 1 PiB. The store keeps a volume's chunk map in
/// memory, and this bound keeps the map of a fully written volume within
/// what one node can hold; the store refuses larger volumes too.
pub const VOLUME_MAX_BYTES: u64 = 1 << 50;

/// Why a volume size is refused. The text names the field the REST API
/// takes (`size_bytes`), the value and what would be accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum VolumeSizeError {
    #[error("size_bytes must be greater than 0")]
    Zero,
    #[error(
        "size_bytes {size_bytes} is larger than the largest volume, {maximum_bytes} bytes (1 PiB)"
    )]
    TooLarge { size_bytes: u64, maximum_bytes: u64 },
    #[error("size_bytes {size_bytes} is not a multiple of {BLOCK_SIZE} (4 KiB): {advice}")]
    Unaligned { size_bytes: u64, advice: String },
}

/// Checks a size for a new or grown volume: above 0, at most
/// [`VOLUME_MAX_BYTES`], a whole number of 4 KiB blocks.
pub fn check_volume_size(size_bytes: u64) -> Result<u64, VolumeSizeError> {
    if size_bytes == 0 {
        return Err(VolumeSizeError::Zero);
    }
    if size_bytes > VOLUME_MAX_BYTES {
        return Err(VolumeSizeError::TooLarge {
            size_bytes,
            maximum_bytes: VOLUME_MAX_BYTES,
        });
    }
    if !size_bytes.is_multiple_of(BLOCK_SIZE) {
        // Below the maximum, rounding up cannot overflow.
        let rounded_up = size_bytes.div_ceil(BLOCK_SIZE) * BLOCK_SIZE;
        return Err(VolumeSizeError::Unaligned {
            size_bytes,
            advice: format!("round it up to {rounded_up}"),
        });
    }
    Ok(size_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_outside_the_limits_are_refused_with_the_limit() {
        assert_eq!(check_volume_size(0), Err(VolumeSizeError::Zero));
        assert_eq!(check_volume_size(4096), Ok(4096));
        assert_eq!(check_volume_size(VOLUME_MAX_BYTES), Ok(VOLUME_MAX_BYTES));
        for size_bytes in [VOLUME_MAX_BYTES + 4096, 2 << 50, 1 << 63, u64::MAX] {
            let error = check_volume_size(size_bytes).unwrap_err();
            assert_eq!(
                error,
                VolumeSizeError::TooLarge {
                    size_bytes,
                    maximum_bytes: VOLUME_MAX_BYTES
                }
            );
            assert!(
                error.to_string().contains("1125899906842624 bytes (1 PiB)"),
                "{error}"
            );
        }
        assert_eq!(
            check_volume_size(4097).unwrap_err().to_string(),
            "size_bytes 4097 is not a multiple of 4096 (4 KiB): round it up to 8192"
        );
    }
}
