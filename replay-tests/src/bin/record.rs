//! Records the scenarios' event logs into `replay-tests/data/<scenario>.jsonl`: each scenario runs through the
//! real command handlers on a fresh database of the test harness, and its log is exported as JSON lines.
//! Re-record after a change that alters what the scenarios record, and review the diff.

use std::path::Path;

use bc_commands::App;
use bc_eventstore::testing::TestDb;
use bc_replay_tests::{export, scenarios};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("data");
    for name in scenarios::NAMES {
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
