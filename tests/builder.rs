//! Building wheels: defaults, options, and clear errors for bad configurations.

use std::time::Duration;

use tokio::time::Instant;
use tokio_wheel::{BuildError, Layout, Wheel};

#[test]
fn outside_a_runtime_try_build_says_so() {
    let error = Wheel::builder().try_build().unwrap_err();
    assert_eq!(error, BuildError::NoRuntime);
    assert!(error.to_string().contains("Builder::runtime"), "{error}");
}

#[test]
#[should_panic(expected = "no Tokio runtime: build the wheel inside a runtime")]
fn outside_a_runtime_new_panics_with_what_to_do() {
    let _ = Wheel::new();
}

#[test]
fn a_named_runtime_lets_a_wheel_be_built_anywhere() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let wheel = Wheel::builder()
        .runtime(runtime.handle().clone())
        .name("outside")
        .build();
    runtime.block_on(async {
        let start = Instant::now();
        wheel.sleep(Duration::from_millis(20)).await;
        assert!(start.elapsed() >= Duration::from_millis(20));
    });
    assert_eq!(wheel.stats().name, "outside");
}

#[tokio::test]
async fn bad_configurations_are_errors_not_panics() {
    assert_eq!(
        Wheel::builder()
            .tick(Duration::ZERO)
            .try_build()
            .unwrap_err(),
        BuildError::ZeroTick
    );
    let huge = Duration::from_secs(10 * 365 * 86_400);
    let error = Wheel::builder().tick(huge).try_build().unwrap_err();
    assert!(matches!(error, BuildError::InvalidLayout(_)));
    // Each says what to change (outside attack: these two named only the problem).
    assert!(error.to_string().contains("tick under a year"), "{error}");
    let error = Layout::custom(&[4_096; 6]).unwrap_err();
    assert!(error.to_string().contains("fewer levels"), "{error}");
    for levels in [&[][..], &[1], &[64, 0], &[5_000], &[2; 17]] {
        let error = Layout::custom(levels).unwrap_err();
        assert!(matches!(error, BuildError::InvalidLayout(_)), "{levels:?}");
        assert!(
            error.to_string().starts_with("invalid wheel layout: "),
            "{error}"
        );
    }
}

/// A tick past what nanoseconds in a `u64` hold (~292 years), up to `Duration::MAX`, with a
/// layout that accepts it: no overflow in the actor, and a `Duration::MAX` sleep stays
/// pending (outside attack: the actor panicked on `2 * tick`, the wheel stopped, and the
/// sleep completed after a second).
#[tokio::test(start_paused = true)]
async fn ticks_of_centuries_saturate_and_never_fire_early() {
    const YEAR: u64 = 365 * 86_400;
    for tick in [
        Duration::from_secs(200 * YEAR),
        Duration::from_secs(300 * YEAR),
        Duration::MAX,
    ] {
        let wheel = Wheel::builder()
            .tick(tick)
            .layout(Layout::binary())
            .try_build()
            .unwrap();
        let mut forever = Box::pin(wheel.sleep(Duration::MAX));
        assert!(futures::poll!(forever.as_mut()).is_pending());
        tokio::time::advance(Duration::from_secs(1)).await;
        tokio::task::yield_now().await;
        assert!(futures::poll!(forever.as_mut()).is_pending(), "{tick:?}");
        assert!(!wheel.is_shutdown(), "{tick:?}: the actor stopped");
    }
}

#[tokio::test]
#[should_panic(expected = "tokio-wheel: the tick must be longer than zero")]
async fn build_panics_with_the_error_message() {
    let _ = Wheel::builder().tick(Duration::ZERO).build();
}

#[tokio::test(start_paused = true)]
async fn every_layout_drives_timers_correctly() {
    let layouts = [
        Layout::clock(),
        Layout::binary(),
        Layout::custom(&[8, 8, 8]).unwrap(),
    ];
    for layout in layouts {
        let wheel = Wheel::builder().layout(layout.clone()).try_build().unwrap();
        for millis in [1u64, 63, 64, 65, 511, 513, 4_097, 200_000] {
            let start = Instant::now();
            wheel.sleep(Duration::from_millis(millis)).await;
            let took = start.elapsed();
            assert!(
                took >= Duration::from_millis(millis),
                "{layout:?} {millis} ms: {took:?}"
            );
            assert!(
                took <= Duration::from_millis(millis + 2),
                "{layout:?} {millis} ms: {took:?}"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_coarse_tick_is_never_early_and_at_most_one_tick_late() {
    let tick = Duration::from_millis(10);
    let wheel = Wheel::builder().tick(tick).build();
    assert_eq!(wheel.tick(), tick);
    for millis in [1u64, 9, 10, 11, 25, 999] {
        let start = Instant::now();
        wheel.sleep(Duration::from_millis(millis)).await;
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(millis),
            "{millis} ms: {took:?}"
        );
        assert!(
            took <= Duration::from_millis(millis) + tick + Duration::from_millis(1),
            "{millis} ms: {took:?}"
        );
    }
}

#[tokio::test]
async fn the_name_shows_in_debug_and_stats() {
    let wheel = Wheel::builder().name("conn-expiry").build();
    assert_eq!(wheel.name(), "conn-expiry");
    assert!(format!("{wheel:?}").contains("conn-expiry"));
    assert_eq!(wheel.stats().name, "conn-expiry");
}

#[test]
fn a_runtime_without_the_time_driver_is_a_build_error() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let error = Wheel::builder()
        .runtime(runtime.handle().clone())
        .try_build()
        .unwrap_err();
    assert_eq!(error, BuildError::NoTimeDriver);
    assert!(error.to_string().contains("enable_time"), "{error}");
    let inside = runtime.block_on(async { Wheel::builder().try_build().unwrap_err() });
    assert_eq!(inside, BuildError::NoTimeDriver);
    let panic =
        std::panic::catch_unwind(|| Wheel::builder().runtime(runtime.handle().clone()).build())
            .unwrap_err();
    let message = panic.downcast_ref::<String>().unwrap();
    assert!(
        message.contains("tokio-wheel") && message.contains("enable_time"),
        "{message}"
    );
}
