//! Attributed commands, whose effects go to the event log, and events only
//! a node sees.

use super::error::CommandError;
use super::{event_record, Command, Reply};
use crate::events::{Actor, ReportedEvent};
use crate::model::ClusterState;

impl ClusterState {
    pub(super) fn apply_attributed(
        &mut self,
        actor: Actor,
        now_ms: u64,
        command: Command,
    ) -> Result<Reply, CommandError> {
        if matches!(command, Command::Attributed { .. }) {
            return Err(CommandError::Invalid(
                "an attributed command cannot wrap another".into(),
            ));
        }
        let before = event_record::Before::capture(self, &command);
        let described = command.clone();
        let reply = self.apply(command)?;
        event_record::record(self, before, &described, &reply, actor, now_ms);
        Ok(reply)
    }

    pub(super) fn check_reported_event(
        &self,
        event: &ReportedEvent,
    ) -> Result<Reply, CommandError> {
        if let Some(node) = event.node {
            if !self.nodes.contains_key(&node) {
                return Err(CommandError::UnknownNode { node });
            }
        }
        Ok(Reply::Done)
    }
}
