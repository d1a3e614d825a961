//! The instance runtime with real parts (slow, behind `BETTER_COMPUTE_SLOW_TESTS=1`): `bcd`'s QEMU runtime boots a
//! real kernel (Debian's, with a small initramfs `scripts/guest-image` builds) for an instance made through the
//! API, the guest prints its disk's first line and its user data on the console the runtime keeps; the agent is
//! killed while the instance runs and, started again, finds it still running; stop, start and delete each reach
//! the guest, and the deletion frees the allocation and leaves no QEMU behind.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bc_agent::runtime::{Accel, RuntimeConfig, running_pid};
use bc_eventstore::{TxOptions, sql};
use reqwest::Method;
use serde_json::{Value, json};

use crate::agents::{Cluster, eventually};
use crate::http_api::{ALICE, ROOT};
use crate::metal::{kvm_works, target_dir, which};

/// Kills whatever QEMU a failed test left running (the runtime's guests outlive their agent by design).
struct Guests(PathBuf);

impl Drop for Guests {
    fn drop(&mut self) {
        let Ok(entries) = std::fs::read_dir(&self.0) else { return };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(pid) = running_pid(&entry.path(), &name) {
                let _ = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
        }
    }
}

async fn as_alice(cluster: &Cluster, method: Method, path: &str, key: Option<&str>, body: Option<Value>) -> Value {
    let mut request = cluster.http.request(method, format!("{}{path}", cluster.base)).bearer_auth(ALICE);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("send");
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    assert!(status.is_success(), "{path}: {status} {body}");
    body
}

async fn instance_state(cluster: &Cluster, id: &str) -> Value {
    as_alice(cluster, Method::GET, &format!("/v1/instances/{id}"), None, None).await
}

async fn await_state(cluster: &Cluster, id: &str, state: &str, generation: u64) -> Value {
    eventually(&format!("instance {id} {state} at generation {generation}"), || async {
        let i = instance_state(cluster, id).await;
        (i["state"] == state && i["observedGeneration"] == generation).then_some(i)
    })
    .await
}

fn console(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("console.log")).unwrap_or_default()
}

async fn await_console(dir: &Path, line: &str, times: usize) {
    eventually(&format!("{times}× {line:?} on the guest's console"), || async {
        (console(dir).matches(line).count() >= times).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_runs_as_a_qemu_guest_outlives_its_agent_and_is_stopped_started_and_deleted() {
    if !crate::hostile::slow_tests_enabled("an instance booted by bcd's QEMU runtime") {
        return;
    }
    if let Some(missing) = ["qemu-system-x86_64", "busybox", "depmod", "cpio"].iter().find(|t| which(t).is_none()) {
        eprintln!("skipped: {missing} is not installed (.ci/run installs qemu-system-x86, busybox-static, ...)");
        return;
    }
    bc_pki::tls::install_default_provider();
    let cluster = Cluster::start("runtime").await;
    let guest = cluster.root.path().join("guest");
    let built = std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/guest-image"))
        .arg("--out")
        .arg(&guest)
        .arg("--cache")
        .arg(target_dir().join("ramdisk-cache"))
        .output()
        .expect("scripts/guest-image");
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    let kernel = guest.join("vmlinuz");
    let accel = if kvm_works(&kernel) { Accel::Kvm } else { Accel::Tcg };
    eprintln!("the guest runs with {accel:?}");

    // A vps-host pool beside the cluster's, offered to acme for exactly one small instance.
    let mut tx = cluster.db().begin(TxOptions::READ_ONLY).await.expect("begin");
    let site: String = sql::query_scalar("SELECT site_id FROM pools WHERE id = $1")
        .bind(cluster.pool.as_str())
        .fetch_one(tx.conn())
        .await
        .expect("the cluster's site");
    tx.commit().await.expect("commit");
    let made = json!({ "siteId": site, "name": "vps", "class": "vps-host", "gpuModel": "H100" });
    let (status, vps) = cluster.call(Method::POST, "/v1/pools", Some(made)).await;
    assert_eq!(status, 201, "{vps}");
    let vps = vps["id"].as_str().expect("pool id").to_owned();
    let offer = json!({ "tenantId": "acme", "quota": { "gpu": 1, "vcpu": 1, "memoryGiB": 1, "disk": 1 } });
    let (status, body) = cluster.call(Method::POST, &format!("/v1/pools/{vps}/offers"), Some(offer)).await;
    assert!(status < 300, "{body}");
    let (status, token) = cluster.call(Method::POST, &format!("/v1/pools/{vps}/join-tokens"), Some(json!({}))).await;
    assert_eq!(status, 201, "{token}");
    let token = token["token"].as_str().expect("token").to_owned();

    let instances = cluster.root.path().join("instances");
    let _guests = Guests(instances.clone());
    let runtime = RuntimeConfig {
        dir: instances.clone(),
        qemu: "qemu-system-x86_64".into(),
        accel,
        guest_kernel: Some(kernel),
        guest_initrd: Some(guest.join("initrd.img")),
        guest_append: "console=ttyS0 quiet".into(),
        vfio: false,
        poll: Duration::from_millis(300),
    };
    let mut agent = cluster.instance_host("vps-1", Some(token), runtime.clone());

    // The image: a raw disk whose first line the guest prints.
    let disk = b"bc-disk: hello from the image\n".to_vec();
    let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&disk));
    let uri = format!("{}/v1/images?name=guest&version=1&format=raw&sha256={sha}&visibility=public", cluster.base);
    let uploaded = cluster.http.post(uri).bearer_auth(ROOT).body(disk).send().await.expect("upload");
    assert_eq!(uploaded.status().as_u16(), 201);
    let image: Value = uploaded.json().await.expect("image");
    let flavor = json!({ "name": "tiny", "vcpu": 1, "memoryGiB": 1, "gpus": 1, "disk": 1, "visibility": "public" });
    let (status, flavor) = cluster.call(Method::POST, "/v1/flavors", Some(flavor)).await;
    assert_eq!(status, 201, "{flavor}");
    let body = json!({ "name": "trainer", "poolId": vps, "flavorId": flavor["id"], "imageId": image["id"],
                       "duration": 3600, "userData": "#cloud-config from the test" });
    eventually("the vps node schedulable", || async {
        let mut tx = cluster.db().begin(TxOptions::READ_ONLY).await.expect("begin");
        let schedulable: Option<bool> = sql::query_scalar("SELECT schedulable FROM nodes WHERE pool_id = $1")
            .bind(&vps)
            .fetch_optional(tx.conn())
            .await
            .expect("node");
        tx.commit().await.expect("commit");
        (schedulable == Some(true)).then_some(())
    })
    .await;

    // Created → running: the guest boots and prints its disk's first line and its user data.
    let asked = std::time::Instant::now();
    let made = as_alice(&cluster, Method::POST, "/v1/instances", Some("vm-1"), Some(body.clone())).await;
    let id = made["instance"]["id"].as_str().expect("id").to_owned();
    let reservation = made["reservation"]["id"].as_str().expect("reservation").to_owned();
    let folder = instances.join(&id);
    let running = await_state(&cluster, &id, "running", 1).await;
    eprintln!("created to running (QEMU started, {accel:?}): {:.2} s", asked.elapsed().as_secs_f64());
    assert!(running["nodeId"].is_string(), "{running}");
    await_console(&folder, "bc-guest: user-data", 1).await;
    eprintln!("created to the guest's first console line: {:.2} s", asked.elapsed().as_secs_f64());
    assert!(console(&folder).contains("bc-guest: disk bc-disk: hello from the image"), "{}", console(&folder));
    assert!(console(&folder).contains("bc-guest: user-data #cloud-config from the test"), "{}", console(&folder));
    let pid = running_pid(&folder, &id).expect("QEMU runs the guest");

    // The agent dies (as SIGKILL would: nothing of its shutdown runs); the guest does not. Started again, the agent
    // finds it running and leaves it be.
    agent.kill();
    assert_eq!(running_pid(&folder, &id), Some(pid), "the guest outlives its agent");
    let mut agent = cluster.instance_host("vps-1", None, runtime.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(running_pid(&folder, &id), Some(pid), "the same QEMU, not a new one");
    assert_eq!(instance_state(&cluster, &id).await["state"], "running");

    // Stopped: QEMU ends, the allocation stays held. Started again: a new boot, appended to the same console.
    as_alice(&cluster, Method::POST, &format!("/v1/instances/{id}/stop"), None, Some(json!({}))).await;
    await_state(&cluster, &id, "stopped", 2).await;
    assert_eq!(running_pid(&folder, &id), None, "stopped");
    as_alice(&cluster, Method::POST, &format!("/v1/instances/{id}/start"), None, Some(json!({}))).await;
    await_state(&cluster, &id, "running", 3).await;
    await_console(&folder, "bc-guest: user-data", 2).await;

    // While it holds the quota's one GPU, vCPU and GiB, a second instance is refused.
    let refused = cluster
        .http
        .post(format!("{}/v1/instances", cluster.base))
        .bearer_auth(ALICE)
        .header("idempotency-key", "vm-2")
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(refused.status().as_u16(), 409);

    // Deleted: the node stops the guest before it confirms the release; the instance ends with the allocation.
    as_alice(&cluster, Method::DELETE, &format!("/v1/instances/{id}"), None, None).await;
    cluster.await_reservation(&reservation, "released").await;
    let ended = instance_state(&cluster, &id).await;
    assert_eq!(ended["state"], "deleted", "{ended}");
    assert_eq!(running_pid(&folder, &id), None, "no QEMU left for it");
    eventually("the guest's folder removed", || async { (!folder.exists()).then_some(()) }).await;

    // Its GPU, vCPU, memory and disk are free again: the second instance fits now; deleted before its guest
    // boots or after, nothing is left running.
    let second = as_alice(&cluster, Method::POST, "/v1/instances", Some("vm-3"), Some(body)).await;
    let second_id = second["instance"]["id"].as_str().expect("id").to_owned();
    let second_reservation = second["reservation"]["id"].as_str().expect("reservation").to_owned();
    as_alice(&cluster, Method::DELETE, &format!("/v1/instances/{second_id}"), None, None).await;
    eventually("the second instance over", || async {
        let state = instance_state(&cluster, &second_id).await["state"].clone();
        (state == "deleted").then_some(())
    })
    .await;
    let r = as_alice(&cluster, Method::GET, &format!("/v1/reservations/{second_reservation}"), None, None).await;
    assert!(["released", "cancelled"].contains(&r["state"].as_str().unwrap_or_default()), "{r}");
    eventually("no guest left running", || async {
        let left = std::fs::read_dir(&instances)
            .map(|entries| {
                entries.flatten().any(|e| running_pid(&e.path(), &e.file_name().to_string_lossy()).is_some())
            })
            .unwrap_or(false);
        (!left).then_some(())
    })
    .await;
    agent.stop().await;
}
