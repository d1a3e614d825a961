//! The BMC drivers against real emulators: OpenStack's sushy-tools (Redfish, with its fake system driver, over
//! HTTP and over TLS) and OpenIPMI's `ipmi_sim` (IPMI, through `ipmitool`). Those start processes and wait
//! for simulated power changes, so they are slow tests: they run only with `BETTER_COMPUTE_SLOW_TESTS=1`,
//! which `.ci/run` sets, and then fail when an emulator is missing. The tests that need no emulator (a closed
//! port, a busy BMC, an oversized answer) always run, against tiny servers of their own.

use std::future::Future;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bc_agent::drivers::ipmi::{Ipmi, IpmiConfig};
use bc_agent::drivers::redfish::{MAX_BODY_BYTES, Redfish, RedfishConfig, RedfishTls, SystemRef};
use bc_agent::drivers::{BmcError, BootDevice, Power, PowerAction};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SLOW_TESTS: &str = "BETTER_COMPUTE_SLOW_TESTS";

fn slow_tests_enabled(test: &str) -> bool {
    let enabled = std::env::var(SLOW_TESTS).is_ok_and(|v| v == "1");
    if !enabled {
        eprintln!("{test}: skipped; set {SLOW_TESTS}=1 to run it");
    }
    enabled
}

/// The sushy-tools release the tests are written against (its fake driver's configuration and answers).
const SUSHY_TOOLS_VERSION: &str = "2.2.0";
const SUSHY: &str = "BETTER_COMPUTE_SUSHY_EMULATOR";

fn install_sushy() -> String {
    format!(
        "install it with `python3 -m pip install sushy-tools=={SUSHY_TOOLS_VERSION}` (add --break-system-packages \
         on a Debian-managed Python), or set {SUSHY} to its sushy-emulator"
    )
}

const INSTALL_IPMI: &str = "install them with `apt-get install -y openipmi ipmitool`";

/// The fake systems: the first is the one the test drives, the second is switched off gracefully beside it.
const NODE_1: &str = "6bd5a5f4-2b8e-4d5e-9c7c-4b2f3f1a0001";
const NODE_2: &str = "6bd5a5f4-2b8e-4d5e-9c7c-4b2f3f1a0002";

const USER: &str = "admin";
const PASSWORD: &str = "sushy-test-password";
/// `PASSWORD` hashed for sushy's htpasswd file, which takes bcrypt only:
/// `python3 -c 'import bcrypt; print(bcrypt.hashpw(b"sushy-test-password", bcrypt.gensalt(rounds=4)).decode())'`.
const PASSWORD_BCRYPT: &str = "$2b$04$4xv75.tnge7e.fYqcSRwGO.ZTwGv1hl8ldma0yb23yl.IFFF/xvM6";

/// How long an emulator may take to answer after it starts, and a simulated power change to show (sushy's fake
/// driver applies one 1 to 11 seconds after it is asked).
const STARTUP: Duration = Duration::from_secs(60);
const POWER_CHANGE: Duration = Duration::from_secs(40);

/// A scratch folder, removed when dropped unless the test failed (then it says where it is).
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("bc-bmc-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the scratch folder");
        Scratch(dir)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap_or_else(|err| panic!("write {}: {err}", path.display()));
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("left {} behind", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// An emulator process, its output in a log file; killed when dropped.
struct Emulator {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Emulator {
    fn spawn(name: &str, mut command: Command, log: PathBuf, install: &str) -> Emulator {
        let file = std::fs::File::create(&log).expect("create the emulator's log");
        let stderr = file.try_clone().expect("clone the log's handle");
        command.stdin(Stdio::null()).stdout(file).stderr(stderr);
        let child = command.spawn().unwrap_or_else(|err| panic!("cannot run {name}: {err}; {install}"));
        Emulator { name: name.to_owned(), child, log }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fails the test if the emulator has exited, with its log.
    fn assert_running(&mut self, install: &str) {
        if let Some(status) = self.child.try_wait().expect("poll the emulator") {
            panic!("{} exited ({status}) before it answered; {install}\n{}", self.name, self.log_text());
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free TCP port").port()
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0").and_then(|s| s.local_addr()).expect("a free UDP port").port()
}

/// Polls `probe` every 100 ms until `check` holds of what it saw, failing after `limit` with what it last saw.
async fn wait_for<T: std::fmt::Debug, F: Future<Output = T>>(
    what: &str,
    limit: Duration,
    mut probe: impl FnMut() -> F,
    check: impl Fn(&T) -> bool,
) {
    let deadline = Instant::now() + limit;
    loop {
        let seen = probe().await;
        if check(&seen) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: still {seen:?} after {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------------------------------------
// Redfish against sushy-emulator

/// A certificate authority and a server certificate it signed for 127.0.0.1, all PEM.
struct TestPki {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

fn test_pki(name: &str) -> TestPki {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca = CertificateParams::default();
    ca.distinguished_name.push(DnType::CommonName, format!("{name} BMC test CA"));
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().expect("server key");
    let mut server = CertificateParams::new(vec!["127.0.0.1".to_owned()]).expect("server names");
    server.distinguished_name.push(DnType::CommonName, "127.0.0.1");
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = server.signed_by(&key, &issuer).expect("server certificate");
    TestPki { ca_pem: ca_cert.pem(), cert_pem: cert.pem(), key_pem: key.serialize_pem() }
}

/// sushy-emulator with the fake driver (no libvirt): two systems, basic authentication from an htpasswd file,
/// its state in the scratch folder (by default it keeps state in /tmp/sushy-emulator, shared by every run).
struct Sushy {
    emulator: Emulator,
    base_url: String,
    _dir: Scratch,
}

impl Sushy {
    fn start(test: &str, tls: Option<&TestPki>) -> Sushy {
        let dir = Scratch::new(test);
        let auth = dir.write("htpasswd", &format!("{USER}:{PASSWORD_BCRYPT}\n"));
        let state = dir.0.join("state");
        let config = dir.write(
            "sushy.conf",
            &format!(
                r#"SUSHY_EMULATOR_FAKE_DRIVER = True
SUSHY_EMULATOR_STATE_DIR = {state:?}
SUSHY_EMULATOR_AUTH_FILE = {auth:?}
SUSHY_EMULATOR_FAKE_SYSTEMS = [
    {{
        'uuid': '{NODE_1}',
        'name': 'gpu-node-1',
        'power_state': 'Off',
        'nics': [
            {{'mac': '52:54:00:AA:00:02', 'ip': '10.0.0.2'}},
            {{'mac': '52:54:00:aa:00:01', 'ip': '10.0.0.1'}},
        ],
    }},
    {{
        'uuid': '{NODE_2}',
        'name': 'gpu-node-2',
        'power_state': 'On',
        'nics': [{{'mac': '52:54:00:bb:00:01', 'ip': '10.0.0.3'}}],
    }},
]
"#
            ),
        );
        let port = free_tcp_port();
        let program = std::env::var(SUSHY).unwrap_or_else(|_| "sushy-emulator".to_owned());
        let mut command = Command::new(&program);
        command.arg("--config").arg(&config).args(["--interface", "127.0.0.1", "--port", &port.to_string()]);
        // Inserted virtual media is downloaded under TMPDIR, and ejecting it leaves a folder behind.
        command.env("PYTHONUNBUFFERED", "1").env("TMPDIR", &dir.0);
        if let Some(pki) = tls {
            let cert = dir.write("bmc.crt", &pki.cert_pem);
            let key = dir.write("bmc.key", &pki.key_pem);
            command.arg("--ssl-certificate").arg(cert).arg("--ssl-key").arg(key);
        }
        let emulator = Emulator::spawn("sushy-emulator", command, dir.0.join("sushy.log"), &install_sushy());
        let scheme = if tls.is_some() { "https" } else { "http" };
        Sushy { emulator, base_url: format!("{scheme}://127.0.0.1:{port}"), _dir: dir }
    }

    fn client(&self, password: &str, tls: RedfishTls) -> Redfish {
        Redfish::new(RedfishConfig {
            base_url: self.base_url.clone(),
            username: USER.to_owned(),
            password: password.to_owned(),
            tls,
            timeout: Duration::from_secs(20),
        })
        .expect("a Redfish client")
    }

    /// Waits until the emulator answers `client` (it refuses connections while Python starts).
    async fn wait_until_ready(&mut self, client: &Redfish) {
        let deadline = Instant::now() + STARTUP;
        loop {
            self.emulator.assert_running(&install_sushy());
            match client.systems().await {
                Ok(_) => return,
                Err(BmcError::Unreachable(_)) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(err) => panic!("sushy-emulator does not answer: {err}\n{}", self.emulator.log_text()),
            }
        }
    }
}

async fn wait_for_power(client: &Redfish, system: &SystemRef, wanted: Power) {
    let what = format!("{system} powering to {wanted:?}");
    wait_for(&what, POWER_CHANGE, || client.power_state(system), |s| matches!(s, Ok(s) if *s == wanted)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redfish_drives_the_fake_systems_of_sushy_emulator() {
    if !slow_tests_enabled("redfish_drives_the_fake_systems_of_sushy_emulator") {
        return;
    }
    let mut sushy = Sushy::start("redfish", None);
    let client = sushy.client(PASSWORD, RedfishTls::Insecure);
    sushy.wait_until_ready(&client).await;

    // The collection lists both systems; sushy's fake driver uses the UUID as the id.
    let mut systems = client.systems().await.expect("systems");
    systems.sort_by(|a, b| a.id.cmp(&b.id));
    let listed: Vec<_> = systems.iter().map(|s| (s.id.as_str(), s.uuid.as_deref(), s.name.as_deref())).collect();
    assert_eq!(listed, [(NODE_1, Some(NODE_1), Some("gpu-node-1")), (NODE_2, Some(NODE_2), Some("gpu-node-2"))]);
    assert_eq!(systems[0].power_state, Power::Off);
    assert_eq!(systems[1].power_state, Power::On);

    // One system, by its id or by its UUID in any case; an unknown one is not found.
    let node = SystemRef::Uuid(NODE_1.to_uppercase());
    let by_id = SystemRef::Id(NODE_1.to_owned());
    let other = SystemRef::Id(NODE_2.to_owned());
    assert_eq!(client.power_state(&node).await.expect("power state"), Power::Off);
    for missing in [SystemRef::Id("gpu-node-9".into()), SystemRef::Uuid("00000000-0000-0000-0000-000000000000".into())]
    {
        let err = client.power_state(&missing).await.expect_err("no such system");
        assert!(matches!(err, BmcError::NotFound(_)), "{err}");
    }

    // Power, on both systems at once (each change shows after 1 to 11 s). sushy's fake driver restarts a
    // switched-off machine into On, so the reset is seen working from Off.
    let first = async {
        client.power(&node, PowerAction::Reset).await.expect("reset");
        wait_for_power(&client, &node, Power::On).await;
        client.power(&by_id, PowerAction::Off).await.expect("power off");
        wait_for_power(&client, &node, Power::Off).await;
        client.power(&node, PowerAction::On).await.expect("power on");
        wait_for_power(&client, &by_id, Power::On).await;
    };
    let second = async {
        client.power(&other, PowerAction::GracefulOff).await.expect("graceful power off");
        wait_for_power(&client, &other, Power::Off).await;
    };
    tokio::join!(first, second);

    // A one-time boot device shows in the Boot object. sushy records the target but always reports
    // `BootSourceOverrideEnabled: Continuous`, whatever was sent, so only the target is held to account.
    for (device, target) in [(BootDevice::Pxe, "Pxe"), (BootDevice::Cd, "Cd"), (BootDevice::Disk, "Hdd")] {
        client.set_one_time_boot(&node, device).await.expect("one-time boot");
        let boot = client.boot_override(&node).await.expect("boot override");
        assert_eq!(boot.target.as_deref(), Some(target), "{device:?}");
    }
    client.set_one_time_boot(&node, BootDevice::Pxe).await.expect("one-time PXE boot");
    assert_eq!(client.boot_override(&by_id).await.expect("boot").target.as_deref(), Some("Pxe"));

    // Virtual media through the manager's CD slot: sushy's fake driver supports it, and really downloads
    // the image, so a tiny server of the test's serves one.
    let iso = serve_fixed(answer("200 OK", &[("Content-Type", "application/octet-stream")], &[0x42; 4096])).await;
    let image = format!("{iso}/installer.iso");
    let empty = client.virtual_media(&node).await.expect("virtual media");
    assert!(!empty.inserted && empty.image.is_none(), "{empty:?}");
    client.insert_virtual_media(&node, &image).await.expect("insert");
    let inserted = client.virtual_media(&node).await.expect("virtual media");
    assert!(inserted.inserted, "{inserted:?}");
    assert_eq!(inserted.image.as_deref(), Some(image.as_str()));
    assert!(inserted.slot.ends_with("/VirtualMedia/Cd"), "the CD slot, not the floppy: {}", inserted.slot);
    client.insert_virtual_media(&node, &image).await.expect("the same image again changes nothing");
    client.eject_virtual_media(&node).await.expect("eject");
    let ejected = client.virtual_media(&node).await.expect("virtual media");
    assert!(!ejected.inserted && ejected.image.is_none(), "{ejected:?}");
    client.eject_virtual_media(&node).await.expect("ejecting an empty slot changes nothing");

    // The inventory: the fake system's UUID and MACs (lower case, sorted). The fake driver reports no
    // processor count, memory, serial number or model.
    let inventory = client.inventory(&node).await.expect("inventory");
    assert_eq!(inventory.uuid.as_deref(), Some(NODE_1));
    assert_eq!(inventory.macs, ["52:54:00:aa:00:01", "52:54:00:aa:00:02"]);
    assert_eq!(inventory.manufacturer.as_deref(), Some("Sushy Emulator"));
    assert_eq!(inventory.power_state, Power::On);
    assert_eq!((inventory.cpu_count, inventory.memory_gib, inventory.serial), (None, None, None));

    // A wrong password is refused, and said so without either password.
    let wrong = sushy.client("not-the-password", RedfishTls::Insecure);
    let err = wrong.power_state(&node).await.expect_err("a wrong password");
    assert!(matches!(err, BmcError::Unauthorized(_)), "{err}");
    let text = err.to_string();
    assert!(text.contains(&sushy.base_url) && text.contains("power state"), "names the BMC and the call: {text}");
    assert!(!text.contains("not-the-password") && !text.contains(PASSWORD), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redfish_over_tls_trusts_the_bmc_only_through_the_configured_ca() {
    if !slow_tests_enabled("redfish_over_tls_trusts_the_bmc_only_through_the_configured_ca") {
        return;
    }
    let pki = test_pki("sushy");
    let mut sushy = Sushy::start("redfish-tls", Some(&pki));
    assert!(sushy.base_url.starts_with("https://"));
    let trusting = sushy.client(PASSWORD, RedfishTls::CaPem(pki.ca_pem.clone()));
    sushy.wait_until_ready(&trusting).await;
    assert_eq!(trusting.systems().await.expect("systems over TLS").len(), 2);

    // Another CA's client refuses the BMC at the handshake, naming the BMC, and never sends the password.
    let stranger = sushy.client(PASSWORD, RedfishTls::CaPem(test_pki("stranger").ca_pem));
    let err = stranger.systems().await.expect_err("a certificate from another CA");
    assert!(matches!(err, BmcError::Tls(_)), "{err}");
    assert!(err.to_string().contains(&sushy.base_url), "{err}");

    // Trusting anything is possible, when asked for.
    let insecure = sushy.client(PASSWORD, RedfishTls::Insecure);
    assert_eq!(insecure.systems().await.expect("systems, any certificate").len(), 2);
}

// ---------------------------------------------------------------------------------------------------------
// Redfish against tiny servers of the test's own (always run)

/// A raw HTTP/1.1 answer that closes the connection.
fn answer(status: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    [head.into_bytes(), body.to_vec()].concat()
}

/// Answers every connection to a new port of 127.0.0.1 with `answer`, after reading the request's head;
/// the address, `http://127.0.0.1:port`.
async fn serve_fixed(answer: Vec<u8>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind a test server");
    let base = format!("http://{}", listener.local_addr().expect("its address"));
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buffer = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buffer[..n]),
                    }
                }
                // The client may hang up early (an answer it refuses): nothing to do about that here.
                let _ = stream.write_all(&answer).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    base
}

fn plain_client(base_url: &str) -> Redfish {
    Redfish::new(RedfishConfig {
        base_url: base_url.to_owned(),
        username: USER.to_owned(),
        password: PASSWORD.to_owned(),
        tls: RedfishTls::Insecure,
        timeout: Duration::from_secs(10),
    })
    .expect("a Redfish client")
}

#[tokio::test]
async fn redfish_reports_a_port_nobody_listens_on_as_unreachable() {
    let base = format!("http://127.0.0.1:{}", free_tcp_port());
    let err = plain_client(&base).systems().await.expect_err("nobody listens");
    assert!(matches!(err, BmcError::Unreachable(_)), "{err}");
    let text = err.to_string();
    assert!(text.contains(&format!("{base}/redfish/v1/Systems")) && text.contains("list the systems"), "{text}");
}

#[tokio::test]
async fn redfish_reports_a_busy_bmc_with_its_retry_after() {
    let busy = answer("503 Service Unavailable", &[("Retry-After", "5")], b"");
    let base = serve_fixed(busy).await;
    let err = plain_client(&base).power_state(&SystemRef::Id("1".into())).await.expect_err("busy");
    match err {
        BmcError::Unavailable { retry_after_s, message } => {
            assert_eq!(retry_after_s, Some(5));
            assert!(message.contains(&base) && message.contains("power state of system 1"), "{message}");
        }
        other => panic!("expected Unavailable, got {other}"),
    }
}

#[tokio::test]
async fn redfish_refuses_an_answer_larger_than_one_mib() {
    let big = vec![b' '; MAX_BODY_BYTES + 1];
    // Announced by Content-Length, and not announced (the body runs until the connection closes).
    let announced = serve_fixed(answer("200 OK", &[("Content-Type", "application/json")], &big)).await;
    let unannounced = serve_fixed([b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".to_vec(), big].concat()).await;
    for base in [announced, unannounced] {
        let err = plain_client(&base).systems().await.expect_err("too big");
        assert!(matches!(err, BmcError::Protocol(_)) && err.to_string().contains("more than"), "{base}: {err}");
    }
}

// ---------------------------------------------------------------------------------------------------------
// IPMI against ipmi_sim

const IPMI_USER: &str = "admin";
const IPMI_PASSWORD: &str = "ipmi-test-password";

/// ipmi_sim's chassis control: it runs `chassis <mc> get power|boot` and `chassis <mc> set <parm> <value>`; the
/// state lives in files beside the script, and each change is logged to `changes`.
const CHASSIS_SCRIPT: &str = r#"#!/bin/sh
dir=$(dirname "$0")
shift
op=$1
shift
case $op in
get)
    for parm in "$@"; do
        case $parm in
        power) echo "power:$(cat "$dir/power" 2>/dev/null || echo 0)" ;;
        boot) echo "boot:$(cat "$dir/boot" 2>/dev/null || echo default)" ;;
        *) echo "Invalid parameter: $parm"; exit 1 ;;
        esac
    done
    ;;
set)
    while [ $# -gt 1 ]; do
        parm=$1
        value=$2
        shift 2
        case $parm in
        power) echo "$value" > "$dir/power" ;;
        shutdown) echo 0 > "$dir/power" ;;
        boot) echo "$value" > "$dir/boot" ;;
        reset) ;;
        *) echo "Invalid parameter: $parm"; exit 1 ;;
        esac
        echo "$parm $value" >> "$dir/changes"
    done
    ;;
*) echo "Unknown operation: $op"; exit 1 ;;
esac
"#;

fn installed(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// ipmi_sim with one BMC (address 0x20) on a LAN channel at 127.0.0.1, one admin user, and the chassis
/// script for power and boot.
struct IpmiSim {
    emulator: Emulator,
    port: u16,
    dir: Scratch,
}

impl IpmiSim {
    fn start(test: &str) -> IpmiSim {
        for program in ["ipmi_sim", "ipmitool"] {
            assert!(installed(program), "{program} is not installed: {INSTALL_IPMI}");
        }
        let dir = Scratch::new(test);
        let script = dir.write("chassis", CHASSIS_SCRIPT);
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("make it executable");
        }
        let port = free_udp_port();
        let lan = dir.write(
            "lan.conf",
            &format!(
                r#"name "bctest"
set_working_mc 0x20
  startlan 1
    addr 127.0.0.1 {port}
    priv_limit admin
    allowed_auths_callback md5
    allowed_auths_user md5
    allowed_auths_operator md5
    allowed_auths_admin md5
    guid a123456789abcdefa123456789abcdef
  endlan
  chassis_control "{} 0x20"
  user 2 true "{IPMI_USER}" "{IPMI_PASSWORD}" admin 10 md5
"#,
                script.display()
            ),
        );
        // The BMC itself (address 0x20; device id, revision, firmware, IPMI version, support flags, vendor).
        let emu = dir.write(
            "bmc.emu",
            "mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02\nmc_enable 0x20\n",
        );
        let state = dir.0.join("state");
        std::fs::create_dir_all(&state).expect("ipmi_sim's state folder");
        let mut command = Command::new("ipmi_sim");
        command.arg("-c").arg(&lan).arg("-f").arg(&emu).arg("-s").arg(&state).arg("-n");
        let emulator = Emulator::spawn("ipmi_sim", command, dir.0.join("ipmi_sim.log"), INSTALL_IPMI);
        IpmiSim { emulator, port, dir }
    }

    fn driver(&self, password: &str, timeout: Duration) -> Ipmi {
        let mut config = IpmiConfig::new("127.0.0.1", IPMI_USER, password);
        config.port = self.port;
        config.timeout = timeout;
        Ipmi::new(config)
    }

    /// What the chassis script last recorded for `parm`.
    fn recorded(&self, parm: &str) -> String {
        std::fs::read_to_string(self.dir.0.join(parm)).unwrap_or_default().trim().to_owned()
    }

    /// Waits until the simulator answers (ipmitool gives up on a silent port only after 20 s, so each probe
    /// has a short limit).
    async fn wait_until_ready(&mut self) {
        let probe = self.driver(IPMI_PASSWORD, Duration::from_secs(3));
        let deadline = Instant::now() + STARTUP;
        loop {
            self.emulator.assert_running(INSTALL_IPMI);
            match probe.power_state().await {
                Ok(_) => return,
                Err(BmcError::Unreachable(_)) if Instant::now() < deadline => {}
                Err(err) => panic!("ipmi_sim does not answer: {err}\n{}", self.emulator.log_text()),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipmi_drives_the_chassis_of_ipmi_sim() {
    if !slow_tests_enabled("ipmi_drives_the_chassis_of_ipmi_sim") {
        return;
    }
    let mut sim = IpmiSim::start("ipmi");
    sim.wait_until_ready().await;
    let ipmi = sim.driver(IPMI_PASSWORD, Duration::from_secs(30));

    // ipmitool gives up on a port nobody answers on by itself (after about 20 s), which runs beside the rest.
    let silent = async {
        let mut config = IpmiConfig::new("127.0.0.1", IPMI_USER, IPMI_PASSWORD);
        config.port = free_udp_port();
        config.timeout = Duration::from_secs(60);
        Ipmi::new(config).power_state().await.expect_err("nobody answers")
    };
    let drive = async {
        assert_eq!(ipmi.power_state().await.expect("power status"), Power::Off);
        ipmi.power(PowerAction::On).await.expect("power on");
        assert_eq!(sim.recorded("power"), "1");
        assert_eq!(ipmi.power_state().await.expect("power status"), Power::On);
        ipmi.power(PowerAction::Reset).await.expect("power reset");
        assert!(sim.recorded("changes").lines().any(|l| l == "reset 1"), "{}", sim.recorded("changes"));
        ipmi.power(PowerAction::GracefulOff).await.expect("power soft");
        assert_eq!(ipmi.power_state().await.expect("power status"), Power::Off);
        ipmi.power(PowerAction::On).await.expect("power on");
        ipmi.power(PowerAction::Off).await.expect("power off");
        assert_eq!(sim.recorded("power"), "0");
        assert_eq!(ipmi.power_state().await.expect("power status"), Power::Off);

        // One-time boot devices, in ipmi_sim's names ("default" is the disk).
        for (device, recorded) in [(BootDevice::Pxe, "pxe"), (BootDevice::Cd, "cdrom"), (BootDevice::Disk, "default")] {
            ipmi.set_one_time_boot(device).await.expect("chassis bootdev");
            assert_eq!(sim.recorded("boot"), recorded, "{device:?}");
        }
        let mut efi = IpmiConfig::new("127.0.0.1", IPMI_USER, IPMI_PASSWORD);
        efi.port = sim.port;
        efi.efi_boot = true;
        Ipmi::new(efi).set_one_time_boot(BootDevice::Pxe).await.expect("chassis bootdev pxe options=efiboot");
        assert_eq!(sim.recorded("boot"), "pxe");

        // A wrong password is refused, and said so without either password.
        let err = sim.driver("not-the-password", Duration::from_secs(30)).power_state().await.expect_err("refused");
        assert!(matches!(err, BmcError::Unauthorized(_)), "{err}");
        let text = err.to_string();
        assert!(text.contains(&format!("ipmi://{IPMI_USER}@127.0.0.1:{}", sim.port)), "names the BMC: {text}");
        assert!(!text.contains("not-the-password") && !text.contains(IPMI_PASSWORD), "{text}");
    };
    let (silent, ()) = tokio::join!(silent, drive);
    assert!(matches!(silent, BmcError::Unreachable(_)), "{silent}");
}
