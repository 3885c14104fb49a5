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
    if let Some(bearer) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    {
        return (Some(bearer.trim().to_owned()), false);
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

/// Every request passes here: the token first, then the page, then the safety headers.
pub(super) async fn guard(
    State(board): State<Arc<Board>>,
    request: Request,
    next: Next,
) -> Response {
    let mut response = match &board.token {
        None => next.run(request).await,
        Some(token) => match presented(&request) {
            (Some(given), from_query) if same_secret(&given, token) => {
                if from_query && request.method() == Method::GET {
                    // Keep the token out of the address bar, the history and the logs.
                    into_cookie(&request, token)
                } else {
                    next.run(request).await
                }
            }
            _ => (
                StatusCode::UNAUTHORIZED,
                Html(
                    "<!doctype html><title>token needed</title><h1>This board needs its token</h1>\
                     <p>Open it once with <code>?token=…</code> (the token given to \
                     <code>--token-file</code>), or send <code>Authorization: Bearer …</code>.</p>",
                ),
            )
                .into_response(),
        },
    };
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
    let path = request.uri().path();
    let mut location = super::html::href(&base, if path == "/" { "" } else { path });
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
    fn queries_decode() {
        assert_eq!(percent_decode("a%20b+c%2F"), "a b c/");
        assert_eq!(percent_decode("100%"), "100%");
    }
}
