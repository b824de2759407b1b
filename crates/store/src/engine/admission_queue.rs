//! The order in which writes that must wait are admitted.
//!
//! A write that finds the journal or the unapplied-data budget full waits
//! for the applier. Without an order, whichever thread takes the lock first
//! after an apply pass gets the room it freed, and a write arriving just
//! then overtakes those that have waited for passes: under a saturated
//! device (J4 of bench/steady.sh) most writes never waited while a few
//! waited 60-170 ms, many passes in a row.
//!
//! Here a write that waits takes a ticket, and the room it needs is held
//! for it against every later write: a write is admitted only if it fits
//! together with all the writes waiting ahead of it. A newcomer counts
//! every waiting write as ahead of it. So no write overtakes one that
//! waited longer, yet nobody has to wake the next write in line: a write
//! admitted out of turn (its wake-up came first) only uses room that was
//! never held for the older ones, and the older ones still fit. Handing
//! the turn from waiter to waiter instead (one wake-up per admission)
//! collapsed J4 to a few thousand IOPS on two cores.

use std::collections::VecDeque;

/// What a waiting write needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Needs {
    /// Data bytes, against the unapplied-data budget.
    pub data_bytes: u64,
    /// Journal bytes, against the ring's room.
    pub journal_bytes: u64,
}

#[derive(Debug, Default)]
pub struct AdmissionQueue {
    /// The writes waiting, oldest first. One that gives up (the pool
    /// failed or stops, the volume went away) leaves from anywhere.
    waiting: VecDeque<(u64, Needs)>,
    next: u64,
}

impl AdmissionQueue {
    /// A ticket at the back of the queue, for a write that needs `needs`.
    pub fn take(&mut self, needs: Needs) -> u64 {
        let ticket = self.next;
        self.next += 1;
        self.waiting.push_back((ticket, needs));
        ticket
    }

    /// What the writes ahead of the one holding `ticket` need (without a
    /// ticket: what every waiting write needs).
    pub fn ahead(&self, ticket: Option<u64>) -> Needs {
        let mut sum = Needs::default();
        for (waiting, needs) in &self.waiting {
            if Some(*waiting) == ticket {
                break;
            }
            sum.data_bytes += needs.data_bytes;
            sum.journal_bytes += needs.journal_bytes;
        }
        sum
    }

    /// The write holding `ticket` was admitted, or gave up.
    pub fn leave(&mut self, ticket: u64) {
        if self
            .waiting
            .front()
            .is_some_and(|(front, _)| *front == ticket)
        {
            self.waiting.pop_front();
        } else {
            self.waiting.retain(|(waiting, _)| *waiting != ticket);
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn needs(data_bytes: u64) -> Needs {
        Needs {
            data_bytes,
            journal_bytes: data_bytes + 64,
        }
    }

    #[test]
    fn a_write_counts_what_the_older_waiting_writes_need() {
        let mut queue = AdmissionQueue::default();
        assert_eq!(queue.ahead(None), Needs::default(), "nobody waits");
        let first = queue.take(needs(4096));
        let second = queue.take(needs(8192));
        assert_eq!(queue.ahead(Some(first)), Needs::default());
        assert_eq!(queue.ahead(Some(second)), needs(4096));
        assert_eq!(
            queue.ahead(None).data_bytes,
            4096 + 8192,
            "a newcomer counts every waiting write"
        );
        queue.leave(first);
        assert_eq!(queue.ahead(Some(second)), Needs::default());
        queue.leave(second);
        assert_eq!(queue.len(), 0);
    }

    #[test]
    fn a_write_that_gives_up_leaves_from_the_middle() {
        let mut queue = AdmissionQueue::default();
        let first = queue.take(needs(4096));
        let second = queue.take(needs(4096));
        let third = queue.take(needs(4096));
        queue.leave(second);
        assert_eq!(queue.len(), 2);
        assert_eq!(queue.ahead(Some(third)), needs(4096));
        queue.leave(first);
        assert_eq!(queue.ahead(Some(third)), Needs::default());
    }
}
