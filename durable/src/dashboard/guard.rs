//! What stands in front of every page: the token (when the board has one), the headers that
//! keep a page from running script or being framed, and the anti-forgery check of actions.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};

use super::Board;

/// The cookie a browser keeps the token in once it opened the board with `?token=`.
const COOKIE: &str = "tw_board_token";

/// 32 random bytes from the operating system, in hex.
pub(super) fn random_secret() -> String {
    let mut bytes = [0u8; 32];
    // Without the system's random source no secret can be made that an attacker cannot
    // guess, and the board must not run with a guessable one.
    getrandom::fill(&mut bytes).expect("the operating system's random source failed");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `a == b` in time that depends only on their lengths.
pub(super) fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |diff, (x, y)| diff | (x ^ y))
            == 0
}

/// Whether a browser says this request came from another site (`Sec-Fetch-Site`, or an
/// `Origin` naming another host): such a request is refused whatever token it carries.
pub(super) fn cross_site(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        return !matches!(site.as_bytes(), b"same-origin" | b"none");
    }
    match (headers.get(header::ORIGIN), headers.get(header::HOST)) {
        (Some(origin), Some(host)) => {
            let origin = origin.to_str().unwrap_or_default();
            let origin_host = origin.split("://").nth(1).unwrap_or_default();
            origin_host != host.to_str().unwrap_or_default()
        }
        _ => false,
    }
}

/// The token a request carries, if any: header, cookie or query.
fn presented(request: &Request) -> (Option<String>, bool) {
    let headers = request.headers();
    if let Some(value) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        // The scheme's name is case-insensitive (RFC 7235).
        if let Some((scheme, bearer)) = value.split_once(' ')
            && scheme.eq_ignore_ascii_case("bearer")
        {
            return (Some(bearer.trim().to_owned()), false);
        }
    }
    for cookies in headers.get_all(header::COOKIE) {
        let Ok(cookies) = cookies.to_str() else {
            continue;
        };
        for pair in cookies.split(';') {
            if let Some((COOKIE, value)) = pair.trim().split_once('=') {
                return (Some(value.to_owned()), false);
            }
        }
    }
    let query = request.uri().query().unwrap_or_default();
    for pair in query.split('&') {
        if let Some(value) = pair.strip_prefix("token=") {
            return (Some(percent_decode(value)), true);
        }
    }
    (None, false)
}

/// Every request passes here: the addressed host, the token, read-only refusal, then the
/// page; then the safety headers, and secrets masked.
pub(super) async fn guard(
    State(board): State<Arc<Board>>,
    request: Request,
    next: Next,
) -> Response {
    let mut response = match refusal(&board, &request) {
        Some(refused) => refused,
        // Given in the query (and checked by `refusal`): keep the token out of the address
        // bar, the history and the logs.
        None => match &board.token {
            Some(token) if request.method() == Method::GET && presented(&request).1 => {
                into_cookie(&request, token)
            }
            _ => next.run(request).await,
        },
    };
    if !board.hidden.is_empty() {
        response = masked(response, &board.hidden).await;
    }
    let headers = response.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
        (header::X_FRAME_OPTIONS, "DENY"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// The answer to a request the board refuses before any page: addressed to another host
/// (`local_only`), without the token, or a write to a read-only board.
fn refusal(board: &Board, request: &Request) -> Option<Response> {
    let plain = |status: StatusCode, title: &str, text: &str| {
        let page = format!("<!doctype html><title>{title}</title><h1>{title}</h1><p>{text}</p>");
        Some((status, Html(page)).into_response())
    };
    if board.local_only && !loopback_host(request.headers()) {
        return plain(
            StatusCode::MISDIRECTED_REQUEST,
            "Not this host",
            "This board answers requests to localhost, 127.0.0.1 or [::1] only.",
        );
    }
    if let Some(token) = &board.token {
        match presented(request) {
            (Some(given), _) if same_secret(&given, token) => {}
            _ => {
                return plain(
                    StatusCode::UNAUTHORIZED,
                    "This board needs its token",
                    "Open it once with <code>?token=…</code> (the token given to \
                     <code>--token-file</code>), or send <code>Authorization: Bearer …</code>.",
                );
            }
        }
    }
    let looks = matches!(*request.method(), Method::GET | Method::HEAD);
    if board.read_only && !looks {
        return plain(
            StatusCode::FORBIDDEN,
            "Refused",
            "This board is read-only: it takes no action.",
        );
    }
    None
}

/// Whether the request's `Host` names this machine by a loopback name.
fn loopback_host(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        // [::1]:8080
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => host.split(':').next().unwrap_or_default(),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `response` with every hidden secret replaced by `***` (pages are small: the body is read
/// whole).
async fn masked(response: Response, hidden: &[String]) -> Response {
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "unreadable page").into_response();
    };
    let mut text = String::from_utf8_lossy(&bytes).into_owned();
    for secret in hidden {
        if text.contains(secret.as_str()) {
            text = text.replace(secret.as_str(), "***");
        }
    }
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(text))
}

/// A redirect to the same address without `token=`, setting the cookie that carries it.
fn into_cookie(request: &Request, token: &str) -> Response {
    let base = request
        .extensions()
        .get::<axum::extract::NestedPath>()
        .map(|nested| nested.as_str().trim_end_matches('/').to_owned())
        .unwrap_or_default();
    let query: Vec<&str> = request
        .uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|pair| !pair.is_empty() && !pair.starts_with("token="))
        .collect();
    // `//evil.example/` or `/\\evil.example` would leave the site: one slash is enough.
    let path = request.uri().path().trim_start_matches(['/', '\\']);
    let path = if path.is_empty() {
        String::new()
    } else {
        format!("/{path}")
    };
    let mut location = super::html::href(&base, &path);
    if !query.is_empty() {
        location = format!("{location}?{}", query.join("&"));
    }
    let cookie = format!("{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/");
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SEE_OTHER;
    let headers = response.headers_mut();
    if let Ok(location) = HeaderValue::from_str(&location) {
        headers.insert(header::LOCATION, location);
    }
    if let Ok(cookie) = HeaderValue::from_str(&cookie) {
        headers.insert(header::SET_COOKIE, cookie);
    }
    response
}

/// `%XX` sequences and `+` decoded, as in a query string.
pub(super) fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = text.get(i + 1..i + 3);
                if let Some(byte) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    out.push(byte);
                    i += 3;
                    continue;
                }
                out.push(b'%');
            }
            byte => out.push(byte),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "ab"));
        assert!(!same_secret("", "a"));
        let one = random_secret();
        assert_eq!(one.len(), 64);
        assert_ne!(one, random_secret());
    }

    #[test]
    fn cross_site_requests_are_told_apart() {
        let mut headers = HeaderMap::new();
        assert!(
            !cross_site(&headers),
            "no browser headers: a script or curl"
        );
        headers.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(cross_site(&headers));
        headers.insert("sec-fetch-site", HeaderValue::from_static("same-origin"));
        assert!(!cross_site(&headers));
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(cross_site(&headers));
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8080"),
        );
        assert!(!cross_site(&headers));
    }

    #[test]
    fn loopback_names_are_told_from_others() {
        let host = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::HOST, HeaderValue::from_static(value));
            loopback_host(&headers)
        };
        for local in [
            "localhost:8080",
            "LOCALHOST",
            "127.0.0.1:8080",
            "127.1.2.3",
            "[::1]:8080",
        ] {
            assert!(host(local), "{local}");
        }
        for other in [
            "evil.example:8080",
            "localhost.evil.example",
            "10.0.0.1",
            "[::2]:80",
        ] {
            assert!(!host(other), "{other}");
        }
        assert!(!loopback_host(&HeaderMap::new()), "no Host at all");
    }

    #[test]
    fn queries_decode() {
        assert_eq!(percent_decode("a%20b+c%2F"), "a b c/");
        assert_eq!(percent_decode("100%"), "100%");
    }
}
