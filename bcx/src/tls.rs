//! Serving over TLS: a listener that completes each handshake in its own task (a slow or hostile client never
//! holds up the others) and hands axum finished streams, with the client certificate the handshake verified.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use bc_pki::PeerCertificate;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// How long a client may take to finish its handshake.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// How many connections a listener keeps open at once unless told otherwise, handshakes included.
pub const MAX_CONNECTIONS: usize = 8_192;

/// The places of a listener's connections: one is taken before each accept and held by the connection until it
/// closes. At the limit the listener stops accepting, so a flood of clients waits in the kernel's backlog (and
/// times out there) instead of the process running out of file descriptors, when every accept, every database
/// connection and every file it opens would fail.
#[derive(Debug, Clone)]
pub struct ConnectionLimit {
    places: Arc<Semaphore>,
    max: usize,
    figures: Arc<LimitFigures>,
}

/// What a limit has seen, for the metrics.
#[derive(Debug, Default)]
struct LimitFigures {
    /// Connections accepted and not yet closed, handshakes included.
    open: AtomicUsize,
    /// Times the listener found every place taken and stopped accepting until one was given back.
    full: AtomicU64,
}

impl ConnectionLimit {
    pub fn new(max: usize) -> ConnectionLimit {
        ConnectionLimit { places: Arc::new(Semaphore::new(max)), max, figures: Arc::default() }
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// The connections open now, handshakes included.
    pub fn open(&self) -> usize {
        self.figures.open.load(Ordering::Relaxed)
    }

    /// How many times the listener reached the limit since it started: each time, new clients waited in the
    /// kernel's backlog until a connection closed.
    pub fn times_full(&self) -> u64 {
        self.figures.full.load(Ordering::Relaxed)
    }

    /// Waits for a place.
    async fn place(&self) -> OwnedSemaphorePermit {
        if let Ok(permit) = Arc::clone(&self.places).try_acquire_owned() {
            return permit;
        }
        let times = self.figures.full.fetch_add(1, Ordering::Relaxed) + 1;
        // Once, then at every thousandth time: a listener held at its limit would otherwise log each accept.
        if times == 1 || times.is_multiple_of(1_000) {
            tracing::warn!(
                max = self.max,
                times,
                "every connection place is taken: new clients wait until one closes (serve --max-connections)"
            );
        }
        match Arc::clone(&self.places).acquire_owned().await {
            Ok(permit) => permit,
            // The semaphore is never closed.
            Err(_) => std::future::pending().await,
        }
    }

    /// The place `permit` holds, now that a connection was accepted into it: counted as open until dropped.
    fn accepted(&self, permit: OwnedSemaphorePermit) -> Place {
        self.figures.open.fetch_add(1, Ordering::Relaxed);
        Place { _permit: permit, figures: Arc::clone(&self.figures) }
    }
}

/// A place in a [`ConnectionLimit`] with a connection in it, counted as open until dropped.
#[derive(Debug)]
struct Place {
    _permit: OwnedSemaphorePermit,
    figures: Arc<LimitFigures>,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.figures.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Default for ConnectionLimit {
    fn default() -> Self {
        ConnectionLimit::new(MAX_CONNECTIONS)
    }
}

/// A connection holding its place in its listener's [`ConnectionLimit`] until it is dropped.
#[derive(Debug)]
pub struct Counted<S> {
    io: S,
    _place: Place,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Who is at the other end of a connection: its address, and the certificate it presented (already verified
/// against the bundle's CA) when it presented one. Requests carry it as `ConnectInfo<Peer>`.
#[derive(Debug, Clone)]
pub struct Peer {
    pub addr: SocketAddr,
    pub certificate: Option<PeerCertificate>,
    /// Whether the connection is TLS: node routes require a node certificate only then.
    pub tls: bool,
}

/// The server configuration new connections are accepted with, replaced when the revocation list changes.
pub type SharedConfig = Arc<std::sync::RwLock<Arc<rustls::ServerConfig>>>;

/// A TCP listener whose connections are TLS.
pub struct TlsListener {
    local: SocketAddr,
    config: SharedConfig,
    limit: ConnectionLimit,
    ready: mpsc::Receiver<(Counted<TlsStream<TcpStream>>, Peer)>,
    accepting: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for TlsListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsListener").field("local", &self.local).finish_non_exhaustive()
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl TlsListener {
    /// A listener with the default limit on open connections ([`MAX_CONNECTIONS`]).
    pub fn new(tcp: TcpListener, config: Arc<rustls::ServerConfig>) -> io::Result<TlsListener> {
        TlsListener::with_limit(tcp, config, ConnectionLimit::default())
    }

    pub fn with_limit(
        tcp: TcpListener,
        config: Arc<rustls::ServerConfig>,
        limit: ConnectionLimit,
    ) -> io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let (send, ready) = mpsc::channel(64);
        let config: SharedConfig = Arc::new(std::sync::RwLock::new(config));
        let shared = Arc::clone(&config);
        let places = limit.clone();
        let accepting = tokio::spawn(async move {
            loop {
                // A place first: a handshake holds a file descriptor too.
                let place = places.place().await;
                let (stream, addr) = match tcp.accept().await {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        // Out of file descriptors and the like: wait a little rather than spin.
                        tracing::warn!(error = %err, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let place = places.accepted(place);
                // An answer goes out as soon as it is written, not after the client's delayed ACK.
                let _ = stream.set_nodelay(true);
                let current = match shared.read() {
                    Ok(config) => Arc::clone(&config),
                    Err(poisoned) => Arc::clone(&poisoned.into_inner()),
                };
                let acceptor = TlsAcceptor::from(current);
                let send = send.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let certificate = tls
                                .get_ref()
                                .1
                                .peer_certificates()
                                .and_then(|chain| chain.first())
                                .and_then(|der| PeerCertificate::parse(der).ok());
                            let tls = Counted { io: tls, _place: place };
                            let _ = send.send((tls, Peer { addr, certificate, tls: true })).await;
                        }
                        Ok(Err(err)) => tracing::debug!(%addr, error = %err, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%addr, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { local, config, limit, ready, accepting })
    }

    /// The configuration new connections get: replace it to change what the next handshakes check.
    pub fn config(&self) -> SharedConfig {
        Arc::clone(&self.config)
    }

    /// The address it listens on.
    pub fn address(&self) -> SocketAddr {
        self.local
    }

    pub fn limit(&self) -> &ConnectionLimit {
        &self.limit
    }
}

impl Listener for TlsListener {
    type Io = Counted<TlsStream<TcpStream>>;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(ready) => ready,
            // The accepting task only ends when the listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(Peer { addr: self.local, certificate: None, tls: true })
    }
}

impl Connected<IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Self {
        stream.remote_addr().clone()
    }
}

/// A plain listener whose connections send each write at once (`TCP_NODELAY`): without it a small answer
/// written in two parts waits for the client's acknowledgement of the first.
#[derive(Debug)]
pub struct PlainListener {
    tcp: TcpListener,
    limit: ConnectionLimit,
}

impl PlainListener {
    /// A listener with the default limit on open connections ([`MAX_CONNECTIONS`]).
    pub fn new(tcp: TcpListener) -> PlainListener {
        PlainListener::with_limit(tcp, ConnectionLimit::default())
    }

    pub fn with_limit(tcp: TcpListener, limit: ConnectionLimit) -> PlainListener {
        PlainListener { tcp, limit }
    }

    pub fn limit(&self) -> &ConnectionLimit {
        &self.limit
    }
}

impl Listener for PlainListener {
    type Io = Counted<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let place = self.limit.place().await;
        // axum's accept waits out errors such as running out of file descriptors rather than spinning.
        let (stream, addr) = Listener::accept(&mut self.tcp).await;
        let _ = stream.set_nodelay(true);
        (Counted { io: stream, _place: self.limit.accepted(place) }, addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

impl Connected<IncomingStream<'_, PlainListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, PlainListener>) -> Self {
        Peer { addr: *stream.remote_addr(), certificate: None, tls: false }
    }
}

impl From<SocketAddr> for Peer {
    /// A connection known by its address alone: plain TCP, no certificate.
    fn from(addr: SocketAddr) -> Self {
        Peer { addr, certificate: None, tls: false }
    }
}

/// How long a client may take to send a request's head, counted from the connection's start or the end of its
/// last answer; so also how long an idle connection is kept for its next request. Above the 60 s idle timeout
/// load balancers commonly keep, so a balancer does not send a request on a connection this side just closed.
pub const REQUEST_HEAD_TIMEOUT: Duration = Duration::from_secs(75);

/// Serves `router` over HTTP/1.1 on `listener` until `shutdown` resolves, then lets the requests in flight finish.
/// This is `axum::serve` with a limit on how long a client may take to send a request's head (`request_head`),
/// which `axum::serve` has no way to set: without it, a client that opens connections and never completes a
/// request holds each one open for good. Requests carry the connection's [`Peer`] as `ConnectInfo<Peer>`.
pub async fn serve_http<L>(
    mut listener: L,
    router: axum::Router,
    request_head: Duration,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()>
where
    L: Listener,
    L::Addr: Into<Peer>,
{
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(request_head);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (io, addr) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let peer: Peer = addr.into();
        let router = router.clone();
        let service = hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            request.extensions_mut().insert(axum::extract::ConnectInfo(peer.clone()));
            tower::ServiceExt::oneshot(router.clone(), request)
        });
        let connection = graceful.watch(builder.serve_connection(hyper_util::rt::TokioIo::new(io), service));
        tokio::spawn(async move {
            // A client that went away, or took too long over a request's head: nothing to answer.
            if let Err(err) = connection.await {
                tracing::debug!(error = %err, "a connection ended with an error");
            }
        });
    }
    // No new connections; the open ones finish the requests they have (an idle one closes at once).
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// A bound listener, plain or TLS.
#[derive(Debug)]
pub enum Bound {
    /// Plain HTTP: only behind a proxy that terminates TLS (`--insecure-http`), and in tests of the HTTP layer.
    Plain(PlainListener),
    Tls(TlsListener),
}

impl Bound {
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Bound::Plain(listener) => listener.local_addr(),
            Bound::Tls(listener) => Ok(listener.address()),
        }
    }

    /// The limit on its open connections.
    pub fn limit(&self) -> &ConnectionLimit {
        match self {
            Bound::Plain(listener) => listener.limit(),
            Bound::Tls(listener) => listener.limit(),
        }
    }

    /// The API's base URL on this listener.
    pub fn url(&self) -> io::Result<String> {
        let scheme = match self {
            Bound::Plain(_) => "http",
            Bound::Tls(_) => "https",
        };
        Ok(format!("{scheme}://{}", self.local_addr()?))
    }
}

impl From<TcpListener> for Bound {
    fn from(listener: TcpListener) -> Self {
        Bound::Plain(PlainListener::new(listener))
    }
}

impl From<TlsListener> for Bound {
    fn from(listener: TlsListener) -> Self {
        Bound::Tls(listener)
    }
}

/// One side's identity in the driver protocol: its certificate chain and key (PEM), and the CA (PEM) whose
/// certificates it accepts from the other side. Both sides present a certificate: the protocol is mutual TLS.
#[derive(Clone)]
pub struct Identity {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").finish_non_exhaustive()
    }
}

impl Identity {
    /// Reads the three PEM files.
    pub fn load(ca: &std::path::Path, cert: &std::path::Path, key: &std::path::Path) -> anyhow::Result<Identity> {
        use anyhow::Context as _;
        let read =
            |path: &std::path::Path| std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()));
        Ok(Identity { ca_pem: read(ca)?, cert_pem: read(cert)?, key_pem: read(key)? })
    }

    /// A server configuration that presents this identity and accepts only clients whose certificate the CA
    /// signed: a client without one fails the handshake.
    pub fn mutual_server_config(&self) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        let provider = bc_pki::tls::provider();
        let mut roots = rustls::RootCertStore::empty();
        for certificate in bc_pki::tls::certificates(&self.ca_pem)? {
            roots.add(certificate)?;
        }
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build()?;
        let chain = bc_pki::tls::certificates(&self.cert_pem)?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, bc_pki::tls::private_key(&self.key_pem)?)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// A client configuration that presents this identity and trusts only servers the CA signed.
    pub fn client_config(&self) -> anyhow::Result<rustls::ClientConfig> {
        Ok(bc_pki::tls::client_config(&self.ca_pem, Some((&self.cert_pem, &self.key_pem)))?)
    }
}
