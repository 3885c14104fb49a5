use std::sync::atomic::Ordering;
use std::time::Duration;
use std::future::Future;
use tokio_wheel::Wheel;
#[path = "support/counting.rs"]
mod counting;
use counting::{Counting, LIVE};
#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn flood(runtime: &tokio::runtime::Runtime, wheel: &Wheel, threads: usize, per_thread: usize) {
    let producers: Vec<_> = (0..threads)
        .map(|_| {
            let (wheel, handle) = (wheel.clone(), runtime.handle().clone());
            std::thread::spawn(move || {
                let _entered = handle.enter();
                let waker = std::task::Waker::noop();
                let mut cx = std::task::Context::from_waker(waker);
                let mut far = Vec::with_capacity(per_thread);
                for _ in 0..per_thread {
                    let mut sleep = wheel.sleep(Duration::from_secs(3_600));
                    assert!(std::pin::Pin::new(&mut sleep).poll(&mut cx).is_pending());
                    far.push(sleep);
                }
                drop(far);
            })
        })
        .collect();
    for producer in producers { producer.join().unwrap(); }
}

#[test]
fn probe() {
    for (shards, threads) in [(1usize, 16usize), (16, 16), (32, 32)] {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let wheel = Wheel::builder().runtime(runtime.handle().clone()).timer_shards(shards).build();
        flood(&runtime, &wheel, threads, 8);
        runtime.block_on(wheel.flush());
        std::thread::sleep(Duration::from_millis(500));
        let baseline = LIVE.load(Ordering::Relaxed);
        flood(&runtime, &wheel, threads, 20_000);
        runtime.block_on(wheel.flush());
        for i in 0..6 {
            std::thread::sleep(Duration::from_millis(500));
            eprintln!("shards {shards} threads {threads}: t={i} retained {}", LIVE.load(Ordering::Relaxed) - baseline);
        }
        eprintln!("{:?}", wheel.stats());
    }
}
