//! The bundle's files: made once, read at every start.

use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, CertificateSigningRequestParams, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose, RevokedCertParams, SerialNumber,
};
use time::{Duration, OffsetDateTime};

use crate::error::PkiError;
use crate::seal::Sealer;

const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const SERVER_CERT: &str = "server.crt";
const SERVER_KEY: &str = "server.key";
const SEALING_KEY: &str = "sealing.key";

/// Every file of a bundle, in the order [`Bundle::init`] writes them.
pub const FILES: [&str; 5] = [CA_CERT, CA_KEY, SEALING_KEY, SERVER_CERT, SERVER_KEY];

/// How long the CA lasts: ten years. Rotating it means a new bundle (see docs/operations.md).
const CA_LIFETIME: Duration = Duration::days(3650);
/// How long a server certificate lasts (the most browsers accept).
const SERVER_LIFETIME: Duration = Duration::days(397);
/// The longest certificate signing request accepted, in bytes (a P-256 request in PEM is about 500).
pub const MAX_CSR: usize = 4096;
/// How far back a new certificate's validity starts, for machines whose clocks are a little behind.
const BACKDATE: Duration = Duration::minutes(5);

/// What a new bundle is made for.
#[derive(Debug, Clone)]
pub struct InitOptions {
    /// The names (DNS names or IP addresses) the server certificate is valid for: every name nodes and clients
    /// reach the API by.
    pub server_names: Vec<String>,
}

impl Default for InitOptions {
    fn default() -> Self {
        Self { server_names: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()] }
    }
}

/// A certificate the CA signed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedCertificate {
    pub pem: String,
    /// The serial number, lowercase hex: what a revocation names.
    pub serial: String,
    /// The end of its validity, in seconds since the Unix epoch.
    pub not_after: i64,
}

/// A revoked certificate, for the revocation list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevokedCertificate {
    /// The serial number, lowercase hex.
    pub serial: String,
    /// When it was revoked, in seconds since the Unix epoch.
    pub revoked_at: i64,
}

/// The control plane's PKI bundle, read from its folder.
pub struct Bundle {
    dir: PathBuf,
    ca_pem: String,
    ca_der: Vec<u8>,
    issuer: Issuer<'static, KeyPair>,
    server_cert_pem: String,
    server_key_pem: String,
    sealer: Sealer,
}

impl std::fmt::Debug for Bundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the keys.
        f.debug_struct("Bundle").field("dir", &self.dir).field("ca", &self.ca_fingerprint()).finish_non_exhaustive()
    }
}

impl Bundle {
    /// Whether `dir` holds a bundle (its CA certificate, at least).
    pub fn exists(dir: &Path) -> bool {
        dir.join(CA_CERT).exists()
    }

    /// Makes a new bundle in `dir` (created if missing, readable by its owner only). Refuses when any of the
    /// bundle's files is already there: a bundle is made once.
    pub fn init(dir: &Path, options: &InitOptions) -> Result<Bundle, PkiError> {
        for file in FILES {
            let path = dir.join(file);
            if path.exists() {
                return Err(PkiError::AlreadyExists { path });
            }
        }
        std::fs::create_dir_all(dir).map_err(|err| unwritable(dir, &err))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(|err| unwritable(dir, &err))?;

        let ca_key = KeyPair::generate()?;
        let now = OffsetDateTime::now_utc();
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::OrganizationName, "Better Compute");
        params.distinguished_name.push(DnType::CommonName, format!("Better Compute CA {}", now.date()));
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        params.not_before = now - BACKDATE;
        params.not_after = now + CA_LIFETIME;
        params.serial_number = Some(random_serial()?);
        params.key_identifier_method = KeyIdMethod::Sha256;
        let ca = params.self_signed(&ca_key)?;

        let sealing_key = Sealer::generate_key()?;
        write_file(&dir.join(CA_CERT), ca.pem().as_bytes(), 0o644)?;
        write_file(&dir.join(CA_KEY), ca_key.serialize_pem().as_bytes(), 0o600)?;
        write_file(&dir.join(SEALING_KEY), crate::hex(&sealing_key).as_bytes(), 0o600)?;

        let issuer = Issuer::new(params, ca_key);
        let (server_cert_pem, server_key_pem) = issue_server(&issuer, &options.server_names)?;
        write_file(&dir.join(SERVER_CERT), server_cert_pem.as_bytes(), 0o644)?;
        write_file(&dir.join(SERVER_KEY), server_key_pem.as_bytes(), 0o600)?;
        Bundle::load(dir)
    }

    /// Reads the bundle in `dir`, checking that its files parse and belong together.
    pub fn load(dir: &Path) -> Result<Bundle, PkiError> {
        if !Bundle::exists(dir) {
            return Err(PkiError::Missing { dir: dir.to_path_buf() });
        }
        let ca_pem = read_file(dir, CA_CERT)?;
        let ca_der = crate::tls::certificates(&ca_pem)
            .ok()
            .and_then(|mut certs| (!certs.is_empty()).then(|| certs.swap_remove(0)))
            .ok_or_else(|| unreadable(&dir.join(CA_CERT), "no PEM certificate in it"))?
            .to_vec();
        let ca_key = KeyPair::from_pem(&read_file(dir, CA_KEY)?)
            .map_err(|err| unreadable(&dir.join(CA_KEY), &format!("not a private key ({err})")))?;
        let ca_public = x509_parser::parse_x509_certificate(&ca_der)
            .map_err(|err| unreadable(&dir.join(CA_CERT), &format!("not a certificate ({err})")))?
            .1
            .public_key()
            .subject_public_key
            .data
            .to_vec();
        if ca_public != ca_key.public_key_raw() {
            return Err(unreadable(&dir.join(CA_KEY), "it is not the key of ca.crt"));
        }
        let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key)
            .map_err(|err| unreadable(&dir.join(CA_CERT), &format!("not a CA certificate ({err})")))?;
        let sealing_hex = read_file(dir, SEALING_KEY)?;
        let sealer = Sealer::from_hex(sealing_hex.trim())
            .ok_or_else(|| unreadable(&dir.join(SEALING_KEY), "not 64 hex digits"))?;
        let server_cert_pem = read_file(dir, SERVER_CERT)?;
        let server_key_pem = read_file(dir, SERVER_KEY)?;
        let bundle = Bundle { dir: dir.to_path_buf(), ca_pem, ca_der, issuer, server_cert_pem, server_key_pem, sealer };
        // The server certificate must chain to this CA and match its key, or TLS would fail at the first client.
        crate::tls::server_config(&bundle, None).map_err(|err| unreadable(&dir.join(SERVER_CERT), &err.to_string()))?;
        Ok(bundle)
    }

    /// Reads the bundle in `dir`, making it first if there is none (what `dev` does).
    pub fn load_or_init(dir: &Path, options: &InitOptions) -> Result<Bundle, PkiError> {
        if Bundle::exists(dir) { Bundle::load(dir) } else { Bundle::init(dir, options) }
    }

    /// Issues a new server certificate for `names` and replaces the bundle's (the CA and the nodes'
    /// certificates stay valid).
    pub fn reissue_server_certificate(&mut self, names: &[String]) -> Result<(), PkiError> {
        let (cert, key) = issue_server(&self.issuer, names)?;
        write_file(&self.dir.join(SERVER_KEY), key.as_bytes(), 0o600)?;
        write_file(&self.dir.join(SERVER_CERT), cert.as_bytes(), 0o644)?;
        self.server_cert_pem = cert;
        self.server_key_pem = key;
        Ok(())
    }

    /// The bundle's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA certificate, PEM: what nodes and clients pin.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The CA certificate, DER.
    pub fn ca_der(&self) -> &[u8] {
        &self.ca_der
    }

    /// The CA certificate's SHA-256, lowercase hex.
    pub fn ca_fingerprint(&self) -> String {
        crate::fingerprint(&self.ca_der)
    }

    /// The server certificate and its key, PEM.
    pub fn server_certificate(&self) -> (&str, &str) {
        (&self.server_cert_pem, &self.server_key_pem)
    }

    /// The key that seals stored secrets.
    pub fn sealer(&self) -> &Sealer {
        &self.sealer
    }

    /// Signs a node's certificate signing request: the certificate names the node (`CN=<node_id>`), is good
    /// for client authentication only, and lasts `lifetime_secs`. The request's own subject, names and
    /// extensions are ignored: the control plane decides what the certificate says; the request only proves
    /// that the node holds the key.
    pub fn sign_node_csr(
        &self,
        csr_pem: &str,
        node_id: &str,
        lifetime_secs: i64,
    ) -> Result<IssuedCertificate, PkiError> {
        if csr_pem.len() > MAX_CSR {
            return Err(PkiError::InvalidCsr(format!("longer than {MAX_CSR} bytes")));
        }
        let mut csr = CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|err| PkiError::InvalidCsr(format!("not a signed PEM request ({err})")))?;
        let now = OffsetDateTime::now_utc();
        let not_after = now + Duration::seconds(lifetime_secs.max(60));
        let serial = random_serial()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::OrganizationName, "Better Compute nodes");
        params.distinguished_name.push(DnType::CommonName, node_id);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.not_before = now - BACKDATE;
        params.not_after = not_after;
        params.serial_number = Some(serial.clone());
        params.use_authority_key_identifier_extension = true;
        csr.params = params;
        let cert = csr.signed_by(&self.issuer)?;
        Ok(IssuedCertificate {
            pem: cert.pem(),
            serial: crate::hex(&serial.to_bytes()),
            not_after: not_after.unix_timestamp(),
        })
    }

    /// A driver's certificate and new key (PEM), for the driver protocol's mutual TLS: named `CN=<name>`, valid for
    /// `hosts` (the names and addresses the control plane reaches it at), good for both ends of a connection, so
    /// the same bundle's CA verifies the driver and the control plane that calls it.
    pub fn issue_driver_identity(&self, name: &str, hosts: &[String]) -> Result<(String, String), PkiError> {
        let usages = [ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        issue_leaf(&self.issuer, hosts, &usages, Some(name))
    }

    /// A revocation list of `revoked`, signed by the CA, DER. `number` must grow from one list to the next.
    pub fn revocation_list(&self, revoked: &[RevokedCertificate], number: u64) -> Result<Vec<u8>, PkiError> {
        let now = OffsetDateTime::now_utc();
        let mut revoked_certs = Vec::with_capacity(revoked.len());
        for entry in revoked {
            let bytes = crate::seal::from_hex(&entry.serial)
                .ok_or_else(|| PkiError::InvalidCertificate(format!("serial {:?} is not hex", entry.serial)))?;
            revoked_certs.push(RevokedCertParams {
                serial_number: SerialNumber::from_slice(&bytes),
                revocation_time: OffsetDateTime::from_unix_timestamp(entry.revoked_at).unwrap_or(now),
                reason_code: None,
                invalidity_date: None,
            });
        }
        let params = CertificateRevocationListParams {
            this_update: now - BACKDATE,
            next_update: now + Duration::days(7),
            crl_number: SerialNumber::from_slice(&number.max(1).to_be_bytes()),
            issuing_distribution_point: None,
            revoked_certs,
            key_identifier_method: KeyIdMethod::Sha256,
        };
        Ok(params.signed_by(&self.issuer)?.der().to_vec())
    }
}

/// A server certificate for `names`, signed by `issuer`, and its new key (PEM).
fn issue_server(issuer: &Issuer<'_, KeyPair>, names: &[String]) -> Result<(String, String), PkiError> {
    issue_leaf(issuer, names, &[ExtendedKeyUsagePurpose::ServerAuth], None)
}

/// A certificate for `names` with the usages `usages` (its common name `common_name`, or the first name), signed
/// by `issuer`, and its new key (PEM).
fn issue_leaf(
    issuer: &Issuer<'_, KeyPair>,
    names: &[String],
    usages: &[ExtendedKeyUsagePurpose],
    common_name: Option<&str>,
) -> Result<(String, String), PkiError> {
    if names.is_empty() {
        return Err(PkiError::Generate("a server certificate needs at least one name".into()));
    }
    let key = KeyPair::generate()?;
    let now = OffsetDateTime::now_utc();
    let mut params = CertificateParams::new(names.to_vec())?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::OrganizationName, "Better Compute");
    params.distinguished_name.push(DnType::CommonName, common_name.unwrap_or(&names[0]).to_owned());
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = usages.to_vec();
    params.not_before = now - BACKDATE;
    params.not_after = now + SERVER_LIFETIME;
    params.serial_number = Some(random_serial()?);
    params.use_authority_key_identifier_extension = true;
    let cert = params.signed_by(&key, issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// 16 random bytes, the top bit clear so the serial is positive.
fn random_serial() -> Result<SerialNumber, PkiError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|err| PkiError::Generate(format!("no randomness: {err}")))?;
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    Ok(SerialNumber::from_slice(&bytes))
}

fn read_file(dir: &Path, name: &str) -> Result<String, PkiError> {
    let path = dir.join(name);
    std::fs::read_to_string(&path).map_err(|err| unreadable(&path, &err.to_string()))
}

/// Writes `bytes` to `path` through a temporary file and a rename, so a crash leaves the old file or the new
/// one, never half of one.
fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), PkiError> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(|err| unwritable(&tmp, &err))?;
    file.write_all(bytes).and_then(|()| file.sync_all()).map_err(|err| unwritable(&tmp, &err))?;
    std::fs::rename(&tmp, path).map_err(|err| unwritable(path, &err))
}

fn unreadable(path: &Path, reason: &str) -> PkiError {
    PkiError::Unreadable { path: path.to_path_buf(), reason: reason.to_owned() }
}

fn unwritable(path: &Path, err: &std::io::Error) -> PkiError {
    PkiError::Unwritable { path: path.to_path_buf(), reason: err.to_string() }
}
