//! The deliveries this process holds, and the journal that undoes a failed step's changes to
//! them.

use super::*;

impl Flights {
    pub(super) fn holds(&self, id: &str, token: u64) -> bool {
        self.tokens.get(id) == Some(&token)
    }

    pub(super) fn of(&self, id: &str) -> Option<&Flight> {
        self.tokens
            .get(id)
            .and_then(|token| self.by_token.get(token))
    }

    pub(super) fn journal(&mut self, id: &str) {
        let before = self
            .tokens
            .get(id)
            .map(|&token| (token, self.by_token[&token].clone()));
        self.journal.push((id.to_owned(), before));
    }

    pub(super) fn unlink(&mut self, id: &str) -> Option<(u64, Flight)> {
        let token = self.tokens.remove(id)?;
        let flight = self.by_token.remove(&token).expect("a flight per token");
        if let Some(until) = flight.lease_until {
            self.leases.remove(&(until, token));
        }
        Some((token, flight))
    }

    pub(super) fn link(&mut self, token: u64, flight: Flight) {
        if let Some(until) = flight.lease_until {
            self.leases.insert((until, token));
        }
        self.tokens.insert(flight.id.clone(), token);
        self.by_token.insert(token, flight);
    }

    /// Ends `id`'s flight (journaled).
    pub(super) fn end(&mut self, id: &str) {
        self.journal(id);
        self.unlink(id);
    }

    /// Starts a flight (journaled).
    pub(super) fn start(&mut self, token: u64, flight: Flight) {
        self.journal(&flight.id);
        self.link(token, flight);
    }

    /// Puts every flight the failed step changed back as it was.
    pub(super) fn undo(&mut self) {
        while let Some((id, before)) = self.journal.pop() {
            self.unlink(&id);
            if let Some((token, flight)) = before {
                self.link(token, flight);
            }
        }
    }

    /// Moves a handed-out delivery's lease end (memory only: see the module docs).
    pub(super) fn set_lease(&mut self, token: u64, until: u64) {
        let flight = self.by_token.get_mut(&token).expect("present");
        if let Some(old) = flight.lease_until.replace(until) {
            self.leases.remove(&(old, token));
        }
        self.leases.insert((until, token));
    }
}
