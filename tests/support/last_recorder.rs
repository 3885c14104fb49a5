//! A `metrics` recorder that keeps the last value of each metric (what a scrape would read),
//! shared with the queue crate's metrics test.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, Recorder, SharedString,
    Unit,
};

/// The last value of each metric, by `name{label=value,…}`.
pub type Values = Arc<Mutex<HashMap<String, f64>>>;

/// A recorder keeping the last value each metric was given: what a scrape would read.
struct Last(Values);

/// One metric's place in [`Last`].
struct Cell {
    key: String,
    values: Values,
}

impl Cell {
    fn update(&self, f: impl FnOnce(f64) -> f64) {
        let mut values = self.values.lock().unwrap();
        let value = values.entry(self.key.clone()).or_insert(0.0);
        *value = f(*value);
    }
}

impl CounterFn for Cell {
    fn increment(&self, n: u64) {
        self.update(|v| v + n as f64);
    }
    fn absolute(&self, n: u64) {
        self.update(|v| v.max(n as f64));
    }
}

impl GaugeFn for Cell {
    fn increment(&self, n: f64) {
        self.update(|v| v + n);
    }
    fn decrement(&self, n: f64) {
        self.update(|v| v - n);
    }
    fn set(&self, n: f64) {
        self.update(|_| n);
    }
}

impl Last {
    fn cell(&self, key: &Key) -> Arc<Cell> {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        Arc::new(Cell {
            key: format!("{}{{{}}}", key.name(), labels.join(",")),
            values: self.0.clone(),
        })
    }
}

impl Recorder for Last {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.cell(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.cell(key))
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

/// One recorder for the whole test binary (a global recorder can be set once); each test
/// uses labels of its own.
pub fn values() -> &'static Values {
    static VALUES: OnceLock<Values> = OnceLock::new();
    VALUES.get_or_init(|| {
        let values = Values::default();
        metrics::set_global_recorder(Last(values.clone())).expect("the only recorder");
        values
    })
}

/// The value of metric `name` labelled `label = value`.
pub fn read(name: &str, label: &str, value: &str) -> Option<f64> {
    values()
        .lock()
        .unwrap()
        .get(&format!("{name}{{{label}={value}}}"))
        .copied()
}
