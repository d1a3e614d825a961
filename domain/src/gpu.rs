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
mod tests {
    use super::*;

    #[test]
    fn a_label_names_an_nvml_name_that_classifies_back_to_it() {
        let name = nvml_name_for("h100").expect("a known model");
        assert_eq!(classify(name).gpu_model, "H100");
        let name = nvml_name_for("A100-SXM4-80GB").expect("a known product");
        assert_eq!(classify(name).gpu_product, "A100-SXM4-80GB");
        assert_eq!(nvml_name_for("Z9000"), None);
    }

    fn known(gpu_product: &str, gpu_model: &str) -> GpuName {
        GpuName { gpu_product: gpu_product.to_owned(), gpu_model: gpu_model.to_owned(), known: true }
    }

    #[test]
    fn the_embedded_table_parses_and_is_version_1() {
        let table = parse(MODELS_JSON).expect("gpu-models.json parses");
        assert_eq!(table.version, 1);
        assert_eq!(models_version(), 1);
        assert!(table.by_name.len() >= 17, "{} names", table.by_name.len());
    }

    #[test]
    fn every_entry_has_a_name_and_no_name_appears_twice() {
        let file: ModelsFile = serde_json::from_str(MODELS_JSON).expect("gpu-models.json parses");
        let mut seen = std::collections::HashSet::new();
        for entry in &file.models {
            assert!(!entry.nvml_names.is_empty(), "{} lists no NVML name", entry.gpu_product);
            for name in &entry.nvml_names {
                assert!(seen.insert(normalize_nvml_name(name)), "{name} appears twice");
            }
        }
    }

    #[test]
    fn every_listed_name_classifies_as_its_entry() {
        let file: ModelsFile = serde_json::from_str(MODELS_JSON).expect("gpu-models.json parses");
        for entry in &file.models {
            for name in &entry.nvml_names {
                assert_eq!(classify(name), known(&entry.gpu_product, &entry.gpu_model), "{name}");
            }
        }
    }

    #[test]
    fn the_design_example_maps_to_h100_sxm5() {
        assert_eq!(classify("NVIDIA H100 80GB HBM3"), known("H100-SXM5-80GB", "H100"));
    }

    #[test]
    fn common_parts_map_to_their_family() {
        assert_eq!(classify("NVIDIA A100-SXM4-80GB"), known("A100-SXM4-80GB", "A100"));
        assert_eq!(classify("NVIDIA A100 80GB PCIe"), known("A100-PCIE-80GB", "A100"));
        assert_eq!(classify("NVIDIA L40S"), known("L40S-48GB", "L40S"));
        assert_eq!(classify("Tesla T4"), known("T4-16GB", "T4"));
        assert_eq!(classify("NVIDIA H200"), known("H200-SXM-141GB", "H200"));
        // L4 and L40S share a prefix; the lookup is by whole name.
        assert_eq!(classify("NVIDIA L4"), known("L4-24GB", "L4"));
    }

    #[test]
    fn spacing_and_case_do_not_matter() {
        let expected = known("H100-SXM5-80GB", "H100");
        assert_eq!(classify("nvidia  h100 80gb hbm3 "), expected);
        assert_eq!(classify("\tNVIDIA H100\u{a0}80GB   HBM3\n"), expected);
        assert_eq!(classify("NVIDIA H100 80GB HBM3".to_uppercase().as_str()), expected);
    }

    #[test]
    fn normalization_trims_collapses_and_lower_cases() {
        assert_eq!(normalize_nvml_name("  NVIDIA   A100-SXM4-40GB\t"), "nvidia a100-sxm4-40gb");
        assert_eq!(normalize_nvml_name("Tesla T4"), "tesla t4");
        assert_eq!(normalize_nvml_name("   "), "");
    }

    #[test]
    fn an_unknown_name_is_other_with_a_usable_product_label() {
        let name = classify("  NVIDIA RTX  6000 Ada Generation ");
        assert_eq!(
            name,
            GpuName {
                gpu_product: "NVIDIA-RTX-6000-ADA-GENERATION".to_owned(),
                gpu_model: UNKNOWN_MODEL.to_owned(),
                known: false
            }
        );
    }

    #[test]
    fn a_near_miss_is_unknown() {
        assert!(!classify("NVIDIA H100").known);
        assert!(!classify("NVIDIA H100 80GB HBM3e").known);
    }

    #[test]
    fn an_empty_name_is_unknown() {
        let name = classify("  ");
        assert_eq!(name.gpu_model, UNKNOWN_MODEL);
        assert_eq!(name.gpu_product, UNNAMED_PRODUCT);
        assert!(!name.known);
    }

    #[test]
    fn gpu_name_uses_camel_case_on_the_wire() {
        let json = serde_json::to_value(classify("Tesla T4")).expect("serialize");
        assert_eq!(json, serde_json::json!({ "gpuProduct": "T4-16GB", "gpuModel": "T4", "known": true }));
    }

    #[test]
    fn a_bad_table_is_refused() {
        let duplicate = r#"{ "version": 2, "models": [
            { "nvmlNames": ["NVIDIA L4"], "gpuProduct": "L4-24GB", "gpuModel": "L4" },
            { "nvmlNames": ["nvidia  l4"], "gpuProduct": "L4-OTHER", "gpuModel": "L4" } ] }"#;
        assert!(matches!(parse(duplicate), Err(TableError::DuplicateName { .. })));

        let nameless = r#"{ "version": 2, "models": [ { "nvmlNames": [], "gpuProduct": "X", "gpuModel": "X" } ] }"#;
        assert!(matches!(parse(nameless), Err(TableError::NoNames { .. })));

        let reserved =
            r#"{ "version": 2, "models": [ { "nvmlNames": ["X"], "gpuProduct": "X", "gpuModel": "Other" } ] }"#;
        assert!(matches!(parse(reserved), Err(TableError::ReservedModel { .. })));

        let empty = r#"{ "version": 2, "models": [ { "nvmlNames": ["X"], "gpuProduct": " ", "gpuModel": "X" } ] }"#;
        assert!(matches!(parse(empty), Err(TableError::EmptyLabel)));

        let unknown_field = r#"{ "version": 2, "models": [], "extra": true }"#;
        assert!(matches!(parse(unknown_field), Err(TableError::Json(_))));
    }
}
