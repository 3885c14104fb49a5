//! Schedule + cancel: register a timer, then drop or cancel it unfired.

use super::*;

// ---------------------------------------------------------------- schedule + cancel

/// What one schedule + cancel batch cost. For synchronous peers the caller's side is the
/// whole cost; for tokio-wheel and `hierarchical_hash_wheel_timer` the end-to-end numbers
/// also wait for the actor or timer thread, which works on another core meanwhile.
#[derive(Debug, Clone, Copy)]
pub struct ScheduleCancel {
    /// Until every timer is filed.
    pub scheduled: Duration,
    /// Until every timer is reclaimed.
    pub cancelled: Duration,
    /// What the registering task itself spent.
    pub caller_scheduled: Duration,
    /// What the cancelling task itself spent.
    pub caller_cancelled: Duration,
}

impl ScheduleCancel {
    /// A peer whose caller does all the work.
    pub(crate) fn synchronous(scheduled: Duration, cancelled: Duration) -> ScheduleCancel {
        ScheduleCancel {
            scheduled,
            cancelled,
            caller_scheduled: scheduled,
            caller_cancelled: cancelled,
        }
    }

    /// Schedule + cancel, end to end.
    pub fn pair(&self) -> Duration {
        self.scheduled + self.cancelled
    }

    /// Schedule + cancel, caller side only.
    pub fn caller_pair(&self) -> Duration {
        self.caller_scheduled + self.caller_cancelled
    }
}

/// Registers a boxed `tokio::time::Sleep` per delay, then drops them all.
pub async fn schedule_cancel_tokio(delays: Arc<Vec<Duration>>) -> ScheduleCancel {
    let start = Instant::now();
    let mut sleeps = Vec::with_capacity(delays.len());
    for &delay in delays.iter() {
        let mut sleep = Box::pin(tokio::time::sleep(delay));
        assert!(poll_once(sleep.as_mut()).is_pending());
        sleeps.push(sleep);
    }
    let scheduled = start.elapsed();
    let start = Instant::now();
    drop(sleeps);
    ScheduleCancel::synchronous(scheduled, start.elapsed())
}

/// Registers a tokio-wheel `Sleep` per delay (waiting until the actor has them all), then
/// drops them all (waiting until the actor has reclaimed them).
pub async fn schedule_cancel_wheel(wheel: Wheel, delays: Arc<Vec<Duration>>) -> ScheduleCancel {
    let start = Instant::now();
    let mut sleeps = Vec::with_capacity(delays.len());
    for &delay in delays.iter() {
        let mut sleep = wheel.sleep(delay);
        assert!(poll_once(Pin::new(&mut sleep)).is_pending());
        sleeps.push(sleep);
    }
    let caller_scheduled = start.elapsed();
    wheel.flush().await;
    let scheduled = start.elapsed();
    let start = Instant::now();
    drop(sleeps);
    let caller_cancelled = start.elapsed();
    wheel.flush().await;
    let cancelled = start.elapsed();
    ScheduleCancel {
        scheduled,
        cancelled,
        caller_scheduled,
        caller_cancelled,
    }
}

/// Inserts every delay into a `DelayQueue`, then removes them all.
pub async fn schedule_cancel_delay_queue(delays: Arc<Vec<Duration>>) -> ScheduleCancel {
    let mut queue = DelayQueue::with_capacity(delays.len());
    let start = Instant::now();
    let keys: Vec<DelayKey> = delays
        .iter()
        .map(|&delay| queue.insert((), delay))
        .collect();
    let scheduled = start.elapsed();
    let start = Instant::now();
    for key in &keys {
        queue.remove(key);
    }
    ScheduleCancel::synchronous(scheduled, start.elapsed())
}

/// Registers a `kestrel-timer` timer per delay, then cancels them all (dropping a kestrel
/// handle does not cancel its timer: `cancel()` is the API).
pub async fn schedule_cancel_kestrel(timer: Kestrel, delays: Arc<Vec<Duration>>) -> ScheduleCancel {
    let start = Instant::now();
    let handles: Vec<TimerHandleWithCompletion> = delays
        .iter()
        .map(|&delay| kestrel_register(&timer, delay).1)
        .collect();
    let scheduled = start.elapsed();
    let start = Instant::now();
    for handle in &handles {
        assert!(handle.cancel());
    }
    drop(handles);
    ScheduleCancel::synchronous(scheduled, start.elapsed())
}

/// Sends a `schedule_action_once` per delay to the timer thread (waiting until it has them
/// all), then a `cancel` per id (waiting until it has applied them). The thread drops a
/// cancelled entry from its id map at once; the entry's slot in the wheel is reclaimed when
/// the wheel passes it.
pub async fn schedule_cancel_hash_wheel(
    mut timer: HashWheelRef,
    delays: Arc<Vec<Duration>>,
) -> ScheduleCancel {
    let start = Instant::now();
    for (id, &delay) in delays.iter().enumerate() {
        timer.schedule_action_once(id as u64, delay, |_| {});
    }
    let caller_scheduled = start.elapsed();
    hash_wheel_barrier(&mut timer).await;
    let scheduled = start.elapsed();
    let start = Instant::now();
    for id in 0..delays.len() as u64 {
        timer.cancel(&id);
    }
    let caller_cancelled = start.elapsed();
    hash_wheel_barrier(&mut timer).await;
    let cancelled = start.elapsed();
    ScheduleCancel {
        scheduled,
        cancelled,
        caller_scheduled,
        caller_cancelled,
    }
}
