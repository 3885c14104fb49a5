//! Memory: heap bytes per pending timer, through a counting allocator.

use super::*;

// ---------------------------------------------------------------- memory

/// A global allocator that counts live heap bytes. Binaries that want memory numbers install
/// it with `#[global_allocator]`.
pub struct CountingAllocator;

pub(crate) static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is a side
// effect that never affects the returned memory.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: forwarded with the caller's arguments.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Live heap bytes (meaningful only under [`CountingAllocator`]).
pub fn live_bytes() -> isize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// Heap bytes per pending timer while `hold` keeps n timers pending. `hold` gets n and must
/// return what keeps them alive (and, for services, everything needed to clean up). Live
/// bytes are counted process-wide, so an actor's, tick task's or timer thread's storage
/// counts. Returns the bytes per timer and what `hold` returned, for the caller to clean up.
pub async fn bytes_per_timer<H, F>(n: usize, hold: H) -> (f64, F::Output)
where
    H: FnOnce(usize) -> F,
    F: Future,
{
    let before = live_bytes();
    let held = hold(n).await;
    let after = live_bytes();
    ((after - before) as f64 / n as f64, held)
}

/// The delays of the memory scenario, spread over [1 h, 2 h) at millisecond resolution: no
/// timer may fire while the count is taken, and registering 10^7 takes seconds.
pub(crate) fn memory_delays(n: usize) -> Vec<Duration> {
    let mut rng = Rng(7);
    (0..n)
        .map(|_| Duration::from_secs(3_600) + Duration::from_millis(rng.next() % 3_600_000))
        .collect()
}

pub async fn hold_tokio_sleeps(n: usize) -> Vec<Pin<Box<tokio::time::Sleep>>> {
    memory_delays(n)
        .into_iter()
        .map(|delay| {
            let mut sleep = Box::pin(tokio::time::sleep(delay));
            assert!(poll_once(sleep.as_mut()).is_pending());
            sleep
        })
        .collect()
}

pub async fn hold_wheel_sleeps(wheel: Wheel, n: usize) -> Vec<tokio_wheel::Sleep> {
    let sleeps = memory_delays(n)
        .into_iter()
        .map(|delay| {
            let mut sleep = wheel.sleep(delay);
            assert!(poll_once(Pin::new(&mut sleep)).is_pending());
            sleep
        })
        .collect();
    wheel.flush().await;
    sleeps
}

pub async fn hold_wheel_jobs(wheel: Wheel, n: usize) -> Vec<tokio_wheel::JobHandle<()>> {
    let jobs = memory_delays(n)
        .into_iter()
        .map(|delay| wheel.spawn_after(delay, async {}))
        .collect();
    wheel.flush().await;
    jobs
}

pub async fn hold_keyed(
    wheel: Wheel,
    n: usize,
) -> (
    tokio_wheel::Timers<u64, u64>,
    tokio_wheel::Expirations<u64, u64>,
) {
    let (timers, expired) = wheel.keyed::<u64, u64>();
    for (key, delay) in memory_delays(n).into_iter().enumerate() {
        timers.set(key as u64, key as u64, delay);
    }
    assert_eq!(timers.len().await, n);
    (timers, expired)
}

/// n keyed entries made by `Timers::insert`, each with its handle held (the handle's own
/// bytes count: the caller holds them).
pub async fn hold_keyed_handles(
    wheel: Wheel,
    n: usize,
) -> (
    tokio_wheel::Timers<u64, u64>,
    tokio_wheel::Expirations<u64, u64>,
    Vec<KeyedTimer<u64, u64>>,
) {
    let (timers, expired) = wheel.keyed::<u64, u64>();
    let handles = memory_delays(n)
        .into_iter()
        .enumerate()
        .map(|(key, delay)| timers.insert(key as u64, key as u64, delay))
        .collect();
    assert_eq!(timers.len().await, n);
    (timers, expired, handles)
}

pub async fn hold_delay_queue(n: usize) -> (DelayQueue<u64>, Vec<DelayKey>) {
    let mut queue = DelayQueue::new();
    let keys = memory_delays(n)
        .into_iter()
        .enumerate()
        .map(|(i, delay)| queue.insert(i as u64, delay))
        .collect();
    (queue, keys)
}

/// n pending `kestrel-timer` timers: the caller holds each one's handle (its id, a reference
/// to the wheel and the completion receiver), the wheel holds the entry and its index slot.
pub async fn hold_kestrel(timer: Kestrel, n: usize) -> (Kestrel, Vec<TimerHandleWithCompletion>) {
    let handles = memory_delays(n)
        .into_iter()
        .map(|delay| kestrel_register(&timer, delay).1)
        .collect();
    (timer, handles)
}

/// n pending `hierarchical_hash_wheel_timer` timers (no-op closures, ids 0..n), once the
/// thread has filed them all: the caller holds nothing per timer (the id is its own).
pub async fn hold_hash_wheel(mut timer: HashWheelRef, n: usize) -> HashWheelRef {
    for (id, delay) in memory_delays(n).into_iter().enumerate() {
        timer.schedule_action_once(id as u64, delay, |_| {});
    }
    hash_wheel_barrier(&mut timer).await;
    timer
}
