//! The background work in steps, for a pool whose owner runs it
//! ([`Background::Inline`]): the simulator picks which step runs when, so
//! a crash can fall between any two of them.

use super::{Background, Engine};
use crate::StoreError;

/// One step of a pool's background work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Write the next batch of admitted records to the journal (the
    /// journal writer's work).
    WriteJournal,
    /// One device flush covering every record written (what a FLUSH, or
    /// the journal writer's eager flush, does).
    Sync,
    /// Activate the regions writers asked for, then apply the records in
    /// the journal: a flush first if one of them is not yet durable, then
    /// in place (the applier's pass).
    Apply,
    /// Write checksums, flush, commit the maps and the journal start.
    Checkpoint,
}

impl Engine {
    /// Runs `step`; false when it had nothing to do.
    pub fn step(&self, step: Step) -> Result<bool, StoreError> {
        debug_assert_eq!(self.background, Background::Inline);
        let fatal = |reason: &String| StoreError::Fatal(reason.clone());
        match step {
            Step::WriteJournal => {
                let (state, progressed) = self.write_journal_inline(self.lock());
                match &state.failed {
                    Some(reason) => Err(fatal(reason)),
                    None => Ok(progressed),
                }
            }
            Step::Sync => {
                let state = self.lock();
                if state.flushing || state.durable_sequence >= state.written_sequence {
                    return Ok(false);
                }
                let state = self.sync_written(state);
                match &state.failed {
                    Some(reason) => Err(fatal(reason)),
                    None => Ok(true),
                }
            }
            Step::Apply => {
                let activated = self.activate_wanted();
                let before = self.lock().applied_sequence;
                self.apply_all(false)?;
                let state = self.lock();
                match &state.failed {
                    Some(reason) => Err(fatal(reason)),
                    None => Ok(activated || state.applied_sequence > before),
                }
            }
            Step::Checkpoint => {
                let before = self.lock().tail;
                self.checkpoint()?;
                Ok(self.lock().tail > before)
            }
        }
    }

    /// Everything the background threads would do before a waiter could
    /// go on: write every admitted record, apply it, checkpoint.
    pub fn run_background_inline(&self) -> Result<(), StoreError> {
        while self.step(Step::WriteJournal)? {}
        self.apply_all(false)?;
        self.checkpoint()
    }
}
