//! The web console at `/console`: static files from the workspace's `console/` folder, embedded at compile time
//! (no node or npm at build time, no CDN at run time), served with their content type, a strict
//! `Content-Security-Policy` (scripts, styles and calls of this origin only; no inline script), `nosniff` and an
//! `ETag` to revalidate against. The console calls the API like any other client, with the caller's token.

use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};

use super::ApiError;

/// The policy every console file is served with: nothing from another origin, no inline script or style, no
/// framing, no plugin.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' \
                                           data:; connect-src 'self'; object-src 'none'; base-uri 'none'; \
                                           form-action 'self'; frame-ancestors 'none'";

/// Declares the embedded files: each path under `console/` once, with its bytes read by the compiler.
macro_rules! assets {
    ($($path:literal,)*) => {
        /// Every file of the console, by its path under `/console/`.
        pub const ASSETS: &[(&str, &[u8])] = &[
            $(($path, include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/../console/", $path))),)*
        ];
    };
}

assets! {
    "index.html",
    "style.css",
    "app.js",
    "api.js",
    "dom.js",
    "views/fleet.js",
    "views/calendar.js",
    "views/reservations.js",
    "views/reservation.js",
    "views/audit.js",
    "views/node.js",
}

/// The content type of a console file, by its extension.
fn content_type(path: &str) -> &'static str {
    match path.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        _ => "application/octet-stream",
    }
}

/// A strong validator of `bytes` for this build: the files only change with the binary.
fn etag(bytes: &[u8]) -> String {
    use std::hash::{Hash as _, Hasher as _};
    let mut hasher = std::hash::DefaultHasher::new();
    bytes.hash(&mut hasher);
    format!("\"{:016x}\"", hasher.finish())
}

/// `GET /console`: the console's page lives under `/console/`, so that its relative links resolve there.
pub async fn root() -> Redirect {
    Redirect::permanent("/console/")
}

/// `GET /console/`: the console's page.
pub async fn index(headers: HeaderMap) -> Response {
    serve("index.html", &headers).unwrap_or_else(IntoResponse::into_response)
}

/// `GET /console/{*path}`: one file of the console, or `404 NOT_FOUND`.
pub async fn file(Path(path): Path<String>, headers: HeaderMap) -> Response {
    serve(&path, &headers).unwrap_or_else(IntoResponse::into_response)
}

fn serve(path: &str, headers: &HeaderMap) -> Result<Response, ApiError> {
    let Some((name, bytes)) = ASSETS.iter().find(|(name, _)| *name == path) else {
        return Err(ApiError::new(StatusCode::NOT_FOUND, "NOT_FOUND", format!("no console file {path}")));
    };
    let tag = etag(bytes);
    let common = [
        (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY)),
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
        // Revalidate every time: the files change with the binary, and a 304 costs one round trip.
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (header::ETAG, HeaderValue::from_str(&tag).unwrap_or_else(|_| HeaderValue::from_static("\"\""))),
    ];
    let unchanged = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.split(',').any(|candidate| candidate.trim() == tag));
    if unchanged {
        return Ok((StatusCode::NOT_MODIFIED, common).into_response());
    }
    let kind = (header::CONTENT_TYPE, HeaderValue::from_static(content_type(name)));
    Ok((StatusCode::OK, common, [kind], *bytes).into_response())
}
