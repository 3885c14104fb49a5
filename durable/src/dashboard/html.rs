//! The pieces every page is made of: escaping, the layout around a page's body, times, and
//! payloads shown as text or hex.
//!
//! Everything that came from the store (ids, reasons, payloads, cron expressions, error
//! messages) goes through [`escape`] before it reaches a page; the response's
//! Content-Security-Policy forbids every script besides, so a payload holding markup is
//! shown as text and can never run.

use std::fmt::Write as _;
use std::time::SystemTime;

use crate::units::{relative, rfc3339};

/// `text` safe inside an element or a quoted attribute.
pub(super) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `text` as one query-string value: every byte but the unreserved ones percent-encoded.
pub(super) fn query_value(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// A time as the board shows it: RFC 3339 in UTC, and how far it is from now.
pub(super) fn time(at: SystemTime, now: SystemTime) -> String {
    format!(
        "<time datetime=\"{0}\">{0}</time> <span class=muted>({1})</span>",
        rfc3339(at, false),
        relative(at, now)
    )
}

/// How much of a payload a task page shows.
pub(super) const PAYLOAD_SHOWN: usize = 64 * 1024;

/// A payload: its text if it is UTF-8 (escaped, control characters shown as `\n`, `\u{1b}`,
/// …), else a hex dump; at most [`PAYLOAD_SHOWN`] bytes, saying so when cut.
pub(super) fn payload(bytes: &[u8]) -> String {
    let mut end = bytes.len().min(PAYLOAD_SHOWN);
    if let Ok(text) = std::str::from_utf8(bytes) {
        // Cut text on a character's boundary, not inside one.
        while !text.is_char_boundary(end) {
            end -= 1;
        }
    }
    let shown = &bytes[..end];
    let cut = if shown.len() < bytes.len() {
        format!(
            "<p class=muted>The first {} of {} bytes.</p>",
            shown.len(),
            bytes.len()
        )
    } else {
        String::new()
    };
    let body = match std::str::from_utf8(bytes) {
        Ok(_) => {
            let text = String::from_utf8_lossy(shown);
            let visible: String = text
                .chars()
                .map(|c| match c {
                    '\n' | '\t' => c.to_string(),
                    c if c.is_control() => c.escape_default().to_string(),
                    c => c.to_string(),
                })
                .collect();
            format!(
                "<p class=muted>{} bytes, UTF-8 text:</p><pre id=payload class=payload>{}</pre>",
                bytes.len(),
                escape(&visible)
            )
        }
        Err(_) => format!(
            "<p class=muted>{} bytes, not UTF-8 (hex):</p><pre id=payload class=payload>{}</pre>",
            bytes.len(),
            hex_dump(shown)
        ),
    };
    format!("{body}{cut}")
}

/// Sixteen bytes a line: offset, hex, and the printable ASCII beside.
fn hex_dump(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 4);
    for (line, chunk) in bytes.chunks(16).enumerate() {
        let _ = write!(out, "{:08x}  ", line * 16);
        for (i, byte) in chunk.iter().enumerate() {
            let _ = write!(out, "{byte:02x}{}", if i == 7 { "  " } else { " " });
        }
        for _ in chunk.len()..16 {
            out.push_str("   ");
        }
        if chunk.len() <= 8 {
            out.push(' ');
        }
        out.push(' ');
        let ascii: String = chunk
            .iter()
            .map(|&b| {
                if b.is_ascii_graphic() || b == b' ' {
                    char::from(b)
                } else {
                    '.'
                }
            })
            .collect();
        out.push_str(&escape(&ascii));
        out.push('\n');
    }
    out
}

/// Which tab of the navigation a page belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tab {
    Overview,
    Pending,
    InFlight,
    Dead,
    Recurring,
    Task,
}

/// What every page shares: where the board is mounted, its title, a message for the
/// operator (the outcome of an action), and whether the queue is paused.
#[derive(Debug)]
pub(super) struct Frame<'a> {
    pub(super) base: &'a str,
    pub(super) title: &'a str,
    pub(super) notice: Option<&'a str>,
    pub(super) paused: bool,
    /// Reload the page every so many seconds (`<meta http-equiv=refresh>`).
    pub(super) refresh: Option<u32>,
}

/// The address of `path` ("" for the overview) on a board mounted at `base`.
pub(super) fn href(base: &str, path: &str) -> String {
    match (base, path) {
        ("", "") => "/".to_owned(),
        _ => format!("{base}{path}"),
    }
}

/// A whole page: the layout, the navigation, a search box, and `body` (already escaped).
pub(super) fn page(frame: &Frame<'_>, tab: Tab, heading: &str, body: &str) -> String {
    let base = frame.base;
    let nav: String = [
        (Tab::Overview, "", "Overview"),
        (Tab::Pending, "/tasks/pending", "Pending"),
        (Tab::InFlight, "/tasks/in-flight", "In flight"),
        (Tab::Dead, "/tasks/dead", "Dead"),
        (Tab::Recurring, "/recurring", "Recurring"),
    ]
    .iter()
    .map(|(which, path, name)| {
        let current = if *which == tab {
            " aria-current=page"
        } else {
            ""
        };
        format!("<a href=\"{}\"{current}>{name}</a>", href(base, path))
    })
    .collect();
    let notice = frame
        .notice
        .map(|text| format!("<p class=notice id=notice role=status>{}</p>", escape(text)))
        .unwrap_or_default();
    let paused = if frame.paused {
        "<p class=paused id=paused-banner>Paused: no worker is handed a task until the queue \
         is resumed.</p>"
    } else {
        ""
    };
    format!(
        "<!doctype html>\n<html lang=en><head><meta charset=utf-8>\
         <meta name=viewport content=\"width=device-width, initial-scale=1\">\
         <title>{heading} · {title}</title>{refresh}<style>{STYLE}</style></head><body>\
         <header><strong class=brand>{title}</strong><nav>{nav}</nav>\
         <form class=search method=get action=\"{base}/task\" role=search>\
         <input name=id id=search placeholder=\"task id\" aria-label=\"task id\" required>\
         <button type=submit>Find</button></form></header>\
         <main>{paused}{notice}<h1>{heading}</h1>{body}</main></body></html>\n",
        title = escape(frame.title),
        heading = escape(heading),
        refresh = frame
            .refresh
            .map(|every| format!("<meta http-equiv=refresh content={every}>"))
            .unwrap_or_default(),
    )
}

/// A form that POSTs an action, with the anti-forgery token; `fields` and `label` are
/// markup. A destructive action asks for a tick first (`confirm`): the browser will not send
/// the form without it, and the board refuses it without it.
pub(super) fn action(
    base: &str,
    csrf: &str,
    path: &str,
    fields: &str,
    label: &str,
    confirm: bool,
) -> String {
    let confirm = if confirm {
        "<label class=confirm><input type=checkbox name=confirm value=yes required> \
         I mean it</label>"
    } else {
        ""
    };
    let class = path.trim_start_matches('/').replace('/', "-");
    format!(
        "<form class=\"action {class}\" method=post action=\"{base}{path}\">\
         <input type=hidden name=csrf value=\"{csrf}\">{fields}{confirm}\
         <button type=submit>{label}</button></form>"
    )
}

/// A table: a header row and rows of cells (markup).
pub(super) fn table(id: &str, head: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = format!("<table id={id}><thead><tr>");
    for cell in head {
        let _ = write!(out, "<th>{cell}</th>");
    }
    out.push_str("</tr></thead><tbody>");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{cell}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    out
}

const STYLE: &str = "\
:root{--fg:#1d232b;--muted:#667085;--line:#d9dee5;--bg:#f6f7f9;--card:#fff;--blue:#2f6fdb;\
--red:#c8372d;--amber:#b7791f}\
*{box-sizing:border-box}\
body{margin:0;font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:var(--fg);\
background:var(--bg)}\
header{display:flex;gap:1.5rem;align-items:center;padding:.6rem 1.5rem;background:#1d232b;color:#fff;\
flex-wrap:wrap}\
header a{color:#cfd6df;text-decoration:none;margin-right:1rem}\
header a[aria-current=page]{color:#fff;border-bottom:2px solid #7aa7ff}\
.brand{font-size:15px}\
.search{margin-left:auto;display:flex;gap:.3rem}\
.search input{padding:.3rem .5rem;border-radius:4px;border:1px solid #444;min-width:16rem}\
main{padding:1rem 1.5rem;max-width:1200px}\
h1{font-size:20px;margin:.4rem 0 1rem}h2{font-size:16px;margin:1.4rem 0 .6rem}\
table{border-collapse:collapse;background:var(--card);width:100%;margin-bottom:.8rem}\
th,td{text-align:left;padding:.35rem .6rem;border-bottom:1px solid var(--line);vertical-align:top}\
th{font-weight:600;color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.03em}\
td{word-break:break-all}\
.cards{display:flex;gap:1rem;flex-wrap:wrap}\
.card{background:var(--card);border:1px solid var(--line);border-radius:6px;padding:.7rem 1rem;\
min-width:10rem}\
.card .n{font-size:26px;font-weight:600}.card .k{color:var(--muted);font-size:12px}\
.card.dead .n{color:var(--red)}\
.muted{color:var(--muted)}\
.notice{background:#e8f1ff;border:1px solid #b6cffb;padding:.5rem .8rem;border-radius:4px}\
.paused{background:#fff4e0;border:1px solid #f0c36d;padding:.5rem .8rem;border-radius:4px}\
.warning{background:#fff4e0;border:1px solid #f0c36d;padding:.5rem .8rem;border-radius:4px}\
.error{background:#fdecea;border:1px solid #f5b7b1;padding:.5rem .8rem;border-radius:4px}\
pre.payload{background:var(--card);border:1px solid var(--line);padding:.7rem;overflow:auto;\
max-height:32rem;white-space:pre-wrap;word-break:break-all}\
form.action{display:inline-flex;gap:.4rem;align-items:center;margin:.2rem 1rem .2rem 0;\
padding:.4rem .6rem;background:var(--card);border:1px solid var(--line);border-radius:4px}\
button{padding:.3rem .7rem;border-radius:4px;border:1px solid #9aa4b2;background:#fff;cursor:pointer}\
.confirm{font-size:12px;color:var(--muted)}\
.chart{background:var(--card);border:1px solid var(--line);border-radius:6px;padding:.5rem}\
.chart svg{width:100%;height:auto}#counters{max-width:36rem}\
.legend span{display:inline-block;margin-right:1rem}\
.sw{display:inline-block;width:.8rem;height:.8rem;margin-right:.3rem;vertical-align:-1px}\
a{color:var(--blue)}\
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_is_escaped() {
        assert_eq!(
            escape("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
        );
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(query_value("a b/c?d=e&f"), "a%20b%2Fc%3Fd%3De%26f");
        assert_eq!(query_value("order-42_x.y~"), "order-42_x.y~");
        assert_eq!(query_value("é"), "%C3%A9");
    }

    #[test]
    fn payloads_show_as_text_or_hex() {
        let text = payload(b"<b>hi</b>\x1b[31m");
        assert!(text.contains("&lt;b&gt;hi&lt;/b&gt;\\u{1b}[31m"), "{text}");
        let binary = payload(&[0xff, 0x00, b'A']);
        assert!(binary.contains("00000000  ff 00 41"), "{binary}");
        assert!(binary.contains("..A"), "{binary}");
        let long = payload(&vec![b'a'; PAYLOAD_SHOWN + 10]);
        assert!(long.contains(&format!("The first {PAYLOAD_SHOWN} of")));
    }
}
