//! The error vocabulary of `hawser.v1.Client` and `hawser.v1.Admin`, the same on every
//! failed call: tonic's own refusals of a request it cannot read get the codes the API
//! documents, and every error carries a SQLSTATE in `hawser-sqlstate`.
//!
//! ```text
//!  response headers (a call that fails before any message: trailers-only)
//!    grpc-status 11 "decoded message length too large" ─► 8 RESOURCE_EXHAUSTED, 54000
//!    grpc-status 13, a request tonic could not decode   ─► 3 INVALID_ARGUMENT, 08P01
//!    any other error without hawser-sqlstate            ─► the SQLSTATE of its code
//! ```
//!
//! Only the public services are wrapped: the peer services' callers (senders, Raft)
//! classify codes themselves. Errors that end a stream after its first message travel in
//! trailers, which this does not rewrite; the handlers give those theirs.

use std::task::{Context, Poll};

use tonic::codegen::{http, BoxFuture, Service};
use tonic::server::NamedService;
use tonic::Code;

/// The metadata key a SQLSTATE travels in.
pub(crate) const SQLSTATE_KEY: &str = "hawser-sqlstate";

/// The SQLSTATE an error of `code` carries when its handler gave none (PostgreSQL's
/// classes).
pub(crate) fn sqlstate_of(code: Code) -> &'static str {
    match code {
        Code::Ok => "00000",
        Code::Cancelled | Code::DeadlineExceeded => "57014",
        Code::InvalidArgument => "22023",
        Code::NotFound => "42704",
        Code::AlreadyExists => "42710",
        Code::PermissionDenied => "42501",
        Code::Unauthenticated => "28000",
        Code::ResourceExhausted => "53000",
        Code::FailedPrecondition => "55000",
        Code::Aborted => "40001",
        Code::OutOfRange => "22003",
        Code::Unimplemented => "0A000",
        Code::Unavailable => "57P03",
        Code::DataLoss => "XX001",
        Code::Unknown | Code::Internal => "XX000",
    }
}

/// The code and SQLSTATE an error response should carry, from the code and (decoded)
/// message it has: `None` when it stays as it is. `has_sqlstate`: its handler gave one.
pub(crate) fn corrected(
    code: Code,
    message: &str,
    has_sqlstate: bool,
) -> Option<(Code, &'static str)> {
    // tonic's wording (tonic::codec::decode, tonic_prost::codec).
    let too_large = code == Code::OutOfRange && message.contains("message length too large");
    let unreadable = code == Code::Internal
        && (message.starts_with("failed to decode Protobuf message")
            || message.starts_with("protocol error:")
            || message.starts_with("Unexpected EOF decoding stream"));
    if too_large {
        Some((Code::ResourceExhausted, "54000"))
    } else if unreadable {
        Some((Code::InvalidArgument, "08P01"))
    } else if code != Code::Ok && !has_sqlstate {
        Some((code, sqlstate_of(code)))
    } else {
        None
    }
}

/// `%XX` sequences of a `grpc-message` decoded (as UTF-8, lossily).
fn percent_decoded(raw: &[u8]) -> String {
    let hex = |b: u8| char::from(b).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match (
            raw[i],
            raw.get(i + 1).and_then(|&b| hex(b)),
            raw.get(i + 2).and_then(|&b| hex(b)),
        ) {
            (b'%', Some(hi), Some(lo)) => {
                out.push(hi << 4 | lo);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Applies [`corrected`] to a response's headers, where a call that failed before its
/// first message has its status.
fn correct(headers: &mut http::HeaderMap) {
    let Some(code) = headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .map(Code::from_i32)
    else {
        return;
    };
    let message = headers
        .get("grpc-message")
        .map(|v| percent_decoded(v.as_bytes()))
        .unwrap_or_default();
    let has_sqlstate = headers.contains_key(SQLSTATE_KEY);
    if let Some((code, sqlstate)) = corrected(code, &message, has_sqlstate) {
        headers.insert("grpc-status", http::HeaderValue::from(code as i32));
        if !has_sqlstate || matches!(sqlstate, "54000" | "08P01") {
            headers.insert(SQLSTATE_KEY, http::HeaderValue::from_static(sqlstate));
        }
    }
}

/// A public service whose error responses [`correct`] fixes.
#[derive(Clone)]
pub(crate) struct Corrected<S>(pub(crate) S);

impl<S: NamedService> NamedService for Corrected<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, R> Service<http::Request<B>> for Corrected<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let response = self.0.call(request);
        Box::pin(async move {
            let mut response = response.await?;
            correct(response.headers_mut());
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tonics_refusals_of_an_unreadable_request_get_the_documented_codes() {
        let too_large = "Error, decoded message length too large: found 204800 bytes, \
                         the limit is: 65536 bytes";
        assert_eq!(
            corrected(Code::OutOfRange, too_large, false),
            Some((Code::ResourceExhausted, "54000"))
        );
        let utf8 = "failed to decode Protobuf message: ExecuteRequest.sql: invalid string \
                    value: data is not UTF-8 encoded";
        assert_eq!(
            corrected(Code::Internal, utf8, false),
            Some((Code::InvalidArgument, "08P01"))
        );
        // A handler's own error keeps its code and SQLSTATE; one without gets its code's.
        assert_eq!(corrected(Code::InvalidArgument, "bad", true), None);
        assert_eq!(
            corrected(Code::FailedPrecondition, "receiver not stopped", false),
            Some((Code::FailedPrecondition, "55000"))
        );
        assert_eq!(corrected(Code::Ok, "", false), None);
    }

    #[test]
    fn headers_are_rewritten_with_the_message_decoded() {
        let mut h = http::HeaderMap::new();
        h.insert("grpc-status", http::HeaderValue::from(11));
        h.insert(
            "grpc-message",
            http::HeaderValue::from_static("Error,%20decoded%20message%20length%20too%20large"),
        );
        correct(&mut h);
        assert_eq!(h["grpc-status"], "8");
        assert_eq!(h[SQLSTATE_KEY], "54000");
        let mut ours = http::HeaderMap::new();
        ours.insert("grpc-status", http::HeaderValue::from(3));
        ours.insert(SQLSTATE_KEY, http::HeaderValue::from_static("42601"));
        correct(&mut ours);
        assert_eq!(
            (&ours["grpc-status"], &ours[SQLSTATE_KEY]),
            (&"3".parse().unwrap(), &"42601".parse().unwrap())
        );
        let mut ok = http::HeaderMap::new();
        correct(&mut ok);
        assert!(ok.is_empty());
        assert_eq!(percent_decoded(b"a%2Cb%zz"), "a,b%zz");
    }
}
