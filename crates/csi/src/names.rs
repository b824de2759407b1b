//! CSI names and ids to trireme names and back.
//!
//! A CSI volume id is the trireme volume's name, so an operator reads
//! `kubectl get pv` and `trireme volume list` side by side. CSI names may
//! be 128 bytes of any characters; trireme names are at most 63 bytes of
//! letters, digits, `-`, `_` and `.`. A CSI name that is already a valid
//! trireme name is used as it is; any other gets `csi-` and a hash of it,
//! the same for the same name every time, so a repeated CreateVolume
//! finds the volume the first one made.
//!
//! A snapshot id is `VOLUME@SNAPSHOT`: `@` is never in a trireme name.

use sha2::{Digest, Sha256};

/// trireme's limit on any name (`NAME_MAX_BYTES` in trireme-types).
pub const NAME_MAX_BYTES: usize = 63;

pub fn is_trireme_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= NAME_MAX_BYTES
        && name.chars().enumerate().all(|(index, character)| {
            character.is_ascii_alphanumeric() || (index > 0 && matches!(character, '-' | '_' | '.'))
        })
}

/// The trireme name a CSI `name` maps to.
pub fn trireme_name(csi_name: &str) -> String {
    if is_trireme_name(csi_name) {
        return csi_name.to_string();
    }
    let digest = Sha256::digest(csi_name.as_bytes());
    format!("csi-{}", &hex::encode(digest)[..40])
}

/// A snapshot's CSI id.
pub fn snapshot_id(volume: &str, snapshot: &str) -> String {
    format!("{volume}@{snapshot}")
}

/// `(volume, snapshot)` of a snapshot id; `None` when it is not one this
/// driver made (which callers answer as "not found").
pub fn parse_snapshot_id(id: &str) -> Option<(&str, &str)> {
    let (volume, snapshot) = id.split_once('@')?;
    (is_trireme_name(volume) && is_trireme_name(snapshot)).then_some((volume, snapshot))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_names_stay_and_others_hash_to_a_valid_stable_name() {
        assert_eq!(trireme_name("pvc-1234-abcd"), "pvc-1234-abcd");
        let long = "x".repeat(128);
        let mapped = trireme_name(&long);
        assert!(is_trireme_name(&mapped), "{mapped}");
        assert_eq!(mapped, trireme_name(&long));
        assert_ne!(mapped, trireme_name(&"y".repeat(128)));
        assert!(is_trireme_name(&trireme_name("a/b c")));
        assert!(is_trireme_name(&trireme_name("-leading-dash")));
    }

    #[test]
    fn snapshot_ids_round_trip_and_foreign_ids_do_not_parse() {
        let id = snapshot_id("vol", "snap");
        assert_eq!(parse_snapshot_id(&id), Some(("vol", "snap")));
        assert_eq!(parse_snapshot_id("no-at-sign"), None);
        assert_eq!(parse_snapshot_id("a@b@c"), None);
        assert_eq!(parse_snapshot_id("@b"), None);
    }
}
