//! What `twq` prints: tasks as table rows or JSON, aligned tables, and URLs with their
//! password masked.

use std::time::SystemTime;

use serde_json::{Value, json};
use tokio_wheel_durable::{QueueStats, TaskInfo, TaskState};

use crate::units::{epoch_ms, relative, rfc3339, short};

/// A task's state as one word: `pending`, `in-flight`, `dead`.
pub(crate) fn state_name(state: &TaskState) -> &'static str {
    match state {
        TaskState::Pending => "pending",
        TaskState::InFlight { .. } => "in-flight",
        TaskState::Dead { .. } => "dead",
        _ => "unknown",
    }
}

/// A task as a JSON object: times as RFC 3339 (milliseconds) and as epoch milliseconds.
pub(crate) fn task_json(task: &TaskInfo) -> Value {
    let mut object = json!({
        "id": task.id.as_str(),
        "state": state_name(&task.state),
        "due": rfc3339(task.due, true),
        "due_ms": epoch_ms(task.due),
        "attempts": task.attempts,
        "payload_len": task.payload_len,
        "reason": task.reason,
    });
    if let TaskState::InFlight {
        attempt,
        lease_until,
    } = &task.state
    {
        object["attempt"] = json!(attempt);
        object["lease_until"] = json!(rfc3339(*lease_until, true));
        object["lease_until_ms"] = json!(epoch_ms(*lease_until));
    }
    object
}

/// The queue's counts and counters as a JSON object (latencies in milliseconds).
pub(crate) fn stats_json(stats: &QueueStats) -> Value {
    json!({
        "pending": stats.pending,
        "in_flight": stats.in_flight,
        "dead": stats.dead,
        "delivered": stats.delivered,
        "acked": stats.acked,
        "retried": stats.retried,
        "dead_lettered": stats.dead_lettered,
        "expired": stats.expired,
        "returned": stats.returned,
        "lateness_p50_ms": u64::try_from(stats.lateness_p50.as_millis()).unwrap_or(u64::MAX),
        "lateness_p99_ms": u64::try_from(stats.lateness_p99.as_millis()).unwrap_or(u64::MAX),
        "eviction_policy_unknown": stats.eviction_policy_unknown,
        "paused": stats.paused,
    })
}

/// The queue's counts and counters as `name  value` lines.
pub(crate) fn stats_table(target: &str, stats: &QueueStats) -> String {
    let mut rows = vec![
        ("queue", clean(target)),
        ("pending", stats.pending.to_string()),
        ("in flight", stats.in_flight.to_string()),
        ("dead", stats.dead.to_string()),
        ("delivered", stats.delivered.to_string()),
        ("acked", stats.acked.to_string()),
        ("retried", stats.retried.to_string()),
        ("dead-lettered", stats.dead_lettered.to_string()),
        ("expired", stats.expired.to_string()),
        ("returned", stats.returned.to_string()),
        ("lateness p50", short(stats.lateness_p50)),
        ("lateness p99", short(stats.lateness_p99)),
        ("paused", if stats.paused { "yes" } else { "no" }.to_owned()),
    ];
    if stats.eviction_policy_unknown {
        rows.push((
            "warning",
            "maxmemory-policy unknown (this user may not read it): make sure it is noeviction"
                .to_owned(),
        ));
    }
    pairs(rows.iter().map(|(k, v)| (*k, v.clone())))
}

/// One task as `field  value` lines.
pub(crate) fn task_block(task: &TaskInfo, now: SystemTime) -> String {
    let mut rows = vec![
        ("id", clean(task.id.as_str())),
        ("state", state_name(&task.state).to_owned()),
        (
            "due",
            format!("{} ({})", rfc3339(task.due, false), relative(task.due, now)),
        ),
        ("attempts", task.attempts.to_string()),
        ("payload", format!("{} bytes", task.payload_len)),
    ];
    if let TaskState::InFlight { lease_until, .. } = &task.state {
        rows.push((
            "lease until",
            format!(
                "{} ({})",
                rfc3339(*lease_until, false),
                relative(*lease_until, now)
            ),
        ));
    }
    if let Some(reason) = &task.reason {
        rows.push(("reason", clean(reason)));
    }
    pairs(rows.into_iter())
}

/// Tasks as an aligned table, a header first.
pub(crate) fn task_table(tasks: &[TaskInfo], now: SystemTime) -> String {
    let mut rows =
        vec![["ID", "STATE", "DUE", "", "ATTEMPTS", "PAYLOAD", "DETAIL"].map(str::to_owned)];
    for task in tasks {
        let detail = match &task.state {
            TaskState::InFlight { lease_until, .. } => {
                format!("lease ends {}", relative(*lease_until, now))
            }
            _ => task.reason.as_deref().map(clean).unwrap_or_default(),
        };
        rows.push([
            clean(task.id.as_str()),
            state_name(&task.state).to_owned(),
            rfc3339(task.due, false),
            relative(task.due, now),
            task.attempts.to_string(),
            format!("{} B", task.payload_len),
            detail,
        ]);
    }
    table(&rows)
}

/// Rows as columns two spaces apart, each as wide as its widest cell (the last not padded).
pub(crate) fn table<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0; N];
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            line.push_str(cell);
            if i + 1 < N {
                let pad = widths[i] - cell.chars().count();
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn pairs(rows: impl Iterator<Item = (&'static str, String)>) -> String {
    let rows: Vec<[String; 2]> = rows.map(|(k, v)| [k.to_owned(), v]).collect();
    table(&rows)
}

/// Text from the store made safe for a terminal: control characters (a newline in a
/// reason, an escape sequence in an id) are shown escaped.
pub(crate) fn clean(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// The URL with the password of its user part replaced by `***`
/// (`redis://:***@host:6379/`, `redis://user:***@host/`), and that of a Unix socket's query
/// (`redis+unix:///run/redis.sock?pass=***`, the redis crate's form). The user part ends at
/// the last `@`: a password may hold `/`, `?`, `#` or `@` unescaped.
pub(crate) fn mask_url(url: &str) -> String {
    let url = &mask_query_password(url);
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let Some(at) = rest.rfind('@') else {
        return url.to_owned();
    };
    match rest[..at].find(':') {
        Some(colon) => format!(
            "{}{}:***{}",
            &url[..scheme_end],
            &rest[..colon],
            &rest[at..]
        ),
        None => url.to_owned(),
    }
}

/// Where a Unix socket URL's password stands in its query (`?pass=…` or `&pass=…`, up to the
/// next `&` or `#`): the redis crate reads it from there.
fn query_password(url: &str) -> Option<std::ops::Range<usize>> {
    let query = url.find('?')? + 1;
    let end = url[query..]
        .find('#')
        .map_or(url.len(), |hash| query + hash);
    let mut at = query;
    for pair in url[query..end].split('&') {
        if let Some(value) = pair.strip_prefix("pass=") {
            let start = at + "pass=".len();
            return Some(start..start + value.len());
        }
        at += pair.len() + 1;
    }
    None
}

fn mask_query_password(url: &str) -> String {
    match query_password(url) {
        Some(range) if !range.is_empty() => {
            format!("{}***{}", &url[..range.start], &url[range.end..])
        }
        _ => url.to_owned(),
    }
}

/// The passwords any of these arguments or variables could carry (`--redis URL`,
/// `--redis=URL`, comma-separated cluster URLs): each comma-separated piece whole (a Unix
/// socket URL's `?pass=` is in its query, a password may hold `=`), and what follows its
/// first `=`.
pub(crate) fn passwords_in_args(args: &[String]) -> Vec<String> {
    let pieces = args
        .iter()
        .flat_map(|arg| arg.split(','))
        .flat_map(|piece| [Some(piece), piece.split_once('=').map(|(_, url)| url)])
        .flatten();
    passwords(pieces)
}

/// The passwords in these URLs, as written and percent-decoded (what must never be printed).
pub(crate) fn passwords<'a>(urls: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut secrets = Vec::new();
    for url in urls {
        if let Some(range) = query_password(url).filter(|range| !range.is_empty()) {
            let password = &url[range];
            secrets.push(password.to_owned());
            // A query's value is form-encoded: `+` is a space there.
            secrets.push(percent_decode(password));
            secrets.push(percent_decode(&password.replace('+', " ")));
        }
        let password = match url.find("://").map(|i| i + 3) {
            // The user part ends at the last '@' (a password may hold '/', '?', '#', '@').
            Some(scheme_end) => {
                let rest = &url[scheme_end..];
                rest.rfind('@')
                    .and_then(|at| rest[..at].find(':').map(|colon| &rest[colon + 1..at]))
            }
            // Not a well-formed URL (`redis//:pw@host`, `redis:/:pw@host`, `:pw@host`): the
            // redis crate's error may still echo it, so whatever stands between a ':' and
            // the last '@' of its last segment is taken for a password too.
            None => url.rfind('@').and_then(|at| {
                let user_part = &url[..at];
                let segment = &user_part[user_part.rfind('/').map_or(0, |slash| slash + 1)..];
                segment.find(':').map(|colon| &segment[colon + 1..])
            }),
        };
        if let Some(password) = password.filter(|password| !password.is_empty()) {
            secrets.push(password.to_owned());
            secrets.push(percent_decode(password));
            // A URL parser may have stopped inside it and echo only its tail: every piece
            // after a '/', '?', '#' or '@' in it long enough to be telling is a secret too.
            for piece in password.split(['/', '?', '#', '@']).skip(1) {
                if piece.len() >= 4 {
                    secrets.push(piece.to_owned());
                }
            }
        }
    }
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets.dedup();
    secrets
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = text.get(i + 1..i + 3).filter(|_| bytes[i] == b'%');
        if let Some(byte) = hex.and_then(|hex| u8::from_str_radix(hex, 16).ok()) {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `text` with every secret replaced by `***`.
pub(crate) fn scrub(text: &str, secrets: &[String]) -> String {
    let mut text = text.to_owned();
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        if text.contains(secret.as_str()) {
            text = text.replace(secret.as_str(), "***");
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The redis crate's Unix socket URLs carry the password in the query (outside attack:
    /// it showed on every board page and in `twq stats`).
    #[test]
    fn a_unix_socket_urls_password_is_masked() {
        for (url, masked) in [
            (
                "redis+unix:///run/r.sock?pass=S0ck3t",
                "redis+unix:///run/r.sock?pass=***",
            ),
            (
                "unix:///run/r.sock?db=2&pass=S0ck3t&user=u",
                "unix:///run/r.sock?db=2&pass=***&user=u",
            ),
            (
                "redis+unix:///run/r.sock?pass=S0ck3t#x",
                "redis+unix:///run/r.sock?pass=***#x",
            ),
        ] {
            assert_eq!(mask_url(url), masked);
            let secrets = passwords([url].into_iter());
            assert_eq!(secrets, ["S0ck3t"], "{url}");
        }
        assert_eq!(
            mask_url("redis+unix:///run/r.sock?db=1"),
            "redis+unix:///run/r.sock?db=1"
        );
        let secrets = passwords(["unix:///r.sock?pass=a%2Bb+c"].into_iter());
        for form in ["a%2Bb+c", "a+b+c", "a+b c"] {
            assert!(secrets.iter().any(|s| s == form), "{form} in {secrets:?}");
        }
    }

    #[test]
    fn passwords_are_found_in_every_form_of_argument() {
        let args = |list: &[&str]| list.iter().map(|arg| (*arg).to_owned()).collect::<Vec<_>>();
        for (given, password) in [
            (args(&["twq", "--redis", "redis://:a=bcd@h/"]), "a=bcd"),
            (args(&["twq", "--redis=redis://:a=bcd@h/"]), "a=bcd"),
            (
                args(&["--cluster", "redis://h1/,redis://:Cl5tr@h2/"]),
                "Cl5tr",
            ),
            (args(&["--redis=unix:///s.sock?pass=S0ck"]), "S0ck"),
        ] {
            let secrets = passwords_in_args(&given);
            assert!(
                secrets.iter().any(|s| s == password),
                "{given:?}: {secrets:?}"
            );
        }
    }

    #[test]
    fn passwords_are_masked() {
        assert_eq!(
            mask_url("redis://:s3cret@10.0.0.1:6379/"),
            "redis://:***@10.0.0.1:6379/"
        );
        assert_eq!(
            mask_url("rediss://worker:p@ss@host/2"),
            "rediss://worker:***@host/2"
        );
        assert_eq!(mask_url("redis://host:6379/"), "redis://host:6379/");
        assert_eq!(mask_url("redis://user@host/"), "redis://user@host/");
        let secrets = passwords(["redis://:a%40b@h/", "redis://h/"].into_iter());
        assert_eq!(secrets, ["a%40b", "a@b"]);
        assert_eq!(scrub("x a@b y a%40b", &secrets), "x *** y ***");
        // Malformed URLs the redis crate's errors echo (issue 29): their password is found.
        for malformed in [
            "redis//:S3cret@127.0.0.1:6390/",
            "redis:/:S3cret@127.0.0.1:6390/",
            ":S3cret@127.0.0.1:6390",
            "redis:S3cret@host",
        ] {
            let secrets = passwords([malformed].into_iter());
            assert_eq!(secrets, ["S3cret"], "{malformed}");
            assert!(!scrub(&format!("bad URL {malformed}"), &secrets).contains("S3cret"));
        }
        assert!(passwords(["redis//host:6390/", "--queue"].into_iter()).is_empty());
        // A password holding '/', '?', '#' or '@' unescaped (outside attack on the board).
        for password in ["Pw/zz81k", "Pw#zz81k", "Pw?zz81k", "Pw@zz81k"] {
            let url = format!("redis://:{password}@127.0.0.1:1/");
            assert_eq!(mask_url(&url), "redis://:***@127.0.0.1:1/", "{url}");
            let secrets = passwords([url.as_str()].into_iter());
            assert!(secrets.contains(&password.to_owned()), "{secrets:?}");
            assert!(secrets.contains(&"zz81k".to_owned()), "{secrets:?}");
        }
    }

    #[test]
    fn tables_align() {
        let rows = [["a", "bb", "c"], ["ccc", "d", ""]].map(|r| r.map(str::to_owned));
        assert_eq!(table(&rows), "a    bb  c\nccc  d\n");
        assert_eq!(clean("a\nb\u{1b}"), "a\\nb\\u{1b}");
    }
}
