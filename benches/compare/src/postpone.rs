//! Postpone: move pending timers later or earlier, one atomic store or one command.

use super::*;

// ---------------------------------------------------------------- postpone

/// How each round moves every deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// 30 s later each round (keep-alive).
    Later,
    /// 1 s earlier each round.
    Earlier,
}

impl Move {
    /// The deadline of round `round` (1-based) for a timer first due at `base`.
    fn deadline(self, base: Instant, round: u32) -> Instant {
        match self {
            Move::Later => base + Duration::from_secs(30) * round,
            Move::Earlier => base - Duration::from_secs(1) * round,
        }
    }
}

/// First deadlines for the postpone scenarios: far enough that 10 earlier moves stay ahead.
pub(crate) fn postpone_bases(n: usize) -> Vec<Instant> {
    let now = Instant::now();
    let mut rng = Rng(0xA5A5_5A5A_1234_5678);
    (0..n)
        .map(|_| now + Duration::from_secs(100) + Duration::from_millis(rng.next() % 60_000))
        .collect()
}

/// `Sleep::reset` on n registered tokio sleeps, `rounds` times each. Returns the time of all
/// resets.
pub async fn postpone_tokio(n: usize, rounds: u32, how: Move) -> Duration {
    let bases = postpone_bases(n);
    let mut sleeps: Vec<_> = bases
        .iter()
        .map(|&base| {
            let mut sleep = Box::pin(tokio::time::sleep_until(base));
            assert!(poll_once(sleep.as_mut()).is_pending());
            sleep
        })
        .collect();
    let start = Instant::now();
    for round in 1..=rounds {
        for (sleep, &base) in sleeps.iter_mut().zip(&bases) {
            sleep.as_mut().reset(how.deadline(base, round));
        }
    }
    start.elapsed()
}

/// `Sleep::reset` on n registered tokio-wheel sleeps, `rounds` times each, then a flush.
pub async fn postpone_wheel(wheel: Wheel, n: usize, rounds: u32, how: Move) -> Duration {
    let bases = postpone_bases(n);
    let mut sleeps: Vec<_> = bases
        .iter()
        .map(|&base| {
            let mut sleep = wheel.sleep_until(base);
            assert!(poll_once(Pin::new(&mut sleep)).is_pending());
            sleep
        })
        .collect();
    wheel.flush().await;
    let start = Instant::now();
    for round in 1..=rounds {
        for (sleep, &base) in sleeps.iter_mut().zip(&bases) {
            Pin::new(sleep).reset(how.deadline(base, round));
        }
    }
    wheel.flush().await;
    let elapsed = start.elapsed();
    drop(sleeps);
    wheel.flush().await;
    elapsed
}

/// `Timers::reset_at` on n keyed entries, `rounds` times each, then a `len()` barrier.
pub async fn postpone_keyed(timers: Timers<u64, ()>, n: usize, rounds: u32, how: Move) -> Duration {
    let bases = postpone_bases(n);
    for (key, &base) in bases.iter().enumerate() {
        timers.set_at(key as u64, (), base);
    }
    assert_eq!(timers.len().await, n);
    let start = Instant::now();
    for round in 1..=rounds {
        for (key, &base) in bases.iter().enumerate() {
            timers.reset_at(&(key as u64), how.deadline(base, round));
        }
    }
    assert_eq!(timers.len().await, n);
    let elapsed = start.elapsed();
    assert_eq!(timers.drain().await.len(), n);
    elapsed
}

/// `KeyedTimer::reset_at` on the handles of n keyed entries (made by `Timers::insert_at`),
/// `rounds` times each, then a `len()` barrier: the connection-task pattern, where each task
/// holds its own entry's handle.
pub async fn postpone_keyed_handle(
    timers: Timers<u64, ()>,
    n: usize,
    rounds: u32,
    how: Move,
) -> Duration {
    let bases = postpone_bases(n);
    let handles: Vec<KeyedTimer<u64, ()>> = bases
        .iter()
        .enumerate()
        .map(|(key, &base)| timers.insert_at(key as u64, (), base))
        .collect();
    assert_eq!(timers.len().await, n);
    let start = Instant::now();
    for round in 1..=rounds {
        for (handle, &base) in handles.iter().zip(&bases) {
            handle.reset_at(how.deadline(base, round));
        }
    }
    assert_eq!(timers.len().await, n);
    let elapsed = start.elapsed();
    assert_eq!(timers.drain().await.len(), n);
    elapsed
}

/// `DelayQueue::reset_at` through `&mut`, `rounds` times per entry.
pub async fn postpone_delay_queue(n: usize, rounds: u32, how: Move) -> Duration {
    let bases = postpone_bases(n);
    let mut queue = DelayQueue::with_capacity(n);
    let keys: Vec<DelayKey> = bases
        .iter()
        .map(|&base| queue.insert_at((), base))
        .collect();
    let start = Instant::now();
    for round in 1..=rounds {
        for (key, &base) in keys.iter().zip(&bases) {
            queue.reset_at(key, how.deadline(base, round));
        }
    }
    start.elapsed()
}

/// `DelayQueue::reset_at` through an `Arc<Mutex<_>>`: the fair peer for a handle that many
/// tasks share.
pub async fn postpone_shared_delay_queue(n: usize, rounds: u32, how: Move) -> Duration {
    let bases = postpone_bases(n);
    let queue = Arc::new(Mutex::new(DelayQueue::with_capacity(n)));
    let keys: Vec<DelayKey> = {
        let mut queue = queue.lock().unwrap();
        bases
            .iter()
            .map(|&base| queue.insert_at((), base))
            .collect()
    };
    let start = Instant::now();
    for round in 1..=rounds {
        for (key, &base) in keys.iter().zip(&bases) {
            queue
                .lock()
                .unwrap()
                .reset_at(key, how.deadline(base, round));
        }
    }
    start.elapsed()
}

/// `kestrel-timer`'s `TimerWheel::postpone(id, delay, None)`, `rounds` times per timer.
/// kestrel takes a delay from now, not a deadline: each round reads the clock once and
/// passes every timer's deadline minus that instant (a keep-alive would pass its constant
/// timeout and read no clock at all).
pub async fn postpone_kestrel(timer: Kestrel, n: usize, rounds: u32, how: Move) -> Duration {
    let bases = postpone_bases(n);
    let now = Instant::now();
    let (ids, handles): (Vec<_>, Vec<_>) = bases
        .iter()
        .map(|&base| kestrel_register(&timer, base - now))
        .unzip();
    let start = Instant::now();
    for round in 1..=rounds {
        let now = Instant::now();
        for (&id, &base) in ids.iter().zip(&bases) {
            let delay = how.deadline(base, round).saturating_duration_since(now);
            assert!(timer.postpone(id, delay, None));
        }
    }
    let elapsed = start.elapsed();
    assert_eq!(timer.cancel_batch(&ids), n);
    drop(handles);
    elapsed
}
