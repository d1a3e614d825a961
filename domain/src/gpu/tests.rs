//! Tests of `gpu`.

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

    let reserved = r#"{ "version": 2, "models": [ { "nvmlNames": ["X"], "gpuProduct": "X", "gpuModel": "Other" } ] }"#;
    assert!(matches!(parse(reserved), Err(TableError::ReservedModel { .. })));

    let empty = r#"{ "version": 2, "models": [ { "nvmlNames": ["X"], "gpuProduct": " ", "gpuModel": "X" } ] }"#;
    assert!(matches!(parse(empty), Err(TableError::EmptyLabel)));

    let unknown_field = r#"{ "version": 2, "models": [], "extra": true }"#;
    assert!(matches!(parse(unknown_field), Err(TableError::Json(_))));
}
