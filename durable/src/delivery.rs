//! [`Deliveries`], the stream of due tasks, and [`Delivery`], one task under a lease with the
//! calls that finish it.

use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use futures::Stream;
use tokio::sync::{mpsc, oneshot};

use crate::protocol::Request;
use crate::{Error, Route, TaskId};

/// The stream of due tasks from [`DurableQueue::deliveries`](crate::DurableQueue::deliveries): `Send + Unpin + 'static`.
pub struct Deliveries {
    pub(crate) receiver: mpsc::UnboundedReceiver<Delivery>,
    pub(crate) credits: Arc<AtomicUsize>,
    /// Claimed for this stream and not yet taken out of `receiver` (the engine counts a claim
    /// in, this stream counts it out as it receives it).
    pub(crate) in_transit: Arc<AtomicUsize>,
    /// Set by the engine when the queue closes: what is still buffered was returned.
    pub(crate) closed: Arc<AtomicBool>,
    /// Set when the queue was paused through this stream's handle: what is buffered goes
    /// back, unread, before anything is yielded.
    pub(crate) give_back: Arc<AtomicBool>,
    pub(crate) prefetch: usize,
    pub(crate) requests: mpsc::UnboundedSender<Request>,
}

impl fmt::Debug for Deliveries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Deliveries")
            .field("buffered", &self.receiver.len())
            .finish_non_exhaustive()
    }
}

impl Stream for Deliveries {
    type Item = Delivery;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Delivery>> {
        if self.closed.load(Ordering::Acquire) {
            // The engine returned what we buffered: drop it unread.
            self.receiver.close();
            while self.receiver.try_recv().is_ok() {}
            return Poll::Ready(None);
        }
        if self.give_back.swap(false, Ordering::AcqRel) {
            // Paused: claims made before the pause are not handed out. Dropped unread, each
            // goes back to its store at once, attempt count unchanged.
            while let Ok(delivery) = self.receiver.try_recv() {
                self.in_transit.fetch_sub(1, Ordering::AcqRel);
                drop(delivery);
            }
        }
        match self.receiver.poll_recv(cx) {
            Poll::Ready(Some(mut delivery)) => {
                // Counted out here, by the receiver, never by the engine after its send: the
                // engine's decrement could land after this stream had already received and
                // yielded the delivery and been polled again. That poll saw it still counted,
                // asked for nothing and waited for a send that no longer came, so the stream
                // stalled with due tasks pending until something else woke it.
                self.in_transit.fetch_sub(1, Ordering::AcqRel);
                delivery.hand_out();
                return Poll::Ready(Some(delivery));
            }
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => {}
        }
        // Nothing buffered, claimed or asked for: ask for up to `prefetch` more, once. A claim
        // counts itself in transit before it takes a credit and stays counted until this
        // stream receives it, so while either count is set a send is still to come, and the
        // waker `poll_recv` just registered sees it.
        if self.credits.load(Ordering::Acquire) == 0
            && self.in_transit.load(Ordering::Acquire) == 0
            && self.receiver.is_empty()
        {
            self.credits.store(self.prefetch, Ordering::Release);
            if self.requests.send(Request::Demand).is_err() {
                return Poll::Ready(None);
            }
        }
        Poll::Pending
    }
}

/// How a delivery is finished.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) enum Outcome {
    Ack,
    /// After this delay, or the policy's backoff.
    Retry(Option<Duration>),
    Fail(String),
}

impl Outcome {
    /// Which kind of finish this is: a finish made again is the same kind.
    pub(crate) fn tag(&self) -> &'static str {
        match self {
            Outcome::Ack => "ack",
            Outcome::Retry(_) => "retry",
            Outcome::Fail(_) => "dead",
        }
    }
}

/// A due task handed to a consumer, under a lease. Finish it with [`ack`](Delivery::ack),
/// [`retry`](Delivery::retry), [`retry_after`](Delivery::retry_after) or
/// [`fail`](Delivery::fail); dropped unfinished, it is delivered again when its lease ends.
///
/// The lease started when the stream yielded the delivery; [`extend`](Delivery::extend)
/// moves its end.
pub struct Delivery {
    id: TaskId,
    payload: Vec<u8>,
    attempt: u32,
    due: SystemTime,
    token: u64,
    engine: mpsc::UnboundedSender<Request>,
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    route: Route,
    /// Yielded by the stream (else still in a prefetch buffer: dropping it returns the task).
    handed_out: bool,
    /// Finished successfully: dropping it tells the engine nothing.
    finished: AtomicBool,
    /// How it was finished (a `tag` of [`Outcome`]): an `ack` made again answers `Ok`
    /// without a store call.
    finished_as: OnceLock<&'static str>,
    /// Redis: which invocation carried its latest finish (see `redis::calls::finish`).
    #[cfg(feature = "redis")]
    kept: crate::redis::Kept,
    /// One finish at a time: a finish made while another is on its way waits for its answer
    /// (two `ack`s at once both answer `Ok`).
    finishing: tokio::sync::Mutex<()>,
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("id", &self.id)
            .field("attempt", &self.attempt)
            .field("due", &self.due)
            .field("payload_len", &self.payload.len())
            .finish()
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        if self.finished.load(Ordering::Acquire) {
            return;
        }
        // Never handed out: the task goes back at once. Handed out: its lease runs out as
        // promised (a dropped delivery is delivered again after it), but keep-alive and
        // `close` stop waiting for it.
        let _ = self.engine.send(if self.handed_out {
            Request::Dropped(self.token)
        } else {
            Request::Release(self.token)
        });
    }
}

impl Delivery {
    pub(crate) fn new(
        id: TaskId,
        payload: Vec<u8>,
        attempt: u32,
        due: SystemTime,
        token: u64,
        engine: mpsc::UnboundedSender<Request>,
        route: Route,
    ) -> Delivery {
        Delivery {
            id,
            payload,
            attempt,
            due,
            token,
            engine,
            route,
            handed_out: false,
            finished: AtomicBool::new(false),
            finished_as: OnceLock::new(),
            #[cfg(feature = "redis")]
            kept: Default::default(),
            finishing: tokio::sync::Mutex::new(()),
        }
    }

    /// The stream yields it: its lease starts now.
    fn hand_out(&mut self) {
        self.handed_out = true;
        let _ = self.engine.send(Request::HandedOut(self.token));
    }

    /// The task's id.
    pub fn id(&self) -> &TaskId {
        &self.id
    }

    /// The task's payload: exactly the bytes that were scheduled.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// The payload deserialized from JSON (feature `serde`), as written by [`Task::json`](crate::Task::json).
    ///
    /// # Errors
    ///
    /// What `serde_json` reports for a payload that is not a `T`.
    #[cfg(feature = "serde")]
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.payload)
    }

    /// Which delivery this is: 1 for the first.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// When the task was due (by the store's clock).
    pub fn due(&self) -> SystemTime {
        self.due
    }

    async fn finish(
        &self,
        outcome: Outcome,
        request: impl FnOnce(oneshot::Sender<Result<(), Error>>) -> Request,
    ) -> Result<(), Error> {
        let tag = outcome.tag();
        let _turn = self.finishing.lock().await;
        if tag == "ack" && self.finished_as.get() == Some(&"ack") {
            // An ack made again (its first answer lost to the caller, or simply repeated) is
            // recognised: the task is gone, it cannot have been handed out again. Any other
            // finish goes to the store, which answers for it (`LeaseLost` once the task
            // moved on).
            return Ok(());
        }
        let result = match &self.route {
            Route::Engine => {
                let (reply, answer) = oneshot::channel();
                self.engine
                    .send(request(reply))
                    .map_err(|_| Error::Closed)?;
                answer.await.map_err(|_| Error::Closed)?
            }
            #[cfg(feature = "redis")]
            Route::Redis(shared) => {
                // The engine stops waiting for it (close, keep-alive); the store decides.
                self.engine
                    .send(Request::Finishing(self.token))
                    .map_err(|_| Error::Closed)?;
                shared
                    .finish(
                        self.id.as_str(),
                        self.token,
                        self.attempt,
                        outcome,
                        &self.kept,
                    )
                    .await
            }
        };
        if result.is_ok() {
            let _ = self.finished_as.set(tag);
            self.finished.store(true, Ordering::Release);
        }
        result
    }

    /// Done: deletes the task for good, once durable.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the task was handed out again or moved on (this call changed
    /// nothing), [`Error::Io`], [`Error::Unreachable`], [`Error::Closed`]. An `ack` is
    /// recognised by its delivery: made again — after it answered `Ok`, or after an error
    /// such as `Unreachable` when its first run did delete the task — it answers `Ok` (for
    /// about one lease after an error), so it can simply be repeated.
    pub async fn ack(&self) -> Result<(), Error> {
        let id = self.id.as_str().to_owned();
        self.finish(Outcome::Ack, |reply| Request::Ack(id, self.token, reply))
            .await
    }

    /// Not now: delivers the task again after the retry policy's backoff, or moves it to the
    /// dead letters if this was its last attempt.
    ///
    /// # Errors
    ///
    /// As [`ack`](Delivery::ack).
    pub async fn retry(&self) -> Result<(), Error> {
        let id = self.id.as_str().to_owned();
        self.finish(Outcome::Retry(None), |reply| {
            Request::Retry(id, self.token, self.attempt, None, reply)
        })
        .await
    }

    /// Not now: delivers the task again after `delay` (e.g. a server's `Retry-After`), by the
    /// store's clock. Counts toward the policy's `max_attempts` like [`retry`](Delivery::retry):
    /// on the last attempt the task goes to the dead letters.
    ///
    /// # Errors
    ///
    /// As [`ack`](Delivery::ack).
    pub async fn retry_after(&self, delay: Duration) -> Result<(), Error> {
        let id = self.id.as_str().to_owned();
        self.finish(Outcome::Retry(Some(delay)), |reply| {
            Request::Retry(id, self.token, self.attempt, Some(delay), reply)
        })
        .await
    }

    /// Never: moves the task to the dead letters with `reason`.
    ///
    /// # Errors
    ///
    /// As [`ack`](Delivery::ack).
    pub async fn fail(&self, reason: impl Into<String>) -> Result<(), Error> {
        let id = self.id.as_str().to_owned();
        let reason = reason.into();
        self.finish(Outcome::Fail(reason.clone()), |reply| {
            Request::Fail(id, self.token, reason, reply)
        })
        .await
    }

    /// Keeps the lease for a long job: it now ends `duration` from now (by the store's
    /// clock), whatever was left of it. Call it again before then to go on.
    ///
    /// Cost: one store round trip on Redis; nothing durable on the embedded store (its leases
    /// live in the process that holds the lock).
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the lease already ran out (or the delivery was finished),
    /// [`Error::Unreachable`], [`Error::Closed`].
    pub async fn extend(&self, duration: Duration) -> Result<(), Error> {
        #[cfg(feature = "redis")]
        if let Route::Redis(shared) = &self.route {
            if self.engine.is_closed() {
                return Err(Error::Closed);
            }
            let held = shared
                .extend(&[(self.id.as_str().to_owned(), self.token)], duration, true)
                .await?;
            return if held == 1 {
                Ok(())
            } else {
                Err(Error::LeaseLost)
            };
        }
        let (reply, answer) = oneshot::channel();
        self.engine
            .send(Request::Extend(self.token, duration, reply))
            .map_err(|_| Error::Closed)?;
        answer.await.map_err(|_| Error::Closed)?
    }
}
