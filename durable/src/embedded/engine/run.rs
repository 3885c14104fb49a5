//! The engine's loop: batches of requests, one store step per batch, streams fed within their
//! prefetch, leases renewed, and a graceful close.

use super::step::refuse;
use super::*;

impl Engine {
    /// Opens the store's tables (blocking), resolves what a previous holder left in flight, and
    /// returns the engine ready to run. Reads the counters and the in-flight index only.
    pub(crate) fn load(
        store: Box<dyn Store>,
        settings: Settings,
        requests: mpsc::UnboundedReceiver<Request>,
        handle: mpsc::WeakUnboundedSender<Request>,
        wheel: Wheel,
    ) -> Result<Engine, Error> {
        let mut core = Core {
            store,
            settings,
            flights: Flights::default(),
            next_token: 0,
            next_seq: 0,
            counters: Counters::default(),
            lateness: LatenessWindow::default(),
            paused: false,
            acked: Acked::default(),
        };
        let (mut next_seq, mut counters, mut paused) = (0, Counters::default(), false);
        core.store.transact(&mut |tx| {
            let mut tasks = Tasks { tx };
            let format = tasks.meta("format")?;
            if format == 0 {
                if tasks.count(Table::Records)? > 0 {
                    return Err(Error::Corrupt(
                        "task records without a format version".into(),
                    ));
                }
                tasks.set_meta("format", FORMAT)?;
            } else if format != FORMAT {
                return Err(Error::Corrupt(format!(
                    "store format {format} is not one this version reads ({FORMAT})"
                )));
            }
            next_seq = tasks.meta("seq")?;
            counters = tasks.counters()?;
            paused = tasks.meta("paused")? != 0;
            Ok(())
        })?;
        core.next_seq = next_seq;
        core.counters = counters;
        core.paused = paused;
        // Holding the lock proves the previous holder is gone: its leases are over.
        let now = now_ms();
        loop {
            let before = core.counters;
            let mut orphans = 0;
            let Core {
                store,
                settings,
                counters,
                ..
            } = &mut core;
            store.transact(&mut |tx| {
                let mut tasks = Tasks { tx };
                let mut changed = *counters;
                let ids = tasks.in_flight(None, STEP_LIMIT)?;
                orphans = ids.len();
                for id in ids {
                    let record = tasks.get(&id)?.ok_or_else(|| missing(&id))?;
                    let next = lease_over(settings, &record, now, &mut changed);
                    tasks.put(&id, Some(&record), &next)?;
                }
                tasks.save_counters(&before, &changed)?;
                *counters = changed;
                Ok(())
            })?;
            if orphans < STEP_LIMIT {
                break;
            }
        }
        let mut next_due = None;
        if !core.paused {
            core.store.transact(&mut |tx| {
                next_due = head(&mut Tasks { tx })?;
                Ok(())
            })?;
        }
        let purge_at = core
            .settings
            .purge_every()
            .map(|every| Instant::now() + every);
        Ok(Engine {
            core: Some(core),
            consumers: Vec::new(),
            requests,
            handle,
            wheel,
            queued: Vec::new(),
            next_due,
            retry_at: None,
            backoff: RETRY_BACKOFF.0,
            renew_at: None,
            purge_at,
            closing: Vec::new(),
            close_deadline: None,
        })
    }

    pub(super) fn core(&mut self) -> &mut Core {
        self.core.as_mut().expect("the core is home between steps")
    }

    pub(crate) async fn run(mut self) {
        let mut shutdown = attach(&self.wheel).shutdown;
        let mut batch = Vec::with_capacity(BATCH);
        loop {
            if shutdown.is_stopped() || self.close_done() || self.core.is_none() {
                break;
            }
            let next = self.next_wake();
            let sleep = self.wheel.sleep_until(next.unwrap_or_else(far_future));
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                received = self.requests.recv_many(&mut batch, BATCH) => {
                    if received == 0 {
                        break; // every handle, stream and delivery is gone
                    }
                    for request in batch.drain(..) {
                        self.handle_request(request);
                    }
                }
                () = sleep, if next.is_some() => {}
            }
            self.step(false).await;
        }
        tracing::debug!("durable queue engine stops; its tasks stay in the store");
        if let Some(core) = &self.core {
            // An open of the same file from now on waits for it rather than answering
            // `Locked`: no handle will use this store again.
            core.store.closing();
        }
        // What is already queued first: a delivery its stream yielded just before the stop is
        // held, not buffered, and must not be returned. The rest is refused, so no caller
        // waits for an answer that never comes.
        self.requests.close();
        while let Ok(request) = self.requests.try_recv() {
            match request {
                Request::HandedOut(_)
                | Request::Dropped(_)
                | Request::Release(_)
                | Request::Finishing(_)
                    if self.core.is_some() =>
                {
                    self.handle_request(request)
                }
                other => refuse(other),
            }
        }
        for request in std::mem::take(&mut self.queued) {
            match request {
                Request::Release(_) => self.queued.push(request),
                other => refuse(other),
            }
        }
        if self.core.is_some() {
            // Buffered claims go back now (best effort: if this commit fails, the next open
            // delivers them again, as after a crash).
            self.begin_close_of_streams();
            self.step(true).await;
        }
        // Release the store (and its lock) before `close()` returns.
        if let Some(core) = self.core.take() {
            let _ = tokio::task::spawn_blocking(move || drop(core)).await;
        }
        for reply in self.closing.drain(..) {
            let _ = reply.send(Ok(()));
        }
    }

    /// Closing, and nothing handed out is still held (or the close timeout passed).
    pub(super) fn close_done(&self) -> bool {
        let Some(deadline) = self.close_deadline else {
            return false;
        };
        Instant::now() >= deadline
            || self
                .core
                .as_ref()
                .is_none_or(|core| !core.flights.by_token.values().any(|f| f.held))
    }

    /// Ends every stream and returns what they buffered.
    pub(super) fn begin_close_of_streams(&mut self) {
        for consumer in self.consumers.drain(..) {
            consumer.close();
        }
        let buffered: Vec<u64> = self
            .core()
            .flights
            .by_token
            .iter()
            .filter(|(_, f)| f.lease_until.is_none())
            .map(|(&token, _)| token)
            .collect();
        self.queued
            .extend(buffered.into_iter().map(Request::Release));
    }

    /// The next time the engine must act: a task due (when someone wants it), a lease
    /// ending, a keep-alive renewal, a retention purge, the close deadline — or, after a
    /// failed commit, the retry.
    pub(super) fn next_wake(&self) -> Option<Instant> {
        if let Some(at) = self.retry_at {
            return Some(at);
        }
        if !self.queued.is_empty() {
            return Some(Instant::now()); // a request goes on in the next step
        }
        let core = self.core.as_ref()?;
        let wanted = self.consumers.iter().any(Consumer::wants);
        let due = self
            .next_due
            .filter(|_| wanted && self.close_deadline.is_none());
        let lease = core.flights.leases.first().map(|&(until, _)| until);
        let wall = match (due, lease) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        [
            wall.map(instant_of),
            self.renew_at,
            self.purge_at,
            self.close_deadline,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Expires leases, applies the queued requests, hands out due tasks — one transaction —
    /// then answers and delivers. Does nothing when there is nothing to do. `last`: the final
    /// step before the engine stops (claims nothing).
    pub(super) async fn step(&mut self, last: bool) {
        if self.core.is_none() {
            return;
        }
        let now = now_ms();
        let retrying = self.retry_at.is_some_and(|at| at > Instant::now());
        if !retrying {
            self.retry_at = None;
            self.renew(now);
            if self.purge_at.is_some_and(|at| at <= Instant::now()) {
                let every = self.core().settings.purge_every();
                let keep = self.core().settings.retention.unwrap_or_default();
                self.purge_at = every.map(|every| Instant::now() + every);
                self.queued.push(Request::Purge {
                    before_ms: now.saturating_sub(crate::delay_ms(keep)),
                    removed: 0,
                    reply: None,
                });
            }
        }
        let claiming = !retrying && !last && self.close_deadline.is_none();
        let wants: Vec<Want> = if claiming {
            self.consumers
                .iter()
                .enumerate()
                .filter(|(_, c)| c.wants())
                .map(|(i, c)| Want {
                    consumer: i,
                    credits: c.credits.clone(),
                    in_transit: c.in_transit.clone(),
                })
                .collect()
        } else {
            Vec::new()
        };
        let lease_over = !retrying
            && self
                .core()
                .flights
                .leases
                .first()
                .is_some_and(|&(until, _)| until <= now);
        let claim = !wants.is_empty() && self.next_due.is_some_and(|due| due <= now);
        if self.queued.is_empty() && !lease_over && !claim {
            return;
        }
        let plan = Plan {
            now,
            requests: std::mem::take(&mut self.queued).into(),
            expire: !retrying,
            wants,
        };
        let mut core = self.core.take().expect("checked above");
        let (core, outcome) = match tokio::task::spawn_blocking(move || {
            let outcome = core.step(plan);
            (core, outcome)
        })
        .await
        {
            Ok(done) => done,
            Err(join) => {
                tracing::error!(error = %join, "the store panicked; the queue stops");
                self.requests.close();
                return;
            }
        };
        self.core = Some(core);
        self.queued.extend(outcome.continuing);
        if let Some(error) = outcome.failure {
            tracing::warn!(%error, "durable queue commit failed; undone, trying again");
            self.retry_at = Some(Instant::now() + self.backoff);
            self.backoff = (self.backoff * 2).min(RETRY_BACKOFF.1);
            return;
        }
        self.backoff = RETRY_BACKOFF.0;
        self.next_due = outcome.next_due;
        let Some(engine) = self.handle.upgrade() else {
            return;
        };
        for claim in outcome.claims {
            let delivery = Delivery::new(
                TaskId::from(claim.id),
                claim.payload,
                claim.attempt,
                system_time(claim.due_ms),
                claim.token,
                engine.clone(),
                crate::Route::Engine,
            );
            // A stream that went away drops it, and its drop returns the task. The stream
            // takes the claim out of its `in_transit` count as it receives it (see
            // `Deliveries::poll_next`), not the engine here after the send.
            let _ = self.consumers[claim.consumer].sender.send(delivery);
        }
        self.consumers.retain(|c| !c.sender.is_closed());
    }

    /// Keep-alive: every held delivery's lease runs a full lease from now.
    pub(super) fn renew(&mut self, now: u64) {
        let Some(at) = self.renew_at else { return };
        if at > Instant::now() {
            return;
        }
        let core = self.core();
        let held: Vec<u64> = core
            .flights
            .by_token
            .iter()
            .filter(|(_, f)| f.held)
            .map(|(&token, _)| token)
            .collect();
        let until = now.saturating_add(core.settings.lease_ms());
        for &token in &held {
            core.flights.set_lease(token, until);
        }
        let every = core.settings.renew_every();
        self.renew_at = (!held.is_empty()).then(|| Instant::now() + every);
    }

    pub(super) fn handle_request(&mut self, request: Request) {
        match request {
            Request::Extend(token, duration, reply) => {
                let flights = &mut self.core().flights;
                let live = flights
                    .by_token
                    .get(&token)
                    .is_some_and(|f| f.lease_until.is_some());
                if live {
                    let until = now_ms().saturating_add(crate::delay_ms(duration));
                    flights.set_lease(token, until);
                }
                let _ = reply.send(lease_result(live));
            }
            Request::HandedOut(token) => {
                let core = self.core();
                let buffered = core
                    .flights
                    .by_token
                    .get(&token)
                    .is_some_and(|f| f.lease_until.is_none());
                if buffered {
                    let until = now_ms().saturating_add(core.settings.lease_ms());
                    core.flights.set_lease(token, until);
                    core.flights.by_token.get_mut(&token).expect("present").held = true;
                    let (keep_alive, every) =
                        (core.settings.keep_alive, core.settings.renew_every());
                    if keep_alive && self.renew_at.is_none() {
                        self.renew_at = Some(Instant::now() + every);
                    }
                }
            }
            Request::Dropped(token) | Request::Finishing(token) => {
                if let Some(flight) = self.core().flights.by_token.get_mut(&token) {
                    flight.held = false;
                }
            }
            Request::Subscribe(consumer) => {
                if self.close_deadline.is_some() {
                    consumer.close(); // closing: the stream ends at once
                } else {
                    self.consumers.push(consumer);
                }
            }
            Request::Demand => {}
            Request::Close(reply) => {
                self.closing.push(reply);
                if self.close_deadline.is_none() {
                    let timeout = self.core().settings.close_timeout;
                    self.close_deadline = Some(Instant::now() + timeout);
                    self.begin_close_of_streams();
                }
            }
            store_request => self.queued.push(store_request),
        }
    }
}
