//! One step: a batch of requests applied in one store transaction (schedule, cancel,
//! reschedule, redrive, finish: ack, retry and dead letters), answered once it commits.

use super::*;

impl Core {
    /// One transaction: expire leases, apply the requests in order, claim due tasks, save the
    /// counters and read the new head. On failure, everything in memory is put back.
    pub(super) fn step(&mut self, mut plan: Plan) -> Outcome {
        let (seq_before, counters_before) = (self.next_seq, self.counters);
        let releases: Vec<u64> = plan
            .requests
            .iter()
            .filter_map(|r| match r {
                Request::Release(token) => Some(*token),
                _ => None,
            })
            .collect();
        let mut answers: Vec<Answer> = Vec::new();
        let mut claims: Vec<Claimed> = Vec::new();
        let mut continuing: Vec<Request> = Vec::new();
        let mut next_due = None;
        let Core {
            store,
            settings,
            flights,
            next_token,
            next_seq,
            counters,
            lateness,
            paused,
            acked,
        } = self;
        let paused_before = *paused;
        let mut state = StepState {
            settings,
            flights,
            next_token,
            next_seq,
            counters,
            lateness,
            paused,
            acked,
            acked_now: Vec::new(),
            now: plan.now,
        };
        let result = store.transact(&mut |tx| {
            let mut tasks = Tasks { tx };
            if plan.expire {
                state.expire_leases(&mut tasks)?;
            }
            while let Some(request) = plan.requests.pop_front() {
                state.apply(&mut tasks, request, &mut answers, &mut continuing)?;
            }
            if !*state.paused {
                state.claim_due(&mut tasks, &plan.wants, &mut claims)?;
            }
            tasks.save_counters(&counters_before, state.counters)?;
            if *state.next_seq != seq_before {
                tasks.set_meta("seq", *state.next_seq)?;
            }
            // Paused, nothing is due for the engine: it does not wake for due tasks.
            next_due = if *state.paused {
                None
            } else {
                head(&mut tasks)?
            };
            Ok(())
        });
        let failure = result.err();
        let acked_now = std::mem::take(&mut state.acked_now);
        if failure.is_none() {
            for token in acked_now {
                self.acked.insert(token);
            }
        }
        for answer in answers {
            answer(failure.as_ref());
        }
        if let Some(error) = &failure {
            for request in plan.requests.drain(..).chain(continuing.drain(..)) {
                fail(request, error);
            }
            // Claims a stream gave back must still go back: tried again in the next step.
            continuing.extend(releases.into_iter().map(Request::Release));
            self.flights.undo();
            self.next_seq = seq_before;
            self.counters = counters_before;
            self.paused = paused_before;
            for claim in claims.drain(..) {
                if let Some(want) = plan.wants.iter().find(|w| w.consumer == claim.consumer) {
                    want.credits.fetch_add(1, Ordering::AcqRel);
                    want.in_transit.fetch_sub(1, Ordering::AcqRel);
                }
            }
        }
        self.flights.journal.clear();
        Outcome {
            claims,
            continuing,
            next_due,
            failure,
        }
    }
}

/// Records `result` as the request's answer; a store failure also abandons the step.
pub(super) fn settle<T: Send + 'static>(
    answers: &mut Vec<Answer>,
    reply: Reply<T>,
    result: Result<T, Error>,
) -> Result<(), Error> {
    let failure = result
        .as_ref()
        .err()
        .filter(|e| is_store_failure(e))
        .cloned();
    answers.push(answer(reply, result));
    failure.map_or(Ok(()), Err)
}

/// Answers a request the stopped engine will not carry out: dropping its reply sender makes
/// the caller see [`Error::Closed`]; a `close` is simply done.
pub(super) fn refuse(request: Request) {
    if let Request::Close(reply) = request {
        let _ = reply.send(Ok(()));
    }
}

/// Answers a request that a failed step could not carry out with the step's error.
pub(super) fn fail(request: Request, error: &Error) {
    pub(super) fn send<T>(reply: Reply<T>, error: &Error) {
        let _ = reply.send(Err(error.clone()));
    }
    match request {
        Request::Schedule(_, reply) | Request::ScheduleRecurring(_, reply) => send(reply, error),
        Request::Cancel(_, reply)
        | Request::CancelRecurring(_, reply)
        | Request::Reschedule(_, _, reply)
        | Request::Redrive(_, reply) => send(reply, error),
        Request::Len(reply) => send(reply, error),
        Request::DeadLetters(reply) | Request::DeadPage(_, _, reply) => send(reply, error),
        Request::Ack(_, _, reply)
        | Request::Retry(_, _, _, _, reply)
        | Request::Fail(_, _, _, reply)
        | Request::Extend(_, _, reply) => send(reply, error),
        Request::Get(_, reply) => send(reply, error),
        Request::Payload(_, reply) => send(reply, error),
        Request::RecurringPage(_, _, reply) => send(reply, error),
        Request::List(_, _, _, reply) => send(reply, error),
        Request::ListPage(_, _, _, reply) => send(reply, error),
        Request::Stats(reply) => send(reply, error),
        Request::Pause(_, reply) => send(reply, error),
        Request::Purge { reply, .. } => {
            if let Some(reply) = reply {
                send(reply, error);
            }
        }
        Request::Close(reply) => {
            let _ = reply.send(Ok(()));
        }
        Request::HandedOut(_)
        | Request::Dropped(_)
        | Request::Release(_)
        | Request::Finishing(_)
        | Request::Subscribe(_)
        | Request::Demand => {}
    }
}

impl StepState<'_> {
    pub(super) fn apply(
        &mut self,
        tasks: &mut Tasks<'_>,
        request: Request,
        answers: &mut Vec<Answer>,
        continuing: &mut Vec<Request>,
    ) -> Result<(), Error> {
        match request {
            Request::Schedule(task, reply) => {
                let result = self.schedule(tasks, task);
                settle(answers, reply, result)
            }
            Request::Cancel(id, reply) => {
                let result = self.cancel(tasks, &id, State::Pending);
                settle(answers, reply, result)
            }
            Request::CancelRecurring(id, reply) => {
                let result = self.cancel(tasks, &id, State::Recurring);
                settle(answers, reply, result)
            }
            Request::Reschedule(id, due_ms, reply) => {
                let result = self.reschedule(tasks, &id, due_ms);
                settle(answers, reply, result)
            }
            Request::Redrive(id, reply) => {
                let result = self.redrive(tasks, &id);
                settle(answers, reply, result)
            }
            Request::Len(reply) => {
                let result = (|| {
                    Ok((tasks.count(Table::Pending)? + tasks.count(Table::InFlight)?) as usize)
                })();
                settle(answers, reply, result)
            }
            Request::Ack(id, token, reply) => {
                let result = self.finish(tasks, &id, token, Finish::Ack);
                settle(answers, reply, result)
            }
            Request::Retry(id, token, _attempt, after, reply) => {
                let result = self.finish(tasks, &id, token, Finish::Retry(after));
                settle(answers, reply, result)
            }
            Request::Fail(id, token, reason, reply) => {
                let result = self.finish(tasks, &id, token, Finish::Fail(reason));
                settle(answers, reply, result)
            }
            Request::Release(token) => self.release(tasks, token),
            Request::DeadLetters(reply) => {
                let result = self.dead_letters(tasks, None, usize::MAX);
                settle(answers, reply, result)
            }
            Request::DeadPage(after, limit, reply) => {
                let result = self.dead_letters(tasks, after.as_deref(), limit.min(STEP_LIMIT));
                settle(answers, reply, result)
            }
            Request::Get(id, reply) => {
                let result = self.get(tasks, &id);
                settle(answers, reply, result)
            }
            Request::Payload(id, reply) => {
                let result = self.payload(tasks, &id);
                settle(answers, reply, result)
            }
            Request::RecurringPage(cursor, limit, reply) => {
                let result = self.recurring_page(tasks, cursor.as_ref(), limit);
                settle(answers, reply, result)
            }
            Request::List(filter, after, limit, reply) => {
                let result = self.list(tasks, filter, after.as_deref(), limit.min(STEP_LIMIT));
                settle(answers, reply, result)
            }
            Request::ListPage(filter, cursor, limit, reply) => {
                let limit = limit.min(STEP_LIMIT);
                let result = self.list_page(tasks, filter, cursor.as_ref(), limit);
                settle(answers, reply, result)
            }
            Request::Stats(reply) => {
                let result = self.stats(tasks);
                settle(answers, reply, result)
            }
            Request::Pause(pause, reply) => {
                let result = tasks.set_meta("paused", u64::from(pause));
                if result.is_ok() {
                    *self.paused = pause;
                }
                settle(answers, reply, result)
            }
            Request::Purge {
                before_ms,
                removed,
                reply,
            } => {
                let (now_removed, done) = match self.purge(tasks, before_ms) {
                    Ok(progress) => progress,
                    Err(error) => {
                        return match reply {
                            Some(reply) => settle(answers, reply, Err(error)),
                            None => Err(error),
                        };
                    }
                };
                let removed = removed + now_removed;
                if done {
                    if let Some(reply) = reply {
                        answers.push(answer(reply, Ok(removed)));
                    }
                } else {
                    continuing.push(Request::Purge {
                        before_ms,
                        removed,
                        reply,
                    });
                }
                Ok(())
            }
            Request::ScheduleRecurring(recurring, reply) => {
                let result = self.schedule_recurring(tasks, recurring);
                settle(answers, reply, result)
            }
            // Handled by the engine in memory, never queued for a step.
            Request::Extend(..)
            | Request::HandedOut(_)
            | Request::Dropped(_)
            | Request::Finishing(_)
            | Request::Subscribe(_)
            | Request::Demand
            | Request::Close(_) => {
                debug_assert!(false, "an in-memory request reached a step");
                Ok(())
            }
        }
    }

    pub(super) fn take_seq(&mut self) -> u64 {
        let seq = *self.next_seq;
        *self.next_seq += 1;
        seq
    }

    pub(super) fn schedule(&mut self, tasks: &mut Tasks<'_>, task: Task) -> Result<TaskId, Error> {
        let id = task.id.clone().unwrap_or_else(TaskId::generate);
        let old = tasks.get(id.as_str())?;
        if old.as_ref().is_some_and(|r| r.state == State::InFlight) {
            return Err(Error::InFlight);
        }
        let record = Record {
            state: State::Pending,
            due_ms: task.due_ms(self.now),
            seq: self.take_seq(),
            attempts: 0,
            payload_len: task.payload.len() as u64,
            dead_ms: 0,
            reason: String::new(),
        };
        tasks.put(id.as_str(), old.as_ref(), &record)?;
        tasks.set_payload(id.as_str(), &task.payload)?;
        Ok(id)
    }

    pub(super) fn schedule_recurring(
        &mut self,
        tasks: &mut Tasks<'_>,
        recurring: Recurring,
    ) -> Result<TaskId, Error> {
        let (id, mut spec, payload) = recurring.into_parts(self.now)?;
        let old = tasks.get(id.as_str())?;
        match &old {
            Some(record) if record.state == State::InFlight => return Err(Error::InFlight),
            Some(record) if record.state == State::Recurring => {
                let previous = Spec::decode(&record.reason)?;
                let same_payload = tasks.payload(id.as_str())?.as_deref() == Some(&payload[..]);
                if previous.same_definition(&spec) && same_payload {
                    return Ok(id); // declared again (e.g. at start-up): kept as it is
                }
                spec.continue_from(&previous);
            }
            _ => {}
        }
        let record = Record {
            state: State::Recurring,
            due_ms: spec.next_after(spec.last_ms.max(self.now)),
            seq: self.take_seq(),
            attempts: 0,
            payload_len: payload.len() as u64,
            dead_ms: 0,
            reason: spec.encode(),
        };
        tasks.put(id.as_str(), old.as_ref(), &record)?;
        tasks.set_payload(id.as_str(), &payload)?;
        Ok(id)
    }

    /// Cancels a pending task (`State::Pending`) or a recurring schedule
    /// (`State::Recurring`).
    pub(super) fn cancel(
        &mut self,
        tasks: &mut Tasks<'_>,
        id: &str,
        state: State,
    ) -> Result<bool, Error> {
        match tasks.get(id)? {
            Some(record) if record.state == state => {
                tasks.delete(id, &record)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    pub(super) fn reschedule(
        &mut self,
        tasks: &mut Tasks<'_>,
        id: &str,
        due_ms: u64,
    ) -> Result<bool, Error> {
        match tasks.get(id)? {
            Some(record) if record.state == State::Pending => {
                let next = Record {
                    due_ms,
                    ..record.clone()
                };
                tasks.put(id, Some(&record), &next)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    pub(super) fn redrive(&mut self, tasks: &mut Tasks<'_>, id: &str) -> Result<bool, Error> {
        match tasks.get(id)? {
            Some(record) if record.state == State::Dead => {
                let next = Record {
                    state: State::Pending,
                    due_ms: self.now,
                    attempts: 0,
                    dead_ms: 0,
                    reason: String::new(),
                    ..record.clone()
                };
                tasks.put(id, Some(&record), &next)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    pub(super) fn finish(
        &mut self,
        tasks: &mut Tasks<'_>,
        id: &str,
        token: u64,
        finish: Finish,
    ) -> Result<(), Error> {
        if !self.flights.holds(id, token) {
            // An ack made again (its first caller gone before the answer, or two at once):
            // the same delivery was acked, the task is gone — as the first said, `Ok`.
            let acked = self.acked.contains(token) || self.acked_now.contains(&token);
            return if matches!(finish, Finish::Ack) && acked {
                Ok(())
            } else {
                Err(Error::LeaseLost)
            };
        }
        let record = tasks.get(id)?.ok_or_else(|| missing(id))?;
        let max = self.settings.policy.attempts();
        match finish {
            Finish::Ack => {
                tasks.delete(id, &record)?;
                self.counters.acked += 1;
                self.acked_now.push(token);
            }
            // `retry_after` counts toward max_attempts like `retry`.
            Finish::Retry(_) if record.attempts >= max => {
                self.bury(tasks, id, &record, last_attempt_reason(record.attempts))?;
            }
            Finish::Retry(after) => {
                let delay =
                    after.unwrap_or_else(|| self.settings.policy.jittered_delay(record.attempts));
                let next = Record {
                    state: State::Pending,
                    due_ms: self
                        .now
                        .saturating_add(crate::delay_ms(delay))
                        .min(crate::MAX_DUE_MS),
                    ..record.clone()
                };
                tasks.put(id, Some(&record), &next)?;
                self.counters.retried += 1;
            }
            Finish::Fail(reason) => self.bury(tasks, id, &record, reason)?,
        }
        self.flights.end(id);
        Ok(())
    }

    pub(super) fn bury(
        &mut self,
        tasks: &mut Tasks<'_>,
        id: &str,
        record: &Record,
        reason: String,
    ) -> Result<(), Error> {
        let next = Record {
            state: State::Dead,
            dead_ms: self.now,
            reason,
            ..record.clone()
        };
        tasks.put(id, Some(record), &next)?;
        self.counters.dead_lettered += 1;
        Ok(())
    }

    /// Returns a claim its stream never yielded: pending again at its due time, the delivery
    /// not counted.
    pub(super) fn release(&mut self, tasks: &mut Tasks<'_>, token: u64) -> Result<(), Error> {
        let Some(flight) = self.flights.by_token.get(&token) else {
            return Ok(());
        };
        if flight.lease_until.is_some() {
            return Ok(()); // handed out: only its lease, a finish or `close` ends it
        }
        let id = flight.id.clone();
        let record = tasks.get(&id)?.ok_or_else(|| missing(&id))?;
        let next = Record {
            state: State::Pending,
            attempts: record.attempts.saturating_sub(1),
            ..record.clone()
        };
        tasks.put(&id, Some(&record), &next)?;
        self.flights.end(&id);
        self.counters.returned += 1;
        Ok(())
    }
}
