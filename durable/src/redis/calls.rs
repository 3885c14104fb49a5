//! The writes of a queue's handles and deliveries, each one script on the partition of its
//! task: schedule, change (cancel, reschedule, redrive, uncron), recurring schedules and
//! their advance, and a delivery's finish, lease extension and release. Each carries a call
//! id (batched schedules and finishes: their invocation's, whose reply is kept), so a retry
//! after a lost reply is recognised instead of acting twice.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use super::batch::{Entry, Kept, Kind, Receipt};
use super::connection::{RESPONSE_TIMEOUT, RETRY_BUDGET};
use super::keys::{call_id, partition_of};
use super::shared::{PAGE, Shared, redis_args};
use crate::recurring::Spec;
use crate::{Due, Error, Outcome, Recurring, Task, TaskId};

/// Shortest time a schedule or finish invocation's reply is kept: as long as the client may
/// still send a retry of it (its retry budget, plus one try left unanswered), so a retry never
/// finds the reply gone and acts again — whatever the lease.
const MIN_REPLY_WINDOW: Duration =
    Duration::from_secs(RETRY_BUDGET.as_secs() + RESPONSE_TIMEOUT.as_secs());

/// How long a reading of a node's clock dates schedule invocations before it is read again:
/// the clocks' drift over it stays far under [`NOT_AFTER_SLACK`].
const CLOCK_FRESH: Duration = Duration::from_secs(60);

/// How long after its caller's last retry could have been sent a schedule invocation may
/// still act: room for that retry's transit and for the clock estimate's error. Past it,
/// a copy delayed in the network is refused ([`Shared::not_after_ms`]).
const NOT_AFTER_SLACK: Duration = Duration::from_secs(2);

// A copy refused by `not after` is one whose kept reply may be gone; one that acts finds its
// reply kept (it is kept from the first run, which came after the invocation was dated).
const _: () =
    assert!(RETRY_BUDGET.as_secs() + 2 * NOT_AFTER_SLACK.as_secs() <= MIN_REPLY_WINDOW.as_secs());

/// A schedule entry's answer as the caller sees it.
fn scheduled(
    id: TaskId,
    answer: Result<Result<String, Error>, oneshot::error::RecvError>,
) -> Result<TaskId, Error> {
    match answer.map_err(|_| Error::Closed)??.as_str() {
        "INFLIGHT" => Err(Error::InFlight),
        _ => Ok(id),
    }
}

impl Shared {
    /// One task's entry for the schedule flusher of its partition, and where its answer
    /// comes back.
    fn schedule_entry(
        &self,
        task: Task,
    ) -> (
        TaskId,
        usize,
        Entry,
        oneshot::Receiver<Result<String, Error>>,
    ) {
        let id = task.id.clone().unwrap_or_else(TaskId::generate);
        // A delay goes to the server as a delay: its clock, not ours, resolves it.
        let (mode, ms) = match task.due {
            None => ("after", 0),
            Some(Due::After(delay)) => ("after", crate::delay_ms(delay)),
            Some(Due::At(at)) => ("at", crate::epoch_ms(at)),
        };
        let part = partition_of(id.as_str(), self.parts.len());
        let (reply, answer) = oneshot::channel();
        let entry = Entry {
            args: redis_args![id.as_str(), task.payload.as_slice(), mode, ms, call_id()],
            reply,
            receipt: None,
        };
        (id, part, entry, answer)
    }

    /// Schedules one task: its entry joins whatever else its partition is scheduling now (see
    /// `batch.rs`), and this returns once that invocation is durable.
    pub(crate) async fn schedule(self: &Arc<Self>, task: Task) -> Result<TaskId, Error> {
        let (id, part, entry, answer) = self.schedule_entry(task);
        self.submit(Kind::Schedule, part, entry);
        scheduled(id, answer.await)
    }

    /// Schedules every task, in order, in invocations of at most `batch::BATCH` tasks per
    /// partition; one answer per task.
    pub(crate) async fn schedule_many(
        self: &Arc<Self>,
        tasks: Vec<Task>,
    ) -> Vec<Result<TaskId, Error>> {
        // Each partition's entries go out in order, chunk after chunk; partitions at once.
        let mut by_part: Vec<Vec<Entry>> = (0..self.parts.len()).map(|_| Vec::new()).collect();
        let waiting: Vec<_> = tasks
            .into_iter()
            .map(|task| {
                let (id, part, entry, answer) = self.schedule_entry(task);
                by_part[part].push(entry);
                (id, answer)
            })
            .collect();
        futures::future::join_all(
            by_part
                .into_iter()
                .enumerate()
                .map(|(part, entries)| self.run_in_order(Kind::Schedule, part, entries)),
        )
        .await;
        let mut answers = Vec::with_capacity(waiting.len());
        for (id, answer) in waiting {
            answers.push(scheduled(id, answer.await));
        }
        answers
    }

    pub(crate) async fn change(&self, id: &str, op: &str, due: u64) -> Result<bool, Error> {
        let keys = self.keys_for(id);
        let changed: i64 = self
            .invoke_write(
                keys,
                &self.scripts.change,
                &[
                    &keys.payload,
                    &keys.meta,
                    &keys.due,
                    &keys.dead,
                    &keys.idle,
                    &keys.inflight,
                ],
                redis_args!["tw-change", id, op, due, &keys.channel],
            )
            .await?;
        Ok(changed == 1)
    }

    /// Finishes the delivery `token` of task `id` (its `attempt`-th).
    ///
    /// `kept`: the delivery's note of the invocation that carried its latest finish (written
    /// when that invocation is sent). An `ack` made again reads that invocation's kept reply
    /// first — so an `ack` that deleted the task answers `Ok`, not `LeaseLost`, however its
    /// first call ended (an error, or its caller gone) — and looks there again if its own
    /// run finds the task gone (the earlier one may have run meanwhile).
    pub(crate) async fn finish(
        self: &Arc<Self>,
        id: &str,
        token: u64,
        attempt: u32,
        outcome: Outcome,
        kept: &Kept,
    ) -> Result<(), Error> {
        let tag = outcome.tag();
        // Only an ack: a retry or fail that took effect may have let the task be handed out
        // again since, and then the same finish made again is stale (`LeaseLost`).
        let earlier = (tag == "ack")
            .then(|| kept.lock().expect("not poisoned").clone())
            .flatten()
            .filter(|(earlier_tag, _)| *earlier_tag == tag)
            .map(|(_, receipt)| receipt);
        if let Some(receipt) = &earlier {
            // Never ran, still on its way, or its reply expired: finish afresh.
            if let Some(answer) = self.kept_answer(receipt).await? {
                return finished(&answer);
            }
        }
        let (outcome, delay, reason) = match outcome {
            Outcome::Ack => ("ack", 0, String::new()),
            Outcome::Retry(after) => {
                let delay = after.unwrap_or_else(|| self.settings.policy.jittered_delay(attempt));
                ("retry", crate::delay_ms(delay), String::new())
            }
            Outcome::Fail(reason) => ("dead", 0, reason),
        };
        let part = partition_of(id, self.parts.len());
        let (reply, answer) = oneshot::channel();
        let entry = Entry {
            args: redis_args![id, token, outcome, delay, reason],
            reply,
            receipt: Some((tag, kept.clone())),
        };
        self.submit(Kind::Finish, part, entry);
        let answer = answer.await.map_err(|_| Error::Closed)??;
        if let Some(receipt) = earlier.as_ref().filter(|_| answer != "1") {
            // The earlier ack may have run between our look and this run.
            if let Some(answer) = self.kept_answer(receipt).await? {
                return finished(&answer);
            }
        }
        finished(&answer)
    }

    /// The answer a finish invocation kept for the entry at `receipt`, if it ran and its
    /// reply is still kept. Runs as a write (it renews the reply's window), so with
    /// `replicas(n)` it returns only once the replicas have what that invocation did.
    async fn kept_answer(&self, receipt: &Receipt) -> Result<Option<String>, Error> {
        let keys = &self.parts[receipt.part];
        let answers: Option<Vec<String>> = self
            .invoke_write(
                keys,
                &self.scripts.kept_reply,
                &[receipt.replied.as_str()],
                redis_args!["tw-kept-reply", self.reply_window_ms()],
            )
            .await?;
        Ok(answers.and_then(|answers| answers.get(receipt.index).cloned()))
    }

    /// The server time (ms, on partition `part`'s node) after which a schedule invocation
    /// dated now must not act: its caller sends retries for [`RETRY_BUDGET`], and a copy that
    /// reaches the server later than that (plus [`NOT_AFTER_SLACK`]) — held in a stalled
    /// network, say — could find its kept reply expired and make its tasks again (one acked
    /// since would be delivered twice). Reads the node's clock once a minute.
    pub(super) async fn not_after_ms(&self, part: usize) -> Result<u64, Error> {
        let keys = &self.parts[part];
        let now = match keys.clock.now_ms(CLOCK_FRESH) {
            Some(now) => now,
            None => {
                let now: u64 = self
                    .invoke(&self.scripts.time, &[&keys.meta], redis_args!["tw-time"])
                    .await?;
                keys.clock.learn(now);
                now
            }
        };
        Ok(now.saturating_add(crate::delay_ms(RETRY_BUDGET + NOT_AFTER_SLACK)))
    }

    /// How long the reply of a schedule or finish invocation is kept to answer a retry of
    /// it (ms): a lease, at least [`MIN_REPLY_WINDOW`] (15 s).
    pub(super) fn reply_window_ms(&self) -> u64 {
        crate::delay_ms(self.settings.lease.max(MIN_REPLY_WINDOW))
    }

    /// Groups deliveries by partition, in pages of at most [`PAGE`].
    fn by_partition<'d>(
        &self,
        deliveries: &'d [(String, u64)],
    ) -> Vec<(usize, Vec<&'d (String, u64)>)> {
        let mut groups: Vec<Vec<&(String, u64)>> = vec![Vec::new(); self.parts.len()];
        for delivery in deliveries {
            groups[partition_of(&delivery.0, self.parts.len())].push(delivery);
        }
        groups
            .into_iter()
            .enumerate()
            .flat_map(|(p, group)| {
                group
                    .chunks(PAGE)
                    .map(|page| (p, page.to_vec()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Sets the leases of these deliveries to end `lease` from now (server time), in pages —
    /// only later than now unless `set` (a user's `extend`); returns how many were still held.
    pub(crate) async fn extend(
        &self,
        deliveries: &[(String, u64)],
        lease: Duration,
        set: bool,
    ) -> Result<usize, Error> {
        let mut held = 0;
        let mode = if set { "set" } else { "renew" };
        for (p, page) in self.by_partition(deliveries) {
            let keys = &self.parts[p];
            let mut args = redis_args!["tw-extend", crate::delay_ms(lease), mode];
            for (id, token) in page {
                args.extend(redis::ToRedisArgs::to_redis_args(id));
                args.extend(redis::ToRedisArgs::to_redis_args(token));
            }
            let flags: Vec<i64> = self
                .invoke(&self.scripts.extend, &[&keys.meta, &keys.inflight], args)
                .await?;
            held += flags.iter().filter(|&&f| f == 1).count();
        }
        Ok(held)
    }

    /// Returns claims never handed out, in pages.
    pub(super) async fn release(&self, deliveries: &[(String, u64)]) -> Result<(), Error> {
        for (p, page) in self.by_partition(deliveries) {
            let keys = &self.parts[p];
            let mut args = redis_args!["tw-release", &keys.channel];
            for (id, token) in page {
                args.extend(redis::ToRedisArgs::to_redis_args(id));
                args.extend(redis::ToRedisArgs::to_redis_args(token));
            }
            let _: i64 = self
                .invoke_write(
                    keys,
                    &self.scripts.release,
                    &[
                        &keys.meta,
                        &keys.inflight,
                        &keys.due,
                        &keys.idle,
                        &keys.stats,
                    ],
                    args,
                )
                .await?;
        }
        Ok(())
    }

    /// Advances the claimed recurring schedule `id` (held by `token`): makes the `owed`
    /// occurrences and moves it to `next_due`.
    pub(super) async fn advance(
        &self,
        id: &str,
        token: u64,
        spec: &Spec,
        next_due: u64,
        owed: &[u64],
    ) -> Result<(), Error> {
        let keys = self.keys_for(id);
        let mut args = redis_args![
            "tw-advance",
            id,
            token,
            spec.encode(),
            next_due,
            &keys.channel
        ];
        for at in owed {
            args.extend(redis::ToRedisArgs::to_redis_args(at));
        }
        let _: i64 = self
            .invoke_write(
                keys,
                &self.scripts.advance,
                &[
                    &keys.payload,
                    &keys.meta,
                    &keys.due,
                    &keys.inflight,
                    &keys.seq,
                    &keys.idle,
                ],
                args,
            )
            .await?;
        Ok(())
    }

    pub(crate) async fn schedule_recurring(&self, recurring: Recurring) -> Result<TaskId, Error> {
        // Validated here; the server's clock sets its start.
        let (id, spec, payload) = recurring.into_parts(0)?;
        let (catch_up, kind, definition) = spec.definition();
        let keys = self.keys_for(id.as_str());
        let answer: String = self
            .invoke_write(
                keys,
                &self.scripts.schedule_recurring,
                &[
                    &keys.payload,
                    &keys.meta,
                    &keys.due,
                    &keys.inflight,
                    &keys.dead,
                    &keys.seq,
                    &keys.idle,
                ],
                redis_args![
                    "tw-recurring",
                    id.as_str(),
                    payload.as_slice(),
                    catch_up,
                    kind,
                    definition,
                    &keys.channel
                ],
            )
            .await?;
        match answer.as_str() {
            "INFLIGHT" => Err(Error::InFlight),
            _ => Ok(id),
        }
    }
}

/// A finish's answer: `1` took effect, anything else means the lease was lost.
fn finished(answer: &str) -> Result<(), Error> {
    match answer {
        "1" => Ok(()),
        _ => Err(Error::LeaseLost),
    }
}
