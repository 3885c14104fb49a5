//! Keyed timers: schedule + cancel, churn, and many producers on one set.

use super::*;

// ---------------------------------------------------------------- keyed schedule + cancel

/// `Timers::set` for n keys (until `len()` says n), then `Timers::remove` for each (until
/// `len()` says 0).
pub async fn keyed_schedule_cancel_wheel(
    timers: Timers<u64, ()>,
    delays: Arc<Vec<Duration>>,
) -> ScheduleCancel {
    let n = delays.len();
    let start = Instant::now();
    for (key, &delay) in delays.iter().enumerate() {
        timers.set(key as u64, (), delay);
    }
    let caller_scheduled = start.elapsed();
    assert_eq!(timers.len().await, n);
    let scheduled = start.elapsed();
    let start = Instant::now();
    for key in 0..n as u64 {
        timers.remove(&key);
    }
    let caller_cancelled = start.elapsed();
    assert_eq!(timers.len().await, 0);
    let cancelled = start.elapsed();
    ScheduleCancel {
        scheduled,
        cancelled,
        caller_scheduled,
        caller_cancelled,
    }
}

/// The same on a `DelayQueue` with a `HashMap` from user key to queue key (the value is the
/// user key, so that an expiration says which key expired): what a keyed API costs users
/// of `DelayQueue`.
pub async fn keyed_schedule_cancel_delay_queue(delays: Arc<Vec<Duration>>) -> ScheduleCancel {
    let n = delays.len();
    let mut queue = DelayQueue::with_capacity(n);
    let mut index: HashMap<u64, DelayKey> = HashMap::with_capacity(n);
    let start = Instant::now();
    for (key, &delay) in delays.iter().enumerate() {
        let key = key as u64;
        if let Some(old) = index.insert(key, queue.insert(key, delay)) {
            queue.remove(&old);
        }
    }
    let scheduled = start.elapsed();
    let start = Instant::now();
    for key in 0..n as u64 {
        if let Some(k) = index.remove(&key) {
            queue.remove(&k);
        }
    }
    ScheduleCancel::synchronous(scheduled, start.elapsed())
}

/// The same through an `Arc<Mutex<_>>`, one lock per operation, as a handle shared across
/// tasks must be.
pub async fn keyed_schedule_cancel_shared_delay_queue(
    delays: Arc<Vec<Duration>>,
) -> ScheduleCancel {
    type Shared = (DelayQueue<u64>, HashMap<u64, DelayKey>);
    let n = delays.len();
    let shared: Arc<Mutex<Shared>> = Arc::new(Mutex::new((
        DelayQueue::with_capacity(n),
        HashMap::with_capacity(n),
    )));
    let start = Instant::now();
    for (key, &delay) in delays.iter().enumerate() {
        let key = key as u64;
        let mut guard = shared.lock().unwrap();
        let (queue, index) = &mut *guard;
        if let Some(old) = index.insert(key, queue.insert(key, delay)) {
            queue.remove(&old);
        }
    }
    let scheduled = start.elapsed();
    let start = Instant::now();
    for key in 0..n as u64 {
        let mut guard = shared.lock().unwrap();
        let (queue, index) = &mut *guard;
        if let Some(k) = index.remove(&key) {
            queue.remove(&k);
        }
    }
    ScheduleCancel::synchronous(scheduled, start.elapsed())
}

// ---------------------------------------------------------------- keyed churn

/// One churn operation on key `key`.
#[derive(Debug, Clone, Copy)]
pub enum Churn {
    Reset,
    Remove,
    Set,
}

/// The churn mix: half resets, a quarter removals, a quarter (re-)sets, on random keys.
pub fn churn_ops(n: usize, count: usize) -> Vec<(u64, Churn, Duration)> {
    let mut rng = Rng(0xDEAD_BEEF_F00D_CAFE);
    (0..count)
        .map(|_| {
            let key = rng.next() % n as u64;
            let op = match rng.next() % 4 {
                0 | 1 => Churn::Reset,
                2 => Churn::Remove,
                _ => Churn::Set,
            };
            (key, op, Duration::from_millis(1_000 + rng.next() % 59_000))
        })
        .collect()
}

pub async fn churn_keyed(
    timers: Timers<u64, u64>,
    n: usize,
    ops: Arc<Vec<(u64, Churn, Duration)>>,
) -> Duration {
    for key in 0..n as u64 {
        timers.set(key, key, Duration::from_secs(30));
    }
    assert_eq!(timers.len().await, n);
    let start = Instant::now();
    for &(key, op, delay) in ops.iter() {
        match op {
            Churn::Reset => timers.reset(&key, delay),
            Churn::Remove => timers.remove(&key),
            Churn::Set => timers.set(key, key, delay),
        }
    }
    timers.len().await;
    let elapsed = start.elapsed();
    timers.drain().await;
    elapsed
}

/// DelayQueue with a `HashMap` from user key to queue key: what a keyed API costs users today.
pub async fn churn_delay_queue(n: usize, ops: Arc<Vec<(u64, Churn, Duration)>>) -> Duration {
    let mut queue = DelayQueue::with_capacity(n);
    let mut index = HashMap::with_capacity(n);
    for key in 0..n as u64 {
        index.insert(key, queue.insert(key, Duration::from_secs(30)));
    }
    let start = Instant::now();
    for &(key, op, delay) in ops.iter() {
        churn_step(&mut queue, &mut index, key, op, delay);
    }
    start.elapsed()
}

/// The same through an `Arc<Mutex<_>>`, as a handle shared across tasks must be.
pub async fn churn_shared_delay_queue(n: usize, ops: Arc<Vec<(u64, Churn, Duration)>>) -> Duration {
    type Shared = (DelayQueue<u64>, HashMap<u64, DelayKey>);
    let shared: Arc<Mutex<Shared>> = Arc::new(Mutex::new((
        DelayQueue::with_capacity(n),
        HashMap::with_capacity(n),
    )));
    {
        let mut guard = shared.lock().unwrap();
        let (queue, index) = &mut *guard;
        for key in 0..n as u64 {
            index.insert(key, queue.insert(key, Duration::from_secs(30)));
        }
    }
    let start = Instant::now();
    for &(key, op, delay) in ops.iter() {
        let mut guard = shared.lock().unwrap();
        let (queue, index) = &mut *guard;
        churn_step(queue, index, key, op, delay);
    }
    start.elapsed()
}

pub(crate) fn churn_step(
    queue: &mut DelayQueue<u64>,
    index: &mut HashMap<u64, DelayKey>,
    key: u64,
    op: Churn,
    delay: Duration,
) {
    match op {
        Churn::Reset => {
            if let Some(k) = index.get(&key) {
                queue.reset(k, delay);
            }
        }
        Churn::Remove => {
            if let Some(k) = index.remove(&key) {
                queue.remove(&k);
            }
        }
        Churn::Set => {
            if let Some(k) = index.remove(&key) {
                queue.remove(&k);
            }
            index.insert(key, queue.insert(key, delay));
        }
    }
}

// ---------------------------------------------------------------- keyed, many producers

/// Keys every keyed-producer run starts with (pending far ahead), so a queue is not empty
/// and a new key's deadline rarely becomes its earliest: the shape of a server with live
/// connections.
pub const KEYED_PRODUCERS_PREFILL: u64 = 10_000;

/// Producer `p`'s `i`-th key: each task owns its keys (a connection's task its own), none
/// collides with the prefill.
pub(crate) fn producer_key(p: usize, i: usize) -> u64 {
    ((p as u64 + 1) << 32) | i as u64
}

/// `producers` tasks each set `per_task` keys (deadlines in [1 s, 60 s]) and remove each right
/// after on one keyed set (`reset` by key in between when `reset` is true), then a `len()`
/// barrier: every command applied. The set holds [`KEYED_PRODUCERS_PREFILL`] keys meanwhile.
pub async fn producers_keyed_wheel(
    timers: Timers<u64, u64>,
    producers: usize,
    per_task: usize,
    reset: bool,
) -> Duration {
    let mut rng = Rng(7);
    for key in 0..KEYED_PRODUCERS_PREFILL {
        timers.set(key, key, producer_delay(&mut rng));
    }
    timers.len().await;
    let start = Instant::now();
    run_producers(producers, |p| {
        let timers = timers.clone();
        async move {
            let mut rng = producer_rng(p);
            for i in 0..per_task {
                let key = producer_key(p, i);
                timers.set(key, key, producer_delay(&mut rng));
                if reset {
                    timers.reset(&key, producer_delay(&mut rng));
                }
                timers.remove(&key);
            }
        }
    })
    .await;
    timers.len().await;
    let elapsed = start.elapsed();
    timers.drain().await;
    elapsed
}

pub(crate) type SharedKeyedQueue = Arc<Mutex<(DelayQueue<u64>, HashMap<u64, DelayKey>)>>;

/// The same on one `Arc<Mutex<DelayQueue + HashMap>>` driven by its own task (which polls it
/// for expirations, as a user must, and is woken when an insert becomes the earliest).
pub async fn producers_keyed_shared_delay_queue(
    producers: usize,
    per_task: usize,
    reset: bool,
) -> Duration {
    let shared: SharedKeyedQueue = Arc::new(Mutex::new((DelayQueue::new(), HashMap::new())));
    {
        let mut guard = shared.lock().unwrap();
        let (queue, index) = &mut *guard;
        let mut rng = Rng(7);
        for key in 0..KEYED_PRODUCERS_PREFILL {
            index.insert(key, queue.insert(key, producer_delay(&mut rng)));
        }
    }
    let stop = Arc::new(tokio::sync::Notify::new());
    let driver = tokio::spawn({
        let (shared, stop) = (shared.clone(), stop.clone());
        async move {
            let expired = std::future::poll_fn(|cx| {
                let mut guard = shared.lock().unwrap();
                let (queue, index) = &mut *guard;
                while let Poll::Ready(Some(expired)) = queue.poll_expired(cx) {
                    index.remove(expired.get_ref());
                }
                // Empty (`Ready(None)`) or nothing due: the waker is stored either way.
                Poll::<()>::Pending
            });
            tokio::select! {
                () = expired => {}
                () = stop.notified() => {}
            }
        }
    });
    let start = Instant::now();
    run_producers(producers, |p| {
        let shared = shared.clone();
        async move {
            let mut rng = producer_rng(p);
            for i in 0..per_task {
                let key = producer_key(p, i);
                let delay = producer_delay(&mut rng);
                {
                    let mut guard = shared.lock().unwrap();
                    let (queue, index) = &mut *guard;
                    if let Some(old) = index.insert(key, queue.insert(key, delay)) {
                        queue.remove(&old);
                    }
                }
                if reset {
                    let delay = producer_delay(&mut rng);
                    let guard = &mut *shared.lock().unwrap();
                    if let Some(k) = guard.1.get(&key) {
                        guard.0.reset(k, delay);
                    }
                }
                let guard = &mut *shared.lock().unwrap();
                if let Some(k) = guard.1.remove(&key) {
                    guard.0.remove(&k);
                }
            }
        }
    })
    .await;
    let elapsed = start.elapsed();
    stop.notify_one();
    driver.await.expect("driver");
    elapsed
}
