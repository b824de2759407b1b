//! Typed identifiers and validated names.
//!
//! Ids are what the store and the wire use; names are what people type.
//! A name is checked once, when it enters the system, and is a valid
//! `NameBuf` from then on.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub u64);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

id_type!(
    /// A volume's identity inside one pool; never reused after deletion.
    VolumeId
);
id_type!(
    /// A pool's identity on one node; never reused after deletion.
    PoolId
);
id_type!(
    /// A node's identity in its cluster: its Raft id, given at join and never
    /// reused.
    NodeId
);

id_type!(
    /// A volume's data-history id. It moves forward at each promotion
    /// (`volume attach` with no other primary, or a primary's restart);
    /// replicas refuse writes from an older one, which fences a cut-off
    /// former primary.
    Generation
);

id_type!(
    /// A snapshot's identity in its cluster: given by the control plane
    /// when the snapshot is created, the same on every replica, never
    /// reused.
    SnapshotId
);

impl Generation {
    pub fn next(self) -> Generation {
        Generation(self.0 + 1)
    }
}

/// The longest name accepted for a pool or a volume. NBD export names and
/// file-system paths stay short and printable with this bound.
pub const NAME_MAX_BYTES: usize = 63;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("{kind} name is empty")]
    Empty { kind: &'static str },
    #[error("{kind} name '{name}' is longer than {NAME_MAX_BYTES} bytes")]
    TooLong { kind: &'static str, name: String },
    #[error(
        "{kind} name '{name}' has '{character}': use letters, digits, '-', '_' and '.', starting with a letter or digit"
    )]
    BadCharacter {
        kind: &'static str,
        name: String,
        character: char,
    },
}

fn validate_name(kind: &'static str, name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty { kind });
    }
    if name.len() > NAME_MAX_BYTES {
        return Err(NameError::TooLong {
            kind,
            name: name.to_string(),
        });
    }
    for (index, character) in name.chars().enumerate() {
        let allowed = character.is_ascii_alphanumeric()
            || (index > 0 && matches!(character, '-' | '_' | '.'));
        if !allowed {
            return Err(NameError::BadCharacter {
                kind,
                name: name.to_string(),
                character,
            });
        }
    }
    Ok(())
}

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            pub fn new(name: impl Into<String>) -> Result<Self, NameError> {
                let name = name.into();
                validate_name($kind, &name)?;
                Ok(Self(name))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = NameError;
            fn try_from(name: String) -> Result<Self, NameError> {
                Self::new(name)
            }
        }

        impl From<$name> for String {
            fn from(name: $name) -> String {
                name.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = NameError;
            fn from_str(name: &str) -> Result<Self, NameError> {
                Self::new(name)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

name_type!(
    /// A volume's name: also its NBD export name.
    VolumeName,
    "volume"
);
name_type!(
    /// A storage pool's name, unique on its node.
    PoolName,
    "pool"
);
name_type!(
    /// A node's name, unique in its cluster (the host name by default).
    NodeName,
    "node"
);
name_type!(
    /// A resource group's name: the template a volume is placed by.
    GroupName,
    "resource group"
);
name_type!(
    /// A snapshot's name, unique among its volume's snapshots. The NBD
    /// export of a snapshot is `VOLUME@SNAPSHOT`.
    SnapshotName,
    "snapshot"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(VolumeName::new("demo").is_ok());
        assert!(VolumeName::new("vm-101-disk.0_a").is_ok());
        assert!(matches!(VolumeName::new(""), Err(NameError::Empty { .. })));
        assert!(matches!(
            VolumeName::new("-x"),
            Err(NameError::BadCharacter { character: '-', .. })
        ));
        assert!(matches!(
            VolumeName::new("a/b"),
            Err(NameError::BadCharacter { character: '/', .. })
        ));
        assert!(matches!(
            PoolName::new("x".repeat(64)),
            Err(NameError::TooLong { .. })
        ));
        let error = VolumeName::new("a b").unwrap_err().to_string();
        assert!(error.contains("volume name 'a b' has ' '"), "{error}");
    }

    #[test]
    fn names_from_strings_go_through_the_same_check() {
        // serde deserializes names through TryFrom<String>.
        assert!(VolumeName::try_from("demo".to_string()).is_ok());
        assert!(matches!(
            PoolName::try_from("bad name".to_string()),
            Err(NameError::BadCharacter { character: ' ', .. })
        ));
        assert!("".parse::<VolumeName>().is_err());
    }
}
