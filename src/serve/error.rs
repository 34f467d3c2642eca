//! The API's error answer, `{"error": {"field": …, "message": …}}`, and
//! how store and validation errors become one.

use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::store::json::api_name;
use crate::store::record::StrategyRecord;
use crate::store::{Invalid, StoreError};

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
            StoreError::Invalid(e) => ApiError::from_invalid(&e, rec),
            StoreError::Import { line, ref cause } => ApiError {
                status: StatusCode::UNPROCESSABLE_ENTITY,
                field: cause.field.map(|f| api_name(f, None)),
                message: e.to_string(),
                line: Some(line),
            },
            StoreError::NotFound(m) => ApiError::not_found(m),
            StoreError::Conflict(m) => ApiError::new(StatusCode::CONFLICT, Some("version"), m),
            e @ StoreError::EmptyReplace(_) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                Some("allow_empty"),
                e.to_string(),
            ),
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

impl ApiError {
    /// 422 naming the field by its API name (`rec` lets a condition be
    /// named `match.<dimension>`); a message given whole stays as it is.
    pub fn from_invalid(e: &Invalid, rec: Option<&StrategyRecord>) -> ApiError {
        match e.field {
            Some(f) => ApiError::invalid(&api_name(f, rec), e.text()),
            None => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, None, e.to_string()),
        }
    }
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

/// A report that is not what docs/API.md describes: 422 naming the field.
impl From<crate::client::protocol::BadField> for ApiError {
    fn from(e: crate::client::protocol::BadField) -> ApiError {
        ApiError::invalid(&e.field, e.problem)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::record::StrategyRecord;

    #[test]
    fn validation_fields() {
        let mut rec: StrategyRecord = serde_json::from_str(
            r#"{"name":"x","match":{"api":"/a","ip":"nope"},"algorithm":"token_bucket","rate":1}"#,
        )
        .unwrap();
        let e = ApiError::from_invalid(&rec.clone().validate().unwrap_err(), Some(&rec));
        assert_eq!(e.field.as_deref(), Some("match.ip"));
        assert!(e.message.starts_with("match.ip: "), "{}", e.message);
        rec.conditions.clear();
        rec.status = Some(200);
        let e = ApiError::from_invalid(&rec.validate().unwrap_err(), None);
        assert_eq!(e.field.as_deref(), Some("status"));
        assert_eq!(e.message, "status: must be between 400 and 599, got 200");
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
    }
}
