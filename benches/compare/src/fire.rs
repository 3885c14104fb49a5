//! Fire: n timers due over one second; CPU per fired timer and lateness.

use super::*;

// ---------------------------------------------------------------- fire

/// What firing n timers spread over one second cost.
#[derive(Debug, Clone)]
pub struct FireReport {
    /// Process CPU time while the timers fired, per timer (every thread: workers, actors,
    /// tick tasks and timer threads alike).
    pub cpu_per_timer: Duration,
    /// Sorted lateness of every timer in nanoseconds: the instant it was seen complete minus
    /// its deadline, negative if it completed early.
    pub lateness: Vec<i64>,
}

impl FireReport {
    /// The lateness at percentile `p` (0.0 to 1.0), in nanoseconds.
    pub fn percentile(&self, p: f64) -> i64 {
        let index = ((self.lateness.len() as f64 - 1.0) * p).round() as usize;
        self.lateness[index]
    }

    /// The largest lateness, in nanoseconds.
    pub fn max(&self) -> i64 {
        *self.lateness.last().expect("timers fired")
    }

    /// How many timers completed before their deadline.
    pub fn early(&self) -> usize {
        self.lateness.partition_point(|&late| late < 0)
    }

    /// How far before its deadline the earliest timer completed (zero if none was early).
    pub fn most_early(&self) -> Duration {
        let first = *self.lateness.first().expect("timers fired");
        Duration::from_nanos(first.min(0).unsigned_abs())
    }
}

/// Lateness samples as they come in: the instant each timer was seen complete, against its
/// deadline.
pub(crate) struct LatenessLog {
    lateness: Vec<i64>,
}

impl LatenessLog {
    fn with_capacity(n: usize) -> LatenessLog {
        LatenessLog {
            lateness: Vec::with_capacity(n),
        }
    }

    fn len(&self) -> usize {
        self.lateness.len()
    }

    fn record(&mut self, deadline: Instant) {
        let now = Instant::now();
        self.lateness.push(if now >= deadline {
            (now - deadline).as_nanos() as i64
        } else {
            -((deadline - now).as_nanos() as i64)
        });
    }

    fn report(mut self, cpu: Duration) -> FireReport {
        let n = self.lateness.len();
        self.lateness.sort_unstable();
        FireReport {
            cpu_per_timer: cpu / n.max(1) as u32,
            lateness: self.lateness,
        }
    }
}

/// CPU time this process has used so far.
pub fn process_cpu_time() -> Duration {
    let mut spec = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `spec` is a valid, writable timespec; the clock id is a constant the kernel knows.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut spec) };
    assert_eq!(status, 0, "clock_gettime failed");
    Duration::new(spec.tv_sec as u64, spec.tv_nsec as u32)
}

/// Deadlines spread over one second, the first `200 ms + 1 µs · n` from now: registering
/// them all (before the CPU clock starts) must end before the first is due, and registering
/// 10^6 timers takes a few hundred milliseconds.
pub(crate) fn fire_deadlines(n: usize) -> Vec<Instant> {
    let first = Instant::now() + Duration::from_millis(200) + Duration::from_micros(n as u64);
    let mut rng = Rng(0x0123_4567_89AB_CDEF);
    let mut deadlines: Vec<Instant> = (0..n)
        .map(|_| first + Duration::from_micros(rng.next() % 1_000_000))
        .collect();
    deadlines.sort_unstable();
    deadlines
}

/// Drives a set of futures that each resolve to their deadline: the first poll registers them
/// all, then CPU time is measured while they fire.
///
/// The driver runs under `tokio::task::unconstrained`. Under Tokio's cooperative budget, a
/// task gets 128 units per poll and a `tokio::time::Sleep` that completes spends one; once
/// the budget is spent, each further `Sleep` polled returns `Pending` and hands its waker to
/// the scheduler's *deferred* list (`context::defer`, woken only after the task yields)
/// instead of waking it at once. `FuturesUnordered::poll_next` relies on children that
/// wake themselves during their poll to notice it should yield (it stops after two); with
/// deferred wakers it sees none, so it polls every other ready child (`polled == len`) before
/// returning. Each task poll then completes at most 128 timers but polls the whole backlog of
/// fired ones: once timers fire faster than that drains (≈ 4·10^5 timers per second here),
/// the backlog grows, each poll gets slower, and the run collapses into quadratic work
/// (2·10^5 timers: 31 million child polls and 5.6 s lateness; 4·10^5: ~1 300 completions per
/// second). That was the "tokio side stops making progress above ~6·10^5" of earlier runs:
/// the harness's fault (one task driving 10^6 futures), not the timer's, and with one task
/// per timer — the pattern it stands for — the budget never runs out. Unconstrained, the
/// driver drains every fired timer in one poll, for every peer alike.
///
/// `filed` completes once the timer service has filed what the first poll registered: tokio
/// files a `Sleep` inside that poll, the wheel's actor a moment later, so without the barrier
/// the wheel's filing was charged to the firing and tokio's was not (the keyed scenario has
/// always waited for its `len()` before starting the clock).
pub(crate) async fn fire_all<F, S>(futures: FuturesUnordered<F>, filed: S) -> FireReport
where
    F: Future<Output = Instant>,
    S: Future<Output = ()>,
{
    tokio::task::unconstrained(async move {
        let n = futures.len();
        let mut futures = pin!(futures);
        let mut log = LatenessLog::with_capacity(n);
        if let Poll::Ready(Some(deadline)) = futures
            .as_mut()
            .poll_next(&mut Context::from_waker(Waker::noop()))
        {
            log.record(deadline);
        }
        filed.await;
        let cpu = process_cpu_time();
        while let Some(deadline) = futures.next().await {
            log.record(deadline);
        }
        log.report(process_cpu_time() - cpu)
    })
    .await
}

pub async fn fire_tokio(n: usize) -> FireReport {
    let futures: FuturesUnordered<_> = fire_deadlines(n)
        .into_iter()
        .map(|deadline| async move {
            tokio::time::sleep_until(deadline).await;
            deadline
        })
        .collect();
    fire_all(futures, async {}).await
}

pub async fn fire_wheel(wheel: Wheel, n: usize) -> FireReport {
    let futures: FuturesUnordered<_> = fire_deadlines(n)
        .into_iter()
        .map(|deadline| {
            let sleep = wheel.sleep_until(deadline);
            async move {
                sleep.await;
                deadline
            }
        })
        .collect();
    let report = fire_all(futures, wheel.flush()).await;
    wheel.flush().await;
    report
}

/// Fires n keyed entries; returns the keyed set for the next run.
pub async fn fire_keyed(keyed: KeyedSet<()>, n: usize) -> (FireReport, KeyedSet<()>) {
    let KeyedSet {
        timers,
        mut expired,
    } = keyed;
    for (key, deadline) in fire_deadlines(n).into_iter().enumerate() {
        timers.set_at(key as u64, (), deadline);
    }
    assert_eq!(timers.len().await, n);
    let report = tokio::task::unconstrained(async {
        let cpu = process_cpu_time();
        let mut log = LatenessLog::with_capacity(n);
        while log.len() < n {
            let e = expired.next().await.expect("expiration");
            log.record(e.deadline());
        }
        log.report(process_cpu_time() - cpu)
    })
    .await;
    (report, KeyedSet { timers, expired })
}

pub async fn fire_delay_queue(n: usize) -> FireReport {
    let mut queue = DelayQueue::with_capacity(n);
    for deadline in fire_deadlines(n) {
        queue.insert_at(deadline, deadline);
    }
    tokio::task::unconstrained(async move {
        let cpu = process_cpu_time();
        let mut log = LatenessLog::with_capacity(n);
        while let Some(expired) = queue.next().await {
            log.record(expired.into_inner());
        }
        log.report(process_cpu_time() - cpu)
    })
    .await
}

/// `kestrel-timer`: one registration per deadline (as a delay from now: kestrel rounds it
/// down to its 10 ms tick), each awaited through its completion receiver.
pub async fn fire_kestrel(timer: Kestrel, n: usize) -> FireReport {
    let futures: FuturesUnordered<_> = fire_deadlines(n)
        .into_iter()
        .map(|deadline| {
            let delay = deadline.saturating_duration_since(Instant::now());
            let (receiver, _handle) = kestrel_register(&timer, delay).1.into_parts();
            async move {
                match receiver {
                    CompletionReceiver::OneShot(receiver) => {
                        assert_eq!(receiver.await, Ok(TaskCompletion::Called));
                    }
                    CompletionReceiver::Periodic(_) => unreachable!("one-shot timer"),
                }
                deadline
            }
        })
        .collect();
    fire_all(futures, async {}).await
}

/// `hierarchical_hash_wheel_timer`: one `schedule_action_once` per deadline (as a delay from
/// now, millisecond resolution) whose closure, run on the timer thread, completes a
/// `tokio::sync::oneshot` the waiting future awaits.
pub async fn fire_hash_wheel(mut timer: HashWheelRef, n: usize) -> FireReport {
    let futures: FuturesUnordered<_> = fire_deadlines(n)
        .into_iter()
        .enumerate()
        .map(|(id, deadline)| {
            let (done, fired) = tokio::sync::oneshot::channel();
            let delay = deadline.saturating_duration_since(Instant::now());
            timer.schedule_action_once(id as u64, delay, move |_| {
                let _ = done.send(());
            });
            async move {
                fired.await.expect("fired");
                deadline
            }
        })
        .collect();
    fire_all(futures, async {}).await
}
