//! The consumer side of a Redis queue: one [`RedisEngine`] task per queue handle claims due
//! tasks for its streams, partition by partition, and keeps what it claimed alive.
//!
//! A claim round visits each partition that has something to do (a due task the streams
//! want, an expired lease, news from a wake channel), the first pick rotating, and shares the
//! streams' credits among them. What a claim hands out waits in its stream's prefetch buffer
//! under a lease the engine renews every lease/3; at hand-out its lease restarts, and with
//! keep-alive it is renewed until finished. Closing the streams returns what they
//! buffered (`release.lua`). Between rounds the engine sleeps on the wheel until the earliest
//! due time or lease end it knows of (or its next renewal or purge), converted from the
//! server's clock through an offset learnt from each claim's reply; the server decides what
//! is due.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_wheel::Wheel;

use super::shared::{Shared, delay_ms_floor, number, redis_args};
use super::wake::Wake;
use crate::protocol::{Consumer, Reply, Request, far_future, now_ms, system_time};
use crate::recurring::Spec;
use crate::{Delivery, Error, Route, TaskId};

/// Most tasks one claim script hands out.
pub(super) const CLAIM_BATCH: usize = 256;
/// Most expired leases one claim script moves back; more follow in the next call at once.
pub(super) const EXPIRE_BATCH: usize = 500;

/// One claim call's answer.
struct Claim {
    server_now: u64,
    next_due: Option<u64>,
    next_lease: Option<u64>,
    more: bool,
    /// id, due, attempt, token, payload.
    tasks: Vec<(String, u64, u32, u64, Vec<u8>)>,
}

/// What the engine knows of one partition.
#[derive(Default)]
struct PartState {
    /// That partition's server clock minus this process's wall clock (ms), from its last
    /// claim: used only to arm the wheel, never to decide what is due.
    offset_ms: i64,
    /// Server times: the earliest pending task and lease end known.
    next_due: Option<u64>,
    next_lease: Option<u64>,
    /// Expired leases remain beyond the last claim's batch.
    more: bool,
    /// Learn the heads again (at start, after a resubscribe, after an error, when woken).
    refresh: bool,
}

impl PartState {
    fn server_now(&self) -> u64 {
        now_ms().saturating_add_signed(self.offset_ms)
    }
}

/// The claiming loop of one queue handle (see the module doc).
pub(super) struct RedisEngine {
    shared: Arc<Shared>,
    requests: mpsc::UnboundedReceiver<Request>,
    handle: mpsc::WeakUnboundedSender<Request>,
    consumers: Vec<Consumer>,
    wheel: Wheel,
    shutdown: tokio_wheel::Stopped,
    wakes: mpsc::UnboundedReceiver<Wake>,
    /// Names this engine's claim records; `claims` counts its claim calls.
    claimer: String,
    /// Where the server wakes this worker alone.
    own_channel: String,
    claims: u64,
    parts: Vec<PartState>,
    /// Which partition claims first next time: each gets first pick in turn.
    rotation: usize,
    /// A stream asked for more since the last claim.
    demand: bool,
    retry_at: Option<Instant>,
    /// Claims waiting in a stream's buffer: token → (id, when the claim was sent).
    buffered: HashMap<u64, (String, Instant)>,
    /// Handed out, neither finished nor dropped: token → id.
    held: HashMap<u64, String>,
    /// Handed out this turn after waiting in a buffer: their leases restart.
    handouts: Vec<(String, u64)>,
    renew_at: Option<Instant>,
    /// Retention: when to purge old dead letters next.
    purge_at: Option<Instant>,
    closing: Vec<Reply<()>>,
    close_deadline: Option<Instant>,
    /// `close()` was called: end the streams and return their buffers in this turn.
    closing_streams: bool,
}

impl RedisEngine {
    /// An engine claiming for the queue of `shared` (its worker named `claimer`, woken alone on
    /// `own_channel`), and the sender its handles and deliveries send their requests to.
    pub(super) fn new(
        shared: Arc<Shared>,
        wheel: &Wheel,
        shutdown: tokio_wheel::Stopped,
        wakes: mpsc::UnboundedReceiver<Wake>,
        claimer: String,
        own_channel: String,
    ) -> (RedisEngine, mpsc::UnboundedSender<Request>) {
        let (requests, receiver) = mpsc::unbounded_channel();
        let parts = shared.parts.len();
        let engine = RedisEngine {
            shared: shared.clone(),
            requests: receiver,
            handle: requests.downgrade(),
            consumers: Vec::new(),
            wheel: wheel.clone(),
            shutdown,
            wakes,
            own_channel,
            claimer,
            claims: 0,
            parts: (0..parts).map(|_| PartState::default()).collect(),
            rotation: 0,
            demand: false,
            retry_at: None,
            buffered: HashMap::new(),
            held: HashMap::new(),
            handouts: Vec::new(),
            renew_at: None,
            purge_at: shared
                .settings
                .purge_every()
                .map(|every| Instant::now() + every),
            closing: Vec::new(),
            close_deadline: None,
            closing_streams: false,
        };
        (engine, requests)
    }

    /// Claims, renews and purges until the wheel stops, the queue is closed, or every
    /// handle is gone; then returns what the streams buffered.
    pub(super) async fn run(mut self) {
        for part in &mut self.parts {
            part.refresh = true;
        }
        loop {
            if self.shutdown.is_stopped() || self.close_done() {
                break;
            }
            if self.retry_at.is_none_or(|at| at <= Instant::now()) {
                match self.claim_round().await {
                    Ok(()) => self.retry_at = None,
                    Err(error) => {
                        tracing::warn!(%error, "claiming from redis failed; retrying");
                        for part in &mut self.parts {
                            part.refresh = true;
                        }
                        // A refused server (it evicts keys) is checked again every few
                        // seconds at most: no need to ask five times a second.
                        let backoff = match error {
                            Error::Invalid(_) => Duration::from_secs(1),
                            _ => Duration::from_millis(200),
                        };
                        self.retry_at = Some(Instant::now() + backoff);
                    }
                }
            }
            self.renew_if_due();
            self.purge_if_due();
            let at = self.next_wake();
            let sleep = self.wheel.sleep_until(at.unwrap_or_else(far_future));
            tokio::select! {
                biased;
                () = &mut self.shutdown => break,
                request = self.requests.recv() => match request {
                    Some(request) => {
                        self.handle_request(request);
                        // Take whatever else is queued in the same turn.
                        while let Ok(request) = self.requests.try_recv() {
                            self.handle_request(request);
                        }
                        self.start_handed_out_leases();
                    }
                    None => break,
                },
                Some(wake) = self.wakes.recv() => self.woken(wake),
                () = sleep, if at.is_some() => {}
            }
            if std::mem::take(&mut self.closing_streams) {
                self.close_streams().await;
            }
            self.consumers.retain(|c| !c.sender.is_closed());
        }
        // What is already queued first: a delivery its stream yielded just before the stop is
        // held, not buffered, and must not be returned.
        self.requests.close();
        while let Ok(request) = self.requests.try_recv() {
            match request {
                Request::HandedOut(_)
                | Request::Dropped(_)
                | Request::Release(_)
                | Request::Finishing(_)
                | Request::Close(_) => self.handle_request(request),
                _ => {} // dropping its reply answers `Closed`
            }
        }
        self.close_streams().await;
        for reply in self.closing.drain(..) {
            let _ = reply.send(Ok(()));
        }
    }

    fn close_done(&self) -> bool {
        self.close_deadline
            .is_some_and(|deadline| Instant::now() >= deadline || self.held.is_empty())
    }

    fn wanted(&self) -> usize {
        if self.close_deadline.is_some() {
            return 0;
        }
        self.consumers
            .iter()
            .filter(|c| c.wants())
            .map(|c| c.credits.load(Ordering::Acquire))
            .sum()
    }

    /// Whether partition `p` has something for a claim to do now.
    fn should_claim(&self, p: usize, wanted: bool) -> bool {
        let part = &self.parts[p];
        let now = part.server_now();
        part.refresh
            || part.more
            || (wanted && (self.demand || part.next_due.is_some_and(|due| due <= now)))
            || part.next_lease.is_some_and(|end| end <= now)
    }

    fn next_wake(&self) -> Option<Instant> {
        if let Some(at) = self.retry_at {
            return Some(at);
        }
        if self.parts.iter().any(|p| p.more || p.refresh) {
            return Some(Instant::now());
        }
        let wanted = self.wanted() > 0;
        let server = self.parts.iter().filter_map(|part| {
            let due = part.next_due.filter(|_| wanted);
            let at = match (due, part.next_lease) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }?;
            Some(Instant::now() + Duration::from_millis(at.saturating_sub(part.server_now())))
        });
        server
            .chain(
                [self.renew_at, self.purge_at, self.close_deadline]
                    .into_iter()
                    .flatten(),
            )
            .min()
    }

    fn woken(&mut self, wake: Wake) {
        match wake {
            Wake::Due(p, due) => {
                if let Some(part) = self.parts.get_mut(p) {
                    part.next_due = Some(part.next_due.map_or(due, |known| known.min(due)));
                }
            }
            Wake::Claim(p) => {
                if let Some(part) = self.parts.get_mut(p) {
                    part.refresh = true;
                }
            }
            Wake::Refresh => {
                // Resubscribed after a lost connection: maybe to another server.
                self.shared.eviction.recheck_soon();
                for part in &mut self.parts {
                    part.refresh = true;
                }
            }
        }
    }

    /// Claims from each partition that has something to do, the first pick rotating, and
    /// shares what the streams want evenly among them: with a backlog everywhere and a
    /// prefetch of 8 over 6 partitions, each gets 1 or 2 of a round's claims, so no partition
    /// waits behind another's backlog.
    async fn claim_round(&mut self) -> Result<(), Error> {
        let count = self.parts.len();
        let start = self.rotation % count;
        self.rotation = self.rotation.wrapping_add(1);
        let wanted_any = self.wanted() > 0;
        let chosen: Vec<usize> = (0..count)
            .map(|step| (start + step) % count)
            .filter(|&p| self.should_claim(p, wanted_any))
            .collect();
        for (i, &p) in chosen.iter().enumerate() {
            let left = chosen.len() - i;
            let share = self.wanted().div_ceil(left);
            // Chosen only for its due tasks, and the credits are gone: nothing to do there.
            if share == 0 && !self.should_claim(p, false) {
                continue;
            }
            self.claim(p, share).await?;
        }
        if !chosen.is_empty() {
            self.demand = false;
        }
        Ok(())
    }

    /// Claims at most `share` tasks from partition `p` (and never more than the streams
    /// want), hands them out, and learns when to look there again.
    async fn claim(&mut self, p: usize, share: usize) -> Result<(), Error> {
        let shared = self.shared.clone();
        let keys = &shared.parts[p];
        let settings = &shared.settings;
        let wanted = self.wanted().min(share).min(CLAIM_BATCH);
        self.claims += 1;
        let record = keys.claim_record(&self.claimer);
        let sent = Instant::now();
        let sent_wall = now_ms();
        let reply: Vec<Vec<u8>> = shared
            .invoke(
                &shared.scripts.claim,
                &[
                    &keys.meta,
                    &keys.due,
                    &keys.inflight,
                    &keys.dead,
                    &keys.token,
                    &keys.payload,
                    &record,
                    &keys.idle,
                    &keys.stats,
                    &keys.lateness,
                    &keys.paused,
                ],
                redis_args![
                    "tw-claim",
                    settings.lease_ms(),
                    wanted,
                    settings.policy.attempts(),
                    &keys.channel,
                    EXPIRE_BATCH,
                    &self.own_channel,
                    self.claims
                ],
            )
            .await?;
        let claim = parse_claim(reply)?;
        // The server read its clock about half a round trip after we sent.
        let midpoint = sent_wall.saturating_add(delay_ms_floor(sent.elapsed() / 2));
        let part = &mut self.parts[p];
        part.offset_ms = claim.server_now as i64 - midpoint as i64;
        part.next_due = claim.next_due;
        part.next_lease = claim.next_lease;
        part.more = claim.more;
        part.refresh = false;
        let Some(engine) = self.handle.upgrade() else {
            return Ok(());
        };
        let mut consumer = 0;
        let mut schedules = Vec::new();
        for (id, due, attempt, token, payload) in claim.tasks {
            if attempt == 0 {
                schedules.push((id, token, payload)); // a recurring schedule to advance
                continue;
            }
            while consumer < self.consumers.len() && !self.consumers[consumer].wants() {
                consumer += 1;
            }
            self.buffered.insert(token, (id.clone(), sent));
            let delivery = Delivery::new(
                TaskId::from(id),
                payload,
                attempt,
                system_time(due),
                token,
                engine.clone(),
                Route::Redis(self.shared.clone()),
            );
            // A stream that vanished meanwhile drops the delivery, and its drop returns it.
            if let Some(target) = self.consumers.get(consumer) {
                // In transit first (the stream counts it out as it receives it): the stream
                // never sees both counts at zero while this delivery is on its way.
                target.in_transit.fetch_add(1, Ordering::AcqRel);
                target.credits.fetch_sub(1, Ordering::AcqRel);
                let _ = target.sender.send(delivery);
            }
        }
        if !self.buffered.is_empty() && self.renew_at.is_none() {
            self.renew_at = Some(Instant::now() + settings.renew_every());
        }
        for (id, token, definition) in schedules {
            let spec = String::from_utf8(definition)
                .map_err(|_| Error::Corrupt(format!("recurring schedule {id:?} is damaged")))
                .and_then(|text| Spec::decode(&text));
            let mut spec = match spec {
                Ok(spec) => spec,
                Err(error) => {
                    tracing::error!(%error, "a recurring schedule cannot be read; left as it is");
                    continue;
                }
            };
            let (owed, next_due) = spec.advance(claim.server_now);
            shared.advance(&id, token, &spec, next_due, &owed).await?;
            // Its occurrences are due now: claim them.
            self.parts[p].refresh = true;
        }
        Ok(())
    }

    /// One renewal for every delivery handed out this turn: their leases run from now.
    fn start_handed_out_leases(&mut self) {
        if self.handouts.is_empty() {
            return;
        }
        let handouts = std::mem::take(&mut self.handouts);
        let shared = self.shared.clone();
        tokio::spawn(async move {
            if let Err(error) = shared.extend(&handouts, shared.settings.lease, false).await {
                tracing::warn!(%error, "starting leases at hand-out failed");
            }
        });
    }

    /// Every lease/3: renews the buffered claims (and, with keep-alive, the held deliveries).
    fn renew_if_due(&mut self) {
        let Some(at) = self.renew_at else { return };
        if at > Instant::now() {
            return;
        }
        let mut tokens: Vec<(String, u64)> = self
            .buffered
            .iter()
            .map(|(&token, (id, _))| (id.clone(), token))
            .collect();
        if self.shared.settings.keep_alive {
            tokens.extend(self.held.iter().map(|(&token, id)| (id.clone(), token)));
        }
        self.renew_at =
            (!tokens.is_empty()).then(|| Instant::now() + self.shared.settings.renew_every());
        let shared = self.shared.clone();
        let lease = shared.settings.lease;
        tokio::spawn(async move {
            if let Err(error) = shared.extend(&tokens, lease, false).await {
                tracing::warn!(%error, "renewing leases failed");
            }
        });
    }

    /// Retention: purges the dead letters older than the retention, in the background.
    fn purge_if_due(&mut self) {
        let Some(at) = self.purge_at else { return };
        if at > Instant::now() {
            return;
        }
        let settings = &self.shared.settings;
        self.purge_at = settings.purge_every().map(|every| Instant::now() + every);
        let keep = crate::delay_ms(settings.retention.unwrap_or_default()).max(1);
        let shared = self.shared.clone();
        tokio::spawn(async move {
            match shared.purge_dead(keep).await {
                Ok(0) => {}
                Ok(removed) => tracing::debug!(removed, "purged old dead letters"),
                Err(error) => tracing::warn!(%error, "purging old dead letters failed"),
            }
        });
    }

    /// Ends the streams and returns what they buffered: when `close` is called (before it waits
    /// for held deliveries), at shutdown, or when every handle is gone.
    async fn close_streams(&mut self) {
        for consumer in self.consumers.drain(..) {
            consumer.close();
        }
        let buffered: Vec<(String, u64)> = self
            .buffered
            .drain()
            .map(|(token, (id, _))| (id, token))
            .collect();
        if buffered.is_empty() {
            return;
        }
        let release = self.shared.release(&buffered);
        match tokio::time::timeout(Duration::from_secs(5), release).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "returning buffered claims failed"),
            Err(_) => tracing::warn!("returning buffered claims timed out"),
        }
    }

    fn handle_request(&mut self, request: Request) {
        let shared = self.shared.clone();
        match request {
            Request::Subscribe(consumer) => {
                if self.close_deadline.is_some() {
                    consumer.close();
                } else {
                    self.consumers.push(consumer);
                }
            }
            Request::Demand => self.demand = true,
            Request::Close(reply) => {
                self.closing.push(reply);
                if self.close_deadline.is_none() {
                    self.close_deadline = Some(Instant::now() + self.shared.settings.close_timeout);
                    // This turn ends the streams and returns their buffers, before the close
                    // waits for held deliveries.
                    self.closing_streams = true;
                }
            }
            Request::HandedOut(token) => {
                let Some((id, claimed)) = self.buffered.remove(&token) else {
                    return;
                };
                self.held.insert(token, id.clone());
                let lease = shared.settings.lease;
                if shared.settings.keep_alive && self.renew_at.is_none() {
                    self.renew_at = Some(Instant::now() + shared.settings.renew_every());
                }
                // The claim set the lease to end a lease after it was sent; if the delivery
                // waited in the buffer for more than a thousandth of a lease, restart it now
                // (batched with the turn's other hand-outs).
                if claimed.elapsed() > lease / 1000 {
                    self.handouts.push((id, token));
                }
            }
            Request::Dropped(token) => {
                self.held.remove(&token);
            }
            Request::Release(token) => {
                if let Some((id, _)) = self.buffered.remove(&token) {
                    tokio::spawn(async move {
                        if let Err(error) = shared.release(&[(id, token)]).await {
                            tracing::warn!(%error, "returning a buffered claim failed");
                        }
                    });
                }
            }
            Request::Finishing(token) => {
                self.held.remove(&token);
            }
            // Handles and deliveries of a Redis queue call the server directly.
            Request::Extend(..)
            | Request::Schedule(..)
            | Request::Cancel(..)
            | Request::Reschedule(..)
            | Request::Redrive(..)
            | Request::Len(..)
            | Request::DeadLetters(..)
            | Request::Ack(..)
            | Request::Retry(..)
            | Request::Fail(..)
            | Request::Get(..)
            | Request::Payload(..)
            | Request::RecurringPage(..)
            | Request::List(..)
            | Request::DeadPage(..)
            | Request::ListPage(..)
            | Request::Purge { .. }
            | Request::Stats(..)
            | Request::ScheduleRecurring(..)
            | Request::CancelRecurring(..)
            | Request::Pause(..) => debug_assert!(false, "routed to the server directly"),
        }
    }
}

fn parse_claim(reply: Vec<Vec<u8>>) -> Result<Claim, Error> {
    let bad = || Error::Io("unexpected reply from the claim script".into());
    let mut fields = reply.into_iter();
    let mut next = || fields.next().ok_or_else(bad);
    let server_now = number(&next()?).ok_or_else(bad)?;
    let next_due = number(&next()?);
    let next_lease = number(&next()?);
    let more = number(&next()?) == Some(1);
    let mut tasks = Vec::new();
    while let Some(id) = fields.next() {
        let mut field = || fields.next().ok_or_else(bad);
        let due = number(&field()?).ok_or_else(bad)?;
        let attempt = number(&field()?).ok_or_else(bad)? as u32;
        let token = number(&field()?).ok_or_else(bad)?;
        let payload = field()?;
        let id = String::from_utf8(id).map_err(|_| bad())?;
        tasks.push((id, due, attempt, token, payload));
    }
    Ok(Claim {
        server_now,
        next_due,
        next_lease,
        more,
        tasks,
    })
}
