//! What `twq` prints beyond one task's record: its payload (`get --payload`) and recurring
//! schedules (`recurring list`).

use std::time::SystemTime;

use serde_json::{Value, json};
use tokio_wheel_durable::{CatchUp, RecurringInfo, RecurringKind};

use crate::show::{clean, table};
use crate::units::{epoch_ms, relative, rfc3339, short};

/// A payload for people: its text if it is UTF-8 (control characters escaped, so a payload
/// cannot drive the terminal), else its bytes in lowercase hex; the first line says which.
pub(crate) fn payload_human(payload: &[u8]) -> String {
    let len = payload.len();
    match std::str::from_utf8(payload) {
        Ok(text) => format!("payload ({len} bytes, UTF-8 text):\n{}\n", clean(text)),
        Err(_) => format!("payload ({len} bytes, not UTF-8, hex):\n{}\n", hex(payload)),
    }
}

/// A payload for scripts: always `base64` (standard alphabet, padded: the exact bytes), and
/// `text` too when the bytes are UTF-8 (else `null`).
pub(crate) fn payload_json(payload: &[u8]) -> Value {
    json!({
        "base64": base64(payload),
        "text": std::str::from_utf8(payload).ok(),
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Standard base64 (RFC 4648 §4) with padding.
pub(crate) fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let word = chunk
            .iter()
            .enumerate()
            .fold(0u32, |word, (i, &b)| word | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(word >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn catch_up_name(catch_up: CatchUp) -> &'static str {
    match catch_up {
        CatchUp::All => "all",
        _ => "latest",
    }
}

fn kind_parts(kind: &RecurringKind) -> (&'static str, String) {
    match kind {
        RecurringKind::Every(period) => ("every", short(*period)),
        RecurringKind::Cron(expression) => ("cron", clean(expression)),
        _ => ("unknown", String::new()),
    }
}

/// Recurring schedules as a table.
pub(crate) fn recurring_table(items: &[RecurringInfo], now: SystemTime) -> String {
    let mut rows =
        vec![["ID", "KIND", "SCHEDULE", "NEXT", "", "CATCH-UP", "PAYLOAD"].map(str::to_owned)];
    for item in items {
        let (kind, schedule) = kind_parts(&item.kind);
        rows.push([
            clean(item.id.as_str()),
            kind.to_owned(),
            schedule,
            rfc3339(item.next, false),
            relative(item.next, now),
            catch_up_name(item.catch_up).to_owned(),
            format!("{} B", item.payload_len),
        ]);
    }
    table(&rows)
}

/// One recurring schedule as JSON: `kind` `every` with `period_ms`, or `cron` with
/// `expression`.
pub(crate) fn recurring_json(item: &RecurringInfo) -> Value {
    let mut object = json!({
        "id": item.id.as_str(),
        "next": rfc3339(item.next, true),
        "next_ms": epoch_ms(item.next),
        "catch_up": catch_up_name(item.catch_up),
        "payload_len": item.payload_len,
    });
    match &item.kind {
        RecurringKind::Every(period) => {
            object["kind"] = json!("every");
            object["period_ms"] = json!(u64::try_from(period.as_millis()).unwrap_or(u64::MAX));
        }
        RecurringKind::Cron(expression) => {
            object["kind"] = json!("cron");
            object["expression"] = json!(expression);
        }
        _ => object["kind"] = json!("unknown"),
    }
    object
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc_4648() {
        for (bytes, encoded) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg=="),
            (b"fooba", "Zm9vYmE="),
            (b"foobar", "Zm9vYmFy"),
            (&[0xff, 0x00, 0xfe], "/wD+"),
        ] {
            assert_eq!(base64(bytes), encoded);
        }
    }
}
