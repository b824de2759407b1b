//! Resource groups and the cluster's settings.

use trireme_types::GroupName;

use super::error::CommandError;
use super::Reply;
use crate::model::*;

impl ClusterState {
    pub(super) fn create_group(&mut self, group: ResourceGroup) -> Result<Reply, CommandError> {
        if self.groups.contains_key(&group.name) {
            return Err(CommandError::GroupExists {
                name: group.name.to_string(),
            });
        }
        validate_group(&group)?;
        self.groups.insert(group.name.clone(), group);
        Ok(Reply::Done)
    }

    pub(super) fn modify_group(&mut self, group: ResourceGroup) -> Result<Reply, CommandError> {
        if !self.groups.contains_key(&group.name) {
            return Err(CommandError::UnknownGroup {
                name: group.name.to_string(),
            });
        }
        validate_group(&group)?;
        self.groups.insert(group.name.clone(), group);
        Ok(Reply::Done)
    }

    pub(super) fn delete_group(&mut self, name: GroupName) -> Result<Reply, CommandError> {
        if name.as_str() == DEFAULT_GROUP {
            return Err(CommandError::DefaultGroup);
        }
        if !self.groups.contains_key(&name) {
            return Err(CommandError::UnknownGroup {
                name: name.to_string(),
            });
        }
        let users: Vec<String> = self
            .volumes
            .values()
            .filter(|volume| volume.group == name)
            .map(|volume| volume.name.to_string())
            .collect();
        if !users.is_empty() {
            return Err(CommandError::GroupInUse {
                name: name.to_string(),
                volumes: users.join(", "),
            });
        }
        self.groups.remove(&name);
        Ok(Reply::Done)
    }

    pub(super) fn set_settings(
        &mut self,
        settings: ClusterSettings,
    ) -> Result<Reply, CommandError> {
        if settings.resync_rate_bytes_per_sec < MIN_RESYNC_RATE {
            return Err(CommandError::Invalid(format!(
                "resync rate {} B/s is too slow: use at least {} MiB/s",
                settings.resync_rate_bytes_per_sec,
                MIN_RESYNC_RATE >> 20
            )));
        }
        self.settings = settings;
        Ok(Reply::Done)
    }
}

/// The rules a resource group obeys, at creation and at every change. (A
/// rule added here must not refuse what an older log holds: replayed, the
/// log must give the same state.)
fn validate_group(group: &ResourceGroup) -> Result<(), CommandError> {
    if group.place_count == 0 || group.place_count > MAX_PLACE_COUNT {
        return Err(CommandError::Invalid(format!(
            "place-count {} is out of range: use 1 to {MAX_PLACE_COUNT}",
            group.place_count
        )));
    }
    if group.min_place_count == 0 || group.min_place_count > group.place_count {
        return Err(CommandError::Invalid(format!(
            "min-place-count {} is out of range: use 1 to the place-count ({})",
            group.min_place_count, group.place_count
        )));
    }
    Ok(())
}
