//! No backend is left untested: every backend crate must have `tests/conformance.rs`
//! calling `dlock_conformance::conformance!` with a module named after the backend.

use std::path::Path;

/// Crates under `crates/` that are not backends.
const NOT_BACKENDS: &[&str] = &[
    "dlock-core",
    "dlock-conformance",
    "dlock",
    "dlock-cli",
    "dlock-torture",
];

#[test]
fn every_backend_crate_calls_the_conformance_macro() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut backends = Vec::new();
    for entry in std::fs::read_dir(&crates).expect("read crates/") {
        let dir = entry.expect("dir entry").path();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        if !dir.join("Cargo.toml").exists() || NOT_BACKENDS.contains(&name.as_str()) {
            continue;
        }
        let suite = dir.join("tests/conformance.rs");
        let text = std::fs::read_to_string(&suite)
            .unwrap_or_else(|_| panic!("{name} is a backend crate without tests/conformance.rs"));
        assert!(
            text.contains("dlock_conformance::conformance!("),
            "{} does not call dlock_conformance::conformance!",
            suite.display()
        );
        backends.push(name);
    }
    assert!(
        backends.contains(&"dlock-memory".to_owned()),
        "found {backends:?}"
    );
}
