//! The API's error answer, `{"error": {"field": …, "message": …}}`, and
//! how store and validation errors become one.

use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::store::record::StrategyRecord;
use crate::store::StoreError;

/// An error answer: `{"error": {"field": …, "message": …}}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub field: Option<String>,
    pub message: String,
    /// The 1-based line (or array item) of an import the error is about.
    pub line: Option<usize>,
}

impl ApiError {
    pub fn new(status: StatusCode, field: Option<&str>, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            field: field.map(str::to_string),
            message: message.into(),
            line: None,
        }
    }
    pub fn bad_request(field: Option<&str>, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, field, message)
    }
    /// 422 for `field`; the message starts with the field name.
    pub fn invalid(field: &str, message: impl std::fmt::Display) -> ApiError {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            Some(field),
            format!("{field}: {message}"),
        )
    }
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, None, message)
    }
    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, None, message)
    }
    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, None, message)
    }

    /// A store error; `rec` lets `conditions[i]` be named `match.<dimension>`.
    pub fn from_store(e: StoreError, rec: Option<&StrategyRecord>) -> ApiError {
        match e {
            StoreError::Invalid(m) => validation(&m, rec),
            StoreError::NotFound(m) => ApiError::not_found(m),
            StoreError::Conflict(m) => ApiError::new(StatusCode::CONFLICT, Some("version"), m),
            e => {
                tracing::error!(error = %e, "store error");
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, None, e.to_string())
            }
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        ApiError::from_store(e, None)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({"error": {"field": self.field, "message": self.message}});
        if let Some(line) = self.line {
            body["error"]["line"] = json!(line);
        }
        (self.status, Json(body)).into_response()
    }
}

pub type ApiResult = Result<Response, ApiError>;

/// A validation message "field: text" from the model or the record → 422
/// naming the API field (`conditions[i]…` → `match.<dimension>`,
/// `action.status` → `status`, `host-id` → `host_id`).
pub fn validation(message: &str, rec: Option<&StrategyRecord>) -> ApiError {
    let (prefix, rest) = message.split_once(':').unwrap_or(("", message));
    let field = if let Some(tail) = prefix.strip_prefix("conditions[") {
        let index: Option<usize> = tail.split(']').next().and_then(|i| i.parse().ok());
        match (index, rec) {
            (Some(i), Some(r)) => r
                .conditions
                .keys()
                .nth(i)
                .map(|d| format!("match.{d}"))
                .unwrap_or_else(|| "match".into()),
            _ => "match".into(),
        }
    } else {
        match prefix {
            "conditions" => "match".into(),
            "action.status" => "status".into(),
            "action.max_delay_ms" => "max_delay_ms".into(),
            "host-id" => "host_id".into(),
            p if !p.is_empty() && p.chars().all(|c| c.is_ascii_lowercase() || c == '_') => {
                p.to_string()
            }
            _ => return ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, None, message.to_string()),
        }
    };
    ApiError::invalid(&field, rest.trim_start())
}

pub async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::not_found(format!("no route {method} {}", uri.path()))
}

pub async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        None,
        format!("method {method} is not allowed on {}", uri.path()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::record::StrategyRecord;

    #[test]
    fn validation_fields() {
        let rec: StrategyRecord = serde_json::from_str(
            r#"{"name":"x","match":{"api":"/a","ip":"nope"},"algorithm":"token_bucket","rate":1}"#,
        )
        .unwrap();
        let e = validation(
            "conditions[1].value: \"nope\" is not an IPv4 or IPv6 address",
            Some(&rec),
        );
        assert_eq!(e.field.as_deref(), Some("match.ip"));
        assert!(e.message.starts_with("match.ip: "), "{}", e.message);
        let e = validation("action.status: must be between 400 and 599, got 200", None);
        assert_eq!(e.field.as_deref(), Some("status"));
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
    }
}
