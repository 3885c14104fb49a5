//! Deliveries and failures over the last hour, drawn from the queue's own counters.
//!
//! The counters in [`QueueStats`] only grow (across every process and restart), so the
//! board samples them every so often and charts the differences, a bar a minute. The chart
//! therefore starts when the board started: it says so until it covers the whole hour.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::QueueStats;

/// How far back the chart goes, and its bar width.
const SPAN_MINUTES: u64 = 60;
const MINUTE: Duration = Duration::from_secs(60);

/// One reading of the counters.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: SystemTime,
    /// Deliveries handed out.
    delivered: u64,
    /// Deliveries that did not end in an ack: retried, dead-lettered or lease run out.
    failed: u64,
}

/// The readings of the last hour (and the one before it, to difference against).
#[derive(Debug, Default)]
pub(super) struct History {
    samples: VecDeque<Sample>,
    started: Option<SystemTime>,
}

impl History {
    /// Records `stats` read at `at`, dropping what the chart no longer needs.
    pub(super) fn record(&mut self, at: SystemTime, stats: &QueueStats) {
        self.started.get_or_insert(at);
        self.samples.push_back(Sample {
            at,
            delivered: stats.delivered,
            failed: stats.retried + stats.dead_lettered + stats.expired,
        });
        let horizon = at - MINUTE * (SPAN_MINUTES as u32 + 1);
        while self.samples.len() > 2 && self.samples[1].at < horizon {
            self.samples.pop_front();
        }
    }

    /// Deliveries and failures per minute, oldest first, the last bar the current minute.
    fn per_minute(&self, now: SystemTime) -> Vec<(u64, u64)> {
        let mut bars = vec![(0u64, 0u64); SPAN_MINUTES as usize];
        let now_minute = minute(now);
        for pair in self.samples.iter().collect::<Vec<_>>().windows(2) {
            let (before, after) = (pair[0], pair[1]);
            let Some(ago) = now_minute.checked_sub(minute(after.at)) else {
                continue;
            };
            if ago >= SPAN_MINUTES {
                continue;
            }
            let bar = &mut bars[(SPAN_MINUTES - 1 - ago) as usize];
            // A counter never goes down; a queue emptied and made anew would: count nothing.
            bar.0 += after.delivered.saturating_sub(before.delivered);
            bar.1 += after.failed.saturating_sub(before.failed);
        }
        bars
    }

    /// The chart as inline SVG with its legend and totals.
    pub(super) fn render(&self, now: SystemTime) -> String {
        let bars = self.per_minute(now);
        let (delivered, failed) = bars
            .iter()
            .fold((0, 0), |(d, f), (bd, bf)| (d + bd, f + bf));
        let peak = bars
            .iter()
            .map(|(d, f)| (*d).max(*f))
            .max()
            .unwrap_or(0)
            .max(1);
        let (width, height, left, bottom) = (720u64, 180u64, 44u64, 22u64);
        let plot_h = height - bottom - 8;
        let slot = (width - left) / SPAN_MINUTES;
        let mut svg = format!(
            "<svg id=chart role=img aria-label=\"deliveries and failures per minute, last hour\" \
             viewBox=\"0 0 {width} {height}\" width={width} height={height} \
             xmlns=\"http://www.w3.org/2000/svg\">"
        );
        let y = |value: u64| height - bottom - value * plot_h / peak;
        for (value, label) in [(peak, peak.to_string()), (peak / 2, (peak / 2).to_string())] {
            let _ = write!(
                svg,
                "<line x1={left} x2={width} y1={0} y2={0} stroke=#e3e7ec />\
                 <text x={1} y={2} font-size=10 text-anchor=end fill=#667085>{label}</text>",
                y(value),
                left - 4,
                y(value) + 3,
            );
        }
        let _ = write!(
            svg,
            "<line x1={left} x2={width} y1={0} y2={0} stroke=#9aa4b2 />",
            height - bottom
        );
        for (i, (d, f)) in bars.iter().enumerate() {
            let x = left + i as u64 * slot;
            let half = slot.saturating_sub(2) / 2;
            if *d > 0 {
                let _ = write!(
                    svg,
                    "<rect class=delivered x={x} y={} width={half} height={} fill=#2f6fdb>\
                     <title>{d} delivered</title></rect>",
                    y(*d),
                    height - bottom - y(*d)
                );
            }
            if *f > 0 {
                let _ = write!(
                    svg,
                    "<rect class=failed x={} y={} width={half} height={} fill=#c8372d>\
                     <title>{f} failed</title></rect>",
                    x + half,
                    y(*f),
                    height - bottom - y(*f)
                );
            }
        }
        for (minutes_ago, anchor) in [(60, "start"), (30, "middle"), (0, "end")] {
            let x = left + (SPAN_MINUTES - minutes_ago) * slot;
            let label = if minutes_ago == 0 {
                "now".to_owned()
            } else {
                format!("−{minutes_ago}m")
            };
            let _ = write!(
                svg,
                "<text x={x} y={} font-size=10 text-anchor={anchor} fill=#667085>{label}</text>",
                height - 6
            );
        }
        svg.push_str("</svg>");
        let since = match self.started {
            Some(started) if now.duration_since(started).unwrap_or_default() < MINUTE * 60 => {
                format!(
                    " <span class=muted>(the board started {}: earlier minutes are not known to it)</span>",
                    crate::units::relative(started, now)
                )
            }
            None => " <span class=muted>(no reading yet)</span>".to_owned(),
            Some(_) => String::new(),
        };
        format!(
            "<div class=chart>{svg}<p class=legend>\
             <span><i class=sw style=\"background:#2f6fdb\"></i>delivered \
             <b id=chart-delivered>{delivered}</b></span>\
             <span><i class=sw style=\"background:#c8372d\"></i>failed (retried, dead-lettered \
             or lease run out) <b id=chart-failed>{failed}</b></span>{since}</p></div>"
        )
    }
}

/// Whole minutes since the epoch.
fn minute(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs() / 60
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(delivered: u64, failed: u64) -> QueueStats {
        QueueStats {
            delivered,
            retried: failed,
            ..QueueStats::default()
        }
    }

    #[test]
    fn bars_are_the_differences_per_minute() {
        let start = UNIX_EPOCH + Duration::from_secs(1_000 * 60);
        let mut history = History::default();
        history.record(start, &stats(100, 1));
        history.record(start + Duration::from_secs(30), &stats(110, 1));
        history.record(start + Duration::from_secs(70), &stats(130, 4));
        let now = start + Duration::from_secs(80);
        let bars = history.per_minute(now);
        assert_eq!(bars[59], (20, 3), "the current minute");
        assert_eq!(bars[58], (10, 0), "the minute before");
        assert_eq!(bars.iter().map(|b| b.0).sum::<u64>(), 30);
        let html = history.render(now);
        assert!(html.contains("<b id=chart-delivered>30</b>"), "{html}");
        assert!(html.contains("<b id=chart-failed>3</b>"), "{html}");
        assert!(html.contains("the board started"));
    }

    #[test]
    fn readings_older_than_the_hour_are_dropped() {
        let start = UNIX_EPOCH + Duration::from_secs(10_000 * 60);
        let mut history = History::default();
        for minute in 0..200u64 {
            history.record(start + MINUTE * minute as u32, &stats(minute * 5, 0));
        }
        assert!(history.samples.len() <= SPAN_MINUTES as usize + 3);
        let now = start + MINUTE * 199;
        let bars = history.per_minute(now);
        assert_eq!(bars.iter().map(|b| b.0).sum::<u64>(), 5 * 60);
        // A queue made anew (counters back to zero) counts nothing, rather than overflowing.
        history.record(now + MINUTE, &stats(0, 0));
        assert_eq!(history.per_minute(now + MINUTE)[59], (0, 0));
    }
}
