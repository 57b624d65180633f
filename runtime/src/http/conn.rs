//! Serving HTTP connections within the front's limits: a tokio runtime of its own
//! ([`spawn_server`]), at most so many connections open (503 beyond), the head's size
//! and deadline, and reading a request's body within its deadline and size
//! ([`read_body`]). Not what a request is answered with ([`Handler`], given).

use crate::http::limits::{MAX_BODY, MAX_HEAD, READ_DEADLINE};
use crate::http::response::{close, error, Out};
use crate::sync::thread;
use crate::sync::Arc;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::CONTENT_LENGTH;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::net::TcpListener;
use std::pin::Pin;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Connections over the limit being answered 503 at once (more are closed unanswered).
const MAX_REFUSING: usize = 64;

/// What answers a request.
pub type Handler = Arc<
    dyn Fn(Request<Incoming>) -> Pin<Box<dyn std::future::Future<Output = Response<Out>> + Send>>
        + Send
        + Sync,
>;

/// Serve `handler` on `listener` from a tokio runtime of its own (two worker
/// threads), with the front's limits: at most `max_connections` open (503 beyond),
/// [`MAX_HEAD`] bytes of head, [`READ_DEADLINE`] to receive a head.
pub fn spawn_server(
    listener: TcpListener,
    name: &str,
    max_connections: usize,
    handler: Handler,
) -> std::io::Result<thread::JoinHandle<()>> {
    listener.set_nonblocking(true)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(name)
        .enable_all()
        .build()?;
    thread::Builder::new()
        .name(format!("{name}-accept"))
        .spawn(move || {
            rt.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => accept_loop(l, max_connections, handler).await,
                    Err(e) => eprintln!("kvsim serve: http: {e}"),
                }
            })
        })
}

async fn accept_loop(l: tokio::net::TcpListener, max: usize, handler: Handler) {
    let open = Arc::new(Semaphore::new(max));
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    loop {
        let stream = match l.accept().await {
            Ok((s, _)) => s,
            Err(_) => {
                // Out of descriptors, most likely: wait for connections to close.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let h = handler.clone();
        match open.clone().try_acquire_owned() {
            Ok(permit) => {
                tokio::spawn(async move {
                    serve_conn(stream, h, false).await;
                    drop(permit);
                });
            }
            Err(_) => {
                // Over the limit: read the request and answer 503 (a reply written
                // before the request is read can be lost to the reset of closing on
                // unread bytes), with a small bound on how many are being refused.
                if let Ok(permit) = refusing.clone().try_acquire_owned() {
                    tokio::spawn(async move {
                        serve_conn(stream, h, true).await;
                        drop(permit);
                    });
                }
            }
        }
    }
}

async fn serve_conn(stream: tokio::net::TcpStream, handler: Handler, refuse: bool) {
    let svc = hyper::service::service_fn(move |req| {
        let h = handler.clone();
        async move {
            if refuse {
                let mut r = error(503, "too many open connections");
                close(&mut r);
                return Ok::<_, Infallible>(r);
            }
            Ok(h(req).await)
        }
    });
    let deadline = if refuse {
        Duration::from_secs(1)
    } else {
        READ_DEADLINE
    };
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(deadline)
        .max_buf_size(MAX_HEAD)
        .keep_alive(!refuse)
        .serve_connection(TokioIo::new(stream), svc)
        .await;
}

/// Read a request's whole body within the deadline and the size limit. A failed read
/// answers with `Connection: close` (the rest of the body is not read).
pub async fn read_body(req: Request<Incoming>, deadline: Duration) -> Result<Bytes, Response<Out>> {
    let fail = |status: u16, msg: String| {
        let mut r = error(status, &msg);
        close(&mut r);
        r
    };
    let claimed = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(n) = claimed.filter(|&n| n > MAX_BODY as u64) {
        return Err(fail(
            413,
            format!("body: {n} bytes is over the limit of {MAX_BODY} bytes"),
        ));
    }
    let body = Limited::new(req.into_body(), MAX_BODY);
    match tokio::time::timeout(deadline, body.collect()).await {
        Err(_) => Err(fail(408, "request body not received in time".into())),
        Ok(Ok(c)) => Ok(c.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(fail(
            413,
            format!("body: over the limit of {MAX_BODY} bytes"),
        )),
        Ok(Err(e)) => Err(fail(400, format!("body: not received whole: {e}"))),
    }
}
