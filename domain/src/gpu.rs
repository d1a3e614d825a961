//! GPU names: the versioned `gpu-models.json` table that maps NVML names to `gpuProduct` and `gpuModel`.
//!
//! Pools, policies and meters use `gpuModel` (the family, `H100`); selectors may also use `gpuProduct` (the
//! exact part, `H100-SXM5-80GB`). A name missing from the table still gets a usable `gpuProduct` label, with
//! `gpuModel` set to [`UNKNOWN_MODEL`], and the caller raises the `GpuModelUnknown` condition.

use std::collections::HashMap;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

/// The `gpuModel` of a GPU whose NVML name is not in the table.
pub const UNKNOWN_MODEL: &str = "other";

/// The `gpuProduct` of a GPU that reported an empty name, which leaves nothing to make a label from.
const UNNAMED_PRODUCT: &str = "UNKNOWN";

/// The table, embedded at build time so that the agent and the control plane classify alike without reading
/// a file at run time.
const MODELS_JSON: &str = include_str!("../gpu-models.json");

/// How a GPU is named for scheduling.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuName {
    /// The exact part, such as `H100-SXM5-80GB`.
    pub gpu_product: String,
    /// The family, such as `H100`, or [`UNKNOWN_MODEL`].
    pub gpu_model: String,
    /// False when the NVML name is not in the table.
    pub known: bool,
}

/// Classifies a GPU by the name NVML reports for it.
pub fn classify(nvml_name: &str) -> GpuName {
    let normalized = normalize_nvml_name(nvml_name);
    if let Some(model) = table().by_name.get(&normalized) {
        return GpuName { gpu_product: model.gpu_product.clone(), gpu_model: model.gpu_model.clone(), known: true };
    }
    let gpu_product =
        if normalized.is_empty() { UNNAMED_PRODUCT.to_owned() } else { normalized.replace(' ', "-").to_uppercase() };
    GpuName { gpu_product, gpu_model: UNKNOWN_MODEL.to_owned(), known: false }
}

/// An NVML name that classifies as `label`, a `gpuProduct` (`H100-SXM5-80GB`) or a `gpuModel` (`H100`, its
/// table's first part): what a simulated GPU of that kind reports.
pub fn nvml_name_for(label: &str) -> Option<&'static str> {
    let entries = &table().entries;
    entries
        .iter()
        .find(|(m, _)| m.gpu_product.eq_ignore_ascii_case(label))
        .or_else(|| entries.iter().find(|(m, _)| m.gpu_model.eq_ignore_ascii_case(label)))
        .map(|(_, name)| name.as_str())
}

/// The version of the embedded `gpu-models.json`.
pub fn models_version() -> u32 {
    table().version
}

/// Trims, collapses runs of whitespace to one space and lower-cases, so that spacing and case in what a driver
/// reports do not make a known GPU unknown.
pub fn normalize_nvml_name(name: &str) -> String {
    name.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase()
}

/// The file's shape.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ModelsFile {
    version: u32,
    models: Vec<ModelEntry>,
}

/// One GPU part and the NVML names it reports.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ModelEntry {
    nvml_names: Vec<String>,
    gpu_product: String,
    gpu_model: String,
}

/// What a known name maps to.
struct Model {
    gpu_product: String,
    gpu_model: String,
}

/// The parsed table, keyed by normalized NVML name.
struct Table {
    version: u32,
    by_name: HashMap<String, Model>,
    /// Each entry's first NVML name with its labels, in the file's order.
    entries: Vec<(Model, String)>,
}

/// Why the table is unusable; the tests check that the embedded one is not.
#[derive(Debug, thiserror::Error)]
enum TableError {
    #[error("gpu-models.json is not valid: {0}")]
    Json(#[from] serde_json::Error),
    #[error("gpu-models.json: {gpu_product} lists no NVML name")]
    NoNames { gpu_product: String },
    #[error("gpu-models.json: an entry has an empty gpuProduct or gpuModel")]
    EmptyLabel,
    #[error("gpu-models.json: {gpu_product} uses the reserved gpuModel {UNKNOWN_MODEL:?}")]
    ReservedModel { gpu_product: String },
    #[error("gpu-models.json: NVML name {name:?} appears more than once (after normalization)")]
    DuplicateName { name: String },
}

/// The embedded table, parsed on first use.
fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    // The file is compiled in and the tests parse it, so a failure here is a build defect, not bad input.
    TABLE.get_or_init(|| parse(MODELS_JSON).expect("the embedded gpu-models.json is valid"))
}

/// Parses and checks a table.
fn parse(text: &str) -> Result<Table, TableError> {
    let file: ModelsFile = serde_json::from_str(text)?;
    let mut by_name = HashMap::new();
    let mut entries = Vec::new();
    for entry in file.models {
        if entry.gpu_product.trim().is_empty() || entry.gpu_model.trim().is_empty() {
            return Err(TableError::EmptyLabel);
        }
        if entry.nvml_names.is_empty() {
            return Err(TableError::NoNames { gpu_product: entry.gpu_product });
        }
        if entry.gpu_model.eq_ignore_ascii_case(UNKNOWN_MODEL) {
            return Err(TableError::ReservedModel { gpu_product: entry.gpu_product });
        }
        let first = Model { gpu_product: entry.gpu_product.clone(), gpu_model: entry.gpu_model.clone() };
        entries.push((first, entry.nvml_names[0].clone()));
        for name in &entry.nvml_names {
            let model = Model { gpu_product: entry.gpu_product.clone(), gpu_model: entry.gpu_model.clone() };
            let normalized = normalize_nvml_name(name);
            if normalized.is_empty() || by_name.insert(normalized, model).is_some() {
                return Err(TableError::DuplicateName { name: name.clone() });
            }
        }
    }
    Ok(Table { version: file.version, by_name, entries })
}

#[cfg(test)]
mod tests;
