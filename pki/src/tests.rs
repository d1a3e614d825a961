use std::sync::Arc;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::*;

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("bc-pki-{name}-{}-{}", std::process::id(), unix_now()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn a_bundle_is_made_once_and_read_back_the_same() {
    let dir = scratch("once");
    let made = Bundle::init(&dir, &InitOptions::default()).expect("init");
    let read = Bundle::load(&dir).expect("load");
    assert_eq!(made.ca_fingerprint(), read.ca_fingerprint());
    assert_eq!(made.server_certificate(), read.server_certificate());
    match Bundle::init(&dir, &InitOptions::default()) {
        Err(PkiError::AlreadyExists { path }) => assert!(path.ends_with("ca.crt"), "{path:?}"),
        other => panic!("a second init must refuse, got {other:?}"),
    }
    use std::os::unix::fs::PermissionsExt as _;
    for key in ["ca.key", "server.key", "sealing.key"] {
        let mode = std::fs::metadata(dir.join(key)).expect("key").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{key}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_or_damaged_bundle_says_to_restore_it_and_names_the_file() {
    let dir = scratch("damaged");
    let missing = Bundle::load(&dir).expect_err("missing").to_string();
    assert!(missing.contains("no PKI bundle") && missing.contains("restore"), "{missing}");
    Bundle::init(&dir, &InitOptions::default()).expect("init");
    std::fs::write(dir.join("ca.key"), "garbage").expect("damage");
    let damaged = Bundle::load(&dir).expect_err("damaged").to_string();
    assert!(damaged.contains("ca.key") && damaged.contains("restore"), "{damaged}");
    // Another bundle's CA key beside this CA certificate is refused, not used to sign.
    let other = scratch("other");
    Bundle::init(&other, &InitOptions::default()).expect("init other");
    std::fs::copy(other.join("ca.key"), dir.join("ca.key")).expect("copy");
    let mismatched = Bundle::load(&dir).expect_err("mismatched").to_string();
    assert!(mismatched.contains("not the key of ca.crt"), "{mismatched}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&other);
}

#[test]
fn a_node_certificate_names_the_node_not_what_its_request_asked_for() {
    let dir = scratch("node");
    let bundle = Bundle::init(&dir, &InitOptions::default()).expect("init");
    let key = NodeKey::generate("gpu-host-7").expect("key");
    let issued = bundle.sign_node_csr(&key.csr_pem, "node_01jz000000000000000000000a", 3600).expect("sign");
    let peer = PeerCertificate::parse_pem(&issued.pem).expect("parse");
    assert_eq!(peer.common_name, "node_01jz000000000000000000000a");
    assert_eq!(peer.serial, issued.serial);
    assert_eq!(peer.not_after, issued.not_after);
    assert!(!peer.due_for_renewal(unix_now()));
    assert!(peer.due_for_renewal(peer.not_after - 100));
    assert!(matches!(
        bundle.sign_node_csr("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n", "n", 60),
        Err(PkiError::InvalidCsr(_))
    ));
    assert!(matches!(bundle.sign_node_csr("not pem", "n", 60), Err(PkiError::InvalidCsr(_))));
    let crl = bundle
        .revocation_list(&[RevokedCertificate { serial: issued.serial.clone(), revoked_at: unix_now() }], 1)
        .expect("crl");
    let (_, parsed) = x509_parser::parse_x509_crl(&crl).expect("parse crl");
    let serials: Vec<String> = parsed.iter_revoked_certificates().map(|r| hex(r.raw_serial())).collect();
    assert_eq!(serials, vec![issued.serial]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_sealed_secret_opens_only_with_its_key_and_context() {
    let sealer = seal::Sealer::new(&seal::Sealer::generate_key().expect("key"));
    let sealed = sealer.seal(b"hunter2", "bmc-password:node_1").expect("seal");
    assert!(!sealed.windows(7).any(|w| w == b"hunter2"), "the secret must not be in the clear");
    assert_eq!(sealer.open(&sealed, "bmc-password:node_1").expect("open"), b"hunter2");
    assert!(matches!(sealer.open(&sealed, "bmc-password:node_2"), Err(PkiError::Unsealable)));
    let other = seal::Sealer::new(&seal::Sealer::generate_key().expect("key"));
    assert!(matches!(other.open(&sealed, "bmc-password:node_1"), Err(PkiError::Unsealable)));
    let mut altered = sealed.clone();
    *altered.last_mut().expect("byte") ^= 1;
    assert!(matches!(sealer.open(&altered, "bmc-password:node_1"), Err(PkiError::Unsealable)));
    assert!(matches!(sealer.open(&[], "x"), Err(PkiError::Unsealable)));
}

#[test]
fn a_derived_secret_is_the_same_for_one_key_and_context_and_no_other() {
    let key = seal::Sealer::generate_key().expect("key");
    let (sealer, again) = (seal::Sealer::new(&key), seal::Sealer::new(&key));
    assert_eq!(sealer.derive("token:tok_1"), again.derive("token:tok_1"));
    assert_ne!(sealer.derive("token:tok_1"), sealer.derive("token:tok_2"));
    let other = seal::Sealer::new(&seal::Sealer::generate_key().expect("key"));
    assert_ne!(sealer.derive("token:tok_1"), other.derive("token:tok_1"));
    assert!(!sealer.derive("token:tok_1").windows(32).any(|w| w == key), "the key itself never comes out");
    assert!(again.verify_derived("token:tok_1", &sealer.derive("token:tok_1")));
    assert!(!sealer.verify_derived("token:tok_2", &sealer.derive("token:tok_1")));
    assert!(!other.verify_derived("token:tok_1", &sealer.derive("token:tok_1")));
}

/// A TLS handshake between the two configurations over loopback; returns the client certificate the server
/// saw, if any.
async fn handshake(
    server: Arc<rustls::ServerConfig>,
    client: rustls::ClientConfig,
) -> Result<Option<PeerCertificate>, String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accept = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("accept");
        let mut tls = tokio_rustls::TlsAcceptor::from(server).accept(tcp).await.map_err(|e| e.to_string())?;
        let peer = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| PeerCertificate::parse(c).expect("peer"));
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
        tls.write_all(b"pong").await.map_err(|e| e.to_string())?;
        tls.shutdown().await.ok();
        Ok::<_, String>(peer)
    });
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
    let client = async {
        let mut tls =
            tokio_rustls::TlsConnector::from(Arc::new(client)).connect(name, tcp).await.map_err(|e| e.to_string())?;
        tls.write_all(b"ping").await.map_err(|e| e.to_string())?;
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
        Ok::<_, String>(())
    };
    let client = client.await;
    let server = accept.await.expect("join");
    client?;
    server
}

#[tokio::test]
async fn clients_pinning_the_ca_reach_the_server_and_nodes_present_their_certificate() {
    let dir = scratch("tls");
    let bundle = Bundle::init(&dir, &InitOptions::default()).expect("init");
    let server = tls::server_config(&bundle, None).expect("server");

    // Without a certificate: allowed (bearer tokens do the rest).
    let anonymous = tls::client_config(bundle.ca_pem(), None).expect("client");
    assert_eq!(handshake(server.clone(), anonymous).await, Ok(None));

    // A node with the certificate the CA signed: the server sees its id.
    let key = NodeKey::generate("host").expect("key");
    let issued = bundle.sign_node_csr(&key.csr_pem, "node_x", 3600).expect("sign");
    let node = tls::client_config(bundle.ca_pem(), Some((&issued.pem, &key.key_pem))).expect("node");
    let seen = handshake(server.clone(), node).await.expect("node handshake").expect("a client certificate");
    assert_eq!(seen.common_name, "node_x");

    // Once revoked, the same certificate is refused at the handshake; others still pass.
    let crl = bundle
        .revocation_list(&[RevokedCertificate { serial: issued.serial.clone(), revoked_at: unix_now() }], 2)
        .expect("crl");
    let revoking = tls::server_config_with_crl(&bundle, None, Some(&crl)).expect("server with crl");
    let revoked = tls::client_config(bundle.ca_pem(), Some((&issued.pem, &key.key_pem))).expect("node");
    assert!(handshake(revoking.clone(), revoked).await.is_err(), "a revoked certificate must be refused");
    let other_key = NodeKey::generate("host").expect("key");
    let other_cert = bundle.sign_node_csr(&other_key.csr_pem, "node_z", 3600).expect("sign");
    let fine = tls::client_config(bundle.ca_pem(), Some((&other_cert.pem, &other_key.key_pem))).expect("node");
    assert_eq!(handshake(revoking, fine).await.expect("not revoked").map(|p| p.common_name), Some("node_z".into()));

    // A client pinning another CA refuses this server.
    let other_dir = scratch("tls-other");
    let other = Bundle::init(&other_dir, &InitOptions::default()).expect("other");
    let wrong_pin = tls::client_config(other.ca_pem(), None).expect("client");
    assert!(handshake(server.clone(), wrong_pin).await.is_err(), "a client must not trust another CA's server");

    // A certificate from another CA is refused by this server.
    let stranger_key = NodeKey::generate("host").expect("key");
    let stranger = other.sign_node_csr(&stranger_key.csr_pem, "node_y", 3600).expect("sign");
    let impostor = tls::client_config(bundle.ca_pem(), Some((&stranger.pem, &stranger_key.key_pem))).expect("client");
    assert!(handshake(server, impostor).await.is_err(), "the server must refuse a certificate of another CA");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&other_dir);
}
