//! Many producers: tasks registering and cancelling on one service at once.

use super::*;

// ---------------------------------------------------------------- many producers

/// The delay of producer `p`'s timers.
pub(crate) fn producer_rng(p: usize) -> Rng {
    Rng(p as u64 + 1)
}

pub(crate) fn producer_delay(rng: &mut Rng) -> Duration {
    Duration::from_millis(1_000 + rng.next() % 59_000)
}

/// Spawns `producers` tasks running `produce(p)` at once and waits for them all.
pub(crate) async fn run_producers<F, Fut>(producers: usize, produce: F)
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let tasks: Vec<_> = (0..producers).map(|p| tokio::spawn(produce(p))).collect();
    for task in tasks {
        task.await.expect("producer");
    }
}

/// `producers` tasks each register and drop `per_task` tokio sleeps, all at once.
pub async fn producers_tokio(producers: usize, per_task: usize) -> Duration {
    let start = Instant::now();
    run_producers(producers, |p| async move {
        let mut rng = producer_rng(p);
        for _ in 0..per_task {
            let mut sleep = Box::pin(tokio::time::sleep(producer_delay(&mut rng)));
            assert!(poll_once(sleep.as_mut()).is_pending());
        }
    })
    .await;
    start.elapsed()
}

/// The same with tokio-wheel sleeps, then a flush.
pub async fn producers_wheel(wheel: Wheel, producers: usize, per_task: usize) -> Duration {
    let start = Instant::now();
    run_producers(producers, |p| {
        let wheel = wheel.clone();
        async move {
            let mut rng = producer_rng(p);
            for _ in 0..per_task {
                let mut sleep = wheel.sleep(producer_delay(&mut rng));
                assert!(poll_once(Pin::new(&mut sleep)).is_pending());
            }
        }
    })
    .await;
    wheel.flush().await;
    start.elapsed()
}

/// The same with insert + remove on one `Arc<Mutex<DelayQueue>>`.
pub async fn producers_shared_delay_queue(producers: usize, per_task: usize) -> Duration {
    let queue = Arc::new(Mutex::new(DelayQueue::<()>::new()));
    let start = Instant::now();
    run_producers(producers, |p| {
        let queue = queue.clone();
        async move {
            let mut rng = producer_rng(p);
            for _ in 0..per_task {
                let key = queue.lock().unwrap().insert((), producer_delay(&mut rng));
                queue.lock().unwrap().remove(&key);
            }
        }
    })
    .await;
    start.elapsed()
}

/// The same with register + cancel on one `kestrel-timer` wheel shared through an `Arc`
/// (each pair takes its mutex three times: allocate, register, cancel).
pub async fn producers_kestrel(timer: Kestrel, producers: usize, per_task: usize) -> Duration {
    let start = Instant::now();
    run_producers(producers, |p| {
        let timer = timer.clone();
        async move {
            let mut rng = producer_rng(p);
            for _ in 0..per_task {
                let (_, handle) = kestrel_register(&timer, producer_delay(&mut rng));
                assert!(handle.cancel());
            }
        }
    })
    .await;
    start.elapsed()
}

/// The same with schedule + cancel messages from a cloned `TimerRef` per task to one timer
/// thread, until the thread has applied them all.
pub async fn producers_hash_wheel(
    mut timer: HashWheelRef,
    producers: usize,
    per_task: usize,
) -> Duration {
    let start = Instant::now();
    run_producers(producers, |p| {
        let mut timer = timer.clone();
        async move {
            let mut rng = producer_rng(p);
            for i in 0..per_task {
                let id = ((p as u64) << 32) | i as u64;
                timer.schedule_action_once(id, producer_delay(&mut rng), |_| {});
                timer.cancel(&id);
            }
        }
    })
    .await;
    hash_wheel_barrier(&mut timer).await;
    start.elapsed()
}
