//! Records the scenarios' event logs into `replay-tests/data/<scenario>.jsonl`: each scenario runs through the
//! real command handlers on a fresh database of the test harness, and its log is exported as JSON lines.
//! Re-record after a change that alters what the scenarios record, and review the diff. With names, only
//! those scenarios are recorded (`record-scenarios agent_life`), so the others' logs keep their ids.

use std::path::Path;

use bc_commands::App;
use bc_eventstore::testing::TestDb;
use bc_replay_tests::{export, scenarios};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("data");
    let chosen: Vec<String> = std::env::args().skip(1).collect();
    if let Some(unknown) = chosen.iter().find(|name| !scenarios::NAMES.contains(&name.as_str())) {
        anyhow::bail!("no scenario named {unknown}; the scenarios are {}", scenarios::NAMES.join(", "));
    }
    for name in scenarios::NAMES.iter().filter(|name| chosen.is_empty() || chosen.iter().any(|c| c == *name)) {
        let t = TestDb::new().await;
        scenarios::run(name, &App::new(t.db.clone())).await?;
        let lines = export(&t.db).await?;
        let mut text =
            format!("# Recorded from the {name} scenario by `cargo run -p bc-replay-tests --bin record-scenarios`.\n");
        for line in &lines {
            text.push_str(&serde_json::to_string(line)?);
            text.push('\n');
        }
        std::fs::write(data.join(format!("{name}.jsonl")), text)?;
        println!("{name}: {} events", lines.len());
    }
    Ok(())
}
