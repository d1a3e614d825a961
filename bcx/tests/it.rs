//! The driver protocol end to end over real mutual TLS: a provider driver written against the SDK passes the
//! conformance suite; callers without a certificate of the bundle's CA are refused at the handshake; a driver
//! that breaks a rule fails the suite naming the rule.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bcx::client::DriverClient;
use bcx::conformance::{self, Setup};
use bcx::protocol::{
    Account, AcquireRequest, DriverError, ErrorCode, ListRequest, Machine, MachineGpu, MachineState, ReleaseRequest,
};
use bcx::server::{Driver, DriverFuture, ProviderDriver, serve};
use bcx::tls::Identity;

/// A provider with machines in memory: each key acquires one machine, `acquiring` until listed once.
#[derive(Default)]
struct Memory {
    machines: Mutex<BTreeMap<String, (String, Machine)>>,
    /// A broken driver forgets the key: every acquire is a new machine.
    forgets_keys: bool,
    next: AtomicU64,
}

impl ProviderDriver for Memory {
    fn acquire(&self, request: AcquireRequest) -> DriverFuture<'_, Machine> {
        Box::pin(async move {
            if request.account.credential != "secret" {
                return Err(DriverError::new(ErrorCode::Unauthenticated, "wrong credential"));
            }
            let mut machines = self.machines.lock().expect("lock");
            if !self.forgets_keys
                && let Some((_, machine)) = machines.values().find(|(key, _)| *key == request.key)
            {
                return Ok(machine.clone());
            }
            let id = format!("m-{}", self.next.fetch_add(1, Ordering::Relaxed));
            let gpus = (0..request.gpus)
                .map(|g| MachineGpu {
                    id: format!("{id}-gpu{g}"),
                    model: request.gpu_model.clone(),
                    memory_mib: 81_559,
                })
                .collect();
            let machine =
                Machine { id: id.clone(), state: MachineState::Acquiring, gpus, until_ms: None, detail: None };
            machines.insert(id, (request.key, machine.clone()));
            Ok(machine)
        })
    }

    fn list(&self, _: ListRequest) -> DriverFuture<'_, Vec<Machine>> {
        Box::pin(async move {
            let mut machines = self.machines.lock().expect("lock");
            let mut listed = Vec::new();
            for (_, machine) in machines.values_mut() {
                listed.push(machine.clone());
                if machine.state == MachineState::Acquiring {
                    machine.state = MachineState::Ready;
                }
            }
            Ok(listed)
        })
    }

    fn release(&self, request: ReleaseRequest) -> DriverFuture<'_, Machine> {
        Box::pin(async move {
            let mut machines = self.machines.lock().expect("lock");
            let Some((_, machine)) = machines.get_mut(&request.machine_id) else {
                return Err(DriverError::new(ErrorCode::NotFound, format!("no machine {}", request.machine_id)));
            };
            machine.state = MachineState::Released;
            Ok(machine.clone())
        })
    }
}

/// A throwaway PKI bundle: the driver's identity and the control plane's, both from its CA.
fn identities(name: &str) -> (Identity, Identity) {
    let dir = std::env::temp_dir().join(format!("bcx-it-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let bundle = bc_pki::Bundle::init(&dir, &bc_pki::InitOptions::default()).expect("bundle");
    let hosts = ["127.0.0.1".to_owned(), "localhost".to_owned()];
    let (cert, key) = bundle.issue_driver_identity("memory", &hosts).expect("driver identity");
    let driver = Identity { ca_pem: bundle.ca_pem().to_owned(), cert_pem: cert, key_pem: key };
    let (cert, key) = bundle.issue_driver_identity("control-plane", &hosts).expect("control plane identity");
    let caller = Identity { ca_pem: bundle.ca_pem().to_owned(), cert_pem: cert, key_pem: key };
    let _ = std::fs::remove_dir_all(&dir);
    (driver, caller)
}

async fn served(driver: Driver, identity: &Identity) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("https://127.0.0.1:{}", listener.local_addr().expect("addr").port());
    let identity = identity.clone();
    tokio::spawn(async move { serve(listener, &identity, driver, std::future::pending()).await });
    url
}

fn setup(key: &str) -> Setup {
    Setup {
        account: Account {
            account_id: "pacct_test".into(),
            endpoint: "https://provider.example".into(),
            settings: BTreeMap::new(),
            credential: "secret".into(),
        },
        gpu_model: "H100".into(),
        key: key.into(),
        patience: Duration::from_secs(10),
    }
}

#[tokio::test]
async fn a_driver_written_against_the_sdk_passes_the_conformance_suite_over_mutual_tls() {
    bc_pki::tls::install_default_provider();
    let (driver, caller) = identities("passes");
    let url = served(Driver::provider("memory", "1", Memory::default()), &driver).await;
    let client = DriverClient::new(&url, &caller).expect("client");
    let passed = conformance::provider(&client, &setup("k1")).await.expect("conformance");
    assert!(passed.len() >= 8, "{passed:?}");
    let mut wrong = setup("k2");
    wrong.account.credential = "guess".into();
    let refused = conformance::provider(&client, &wrong).await.expect_err("a wrong credential");
    assert_eq!(refused.check, "acquire", "{refused}");
    assert!(refused.why.contains("Unauthenticated"), "{refused}");
}

#[tokio::test]
async fn callers_without_a_certificate_of_the_ca_are_refused_at_the_handshake() {
    bc_pki::tls::install_default_provider();
    let (driver, _) = identities("handshake");
    let url = served(Driver::provider("memory", "1", Memory::default()), &driver).await;
    // No client certificate at all.
    let anonymous = reqwest::Client::builder()
        .tls_backend_preconfigured(bc_pki::tls::client_config(&driver.ca_pem, None).expect("tls"))
        .build()
        .expect("client");
    assert!(anonymous.get(format!("{url}/bcx/v1/describe")).send().await.is_err(), "no certificate, no answer");
    // A certificate of another CA.
    let (_, stranger) = identities("stranger");
    let stranger = Identity { ca_pem: driver.ca_pem.clone(), ..stranger };
    let client = DriverClient::new(&url, &stranger).expect("client");
    let err = client.describe().await.expect_err("another CA's certificate");
    assert!(matches!(err, bcx::client::CallError::Unreachable(_)), "{err}");
}

#[tokio::test]
async fn a_driver_that_acquires_twice_for_one_key_fails_the_suite_naming_the_rule() {
    bc_pki::tls::install_default_provider();
    let (driver, caller) = identities("broken");
    let broken = Memory { forgets_keys: true, ..Memory::default() };
    let url = served(Driver::provider("broken", "1", broken), &driver).await;
    let client = DriverClient::new(&url, &caller).expect("client");
    let failed = conformance::provider(&client, &setup("k1")).await.expect_err("a broken driver");
    assert_eq!(failed.check, "acquire again", "{failed}");
    // The server checks what every acquire must satisfy before the driver sees it.
    let mut invalid = setup("k2");
    invalid.key = String::new();
    let request = AcquireRequest {
        account: invalid.account,
        key: String::new(),
        gpus: 1,
        gpu_model: "H100".into(),
        duration_s: 60,
    };
    let refused = client.acquire(&request).await.expect_err("an empty key");
    assert_eq!(refused.code(), Some(ErrorCode::InvalidArgument), "{refused}");
}

#[tokio::test]
async fn a_driver_that_answers_garbage_or_hangs_is_a_clear_error_not_a_hang() {
    bc_pki::tls::install_default_provider();
    let (driver, caller) = identities("garbage");
    let garbage = axum::Router::new()
        .route("/bcx/v1/describe", axum::routing::get(|| async { "not a describe" }))
        .route("/bcx/v1/provider/list", axum::routing::post(|| async { (axum::http::StatusCode::BAD_GATEWAY, "oops") }))
        .route(
            "/bcx/v1/provider/acquire",
            axum::routing::post(|| async {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                "never"
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("https://127.0.0.1:{}", listener.local_addr().expect("addr").port());
    let tls = bcx::tls::TlsListener::new(listener, driver.mutual_server_config().expect("tls")).expect("listener");
    tokio::spawn(async move { axum::serve(tls, garbage).await });
    let client = DriverClient::with_timeout(&url, &caller, Duration::from_secs(1)).expect("client");
    let described = client.describe().await.expect_err("garbage");
    assert!(matches!(described, bcx::client::CallError::Protocol(_)), "{described}");
    let listed = client.list(&ListRequest { account: setup("k").account }).await.expect_err("no error body");
    assert!(matches!(listed, bcx::client::CallError::Protocol(ref m) if m.contains("502")), "{listed}");
    let request = AcquireRequest {
        account: setup("k").account,
        key: "k".into(),
        gpus: 1,
        gpu_model: "H100".into(),
        duration_s: 60,
    };
    let hung = client.acquire(&request).await.expect_err("a hang");
    assert!(matches!(hung, bcx::client::CallError::Unreachable(_)), "{hung}");
}

/// A machine's power and next boot, behind a BMC driver.
#[derive(Default)]
struct Bmc(Mutex<Option<bcx::protocol::PowerState>>);

impl bcx::server::BmcDriver for Bmc {
    fn power_state(&self, _: bcx::protocol::PowerStateRequest) -> DriverFuture<'_, bcx::protocol::PowerState> {
        Box::pin(async move { Ok(self.0.lock().expect("lock").unwrap_or(bcx::protocol::PowerState::Unknown)) })
    }

    fn set_power(&self, request: bcx::protocol::PowerRequest) -> DriverFuture<'_, bcx::protocol::PowerState> {
        Box::pin(async move {
            let state = match request.action {
                bcx::protocol::PowerAction::On | bcx::protocol::PowerAction::Reset => bcx::protocol::PowerState::On,
                _ => bcx::protocol::PowerState::Off,
            };
            *self.0.lock().expect("lock") = Some(state);
            Ok(state)
        })
    }

    fn set_boot(&self, _: bcx::protocol::BootRequest) -> DriverFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
}

#[tokio::test]
async fn a_bmc_driver_passes_its_conformance_suite_and_a_provider_driver_is_refused_power() {
    bc_pki::tls::install_default_provider();
    let (driver, caller) = identities("bmc");
    let url = served(Driver::bmc("memory-bmc", "1", Bmc::default()), &driver).await;
    let client = DriverClient::new(&url, &caller).expect("client");
    let target = bcx::protocol::BmcTarget {
        address: "https://bmc.example".into(),
        username: "admin".into(),
        password: "pw".into(),
        system_id: None,
    };
    let passed = conformance::bmc(&client, &target).await.expect("conformance");
    assert_eq!(passed.len(), 4, "{passed:?}");
    // A provider driver carries no power: the suite says so, and the route answers UNIMPLEMENTED.
    let provider = served(Driver::provider("memory", "1", Memory::default()), &driver).await;
    let provider = DriverClient::new(&provider, &caller).expect("client");
    let failed = conformance::bmc(&provider, &target).await.expect_err("no power concern");
    assert_eq!(failed.check, "describe", "{failed}");
    let request = bcx::protocol::PowerStateRequest { bmc: target };
    let refused = provider.power_state(&request).await.expect_err("unimplemented");
    assert_eq!(refused.code(), Some(ErrorCode::Unimplemented), "{refused}");
}

/// A client that opens a connection and never finishes a request's head is cut off after the limit, whether it
/// sends part of one or nothing; a whole request is answered, with the connection's peer in its extensions; on
/// shutdown the server stops and the request in flight still gets its answer.
#[tokio::test]
async fn a_connection_that_never_finishes_a_request_head_is_closed_and_whole_requests_are_answered() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    // Each answer says when its handler has begun, and takes a moment: long enough to be in flight at a shutdown.
    let (began, mut begun) = tokio::sync::mpsc::unbounded_channel::<()>();
    let router = axum::Router::new().route(
        "/peer",
        axum::routing::get(move |axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<bcx::tls::Peer>| {
            let began = began.clone();
            async move {
                let _ = began.send(());
                tokio::time::sleep(Duration::from_millis(200)).await;
                format!("{} tls={}", peer.addr, peer.tls)
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(bcx::tls::serve_http(
        bcx::tls::PlainListener::new(listener),
        router,
        Duration::from_millis(300),
        async move {
            let _ = stopped.await;
        },
    ));

    // Part of a head, then nothing; and nothing at all. The server closes both: the reads end.
    for sent in ["GET /peer HTTP/1.1\r\nHost: x\r\n", ""] {
        let mut stream = tokio::net::TcpStream::connect(address).await.expect("connect");
        stream.write_all(sent.as_bytes()).await.expect("write");
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut rest)).await;
        assert!(read.is_ok(), "a connection that sent {sent:?} was still open after 20 s");
    }

    // A whole request is answered with its peer.
    let mut stream = tokio::net::TcpStream::connect(address).await.expect("connect");
    let local = stream.local_addr().expect("local address");
    stream.write_all(b"GET /peer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.expect("write");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.expect("read");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with(&format!("{local} tls=false")), "{answer}");

    // A request in flight when the shutdown comes still gets its answer; then the server returns.
    while begun.try_recv().is_ok() {}
    let mut stream = tokio::net::TcpStream::connect(address).await.expect("connect");
    stream.write_all(b"GET /peer HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
    begun.recv().await.expect("the handler began");
    let _ = stop.send(());
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_string(&mut answer))
        .await
        .expect("the answer in flight")
        .expect("read");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    tokio::time::timeout(Duration::from_secs(20), server)
        .await
        .expect("the server stopped")
        .expect("join")
        .expect("serve");
}

/// At its limit a listener stops accepting: a third connection to a plain listener of two places is answered only
/// once one of the first two closes; and a TLS listener counts a connection from its accept, so one that never
/// starts its handshake keeps the only place from a real client until it goes.
#[tokio::test]
async fn a_listener_at_its_connection_limit_serves_the_next_client_once_a_connection_closes() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let router = axum::Router::new().route("/", axum::routing::get(|| async { "hello" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let plain = bcx::tls::PlainListener::with_limit(listener, bcx::tls::ConnectionLimit::new(2));
    assert_eq!(plain.limit().max(), 2);
    tokio::spawn(bcx::tls::serve_http(plain, router, Duration::from_secs(60), std::future::pending()));

    // Reads one answer off a kept-alive connection (its body is the five bytes of "hello").
    async fn answered(stream: &mut tokio::net::TcpStream) -> String {
        let mut answer = Vec::new();
        let mut buffer = [0u8; 1024];
        while !answer.ends_with(b"hello") {
            let n = stream.read(&mut buffer).await.expect("read");
            assert!(n > 0, "the connection closed before its answer: {}", String::from_utf8_lossy(&answer));
            answer.extend_from_slice(&buffer[..n]);
        }
        String::from_utf8_lossy(&answer).into_owned()
    }
    let request = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut first = tokio::net::TcpStream::connect(address).await.expect("connect");
    first.write_all(request).await.expect("write");
    assert!(answered(&mut first).await.starts_with("HTTP/1.1 200"));
    let mut second = tokio::net::TcpStream::connect(address).await.expect("connect");
    second.write_all(request).await.expect("write");
    assert!(answered(&mut second).await.starts_with("HTTP/1.1 200"));

    // The kernel completes the third client's connection, but the server does not take it while both are open.
    let mut third = tokio::net::TcpStream::connect(address).await.expect("connect");
    third.write_all(request).await.expect("write");
    let waited = tokio::time::timeout(Duration::from_millis(500), answered(&mut third)).await;
    assert!(waited.is_err(), "a third connection was served beyond the limit of two: {waited:?}");
    drop(first);
    let answer = tokio::time::timeout(Duration::from_secs(20), answered(&mut third))
        .await
        .expect("the third client was served once the first left");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    // TLS, one place: a connection that never says a word holds it, and a driver client cannot get through.
    bc_pki::tls::install_default_provider();
    let (driver, caller) = identities("limited");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("https://127.0.0.1:{}", listener.local_addr().expect("addr").port());
    let config = driver.mutual_server_config().expect("tls");
    let tls = bcx::tls::TlsListener::with_limit(listener, config, bcx::tls::ConnectionLimit::new(1)).expect("listener");
    let describe = axum::Router::new().route("/bcx/v1/describe", axum::routing::get(|| async { "not a describe" }));
    tokio::spawn(bcx::tls::serve_http(tls, describe, Duration::from_secs(60), std::future::pending()));
    let silent = tokio::net::TcpStream::connect(url.trim_start_matches("https://")).await.expect("connect");
    let client = DriverClient::with_timeout(&url, &caller, Duration::from_secs(1)).expect("client");
    let held = client.describe().await.expect_err("no place");
    assert!(matches!(held, bcx::client::CallError::Unreachable(_)), "served beyond the limit of one: {held}");
    drop(silent);
    let client = DriverClient::with_timeout(&url, &caller, Duration::from_secs(20)).expect("client");
    let served = client.describe().await.expect_err("answered, with a body that is not a description");
    assert!(
        matches!(served, bcx::client::CallError::Protocol(_)),
        "the client was not served once the place freed: {served}"
    );
}
