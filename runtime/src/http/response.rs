//! The shapes of the front's answers: a body of bytes or JSON, SGLang's error, an
//! SSE stream and its events, and asking hyper to close the connection. Not what an
//! endpoint answers (the front's routes) nor OpenAI's error shape ([`crate::http::openai`]).

use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Bytes};
use hyper::header::{HeaderValue, CONNECTION, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use serde_json::{json, Value};
use std::convert::Infallible;

/// A response body.
pub type Out = UnsyncBoxBody<Bytes, Infallible>;

pub fn full(status: u16, ctype: &str, body: impl Into<Bytes>) -> Response<Out> {
    let mut r = Response::new(Full::new(body.into()).boxed_unsync());
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = HeaderValue::from_str(ctype) {
        r.headers_mut().insert(CONTENT_TYPE, v);
    }
    r
}

/// A JSON response.
pub fn json_reply(status: u16, v: &Value) -> Response<Out> {
    full(status, "application/json", v.to_string())
}

/// An error in SGLang's shape (which carries OpenAI's `error` object too).
pub fn error(status: u16, message: &str) -> Response<Out> {
    json_reply(status, &error_body(status, message))
}

/// Ask hyper to close the connection after this response.
pub fn close(r: &mut Response<Out>) {
    r.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
}

/// SGLang's error body.
pub fn error_body(status: u16, message: &str) -> Value {
    let kind = match status {
        400..=499 => "BadRequestError",
        503 => "ServiceUnavailableError",
        _ => "InternalServerError",
    };
    json!({"error": {"message": message, "type": kind, "code": status}, "object": "error",
           "message": message, "code": status})
}

/// An SSE response with `body`.
pub fn sse<B>(body: B) -> Response<Out>
where
    B: Body<Data = Bytes, Error = Infallible> + Send + 'static,
{
    let mut r = Response::new(body.boxed_unsync());
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    r.headers_mut()
        .insert("cache-control", HeaderValue::from_static("no-cache"));
    r
}

/// One SSE event.
pub fn event(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}
