//! How many calls of a public service a node handles at once: one past the bound is
//! refused at once with RESOURCE_EXHAUSTED (SQLSTATE 53300), never queued, so a flood
//! of callers gets a clear answer instead of growing the node's memory and every
//! other caller's latency.
//!
//! ```text
//!  request ─► Bounded: a permit free? ── yes ─► the service; the permit is held
//!                                    │          until its response (headers) is ready
//!                                    └─ no ──► RESOURCE_EXHAUSTED, 53300, at once
//! ```
//!
//! A streaming call holds its permit only while it is being opened: `Client.Session`
//! streams are bounded by `--max-sessions` instead. `Client` and `Admin` have separate
//! bounds, so an operator's `hawser status` still reaches a node its clients flood.

use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::Semaphore;
use tonic::codegen::{http, BoxFuture, Service};
use tonic::server::NamedService;

use crate::codes::SQLSTATE_KEY;

/// A service that handles at most a fixed number of calls at once.
#[derive(Clone)]
pub(crate) struct Bounded<S> {
    inner: S,
    permits: Arc<Semaphore>,
    limit: usize,
    /// Names the bound in the refusal (the flag that sets it).
    setting: &'static str,
}

impl<S> Bounded<S> {
    pub(crate) fn new(inner: S, limit: usize, setting: &'static str) -> Self {
        Bounded {
            inner,
            permits: Arc::new(Semaphore::new(limit)),
            limit,
            setting,
        }
    }
}

impl<S: NamedService> NamedService for Bounded<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, R> Service<http::Request<B>> for Bounded<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>> + NamedService,
    S::Future: Send + 'static,
    R: Default + Send + 'static,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            metrics::counter!("hawser_requests_refused_total", "service" => S::NAME).increment(1);
            let refusal = refusal(self.limit, self.setting);
            return Box::pin(async move { Ok(refusal) });
        };
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await;
            drop(permit);
            response
        })
    }
}

/// The answer to a call past the bound.
fn refusal<R: Default>(limit: usize, setting: &str) -> http::Response<R> {
    let mut status = tonic::Status::resource_exhausted(format!(
        "too many calls: this node is handling {limit} at once, its limit ({setting}); \
         retry after a short backoff, or spread the calls over more nodes"
    ));
    status.metadata_mut().insert(
        SQLSTATE_KEY,
        tonic::metadata::MetadataValue::from_static("53300"),
    );
    status.into_http()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::future::Future;
    use std::pin::Pin;
    use tokio::sync::oneshot;

    /// Answers each call when the test says so.
    #[derive(Clone)]
    struct Held(Arc<parking_lot::Mutex<Vec<oneshot::Sender<()>>>>);

    impl NamedService for Held {
        const NAME: &'static str = "test.Held";
    }

    impl Service<http::Request<()>> for Held {
        type Response = http::Response<String>;
        type Error = Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            let (tx, rx) = oneshot::channel();
            self.0.lock().push(tx);
            Box::pin(async move {
                let _ = rx.await;
                Ok(http::Response::new("answered".to_string()))
            })
        }
    }

    fn status_of(r: &http::Response<String>) -> (Option<&str>, Option<&str>) {
        let h = |k: &str| r.headers().get(k).and_then(|v| v.to_str().ok());
        (h("grpc-status"), h(SQLSTATE_KEY))
    }

    #[tokio::test]
    async fn a_call_past_the_bound_is_refused_at_once_and_a_freed_permit_admits_the_next() {
        let waiting = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let mut svc = Bounded::new(Held(waiting.clone()), 2, "--max-requests");
        let first = tokio::spawn(svc.call(http::Request::new(())));
        let second = tokio::spawn(svc.call(http::Request::new(())));
        // The third finds both permits held: refused without waiting for either.
        let third = svc.call(http::Request::new(())).await.unwrap();
        assert_eq!(status_of(&third), (Some("8"), Some("53300")));
        let message = third.headers()["grpc-message"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(message.contains("max-requests"), "{message}");
        // One answered: its permit is free again.
        waiting.lock().remove(0).send(()).unwrap();
        assert_eq!(first.await.unwrap().unwrap().body(), "answered");
        let fourth = tokio::spawn(svc.call(http::Request::new(())));
        for tx in waiting.lock().drain(..) {
            tx.send(()).unwrap();
        }
        assert_eq!(second.await.unwrap().unwrap().body(), "answered");
        assert_eq!(fourth.await.unwrap().unwrap().body(), "answered");
    }
}
