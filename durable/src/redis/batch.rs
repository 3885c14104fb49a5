//! Writes gathered into shared script invocations: every `schedule` and every finish (`ack`,
//! `retry`, `fail`) of one partition goes through one flusher task, which sends whatever
//! calls are waiting as one `schedule.lua` or `finish.lua` invocation, answers each call from
//! its own entry of the reply, and then takes the calls that queued meanwhile. A call made
//! while nothing else is waiting goes out at once (no timer, no added latency); under load,
//! 16 producers or 64 acking deliveries share one round trip and one script.
//!
//! Each entry keeps its own call id, so a batch retried after a lost reply is recognised
//! entry by entry, exactly as a call of its own would be; each call still returns only once
//! its entry is durable (and, with `replicas(n)`, on n replicas: one `WAIT` per batch).

use std::sync::{Arc, OnceLock, Weak};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};

use super::keys::call_id;
use super::shared::{Shared, redis_args};
use crate::Error;

/// Most entries (tasks scheduled or deliveries finished) one invocation takes: the bounded
/// work per script step.
pub(super) const BATCH: usize = 500;
/// Most argument bytes (payloads mostly) one invocation carries, at least one entry: a batch
/// of large payloads does not become one long script that keeps other clients waiting.
const BATCH_BYTES: usize = 1 << 20;

/// Most invocations of one flusher in flight at once, pipelined on the connection. Concurrent
/// calls carry no order between them; `schedule_many`, which does, sends its chunks itself,
/// one at a time.
const IN_FLIGHT: usize = 4;

/// Which script a flusher runs.
#[derive(Clone, Copy, Debug)]
pub(super) enum Kind {
    Schedule,
    Finish,
}

impl Kind {
    /// Entries that must wait before another invocation goes while one runs. Schedules:
    /// eight. With one invocation at a time, 16 producers split into two groups of ~8 that
    /// took turns, each waiting a whole round trip for the other's (issue 30's peer table,
    /// redis-server on a core of its own: 21–24 k tasks/s); letting a group of 8 go at once
    /// raised the immediate rows to 28–35 k/s and, with more tasks waiting per claim, cut
    /// the server's CPU per task from ~35–39 to ~25–28 µs. Fewer than 8 would split batches
    /// into invocations of one or two tasks, each costing the server far more than a task in
    /// it (measured with four in flight and no threshold: most invocations carried one
    /// task). Finishes: one (a worker's acks come in bursts of its claims anyway).
    fn extra_batch(self) -> usize {
        match self {
            Kind::Schedule => 8,
            Kind::Finish => 1,
        }
    }
}

/// One call's entry: its arguments, and where its answer goes.
pub(super) struct Entry {
    pub(super) args: Vec<Vec<u8>>,
    pub(super) reply: oneshot::Sender<Result<String, Error>>,
    /// A finish's: where its delivery notes which invocation carries it, written when the
    /// invocation is sent — so that the same finish made again, even after its first caller
    /// went away, can read that invocation's kept reply.
    pub(super) receipt: Option<(&'static str, Kept)>,
}

/// A delivery's note of the invocation that carried its latest finish, and of what kind.
pub(crate) type Kept = std::sync::Arc<std::sync::Mutex<Option<(&'static str, Receipt)>>>;

/// Where the answer of a finish whose invocation erred (a lost reply, replicas that did not
/// confirm in time) is kept if that invocation ran: its kept reply, and its place in it.
#[derive(Debug, Clone)]
pub(crate) struct Receipt {
    pub(super) part: usize,
    pub(super) replied: String,
    pub(super) index: usize,
}

/// The replies of one invocation's entries, in order.
type Waiting = Vec<oneshot::Sender<Result<String, Error>>>;

/// Notes, in each finish's delivery, which invocation carries it.
fn note_receipts(part: usize, replied: &str, receipts: Vec<Option<(&'static str, Kept)>>) {
    for (index, receipt) in receipts.into_iter().enumerate() {
        if let Some((tag, kept)) = receipt {
            let receipt = Receipt {
                part,
                replied: replied.to_owned(),
                index,
            };
            *kept.lock().expect("not poisoned") = Some((tag, receipt));
        }
    }
}

impl Entry {
    fn bytes(&self) -> usize {
        self.args.iter().map(Vec::len).sum::<usize>()
    }
}

/// Per partition: the sender to its schedule flusher and to its finish flusher, each
/// started on first use.
pub(super) struct Batchers {
    schedule: Vec<OnceLock<mpsc::UnboundedSender<Entry>>>,
    finish: Vec<OnceLock<mpsc::UnboundedSender<Entry>>>,
    /// The wheel's runtime, where the flushers run: not the first caller's, which may be a
    /// short-lived runtime of its own (its end would take the flusher along, and every later
    /// call of the partition would answer `Closed`).
    runtime: tokio::runtime::Handle,
}

impl Batchers {
    pub(super) fn new(parts: usize, runtime: tokio::runtime::Handle) -> Batchers {
        Batchers {
            schedule: (0..parts).map(|_| OnceLock::new()).collect(),
            finish: (0..parts).map(|_| OnceLock::new()).collect(),
            runtime,
        }
    }
}

impl Shared {
    /// Queues `entry` for partition `part`'s flusher of `kind`; its answer arrives on the
    /// entry's reply (dropped unanswered, read as [`Error::Closed`], if the queue is gone).
    pub(super) fn submit(self: &Arc<Self>, kind: Kind, part: usize, entry: Entry) {
        let slots = match kind {
            Kind::Schedule => &self.batchers.schedule,
            Kind::Finish => &self.batchers.finish,
        };
        let sender = slots[part].get_or_init(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            // The flusher holds the queue weakly: it ends when the last handle is gone (and
            // with it this sender).
            self.batchers
                .runtime
                .spawn(flusher(Arc::downgrade(self), kind, part, receiver));
            sender
        });
        let _ = sender.send(entry);
    }

    /// Runs `entries` of partition `part` in their order, one bounded chunk after the other
    /// (`schedule_many`: its order is the order of ties), answering each entry.
    pub(super) async fn run_in_order(&self, kind: Kind, part: usize, entries: Vec<Entry>) {
        let mut entries = entries.into_iter().peekable();
        while entries.peek().is_some() {
            let mut bytes = 0;
            let (mut args, mut waiting, mut receipts) = (Vec::new(), Vec::new(), Vec::new());
            while let Some(entry) = entries.next_if(|entry| {
                waiting.is_empty()
                    || (waiting.len() < BATCH && bytes + entry.bytes() <= BATCH_BYTES)
            }) {
                bytes += entry.bytes();
                args.extend(entry.args);
                waiting.push(entry.reply);
                receipts.push(entry.receipt);
            }
            let replied = self.parts[part].replied(&call_id());
            note_receipts(part, &replied, receipts);
            let result = self.run_batch(kind, part, &replied, args).await;
            answer(kind, waiting, result);
        }
    }

    /// One invocation for these entries; the reply has one answer per entry, in order. The
    /// invocation is named once, so its retries (same arguments) are answered from the reply
    /// its first run kept, never applied twice.
    async fn run_batch(
        &self,
        kind: Kind,
        part: usize,
        replied: &str,
        entries: Vec<Vec<u8>>,
    ) -> Result<Vec<String>, Error> {
        let keys = &self.parts[part];
        let window = self.reply_window_ms();
        let not_after = match kind {
            Kind::Schedule => self.not_after_ms(part).await?,
            // A finish acts only for the delivery's current token, once: a late copy of one
            // finds the token gone and changes nothing.
            Kind::Finish => 0,
        };
        let (script, key_list, mut args) = match kind {
            Kind::Schedule => (
                &self.scripts.schedule,
                vec![
                    keys.payload.as_str(),
                    &keys.meta,
                    &keys.due,
                    &keys.dead,
                    &keys.seq,
                    &keys.idle,
                    &keys.inflight,
                    replied,
                ],
                redis_args!["tw-schedule", &keys.channel, window, not_after],
            ),
            Kind::Finish => (
                &self.scripts.finish,
                vec![
                    keys.payload.as_str(),
                    &keys.meta,
                    &keys.inflight,
                    &keys.due,
                    &keys.dead,
                    &keys.idle,
                    &keys.stats,
                    replied,
                ],
                redis_args![
                    "tw-finish",
                    &keys.channel,
                    self.settings.policy.attempts(),
                    window
                ],
            ),
        };
        args.extend(entries);
        self.invoke_write(keys, script, &key_list, args).await
    }
}

/// Sends what waits in bounded batches (they pipeline on the multiplexed connection), until
/// the queue is gone: one invocation whenever none is running, and more, up to
/// [`IN_FLIGHT`], once at least [`Kind::extra_batch`] entries wait — so a quiet queue
/// sends each call at once, and a busy one neither waits a whole round trip per batch nor
/// splits into invocations of one entry.
async fn flusher(
    shared: Weak<Shared>,
    kind: Kind,
    part: usize,
    mut entries: mpsc::UnboundedReceiver<Entry>,
) {
    let mut queued: std::collections::VecDeque<Entry> = std::collections::VecDeque::new();
    let mut running = FuturesUnordered::new();
    let mut open = true;
    loop {
        while let Ok(entry) = entries.try_recv() {
            queued.push_back(entry);
        }
        let send = !queued.is_empty()
            && running.len() < IN_FLIGHT
            && (running.is_empty() || queued.len() >= kind.extra_batch());
        if !send {
            tokio::select! {
                Some((waiting, result)) = running.next(), if !running.is_empty() => {
                    answer(kind, waiting, result);
                }
                entry = entries.recv(), if open => match entry {
                    Some(entry) => queued.push_back(entry),
                    None => open = false,
                },
                else => return,
            }
            continue;
        }
        let mut bytes = 0;
        let mut batch = Vec::new();
        while let Some(entry) = queued.pop_front() {
            if !batch.is_empty() && (batch.len() >= BATCH || bytes + entry.bytes() > BATCH_BYTES) {
                queued.push_front(entry);
                break;
            }
            bytes += entry.bytes();
            batch.push(entry);
        }
        let Some(queue) = shared.upgrade() else {
            return;
        };
        let mut args = Vec::new();
        let mut waiting: Waiting = Vec::with_capacity(batch.len());
        let mut receipts = Vec::with_capacity(batch.len());
        for entry in batch {
            args.extend(entry.args);
            waiting.push(entry.reply);
            receipts.push(entry.receipt);
        }
        let replied = queue.parts[part].replied(&call_id());
        note_receipts(part, &replied, receipts);
        running.push(async move {
            let result = queue.run_batch(kind, part, &replied, args).await;
            (waiting, result)
        });
    }
}

/// Answers each call of a batch from its entry of the reply.
fn answer(kind: Kind, replies: Waiting, result: Result<Vec<String>, Error>) {
    match result {
        Ok(answers) if answers.len() == replies.len() => {
            for (reply, answer) in replies.into_iter().zip(answers) {
                let _ = reply.send(Ok(answer));
            }
        }
        Ok(_) => {
            let error = Error::Io(format!("unexpected reply from the {kind:?} script"));
            for reply in replies {
                let _ = reply.send(Err(error.clone()));
            }
        }
        Err(error) => {
            for reply in replies {
                let _ = reply.send(Err(error.clone()));
            }
        }
    }
}
