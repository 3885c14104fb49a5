//! The report side of `compare`: tables of samples per system, printed as markdown with
//! medians, spread and ratios; the progress bar; argument parsing.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use super::*;

/// One measured quantity: samples per system, lower is better.
pub(crate) struct Table {
    title: String,
    unit: &'static str,
    /// (row label, system) → samples.
    cells: BTreeMap<(String, String), Vec<f64>>,
    pub(crate) rows: Vec<String>,
    systems: Vec<String>,
    /// A peer every tokio-wheel column is also compared with, in a column of its own.
    reference: Option<&'static str>,
    /// Peers never taken as the best peer here, and why.
    excluded: Vec<(String, &'static str)>,
}

impl Table {
    pub(crate) fn new(title: &str, unit: &'static str) -> Table {
        Table {
            title: title.to_owned(),
            unit,
            cells: BTreeMap::new(),
            rows: Vec::new(),
            systems: Vec::new(),
            reference: None,
            excluded: Vec::new(),
        }
    }

    /// Never takes `system` as the best peer in this table, saying `why` under it.
    pub(crate) fn exclude(&mut self, system: &str, why: &'static str) {
        if !self.excluded.iter().any(|(s, _)| s == system) {
            self.excluded.push((system.to_owned(), why));
        }
    }

    /// Adds a "tokio-wheel … vs `reference`" column.
    pub(crate) fn versus(mut self, reference: &'static str) -> Table {
        self.reference = Some(reference);
        self
    }

    pub(crate) fn add(&mut self, row: &str, system: &str, value: f64) {
        if !self.rows.iter().any(|r| r == row) {
            self.rows.push(row.to_owned());
        }
        if !self.systems.iter().any(|s| s == system) {
            self.systems.push(system.to_owned());
        }
        self.cells
            .entry((row.to_owned(), system.to_owned()))
            .or_default()
            .push(value);
    }

    pub(crate) fn median(&self, row: &str, system: &str) -> Option<f64> {
        let mut samples = self
            .cells
            .get(&(row.to_owned(), system.to_owned()))?
            .clone();
        samples.sort_by(f64::total_cmp);
        Some(samples[samples.len() / 2])
    }

    pub(crate) fn ratio(reference: f64, value: f64) -> String {
        if !reference.is_finite() || reference <= 0.0 || value <= 0.0 {
            return "–".to_owned();
        }
        format!(
            "**{:.2}×** {}",
            reference / value,
            if reference >= value {
                "better"
            } else {
                "worse"
            }
        )
    }

    pub(crate) fn print(&self) {
        println!(
            "\n### {} ({}; median [min–max]; lower is better)\n",
            self.title, self.unit
        );
        let ours: Vec<&String> = self
            .systems
            .iter()
            .filter(|s| s.starts_with(OURS))
            .collect();
        let reference = self
            .reference
            .filter(|r| self.systems.iter().any(|s| s == r));
        let mut header = format!("| {} |", "case");
        for system in &self.systems {
            header += &format!(" {system} |");
        }
        for system in &ours {
            header += &format!(" {system} vs best peer |");
            if let Some(reference) = reference {
                header += &format!(" {system} vs {reference} |");
            }
        }
        println!("{header}");
        let ratio_columns = ours.len() * if reference.is_some() { 2 } else { 1 };
        println!("|{}", "---|".repeat(1 + self.systems.len() + ratio_columns));
        for row in &self.rows {
            let mut line = format!("| {row} |");
            for system in &self.systems {
                let cell = match self.cells.get(&(row.clone(), system.clone())) {
                    Some(samples) => {
                        let min = samples.iter().copied().fold(f64::INFINITY, f64::min);
                        let max = samples.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                        let median = self.median(row, system).unwrap();
                        if samples.len() > 1 {
                            format!("{} [{}–{}]", fmt(median), fmt(min), fmt(max))
                        } else {
                            fmt(median)
                        }
                    }
                    None => "–".to_owned(),
                };
                line += &format!(" {cell} |");
            }
            // The best end-to-end peer: a caller-side-only column is not a whole cost.
            let best_peer = self
                .systems
                .iter()
                .filter(|s| !s.starts_with(OURS) && !s.contains(CALLER_SIDE))
                .filter(|s| !self.excluded.iter().any(|(e, _)| e == *s))
                .filter_map(|s| self.median(row, s))
                .fold(f64::INFINITY, f64::min);
            for system in &ours {
                let value = self.median(row, system);
                line += &format!(
                    " {} |",
                    value.map_or("–".to_owned(), |v| Table::ratio(best_peer, v))
                );
                if let Some(reference) = reference {
                    let base = self.median(row, reference).unwrap_or(f64::INFINITY);
                    line += &format!(
                        " {} |",
                        value.map_or("–".to_owned(), |v| Table::ratio(base, v))
                    );
                }
            }
            println!("{line}");
        }
        for (system, why) in &self.excluded {
            println!("\n{system} is not taken as the best peer here: {why}.");
        }
    }
}

pub(crate) fn fmt(value: f64) -> String {
    if value.abs() >= 100.0 {
        format!("{value:.0}")
    } else if value.abs() >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

pub(crate) struct Progress {
    pub(crate) done: usize,
    pub(crate) total: usize,
}

impl Progress {
    pub(crate) fn step(&mut self, what: &str) {
        self.done += 1;
        let width = 30;
        let filled = (width * self.done / self.total.max(1)).min(width);
        eprint!(
            "\r[{}{}] {:>3}/{} {:<48}",
            "#".repeat(filled),
            " ".repeat(width - filled),
            self.done,
            self.total,
            what
        );
        let _ = std::io::stderr().flush();
    }
}

pub(crate) fn ns_per(duration: Duration, ops: usize) -> f64 {
    duration.as_nanos() as f64 / ops as f64
}

pub(crate) fn parse_sizes(args: &[String], flag: &str) -> Option<Vec<usize>> {
    let i = args.iter().position(|a| a == flag)?;
    let list = args
        .get(i + 1)
        .unwrap_or_else(|| panic!("{flag} 10000,100000"));
    Some(
        list.split(',')
            .map(|s| s.parse().unwrap_or_else(|_| panic!("{flag} 10000,100000")))
            .collect(),
    )
}

/// Prints the report's head: the command that made it (from `args`), the repetitions, and how
/// each system is kept across repetitions; `pingora_note` adds that pingora's clock thread ran.
pub(crate) fn print_header(args: &[String], reps: usize, pingora_note: bool) {
    println!(
        "## tokio-wheel vs tokio::time, DelayQueue, pingora-timeout, kestrel-timer and hierarchical_hash_wheel_timer\n"
    );
    let mut command = String::from("cargo run --release -p tokio-wheel-compare --example compare");
    if args.len() > 1 {
        command += " --";
        for arg in &args[1..] {
            command += &format!(" {arg}");
        }
    }
    let timer = if tokio_wheel_compare::alt_timer() {
        " on tokio's per-worker timer (`RUSTFLAGS=\"--cfg tokio_unstable\"`, \
         `TOKIO_WHEEL_ALT_TIMER=1`: `enable_alt_timer`)"
    } else {
        ""
    };
    println!(
        "`{command}` · {reps} repetitions reported per case, after one warm-up repetition of \
         every system that is not · 2 Tokio workers{timer}"
    );
    println!();
    println!(
        "**Steady state.** Each scenario group uses one long-lived tokio-wheel `Wheel` (and, \
         for keyed scenarios, one keyed set), built before the group's first repetition, \
         kept across its repetitions and sizes, and shut down after the group; every \
         repetition leaves it empty (cancelled, fired or drained, then flushed) outside the \
         measured time. `kestrel-timer` and `hierarchical_hash_wheel_timer` are kept the same \
         way (one wheel with its tick task, one timer thread) in schedule + cancel, postpone \
         and producers; in fire and idle each run gets its own, so that an idle one never \
         ticks under another peer's measurement. `DelayQueue` is built per repetition with \
         the capacity it needs. Fire runs `--reps` times per system at up to 10^5 timers, the \
         systems taking turns, and once above (no warm-up). Memory \
         builds a fresh wheel or peer per measurement, so that the service's own growth is \
         counted."
    );
    if pingora_note {
        println!();
        println!(
            "Note: pingora-timeout's clock thread ran during the idle scenario; its wake-ups \
             are left out, its CPU is not."
        );
    }
}
