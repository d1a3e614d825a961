//! The site agent's boot server as `bcd site` starts it.

use bc_agent::boot::BootConfig;
use bc_agent::run::{AgentConfig, InventorySource, ServerTrust, run};
use bc_agent::site::SiteConfig;

#[tokio::test]
async fn the_site_agent_does_not_start_when_the_boot_address_is_taken() {
    let dir = std::env::temp_dir().join(format!("bcd-boot-taken-{}", bc_domain::id::new_id("t")));
    let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let listen = taken.local_addr().expect("local address");
    let boot = BootConfig {
        listen,
        url: format!("http://{listen}"),
        kernel: None,
        initrd: None,
        cache_dir: dir.join("images"),
    };
    let config = AgentConfig {
        server: "http://127.0.0.1:1".into(),
        trust: ServerTrust::InsecureHttp,
        join_token: Some("jt_unused".into()),
        state_dir: dir.join("state"),
        cdi_dir: dir.join("cdi"),
        inventory: InventorySource::Local { hostname: None },
        inventory_every: 0,
        site: Some(SiteConfig { boot: Some(boot), ..Default::default() }),
        runtime: None,
    };
    let err = run(config, std::future::pending()).await.expect_err("the address is taken");
    assert!(format!("{err:#}").contains("--boot-listen"), "{err:#}");
    let _ = std::fs::remove_dir_all(&dir);
}
