//! What keeps other web pages out: the `Host` check (against DNS rebinding), the same-origin
//! check and per-process token on writes (against cross-site request forgery), and headers
//! that keep a page from running any script but the UI's own (against script in payloads).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::failure::{Failure, Result};

/// Bytes of randomness in the token.
const TOKEN_BYTES: usize = 32;

/// The page may load its own script, style sheet and graph, and nothing else; no inline
/// script runs, no form posts elsewhere, no other site frames it.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The checks of one UI process.
pub struct Guard {
    /// Hex of [`TOKEN_BYTES`] random bytes, made at start; in every page's forms.
    token: String,
    /// The `Host` values a request may name: the address listened on (and `localhost:PORT`
    /// for a loopback address). `None` when listening on every address (0.0.0.0 or ::),
    /// whose names are not known here.
    hosts: Option<Vec<String>>,
}

impl Guard {
    /// The guard of a UI listening on `addr`, with a fresh token. Fails if the operating
    /// system gives no random bytes.
    pub fn new(addr: SocketAddr) -> Result<Guard> {
        let mut bytes = [0u8; TOKEN_BYTES];
        getrandom::fill(&mut bytes)
            .map_err(|e| Failure::new(format!("cannot make the UI's token: {e}")))?;
        let token = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let hosts = (!addr.ip().is_unspecified()).then(|| {
            let mut hosts = vec![addr.to_string()];
            if addr.ip().is_loopback() {
                hosts.push(format!("localhost:{}", addr.port()));
            }
            hosts
        });
        Ok(Guard { token, hosts })
    }

    /// The token the pages' forms carry.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Whether `given` is the token (compared in time that does not depend on where they
    /// differ).
    pub fn token_ok(&self, given: &str) -> bool {
        let (a, b) = (self.token.as_bytes(), given.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }

    /// Why a request with `headers` is refused before it is answered, if it is: a `Host`
    /// that is not the UI's address (a DNS rebinding page), or for a write, a request that
    /// does not come from one of the UI's pages.
    fn refusal(&self, method: &Method, headers: &HeaderMap) -> Option<(StatusCode, &'static str)> {
        let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
            return Some((StatusCode::BAD_REQUEST, "a request must name its Host"));
        };
        if let Some(hosts) = &self.hosts
            && !hosts.iter().any(|h| h == host)
        {
            return Some((
                StatusCode::MISDIRECTED_REQUEST,
                "this request names another host than the address loops ui listens on",
            ));
        }
        if method == Method::GET || method == Method::HEAD {
            return None;
        }
        // A browser says where a request comes from in `Sec-Fetch-Site` (a header no page can
        // set), and older ones in `Origin` (which Chromium sends as `null` on a page's own
        // form posts); a request with neither is not from a page of this UI.
        let site = headers.get("sec-fetch-site").and_then(|h| h.to_str().ok());
        let origin = headers
            .get(header::ORIGIN)
            .and_then(|h| h.to_str().ok())
            .filter(|o| *o != "null");
        let own = format!("http://{host}");
        let same_site = site.map(|s| s == "same-origin");
        let same_origin = origin.map(|o| o == own);
        match (same_site, same_origin) {
            (Some(true), None | Some(true)) | (None, Some(true)) => {}
            _ => {
                return Some((
                    StatusCode::FORBIDDEN,
                    "a write must come from a page of this loops ui (Sec-Fetch-Site or Origin says it does not)",
                ));
            }
        }
        None
    }
}

/// Refuses what [`Guard`] refuses (421 for another host, 403 for a write from elsewhere)
/// and adds the security headers to every answer.
pub async fn check(State(guard): State<Arc<Guard>>, request: Request, next: Next) -> Response {
    let refusal = guard.refusal(request.method(), request.headers());
    let mut response = match refusal {
        Some((status, why)) => (status, why).into_response(),
        None => next.run(request).await,
    };
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
