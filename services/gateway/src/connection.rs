//! The connections [`crate::serve`] accepts, each of which a request can close: a stream of events whose client has
//! stopped reading must end, but its response body is then not even polled (the connection's buffers are full, so
//! the HTTP server waits for them to drain), so ending the body would change nothing. The stream instead cancels its
//! connection's [`Connection::cut`], and the connection's next read or write (or the one it is waiting on) fails,
//! which makes the HTTP server drop it: the socket closes, and the client, once it reads what was already sent,
//! sees the stream end and resumes from its last id.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::extract::connect_info::Connected;
use axum::serve::IncomingStream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// A TCP listener whose connections can be cut ([`Cuttable`]).
#[derive(Debug)]
pub(crate) struct Listener {
    inner: TcpListener,
}

impl Listener {
    pub(crate) fn new(inner: TcpListener) -> Self {
        Listener { inner }
    }
}

impl axum::serve::Listener for Listener {
    type Io = Cuttable;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Cuttable, SocketAddr) {
        // axum's own accept loop: it retries what fails (too many open files waits a moment first).
        let (stream, address) = axum::serve::Listener::accept(&mut self.inner).await;
        (Cuttable::new(stream), address)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// What a request knows of its connection (axum's `ConnectInfo`): the peer, and the token that closes it.
#[derive(Debug, Clone)]
pub(crate) struct Connection {
    pub(crate) peer: SocketAddr,
    /// Cancelled: the connection's reads and writes fail from then on, and the server drops it.
    pub(crate) cut: CancellationToken,
}

impl Connected<IncomingStream<'_, Listener>> for Connection {
    fn connect_info(stream: IncomingStream<'_, Listener>) -> Self {
        Connection { peer: *stream.remote_addr(), cut: stream.io().cut.clone() }
    }
}

/// A TCP stream that fails every read and write once its token is cancelled, including one that is waiting for the
/// peer (the token's cancellation wakes it).
#[derive(Debug)]
pub(crate) struct Cuttable {
    stream: TcpStream,
    cut: CancellationToken,
    /// The cancellation, polled only when the stream would wait, so that a wait ends when the token is cancelled.
    cutting: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl Cuttable {
    fn new(stream: TcpStream) -> Self {
        let cut = CancellationToken::new();
        let cutting = Box::pin(cut.clone().cancelled_owned());
        Cuttable { stream, cut, cutting }
    }

    /// `Ready` with the error of a cut connection if it is cut; when `waiting` (the stream answered `Pending`),
    /// also asks to be woken when it is.
    fn check(&mut self, cx: &mut Context<'_>, waiting: bool) -> Poll<io::Error> {
        let cut = if waiting { self.cutting.as_mut().poll(cx).is_ready() } else { self.cut.is_cancelled() };
        if cut {
            Poll::Ready(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the gateway closed the connection: its client was not reading",
            ))
        } else {
            Poll::Pending
        }
    }

    /// `poll` on the stream, unless the connection is cut; a `Pending` also waits for the cut.
    fn poll_unless_cut<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(Pin<&mut TcpStream>, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if let Poll::Ready(e) = self.check(cx, false) {
            return Poll::Ready(Err(e));
        }
        match poll(Pin::new(&mut self.stream), cx) {
            Poll::Ready(result) => Poll::Ready(result),
            Poll::Pending => match self.check(cx, true) {
                Poll::Ready(e) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl AsyncRead for Cuttable {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_unless_cut(cx, |stream, cx| stream.poll_read(cx, buf))
    }
}

impl AsyncWrite for Cuttable {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.get_mut().poll_unless_cut(cx, |stream, cx| stream.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_unless_cut(cx, |stream, cx| stream.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_unless_cut(cx, |stream, cx| stream.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // A cut connection is closing anyway: what it still has to send is left to the kernel.
        let this = self.get_mut();
        if this.cut.is_cancelled() {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_shutdown(cx)
    }
}
