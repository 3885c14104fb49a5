//! Claims and leases: expired leases back to pending (or to the dead letters), due tasks
//! claimed for the streams that want them, recurring occurrences made when due.

use super::*;

impl StepState<'_> {
    pub(super) fn expire_leases(&mut self, tasks: &mut Tasks<'_>) -> Result<(), Error> {
        for _ in 0..STEP_LIMIT {
            let Some(&(until, token)) = self.flights.leases.first() else {
                break;
            };
            if until > self.now {
                break;
            }
            let id = self.flights.by_token[&token].id.clone();
            self.flights.end(&id);
            let record = tasks.get(&id)?.ok_or_else(|| missing(&id))?;
            let next = lease_over(self.settings, &record, self.now, self.counters);
            tracing::debug!(id = %id, attempts = record.attempts, "lease expired");
            tasks.put(&id, Some(&record), &next)?;
        }
        Ok(())
    }

    pub(super) fn claim_due(
        &mut self,
        tasks: &mut Tasks<'_>,
        wants: &[Want],
        claims: &mut Vec<Claimed>,
    ) -> Result<(), Error> {
        let mut budget = STEP_LIMIT;
        for Want {
            consumer,
            credits,
            in_transit,
        } in wants
        {
            while budget > 0 && credits.load(Ordering::Acquire) > 0 {
                let Some((due, _, id)) = tasks.ordered(Table::Pending, None, 1)?.pop() else {
                    return Ok(());
                };
                if due > self.now {
                    return Ok(());
                }
                budget -= 1;
                let record = tasks.get(&id)?.ok_or_else(|| missing(&id))?;
                if record.state == State::Recurring {
                    self.make_occurrences(tasks, &id, &record)?;
                    continue;
                }
                let payload = tasks
                    .payload(&id)?
                    .ok_or_else(|| Error::Corrupt(format!("task {id:?} has no payload")))?;
                let next = Record {
                    state: State::InFlight,
                    attempts: record.attempts + 1,
                    ..record.clone()
                };
                tasks.put(&id, Some(&record), &next)?;
                // In transit first: the stream never sees both at zero meanwhile.
                in_transit.fetch_add(1, Ordering::AcqRel);
                credits.fetch_sub(1, Ordering::AcqRel);
                let token = *self.next_token;
                *self.next_token += 1;
                // The lease starts at hand-out; until then the delivery waits in its stream.
                self.flights.start(
                    token,
                    Flight {
                        id: id.clone(),
                        lease_until: None,
                        held: false,
                    },
                );
                self.counters.delivered += 1;
                self.lateness.record(self.now.saturating_sub(due));
                claims.push(Claimed {
                    consumer: *consumer,
                    id,
                    token,
                    payload,
                    attempt: next.attempts,
                    due_ms: due,
                });
            }
        }
        Ok(())
    }

    /// A recurring schedule came due: makes the occurrences it owes as pending tasks (due now
    /// or earlier, so claimable at once) and moves it to its next occurrence.
    pub(super) fn make_occurrences(
        &mut self,
        tasks: &mut Tasks<'_>,
        id: &str,
        record: &Record,
    ) -> Result<(), Error> {
        let mut spec = Spec::decode(&record.reason)?;
        let (owed, next_due) = spec.advance(self.now);
        if !owed.is_empty() {
            let payload = tasks.payload(id)?.unwrap_or_default();
            for at in owed {
                let occurrence = occurrence_id(id, at);
                if tasks.get(&occurrence)?.is_some() {
                    continue; // a task of that name exists: never made twice
                }
                let task = Record {
                    state: State::Pending,
                    due_ms: at,
                    seq: self.take_seq(),
                    attempts: 0,
                    payload_len: payload.len() as u64,
                    dead_ms: 0,
                    reason: String::new(),
                };
                tasks.put(&occurrence, None, &task)?;
                tasks.set_payload(&occurrence, &payload)?;
            }
        }
        let next = Record {
            due_ms: next_due,
            reason: spec.encode(),
            ..record.clone()
        };
        tasks.put(id, Some(record), &next)
    }
}
