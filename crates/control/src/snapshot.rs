//! Where the snapshot records lived before they moved into the model
//! ([`crate::model::snapshot`]); kept so that `trireme_control::snapshot::*`
//! paths keep working. The snapshot commands are in `crate::command`.

pub use crate::model::snapshot::*;
