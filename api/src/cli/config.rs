//! The CLI's configuration: named servers (contexts) with their URL, token and CA, and the one in use, in a
//! TOML file (`$BETTER_COMPUTE_CONFIG`, or `better-compute/config.toml` in the user's configuration folder).
//!
//! ```toml
//! current = "dev"
//!
//! [servers.dev]
//! url = "https://127.0.0.1:8443"
//! token = "bct_..."
//! ca = "/home/me/.local/share/better-compute/dev/pki/ca.pem"
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CliConfig {
    /// The server used when `--context` is not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
    #[serde(default)]
    pub servers: BTreeMap<String, ServerEntry>,
}

/// One server and how to talk to it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerEntry {
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The CA certificate (PEM file) the server's certificate is checked against, for `https://`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
}

/// Where the file is: `$BETTER_COMPUTE_CONFIG`, else the user's configuration folder.
pub fn default_path() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("BETTER_COMPUTE_CONFIG").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    let Some(dir) = dirs::config_dir() else {
        bail!("no configuration folder for this user: set BETTER_COMPUTE_CONFIG to the file to use");
    };
    Ok(dir.join("better-compute").join("config.toml"))
}

impl CliConfig {
    /// Reads `path`; a missing file is an empty configuration.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        match std::fs::read_to_string(path) {
            Ok(text) => {
                toml::from_str(&text).with_context(|| format!("{} is not a valid configuration", path.display()))
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(err) => Err(err).with_context(|| format!("cannot read {}", path.display())),
        }
    }

    /// Writes the file, readable by its owner only (it holds tokens).
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
        }
        let text = toml::to_string(self).context("cannot write the configuration as TOML")?;
        let temporary = path.with_extension("toml.new");
        {
            use std::io::Write as _;
            use std::os::unix::fs::OpenOptionsExt as _;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&temporary)
                .with_context(|| format!("cannot write {}", temporary.display()))?;
            file.write_all(text.as_bytes()).with_context(|| format!("cannot write {}", temporary.display()))?;
        }
        std::fs::rename(&temporary, path).with_context(|| format!("cannot replace {}", path.display()))
    }

    /// The server named `context`, or the current one.
    pub fn server(&self, context: Option<&str>) -> anyhow::Result<(&str, &ServerEntry)> {
        let name = match context.or(self.current.as_deref()) {
            Some(name) => name,
            None if self.servers.len() == 1 => self.servers.keys().next().map(String::as_str).unwrap_or_default(),
            None => bail!(
                "no server chosen: run `better-compute config set-server NAME --url URL --token TOKEN`, or \
                 `better-compute dev`, which adds its own"
            ),
        };
        match self.servers.get_key_value(name) {
            Some((name, entry)) => Ok((name.as_str(), entry)),
            None => {
                let known: Vec<&str> = self.servers.keys().map(String::as_str).collect();
                bail!("no server named {name:?} in the configuration (known: {})", known.join(", "))
            }
        }
    }
}
