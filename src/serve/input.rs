//! What every API request body must be, checked before any handler: JSON
//! by its `Content-Type` (415 otherwise); and every API error answered in
//! the API's JSON shape, also those axum writes itself in plain text (413
//! for an over-long body, 400 for a path or query it cannot extract).

use axum::extract::Request;
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::IMPORT_BODY_LIMIT;

/// axum's default body limit, which every route but import keeps.
const DEFAULT_BODY_LIMIT: usize = 2 << 20;

fn is_import(path: &str) -> bool {
    path.ends_with("/strategies/import")
}

/// The media types a route takes: JSON, and JSON lines for import.
fn accepted(path: &str) -> &'static [&'static str] {
    if is_import(path) {
        &[
            "application/json",
            "application/x-ndjson",
            "application/ndjson",
        ]
    } else {
        &["application/json"]
    }
}

fn has_body(req: &Request) -> bool {
    let h = req.headers();
    h.contains_key(header::TRANSFER_ENCODING)
        || h.get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .is_some_and(|n| n > 0)
}

pub async fn check(req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let api = path.starts_with("/api/");
    let writes = matches!(
        *req.method(),
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );
    if api && writes && has_body(&req) {
        let ct = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                v.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase()
            });
        let want = accepted(&path);
        if !ct.as_deref().is_some_and(|c| want.contains(&c)) {
            let got = ct.map_or_else(|| "none".to_string(), |c| format!("{c:?}"));
            return ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                Some("Content-Type"),
                format!("Content-Type: expected {}, got {got}", want.join(" or ")),
            )
            .into_response();
        }
    }
    let res = next.run(req).await;
    if !api || !res.status().is_client_error() && !res.status().is_server_error() {
        return res;
    }
    if res.status() == StatusCode::PAYLOAD_TOO_LARGE {
        let limit = if is_import(&path) {
            IMPORT_BODY_LIMIT
        } else {
            DEFAULT_BODY_LIMIT
        };
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            None,
            format!("the body is larger than this route's limit of {limit} bytes"),
        )
        .into_response();
    }
    // Any other error axum answered in plain text (a path or query it could
    // not extract, e.g. "Invalid URL: Invalid UTF-8 in `id`"): the same
    // words in the API's JSON shape.
    let is_json = res
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return res;
    }
    let status = res.status();
    let text = axum::body::to_bytes(res.into_body(), 64 << 10)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let text = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_string()
    } else {
        text
    };
    ApiError::new(status, None, text).into_response()
}
